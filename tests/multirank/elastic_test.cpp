// Elastic jobs under ronderun --min-np: ranks die of SIGKILL (in a
// collective, at a commit, rank 0, a second one during recovery), the
// survivors go on, and rank 0 checks the result against one process that
// applies the same global batches (worker_elastic.cpp). Below the minimum
// the survivors fail with a clear error. Nothing is left behind.
#include "harness.h"

#include <gtest/gtest.h>

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Outcome {
  int rc = -1;
  std::string text;
};

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..")
        out.push_back(name);
    }
    ::closedir(d);
  }
  return out;
}

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ronde::testing::make_temp_dir();
    shm_ = dir_ + "/shm";
    ASSERT_EQ(std::system(("mkdir -p " + shm_).c_str()), 0);
  }
  void TearDown() override {
    ronde::testing::remove_temp_dir(dir_);
  }

  // ronderun -np NP --min-np MIN over the worker's elastic_train, with its
  // segments in a directory of the test's own, under a hard time limit.
  Outcome run(
      int np,
      int min_np,
      const std::string& args,
      int timeout = 15,
      const std::string& growth = "") {
    const std::string out = dir_ + "/out.txt";
    const std::string cmd =
        "RONDE_SHM_DIR=" + shm_ + " timeout -s KILL 120 " +
        std::string(RONDERUN_PATH) + " -np " + std::to_string(np) +
        " --min-np " + std::to_string(min_np) + " " + growth + " --timeout " +
        std::to_string(timeout) + " -- " + ronde::testing::worker_path() +
        " elastic_train " + args + " > " + out + " 2>&1";
    Outcome o;
    const int status = std::system(cmd.c_str());
    o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::stringstream log;
    log << std::ifstream(out).rdbuf();
    o.text = log.str();
    return o;
  }

  // Survivors finished with `size` ranks and rank 0's checks held.
  void expect_went_on(const Outcome& o, int size, int died = -1) {
    EXPECT_EQ(o.rc, 0) << o.text;
    EXPECT_EQ(count_of(o.text, "dying"), died < 0 ? 4 - size : died) << o.text;
    EXPECT_EQ(
        count_of(o.text, "with " + std::to_string(size) + " ranks over shm\n"),
        size)
        << o.text;
    EXPECT_NE(o.text.find("parameters match the reference"), std::string::npos)
        << o.text;
    EXPECT_NE(o.text.find("every sample once: yes"), std::string::npos)
        << o.text;
    EXPECT_NE(
        o.text.find("for " + std::to_string(size) + " ranks"),
        std::string::npos)
        << o.text;
    if (died != 0)
      EXPECT_NE(o.text.find("the job is elastic"), std::string::npos) << o.text;
    expect_nothing_left();
  }

  void expect_nothing_left() {
    EXPECT_TRUE(entries(shm_).empty())
        << "left in the segment directory: " << entries(shm_).size();
    EXPECT_NE(std::system("pgrep -x ronde_store > /dev/null"), 0)
        << "a store host outlived its job";
  }

  std::string dir_, shm_;
};

TEST_F(Elastic, OneOfFourKilledWithAllReducesInFlight) {
  expect_went_on(run(4, 2, "7 3 backward"), 3);
}

TEST_F(Elastic, RankZeroKilledBetweenCollectives) {
  const Outcome o = run(4, 2, "7 0 forward");
  expect_went_on(o, 3);
  EXPECT_NE(o.text.find("eras: 0:4 6:3"), std::string::npos) << o.text;
}

TEST_F(Elastic, KilledWhereItWouldCommit) {
  const Outcome o = run(4, 2, "6 1 commit");
  expect_went_on(o, 3);
  // The others committed step 6: nothing after it was lost.
  EXPECT_NE(o.text.find("eras: 0:4 6:3"), std::string::npos) << o.text;
}

TEST_F(Elastic, SecondFailureDuringRecovery) {
  const Outcome o = run(4, 2, "7 3 forward 2 reset");
  expect_went_on(o, 2);
  EXPECT_NE(o.text.find("eras: 0:4 6:3 6:2"), std::string::npos) << o.text;
}

// A replacement for the lost rank joins at a later commit, takes the
// state from rank 0, and the job ends with four ranks again.
TEST_F(Elastic, AFailedRankIsReplaced) {
  const Outcome o = run(4, 2, "7 3 forward sleep 120", 15, "--restart-failed");
  expect_went_on(o, 4, 1);
  EXPECT_NE(o.text.find("starting a replacement for rank 3"), std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("eras: 0:4 6:3 "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("(ranks joined)"), std::string::npos) << o.text;
}

// Two ranks grow to four through the discovery script's slots.
TEST_F(Elastic, GrowsThroughTheDiscoveryScript) {
  const std::string hosts = dir_ + "/hosts";
  std::ofstream(hosts) << "localhost:4\n";
  const Outcome o =
      run(2,
          2,
          "-1 sleep 120",
          15,
          "--max-np 4 --host-discovery-script 'cat " + hosts + "'");
  expect_went_on(o, 4, 0);
  EXPECT_EQ(count_of(o.text, "to join the running job"), 2) << o.text;
  EXPECT_NE(o.text.find("eras: 0:2 "), std::string::npos) << o.text;
}

// Below the minimum, the survivors wait; the replacement ronderun starts
// arrives within the timeout and the job goes on with three ranks.
TEST_F(Elastic, BelowTheMinimumAReplacementArrivesInTime) {
  const Outcome o = run(3, 3, "4 2 forward sleep 60", 15, "--restart-failed");
  expect_went_on(o, 3, 1);
  EXPECT_NE(o.text.find("starting a replacement for rank 2"), std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("eras: 0:3 4:3"), std::string::npos) << o.text;
}

TEST_F(Elastic, BelowTheMinimumFailsEverySurvivorClearly) {
  const Outcome o = run(3, 3, "4 2 forward", /*timeout=*/6);
  EXPECT_NE(o.rc, 0) << o.text;
  EXPECT_EQ(count_of(o.text, "fewer than the job's minimum of 3"), 2) << o.text;
  EXPECT_EQ(count_of(o.text, "finished at step"), 0) << o.text;
  expect_nothing_left();
}

}  // namespace
