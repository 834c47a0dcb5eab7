// Coordinated checkpoints on 2 real ranks: a run killed with SIGKILL and
// resumed ends bitwise equal to an uninterrupted run; torn and corrupt
// files are skipped; a failed write is an error on every rank; a writer
// killed in the middle of a file costs only that checkpoint.
#include "harness.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

namespace {

using ronde::testing::JobResult;
using ronde::testing::run_job;
using ronde::testing::worker_spec;

constexpr int kTotal = 40;

ronde::testing::JobSpec checkpoint_spec(
    const std::string& dir, int every, const std::string& kill) {
  auto spec = worker_spec(
      {"checkpoint", dir, std::to_string(kTotal), std::to_string(every), kill},
      2);
  spec.env["RONDE_TIMEOUT_SECONDS"] = "10";
  spec.timeout = std::chrono::seconds(120);
  return spec;
}

JobResult run_checkpoint(const std::string& dir, int every, int kill_at) {
  return run_job(checkpoint_spec(dir, every, std::to_string(kill_at)));
}

// "rank R: params <hash> after step 40" for each rank.
std::vector<std::string> params_of(const JobResult& job) {
  std::vector<std::string> out;
  std::regex re("params ([0-9a-f]{16}) after step 40");
  for (const auto& r : job.ranks) {
    std::smatch m;
    out.push_back(
        std::regex_search(r.output, m, re) ? std::string(m[1]) : "(none)");
  }
  return out;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") {
        names.push_back(n);
      }
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ckpt(int step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-%012d.ronde", step);
  return buf;
}

TEST(Checkpoint, KilledRunResumesToTheSameParameters) {
  auto root = ronde::testing::make_temp_dir();
  // The uninterrupted reference.
  auto straight = run_checkpoint(root + "/straight", 0, -1);
  ASSERT_TRUE(straight.all_succeeded()) << straight.dump();
  auto expected = params_of(straight);
  ASSERT_NE(expected[0], "(none)") << straight.dump();
  EXPECT_EQ(expected[0], expected[1]) << straight.dump();
  EXPECT_NE(straight.ranks[0].output.find("fresh start"), std::string::npos);

  // Rank 1 dies by SIGKILL after step 20; checkpoints at 8 and 16 remain.
  const std::string dir = root + "/run";
  auto killed = run_checkpoint(dir, 8, 20);
  ASSERT_FALSE(killed.timed_out) << killed.dump();
  EXPECT_EQ(killed.ranks[1].signal, SIGKILL) << killed.dump();
  EXPECT_EQ(killed.ranks[0].exit_code, 4) << killed.dump();  // a CommError
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{ckpt(8), ckpt(16)}));

  // Resumed: from step 16, to the same parameters, bit for bit.
  auto resumed = run_checkpoint(dir, 8, -1);
  ASSERT_TRUE(resumed.all_succeeded()) << resumed.dump();
  EXPECT_NE(resumed.ranks[0].output.find("restored step 16"), std::string::npos)
      << resumed.dump();
  EXPECT_NE(resumed.ranks[1].output.find("restored step 16"), std::string::npos)
      << resumed.dump();
  EXPECT_EQ(params_of(resumed), expected) << resumed.dump();
  // keep_last = 2.
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{ckpt(32), ckpt(40)}));
}

TEST(Checkpoint, TornAndCorruptFilesAreSkipped) {
  auto root = ronde::testing::make_temp_dir();
  auto straight = run_checkpoint(root + "/straight", 0, -1);
  ASSERT_TRUE(straight.all_succeeded()) << straight.dump();
  auto expected = params_of(straight);

  const std::string dir = root + "/run";
  auto first = run_checkpoint(dir, 8, -1);
  ASSERT_TRUE(first.all_succeeded()) << first.dump();
  ASSERT_EQ(files_in(dir), (std::vector<std::string>{ckpt(32), ckpt(40)}));
  const std::string newest = dir + "/" + ckpt(40);

  // A flipped byte in the payload: the checksum catches it. A stale
  // temporary file (a writer killed mid-write) is ignored, then removed.
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c = 0;
    f.read(&c, 1);
    f.seekp(200);
    c ^= 0x5a;
    f.write(&c, 1);
  }
  std::ofstream(dir + "/" + ckpt(48) + ".tmp") << "half a checkpoint";
  auto after_corrupt = run_checkpoint(dir, 8, -1);
  ASSERT_TRUE(after_corrupt.all_succeeded()) << after_corrupt.dump();
  EXPECT_NE(
      after_corrupt.ranks[0].output.find(
          "skipping checkpoint " + newest + ": corrupt: checksum mismatch"),
      std::string::npos)
      << after_corrupt.dump();
  EXPECT_NE(
      after_corrupt.ranks[1].output.find("restored step 32"), std::string::npos)
      << after_corrupt.dump();
  EXPECT_EQ(params_of(after_corrupt), expected) << after_corrupt.dump();
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{ckpt(32), ckpt(40)}));

  // Cut short (a torn write on a file system without atomic rename).
  ASSERT_EQ(truncate(newest.c_str(), 100), 0);
  auto after_torn = run_checkpoint(dir, 8, -1);
  ASSERT_TRUE(after_torn.all_succeeded()) << after_torn.dump();
  EXPECT_NE(
      after_torn.ranks[0].output.find(
          "skipping checkpoint " + newest + ": torn"),
      std::string::npos)
      << after_torn.dump();
  EXPECT_EQ(params_of(after_torn), expected) << after_torn.dump();
}

// A checkpoint key file of the test's own: 64 hex digits, private.
std::string key_file(const std::string& dir, char digit) {
  const std::string path = dir + "/key-" + digit;
  std::ofstream(path) << std::string(64, digit) << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

JobResult run_encrypted(
    const std::string& dir, const std::string& key, int kill_at) {
  auto spec = checkpoint_spec(dir, 8, std::to_string(kill_at));
  spec.env["RONDE_CHECKPOINT_KEY_FILE"] = key;
  return run_job(spec);
}

std::string file_bytes(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path, std::ios::binary).rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Rank 0 skipped `file` for `reason`, every rank restored step 32 instead,
// and the run ended with the uninterrupted run's parameters.
void expect_fell_back_to_32(
    const JobResult& job,
    const std::string& file,
    const std::string& reason,
    const std::vector<std::string>& expected) {
  ASSERT_TRUE(job.all_succeeded()) << job.dump();
  EXPECT_NE(
      job.ranks[0].output.find("skipping checkpoint " + file + ": " + reason),
      std::string::npos)
      << job.dump();
  for (const auto& r : job.ranks) {
    EXPECT_NE(r.output.find("restored step 32"), std::string::npos)
        << job.dump();
  }
  EXPECT_EQ(params_of(job), expected) << job.dump();
}

TEST(Checkpoint, EncryptedFilesResumeBitwiseAndRefuseChangesAndOtherKeys) {
  auto root = ronde::testing::make_temp_dir();
  auto straight = run_checkpoint(root + "/straight", 0, -1);
  ASSERT_TRUE(straight.all_succeeded()) << straight.dump();
  auto expected = params_of(straight);
  const std::string key_a = key_file(root, 'a');
  const std::string key_b = key_file(root, 'b');

  // Killed after step 20 and resumed from 16, encrypted: the same
  // parameters, bit for bit.
  const std::string dir = root + "/run";
  auto killed = run_encrypted(dir, key_a, 20);
  EXPECT_EQ(killed.ranks[1].signal, SIGKILL) << killed.dump();
  ASSERT_EQ(files_in(dir), (std::vector<std::string>{ckpt(8), ckpt(16)}));
  const std::string f16 = file_bytes(dir + "/" + ckpt(16));
  EXPECT_EQ(f16.substr(0, 8), std::string("RONDECK\x02", 8));
  // The archive's names are in the clear in a plain file, not here.
  EXPECT_EQ(f16.find("ronde.rng_cpu"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/" + ckpt(16)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto resumed = run_encrypted(dir, key_a, -1);
  ASSERT_TRUE(resumed.all_succeeded()) << resumed.dump();
  EXPECT_NE(resumed.ranks[1].output.find("restored step 16"), std::string::npos)
      << resumed.dump();
  EXPECT_EQ(params_of(resumed), expected) << resumed.dump();
  ASSERT_EQ(files_in(dir), (std::vector<std::string>{ckpt(32), ckpt(40)}));
  const std::string newest = dir + "/" + ckpt(40);
  const std::string good40 = file_bytes(newest);

  // One ciphertext byte changed, its CRC-32 recomputed as a deliberate
  // change would: the tag refuses it, and step 32 is used.
  {
    std::string bad = good40;
    constexpr size_t prefix = 32 + 8 + 12 + 16;
    bad[prefix + 100] ^= 0x01;
    const uint32_t crc = static_cast<uint32_t>(::crc32(
        0L,
        reinterpret_cast<const Bytef*>(bad.data() + prefix),
        static_cast<uInt>(bad.size() - prefix)));
    std::memcpy(bad.data() + 24, &crc, 4);
    write_bytes(newest, bad);
  }
  expect_fell_back_to_32(
      run_encrypted(dir, key_a, -1),
      newest,
      "refused: its authentication tag does not verify",
      expected);

  // Step 40 as written under another key: refused, step 32 used.
  const std::string other = root + "/other";
  auto under_b = run_encrypted(other, key_b, -1);
  ASSERT_TRUE(under_b.all_succeeded()) << under_b.dump();
  write_bytes(newest, file_bytes(other + "/" + ckpt(40)));
  expect_fell_back_to_32(
      run_encrypted(dir, key_a, -1),
      newest,
      "refused: encrypted with another key",
      expected);

  // A plain file where a key is set: anyone could have written it.
  const std::string plain_dir = root + "/plain";
  auto plain = run_checkpoint(plain_dir, 8, -1);
  ASSERT_TRUE(plain.all_succeeded()) << plain.dump();
  auto refused_plain = run_encrypted(plain_dir, key_a, -1);
  ASSERT_TRUE(refused_plain.all_succeeded()) << refused_plain.dump();
  EXPECT_NE(
      refused_plain.ranks[0].output.find(
          ": refused: it is not encrypted, but a checkpoint key is set"),
      std::string::npos)
      << refused_plain.dump();
  EXPECT_NE(
      refused_plain.ranks[0].output.find("fresh start"), std::string::npos)
      << refused_plain.dump();

  // A key file others may read fails every rank alike, naming it.
  ::chmod(key_b.c_str(), 0644);
  auto loose = run_encrypted(other, key_b, -1);
  EXPECT_FALSE(loose.all_succeeded()) << loose.dump();
  for (const auto& r : loose.ranks) {
    EXPECT_NE(r.output.find("chmod 600"), std::string::npos) << loose.dump();
  }
}

TEST(Checkpoint, AFailedWriteIsAnErrorOnEveryRank) {
  // A directory below a regular file cannot be created.
  auto root = ronde::testing::make_temp_dir();
  std::ofstream(root + "/file") << "x";
  auto job = run_checkpoint(root + "/file/ckpt", 8, -1);
  ASSERT_FALSE(job.timed_out) << job.dump();
  for (const auto& r : job.ranks) {
    EXPECT_EQ(r.exit_code, 3) << job.dump();
    EXPECT_NE(
        r.output.find(
            "Checkpointer: rank 0 failed to save checkpoint 8 in '" + root +
            "/file/ckpt': cannot create the checkpoint directory '" + root +
            "/file"),
        std::string::npos)
        << job.dump();
  }
}

TEST(Checkpoint, ARankKilledInsideBackwardFailsThePeerWithinTheTimeout) {
  auto root = ronde::testing::make_temp_dir();
  auto job = run_job(checkpoint_spec(root + "/run", 8, "b10"));
  ASSERT_FALSE(job.timed_out) << job.dump();
  EXPECT_EQ(job.ranks[1].signal, SIGKILL) << job.dump();
  EXPECT_NE(
      job.ranks[1].output.find("killing myself inside backward"),
      std::string::npos)
      << job.dump();
  EXPECT_EQ(job.ranks[0].exit_code, 4) << job.dump();
  EXPECT_NE(
      job.ranks[0].output.find("COMM_ERROR: ronde: allreduce of "),
      std::string::npos)
      << job.dump();
  EXPECT_NE(job.ranks[0].output.find("failed on rank 0"), std::string::npos)
      << job.dump();
  // RONDE_TIMEOUT_SECONDS is 10: the failure is detected, not waited out.
  EXPECT_LT(job.seconds, 60.0) << job.dump();
  // The checkpoint of step 8 is intact.
  EXPECT_EQ(files_in(root + "/run"), (std::vector<std::string>{ckpt(8)}));
}

TEST(Checkpoint, AWriterKilledMidFileLosesOnlyThatCheckpoint) {
  auto root = ronde::testing::make_temp_dir();
  auto straight = run_checkpoint(root + "/straight", 0, -1);
  ASSERT_TRUE(straight.all_succeeded()) << straight.dump();
  auto expected = params_of(straight);

  // Rank 0 dies by SIGKILL with half of checkpoint 16's payload written.
  const std::string dir = root + "/run";
  auto spec = checkpoint_spec(dir, 8, "-1");
  spec.env["RONDE_TEST_KILL_WRITING"] = ckpt(16) + ".tmp";
  auto killed = run_job(spec);
  ASSERT_FALSE(killed.timed_out) << killed.dump();
  EXPECT_EQ(killed.ranks[0].signal, SIGKILL) << killed.dump();
  EXPECT_NE(
      killed.ranks[0].output.find("killed while writing a checkpoint"),
      std::string::npos)
      << killed.dump();
  // Rank 1, waiting for the outcome of the save, fails within the timeout.
  EXPECT_EQ(killed.ranks[1].exit_code, 4) << killed.dump();
  EXPECT_NE(
      killed.ranks[1].output.find("COMM_ERROR: ronde:"), std::string::npos)
      << killed.dump();
  EXPECT_LT(killed.seconds, 60.0) << killed.dump();
  // The half-written file never took the checkpoint's name.
  ASSERT_EQ(
      files_in(dir), (std::vector<std::string>{ckpt(8), ckpt(16) + ".tmp"}));
  struct stat st {};
  ASSERT_EQ(stat((dir + "/" + ckpt(16) + ".tmp").c_str(), &st), 0);
  EXPECT_GT(st.st_size, 32);  // the header and part of the payload

  // Resumed: from step 8, to the same parameters; the torn file is removed
  // once a newer checkpoint is durable.
  auto resumed = run_checkpoint(dir, 8, -1);
  ASSERT_TRUE(resumed.all_succeeded()) << resumed.dump();
  EXPECT_NE(resumed.ranks[1].output.find("restored step 8"), std::string::npos)
      << resumed.dump();
  EXPECT_EQ(params_of(resumed), expected) << resumed.dump();
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{ckpt(32), ckpt(40)}));
}

// Saved by the ranks still training while the last is in ronde::join();
// restored by all (worker_checkpoint.cpp, scenario_save_while_joined).
TEST(Checkpoint, SavedWhileARankHasJoined) {
  const std::string dir = ronde::testing::make_temp_dir();
  JobResult r = run_job(worker_spec({"save_while_joined", dir}, 3));
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  EXPECT_NE(
      r.ranks[2].output.find(
          "was saved while this rank was in ronde::join(): its random "
          "number generators are not restored"),
      std::string::npos)
      << r.dump();
  for (int q = 0; q < 2; ++q) {
    EXPECT_EQ(r.ranks[q].output.find("not restored"), std::string::npos)
        << r.dump();
  }
}

TEST(Checkpoint, TwoJobsOnOneMachineDoNotInterfere) {
  auto root = ronde::testing::make_temp_dir();
  // Distinct job ids and ports, started at once.
  ronde::testing::RunningJob a(checkpoint_spec(root + "/a", 8, "-1"));
  ronde::testing::RunningJob b(checkpoint_spec(root + "/b", 8, "-1"));
  EXPECT_NE(a.spec().job_id, b.spec().job_id);
  EXPECT_NE(a.spec().port, b.spec().port);
  auto ra = a.wait();
  auto rb = b.wait();
  ASSERT_TRUE(ra.all_succeeded()) << ra.dump();
  ASSERT_TRUE(rb.all_succeeded()) << rb.dump();
  EXPECT_EQ(params_of(ra), params_of(rb));
  EXPECT_EQ(
      files_in(root + "/a"), (std::vector<std::string>{ckpt(32), ckpt(40)}));
  EXPECT_EQ(
      files_in(root + "/b"), (std::vector<std::string>{ckpt(32), ckpt(40)}));
}

TEST(Timeline, EveryRankWritesItsOwnTrace) {
  auto root = ronde::testing::make_temp_dir();
  auto spec = checkpoint_spec(root + "/run", 8, "-1");
  spec.env["RONDE_TIMELINE"] = root + "/trace.json";
  auto job = run_job(spec);
  ASSERT_TRUE(job.all_succeeded()) << job.dump();
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(root + "/trace." + std::to_string(r) + ".json");
    std::stringstream text;
    text << f.rdbuf();
    const std::string t = text.str();
    ASSERT_FALSE(t.empty()) << "no trace for rank " << r;
    EXPECT_EQ(t.rfind("[\n", 0), 0u);
    EXPECT_EQ(t.substr(t.size() - 3), "\n]\n");
    EXPECT_NE(
        t.find("\"args\":{\"name\":\"rank " + std::to_string(r) + "\"}"),
        std::string::npos);
    EXPECT_NE(t.find("\"cat\":\"collective\",\"ph\":\"X\""), std::string::npos);
    EXPECT_NE(t.find("\"name\":\"allreduce "), std::string::npos);
    EXPECT_NE(
        t.find("\"args\":{\"name\":\"communication\"}"), std::string::npos);
    EXPECT_NE(
        t.find("\"name\":\"checkpoint save 40\",\"cat\":\"checkpoint\""),
        std::string::npos);
    EXPECT_NE(t.find("\"name\":\"checkpoint restore\""), std::string::npos);
    // The optimizer's own events: gradient hooks, the bucket all-reduce
    // named by its parameters, the wait in step(), the optimizer step.
    EXPECT_NE(
        t.find("\"name\":\"gradient 0.weight\",\"cat\":\"hook\",\"ph\":\"i\""),
        std::string::npos);
    EXPECT_NE(
        t.find("\"name\":\"allreduce ronde.bucket.0 [3.bias, 3.weight, 0.bias, "
               "+1 more]\""),
        std::string::npos);
    EXPECT_NE(
        t.find("\"name\":\"wait for all-reduces\",\"cat\":\"wait\""),
        std::string::npos);
    EXPECT_NE(
        t.find("\"name\":\"optimizer step\",\"cat\":\"step\""),
        std::string::npos);
  }
}

TEST(StallInspector, WarnsAboutARankThatHasNotSubmitted) {
  auto spec = worker_spec({"stall", "4"}, 2);
  spec.env["RONDE_TIMEOUT_SECONDS"] = "30";
  spec.env["RONDE_STALL_WARNING_SECONDS"] = "1";
  auto job = run_job(spec);
  ASSERT_TRUE(job.all_succeeded()) << job.dump();
  const auto& out = job.ranks[0].output;
  EXPECT_NE(
      out.find("ronde: stall warning: rank 0 has waited 1 s in collective #"),
      std::string::npos)
      << job.dump();
  EXPECT_NE(
      out.find(" allreduce 'late tensor'; rank 1 has not submitted it (rank 1 "
               "last started #"),
      std::string::npos)
      << job.dump();
  // Warned once, and the late rank was not warned about anything.
  EXPECT_EQ(
      out.find("stall warning", out.find("stall warning") + 1),
      std::string::npos)
      << job.dump();
  EXPECT_EQ(job.ranks[1].output.find("stall"), std::string::npos) << job.dump();
  EXPECT_NE(job.ranks[1].output.find("rank 1: sum 2"), std::string::npos)
      << job.dump();
}

TEST(StallInspector, ShutsTheCollectiveDownAfterTheLimit) {
  auto spec = worker_spec({"stall", "12"}, 2);
  spec.env["RONDE_TIMEOUT_SECONDS"] = "60";
  spec.env["RONDE_STALL_WARNING_SECONDS"] = "1";
  spec.env["RONDE_STALL_SHUTDOWN_SECONDS"] = "3";
  auto job = run_job(spec);
  ASSERT_FALSE(job.timed_out) << job.dump();
  const auto& out = job.ranks[0].output;
  EXPECT_EQ(job.ranks[0].exit_code, 4) << job.dump();
  EXPECT_NE(
      out.find("ronde: stall: rank 0 gave up after 3 s in collective #"),
      std::string::npos)
      << job.dump();
  EXPECT_NE(
      out.find("(RONDE_STALL_SHUTDOWN_SECONDS=3); rank 1 has not submitted it"),
      std::string::npos)
      << job.dump();
  EXPECT_NE(
      out.find("rank 0: COMM_ERROR: ronde: allreduce of 'late tensor' failed "
               "on rank 0"),
      std::string::npos)
      << job.dump();
  // The late rank fails too when it finally arrives, instead of hanging.
  EXPECT_EQ(job.ranks[1].exit_code, 4) << job.dump();
  // Well before the 60 s collective timeout.
  EXPECT_LT(job.seconds, 40.0) << job.dump();
}

}  // namespace
