// DistributedOptimizer across real processes: every optimizer, and the
// variants (gradient accumulation, an unused parameter, two param groups, a
// LibTorch LR scheduler, copies instead of views, copies by whole-bucket
// concatenation and split, many small buckets, buckets all-reduced in
// place in shared memory), each equal to one process training on the
// whole global batch.
#include "harness.h"

#include <gtest/gtest.h>

#include <tuple>

using ronde::testing::JobResult;
using ronde::testing::JobSpec;
using ronde::testing::run_job;
using ronde::testing::worker_path;

namespace {

JobResult run_optim(
    int np, const std::string& optimizer, const std::string& variant) {
  return run_job(
      ronde::testing::worker_spec({"optim", optimizer, variant}, np));
}

using Case = std::tuple<int, std::string, std::string>;

class OptimizerEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerEquivalence, MatchesSingleProcessTraining) {
  auto [np, optimizer, variant] = GetParam();
  JobResult r = run_optim(np, optimizer, variant);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<1>(info.param) + "_" + std::get<2>(info.param) + "_np" +
         std::to_string(std::get<0>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers,
    OptimizerEquivalence,
    ::testing::Combine(
        ::testing::Values(2, 4),
        ::testing::Values(
            "sgd",
            "sgd_nesterov",
            "adam",
            "adamw",
            "rmsprop",
            "adagrad",
            "lbfgs",
            "custom"),
        ::testing::Values("plain")),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Variants,
    OptimizerEquivalence,
    ::testing::Combine(
        ::testing::Values(2, 4),
        ::testing::Values("sgd", "adam"),
        ::testing::Values(
            "bpps2",
            "unused",
            "groups",
            "steplr",
            "copy",
            "copywhole",
            "smallbuckets",
            "keepgrad",
            "reload",
            "zerocopy")),
    case_name);

TEST(DistributedOptimizer, ErrorsReachEveryRank) {
  JobResult r = run_job(ronde::testing::worker_spec({"optim_errors"}, 2));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(DistributedOptimizer, BucketsLaunchDuringBackwardAndHooksAreReleased) {
  JobResult r = run_job(ronde::testing::worker_spec({"optim_overlap"}, 2));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

// Buckets rebuilt from the first step's ready order: equal training, an
// earlier first launch; off, the layout stays.
TEST(DistributedOptimizer, BucketsRebuiltFromObservedOrder) {
  for (int np : {2, 4}) {
    for (const char* opt : {"sgd", "adam"}) {
      JobResult r =
          run_job(ronde::testing::worker_spec({"rebuild", opt, "on"}, np));
      EXPECT_TRUE(r.all_succeeded()) << r.dump();
    }
  }
  JobResult off =
      run_job(ronde::testing::worker_spec({"rebuild", "sgd", "off"}, 2));
  EXPECT_TRUE(off.all_succeeded()) << off.dump();
}

// Autotune ends on rank 0's choice on every rank, whatever their own
// clocks say, and checkpoints keep it.
TEST(DistributedOptimizer, AutotuneAgreesOnRankZerosChoice) {
  for (int np : {2, 3}) {
    JobResult r = run_job(ronde::testing::worker_spec({"autotune"}, np));
    EXPECT_TRUE(r.all_succeeded()) << r.dump();
    EXPECT_NE(
        r.ranks[0].output.find("ronde: autotune chose bucket"),
        std::string::npos)
        << r.dump();
  }
}

// Two halves of the job train two models at once, each over its own
// process set, each equal to one process over its half's data.
TEST(DistributedOptimizer, TwoModelsOnTwoProcessSets) {
  for (int np : {2, 3, 4}) {
    JobResult r = run_job(ronde::testing::worker_spec({"two_models"}, np));
    EXPECT_TRUE(r.all_succeeded()) << "np " << np << "\n" << r.dump();
  }
}

// Uneven inputs (10, 7, 3 and 5 batches): the last rank to join ends where
// one process trained on the same batches ends, under each averaging rule,
// with gradient accumulation, on a process set, and through an overflow.
TEST(Join, UnevenInputsMatchOneProcess) {
  const std::vector<std::pair<int, std::string>> cases = {
      {2, "contrib"},
      {3, "contrib"},
      {4, "contrib"},
      {3, "setsize"},
      {3, "bpps2"},
      {3, "set"},
      {3, "amp"}};
  for (const auto& [np, variant] : cases) {
    JobResult r = run_job(ronde::testing::worker_spec({"join", variant}, np));
    EXPECT_TRUE(r.all_succeeded()) << "np " << np << " " << variant << "\n"
                                   << r.dump();
  }
}

TEST(Join, KilledRankFailsTheJoinedWithCommError) {
  JobSpec s = ronde::testing::worker_spec({"join_killed"}, 3);
  s.env["RONDE_TIMEOUT_SECONDS"] = "20";
  s.timeout = std::chrono::seconds(60);
  JobResult r = run_job(s);
  ASSERT_FALSE(r.timed_out) << r.dump();
  for (const auto& rank : r.ranks) {
    if (rank.rank == 2)
      continue;
    EXPECT_EQ(rank.exit_code, 3) << r.dump();
    EXPECT_NE(rank.output.find("COMM_ERROR: ronde: join"), std::string::npos)
        << r.dump();
  }
  EXPECT_LT(r.seconds, 40.0) << r.dump();
}

class TrainingAids
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// GradScaler overflow on one rank, compression error bounds, LR scaling
// without compounding, sampler shards.
TEST_P(TrainingAids, HoldOnEveryRank) {
  auto [scenario, np] = GetParam();
  JobResult r = run_job(ronde::testing::worker_spec({scenario}, np));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios,
    TrainingAids,
    ::testing::Combine(
        ::testing::Values(
            "amp_overflow", "compression", "lr_scaling", "sampler"),
        ::testing::Values(2, 4)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
      return std::get<0>(info.param) + "_np" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
