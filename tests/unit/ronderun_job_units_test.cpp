// Unit tests of ronderun's units that touch files and processes, without
// starting the binary: hostfiles, the job secret, the timeline directory,
// line tagging and exit codes (see also ronderun_units_test.cpp).

#include "exit_status.h"
#include "hosts.h"
#include "options.h"
#include "output.h"
#include "runtime/launch_contract.h"
#include "secret.h"
#include "supervisor.h"
#include "timeline_dir.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ronde::detail {
namespace {

// A private directory per test, removed with what it holds.
class RonderunFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/ronderun_units.XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override {
    const std::string command = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(command.c_str()), 0);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

// --- hostfiles -------------------------------------------------------------

TEST_F(RonderunFiles, ReadsHostfiles) {
  const std::string path = write(
      "hosts", "# the cluster\nnode1 slots=2\n\n  node2:3   # fast\nnode3\n");
  std::vector<HostSlots> hosts;
  EXPECT_EQ(read_hostfile(path, hosts), "");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node1");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "node2");
  EXPECT_EQ(hosts[1].slots, 3);
  EXPECT_EQ(hosts[2].host, "node3");
  EXPECT_EQ(hosts[2].slots, 1);
  // --hostfile without -np starts a rank per slot.
  std::string args[] = {"ronderun", "--hostfile", path, "cmd"};
  char* argv[] = {&args[0][0], &args[1][0], &args[2][0], &args[3][0]};
  Options o;
  EXPECT_EQ(parse_args(4, argv, o), "");
  EXPECT_EQ(o.num_ranks, 6);
}

TEST_F(RonderunFiles, RefusesBadHostfilesWithTheirMessage) {
  std::vector<HostSlots> hosts;
  const std::string missing = dir_ + "/none";
  EXPECT_EQ(
      read_hostfile(missing, hosts),
      "--hostfile: cannot read '" + missing + "'");
  const std::string empty = write("empty", "# nothing\n\n");
  EXPECT_EQ(
      read_hostfile(empty, hosts), "--hostfile: '" + empty + "' names no host");
  const std::string words = write("words", "node1\nnode2 3\n");
  EXPECT_EQ(
      read_hostfile(words, hosts),
      words + ":2: expected 'host slots=N' or 'host:N'");
  const std::string zero = write("zero", "node slots=0\n");
  EXPECT_EQ(
      read_hostfile(zero, hosts),
      zero + ":1: 'node:0' needs a positive slot count after ':'");
}

// --- the job secret ---------------------------------------------------------

TEST_F(RonderunFiles, MakesAPrivateSecretAndRemovesIt) {
  std::string file;
  {
    JobSecret secret;
    ASSERT_EQ(secret.prepare(nullptr, false, dir_.c_str()), "");
    file = secret.file();
    const std::string parent = file.substr(0, file.rfind('/'));
    EXPECT_EQ(parent.rfind(dir_ + "/ronderun-", 0), 0u) << file;
    EXPECT_EQ(file.substr(file.rfind('/')), "/secret");
    struct stat st {};
    ASSERT_EQ(stat(file.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(stat(parent.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(text, secret.bytes());
    ASSERT_EQ(text.size(), 65u);
    EXPECT_EQ(text.find_first_not_of("0123456789abcdef"), 64u);
    EXPECT_EQ(text.back(), '\n');
    EXPECT_GE(text.size() - 1, kMinJobSecretBytes);
  }
  EXPECT_NE(access(file.c_str(), F_OK), 0);
  EXPECT_NE(access(file.substr(0, file.rfind('/')).c_str(), F_OK), 0);
}

TEST_F(RonderunFiles, UsesAGivenSecretAndReadsItOnlyForOtherHosts) {
  const std::string path = write("given", "0123456789abcdef0123\n");
  JobSecret local;
  EXPECT_EQ(local.prepare(path.c_str(), false, nullptr), "");
  EXPECT_EQ(local.file(), path);
  EXPECT_EQ(local.bytes(), "");
  JobSecret remote;
  EXPECT_EQ(remote.prepare(path.c_str(), true, nullptr), "");
  EXPECT_EQ(remote.bytes(), "0123456789abcdef0123\n");
  remote.remove();
  EXPECT_EQ(access(path.c_str(), F_OK), 0) << "a given secret stays";
  const std::string largest =
      write("largest", std::string(kMaxSecretBytes, 'k'));
  JobSecret fits;
  EXPECT_EQ(fits.prepare(largest.c_str(), true, nullptr), "");
  EXPECT_EQ(fits.bytes().size(), 4096u);
}

TEST_F(RonderunFiles, RefusesGivenSecretsItCannotHandOn) {
  const std::string big = write("big", std::string(kMaxSecretBytes + 1, 'k'));
  JobSecret secret;
  EXPECT_EQ(
      secret.prepare(big.c_str(), true, nullptr),
      "RONDE_JOB_SECRET_FILE '" + big +
          "' is larger than 4096 bytes: not a secret");
  const std::string missing = dir_ + "/missing";
  EXPECT_EQ(
      secret.prepare(missing.c_str(), true, nullptr),
      "cannot read RONDE_JOB_SECRET_FILE '" + missing +
          "': No such file or directory");
  EXPECT_EQ(
      secret.prepare("", false, (dir_ + "/none").c_str()),
      "cannot make a private directory for the job secret (" + dir_ +
          "/none/ronderun-XXXXXX): No such file or directory");
}

// --- output -----------------------------------------------------------------

TEST(RonderunOutput, TagsEachLineWithTheRank) {
  EXPECT_EQ(rank_prefix(12), "[12] ");
  const std::string text = "a\n\nb\n";
  EXPECT_EQ(
      tag_lines("[0] ", text.data(), text.size()), "[0] a\n[0] \n[0] b\n");
  const std::string partial = "x\ny";
  EXPECT_EQ(tag_lines("[3] ", partial.data(), partial.size()), "[3] x\n[3] y");
  EXPECT_EQ(tag_lines("[3] ", "", 0), "");
  // Without a prefix (--no-prefix) the bytes pass through as they came.
  EXPECT_EQ(tag_lines("", text.data(), text.size()), text);
}

TEST(RonderunOutput, FindsCompleteLinesAcrossChunks) {
  std::string pending;
  EXPECT_EQ(append_and_find_lines(pending, "ab", 2), 0u);
  EXPECT_EQ(pending, "ab");
  EXPECT_EQ(append_and_find_lines(pending, "c\nd\ne", 5), 6u);
  EXPECT_EQ(pending.substr(0, 6), "abc\nd\n");
  pending.erase(0, 6);
  EXPECT_EQ(pending, "e");
  EXPECT_EQ(append_and_find_lines(pending, "\n", 1), 2u);
  EXPECT_EQ(append_and_find_lines(pending, "", 0), 0u);
}

// --- exit codes -------------------------------------------------------------

int wait_status_of(void (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(99);
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

TEST(RonderunExitStatus, MapsExitsAndSignalsToCodes) {
  RankExit e = rank_exit(wait_status_of([] { _exit(3); }));
  EXPECT_EQ(e.code, 3);
  EXPECT_EQ(e.how, "exited with code 3");
  e = rank_exit(wait_status_of([] { _exit(0); }));
  EXPECT_EQ(e.code, 0);
  EXPECT_EQ(e.how, "exited with code 0");
  e = rank_exit(wait_status_of([] { raise(SIGKILL); }));
  EXPECT_EQ(e.code, 137);
  EXPECT_EQ(e.how, "was killed by signal SIGKILL");
  e = rank_exit(wait_status_of([] {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
  }));
  EXPECT_EQ(e.code, 128 + SIGTERM);
  EXPECT_EQ(e.how, "was killed by signal SIGTERM");
}

TEST(RonderunExitStatus, NamesSignals) {
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signal_name(SIGHUP), "SIGHUP");
  EXPECT_EQ(signal_name(0), "0");
}

TEST(RonderunExitStatus, ReadsTheKillGrace) {
  std::string warning;
  EXPECT_EQ(parse_kill_grace(nullptr, warning), 5.0);
  EXPECT_EQ(parse_kill_grace("", warning), 5.0);
  EXPECT_EQ(parse_kill_grace("2.5", warning), 2.5);
  EXPECT_EQ(parse_kill_grace("0", warning), 0.0);
  EXPECT_EQ(parse_kill_grace("1e9", warning), 7.0 * 24 * 3600);
  EXPECT_EQ(warning, "");
  for (const char* bad : {"abc", "-1", "3s", "nan", "inf"}) {
    warning.clear();
    EXPECT_EQ(parse_kill_grace(bad, warning), 5.0) << bad;
    EXPECT_EQ(
        warning,
        std::string("ignoring RONDE_KILL_GRACE_SECONDS='") + bad +
            "'; using 5 seconds");
  }
}

// --- the timeline directory -------------------------------------------------

TEST_F(RonderunFiles, PreparesTheTimelineDirectory) {
  const std::string dir = dir_ + "/tl";
  EXPECT_EQ(timeline_file(dir, 3), dir + "/timeline.3.json");
  EXPECT_EQ(prepare_timeline_dir(dir, 2), "");
  write("tl/timeline.1.json", "[\n");
  write("tl/timeline.2.json", "[\n");
  EXPECT_EQ(prepare_timeline_dir(dir, 2), "");
  EXPECT_NE(access((dir + "/timeline.1.json").c_str(), F_OK), 0);
  EXPECT_EQ(access((dir + "/timeline.2.json").c_str(), F_OK), 0)
      << "not a rank of this job";
  EXPECT_EQ(
      merge_job_timeline(dir, 2),
      "--timeline: no rank wrote a timeline in '" + dir + "'");
  const std::string file = write("file", "");
  EXPECT_EQ(
      prepare_timeline_dir(file, 1),
      "--timeline: '" + file + "' is not a directory");
}

}  // namespace
}  // namespace ronde::detail
