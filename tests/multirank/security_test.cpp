// Authenticated jobs on real ranks: processes without the job's secret (or
// with another's) are refused while the job goes on; values a stranger
// writes into the store are ignored with an error line, where without a
// secret they would end the job; ronderun's secret never shows in a log
// line or in ps. Encrypted checkpoints are in checkpoint_test.cpp.
#include "harness.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace {

using ronde::testing::JobResult;
using ronde::testing::JobSpec;
using ronde::testing::run_job;
using ronde::testing::RunningJob;

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// A secret file of the test's own, private as ronde requires.
std::string secret_file(const std::string& dir, const std::string& secret) {
  const std::string path = dir + "/secret-" + std::to_string(secret.size()) +
                           "-" + secret.substr(0, 4);
  std::ofstream(path) << secret << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

// A "hold" job (ranks meet, wait for <dir>/go, then all-reduce), started
// and waited for until it is ready.
struct HeldJob {
  std::string dir = ronde::testing::make_temp_dir();
  std::unique_ptr<RunningJob> job;
  explicit HeldJob(const std::string& secret_path) {
    JobSpec s = ronde::testing::worker_spec({"hold", dir}, 2);
    if (!secret_path.empty())
      s.env["RONDE_JOB_SECRET_FILE"] = secret_path;
    s.env["RONDE_TIMEOUT_SECONDS"] = "20";
    job = std::make_unique<RunningJob>(s);
    struct stat st {};
    for (int i = 0; i < 600 && ::stat((dir + "/ready").c_str(), &st) != 0;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  bool ready() const {
    struct stat st {};
    return ::stat((dir + "/ready").c_str(), &st) == 0;
  }
  JobResult finish() {
    std::ofstream(dir + "/go").put('\n');
    return job->wait();
  }
};

// This job's rank 1 again, as another process would start it.
JobResult intruder(const HeldJob& held, const std::string& secret_path) {
  JobSpec s = ronde::testing::worker_spec({"intruder"}, 2);
  s.port = held.job->spec().port;
  s.job_id = held.job->spec().job_id;
  s.only_ranks = {1};
  s.env["RONDE_TIMEOUT_SECONDS"] = "10";
  if (!secret_path.empty())
    s.env["RONDE_JOB_SECRET_FILE"] = secret_path;
  return run_job(s);
}

// The processes rank 0's "refused ..." lines count.
int refusals_reported(const std::string& out) {
  int n = 0;
  std::regex line("refused (a process|([0-9]+) processes) that tried to join");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line);
       it != std::sregex_iterator();
       ++it) {
    n += (*it)[2].matched ? std::stoi((*it)[2].str()) : 1;
  }
  return n;
}

TEST(Security, ProcessesWithoutTheSecretAreRefusedWhileTheJobGoesOn) {
  const std::string keys = ronde::testing::make_temp_dir();
  const std::string ours = secret_file(keys, "our job secret, 32 bytes long..");
  const std::string theirs =
      secret_file(keys, "THEIR job secret, 32 bytes long");
  HeldJob held(ours);
  ASSERT_TRUE(held.ready()) << held.job->wait().dump();

  JobResult none = intruder(held, "");
  ASSERT_EQ(none.ranks.size(), 1u);
  EXPECT_EQ(none.ranks[0].exit_code, 4) << none.dump();
  EXPECT_TRUE(contains(none.ranks[0].output, "is authenticated"))
      << none.dump();
  EXPECT_TRUE(contains(none.ranks[0].output, "has no job secret"))
      << none.dump();

  JobResult other = intruder(held, theirs);
  EXPECT_EQ(other.ranks[0].exit_code, 4) << other.dump();
  EXPECT_TRUE(contains(other.ranks[0].output, "does not prove the secret"))
      << other.dump();

  // A secret file others may read is refused on its own side.
  const std::string loose = keys + "/loose";
  std::ofstream(loose) << "our job secret, 32 bytes long..\n";
  ::chmod(loose.c_str(), 0644);
  JobResult careless = intruder(held, loose);
  EXPECT_EQ(careless.ranks[0].exit_code, 4) << careless.dump();
  EXPECT_TRUE(contains(careless.ranks[0].output, "chmod 600"))
      << careless.dump();

  // Rank 0's inspector reports the two refused at rendezvous (the third
  // never reached the store), in one line or one each, as they came.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  JobResult jr = held.finish();
  EXPECT_TRUE(jr.all_succeeded()) << jr.dump();
  EXPECT_EQ(refusals_reported(jr.ranks[0].output), 2) << jr.dump();
}

// Writes a stall-shutdown notice and a progress record into the job's
// store as a stranger would, waits for the inspectors to see them, then
// lets the job go on.
JobResult forge_into(HeldJob& held) {
  // The worker program as a plain store client (scenario forge_store).
  const std::string cmd = ronde::testing::worker_path() + " forge_store " +
                          std::to_string(held.job->spec().port) + " " +
                          held.job->spec().job_id;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  return held.finish();
}

TEST(Security, ForgedStoreValuesAreIgnoredWithAnErrorLine) {
  const std::string keys = ronde::testing::make_temp_dir();
  HeldJob held(secret_file(keys, "our job secret, 32 bytes long.."));
  ASSERT_TRUE(held.ready()) << held.job->wait().dump();
  JobResult jr = forge_into(held);
  EXPECT_TRUE(jr.all_succeeded()) << jr.dump();
  const std::string key =
      "'ronde/" + held.job->spec().job_id + "/stall_shutdown' refused";
  for (const auto& r : jr.ranks) {
    EXPECT_TRUE(contains(r.output, "ignoring ronde: store value " + key))
        << jr.dump();
    EXPECT_TRUE(contains(r.output, "not sealed")) << jr.dump();
    EXPECT_FALSE(contains(r.output, "closing connections")) << jr.dump();
  }
}

TEST(Security, WithoutASecretTheSameForgeryEndsTheJob) {
  // What the secret prevents: the forged notice is believed.
  HeldJob held("");
  ASSERT_TRUE(held.ready()) << held.job->wait().dump();
  JobResult jr = forge_into(held);
  EXPECT_FALSE(jr.all_succeeded()) << jr.dump();
  EXPECT_TRUE(contains(jr.ranks[0].output, "closing connections: forged"))
      << jr.dump();
}

TEST(Security, RonderunSecretNeverInLogsOrProcessList) {
  const std::string dir = ronde::testing::make_temp_dir();
  const std::string out = dir + "/ronderun.log";
  // The marker proves that ps shows environments here, so that the
  // secret's absence from them means something.
  const std::string cmd =
      "env -u RONDE_JOB_SECRET_FILE "
      "RONDE_TEST_PS_MARKER=ps-shows-env-7f3a " +
      std::string(RONDERUN_PATH) + " -np 2 --verbose --timeout 20 -- " +
      ronde::testing::worker_path() + " secret_probe " + dir + " > " + out +
      " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream log;
  log << std::ifstream(out).rdbuf();
  const std::string text = log.str();
  ASSERT_EQ(rc, 0) << text;
  std::string secret;
  for (int r = 0; r < 2; ++r) {
    std::stringstream s;
    s << std::ifstream(dir + "/secret-" + std::to_string(r)).rdbuf();
    if (r == 0)
      secret = s.str();
    EXPECT_EQ(s.str(), secret) << "every rank got the same secret";
  }
  while (!secret.empty() && secret.back() == '\n')
    secret.pop_back();
  ASSERT_EQ(secret.size(), 64u) << "256 bits, in hex: '" << secret << "'";
  EXPECT_TRUE(contains(text, "SECRET_FILE mode 600")) << text;
  EXPECT_TRUE(contains(text, "ps-shows-env-7f3a")) << text;
  EXPECT_TRUE(contains(text, "RONDE_JOB_SECRET_FILE=")) << text;
  EXPECT_FALSE(contains(text, secret)) << text;
  // Only the job's ranks were ever told where it was: gone with ronderun.
  const std::string marker = "SECRET_FILE mode 600 at ";
  const size_t at = text.find(marker);
  ASSERT_NE(at, std::string::npos) << text;
  const std::string path =
      text.substr(at + marker.size(), text.find('\n', at) - at - marker.size());
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << path << " is still there";
}

}  // namespace
