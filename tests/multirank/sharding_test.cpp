// Sharded optimizer state (ZeRO stages 1 and 2) across real processes:
// every element-wise optimizer and the variants (two param groups,
// gradient accumulation, an unused parameter, global-norm clipping, AMP
// with an overflow, a warmup schedule, stage 2, stage 2 with a layer used
// on alternate ranks, either stage with fp16 wires) equal the unsharded
// optimizer bit for bit over shared memory at 2, 3 and 4 ranks, and within
// rounding over Gloo; checkpoints move between sharded and unsharded jobs
// and from 4 ranks to 2.
#include "harness.h"

#include <gtest/gtest.h>

#include <tuple>

using ronde::testing::JobResult;
using ronde::testing::run_job;
using ronde::testing::worker_spec;

namespace {

using Case = std::tuple<int, std::string, std::string>;

class ShardedEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedEquivalence, EqualsUnshardedBitForBit) {
  auto [np, optimizer, variant] = GetParam();
  JobResult r = run_job(worker_spec({"zero", optimizer, variant}, np));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<1>(info.param) + "_" + std::get<2>(info.param) + "_np" +
         std::to_string(std::get<0>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers,
    ShardedEquivalence,
    ::testing::Combine(
        ::testing::Values(2, 3, 4),
        ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"),
        ::testing::Values("plain")),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Variants,
    ShardedEquivalence,
    ::testing::Combine(
        ::testing::Values(3),
        ::testing::Values("adam"),
        ::testing::Values(
            "groups",
            "bpps2",
            "unused",
            "clip",
            "amp",
            "warmup",
            "stage2",
            "zerocopy",
            "stage2_partial",
            "stage1_fp16",
            "stage2_fp16",
            "per_param",
            "stage2_per_param")),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Stage2,
    ShardedEquivalence,
    ::testing::Combine(
        ::testing::Values(2, 4),
        ::testing::Values("sgd_nesterov", "rmsprop"),
        ::testing::Values("stage2")),
    case_name);

TEST(Sharding, OverGlooWithinRounding) {
  auto spec = worker_spec({"zero", "adam", "clip"}, 3);
  spec.env["RONDE_SHM"] = "0";
  JobResult r = run_job(spec);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

// A bucket per parameter over Gloo: the gathers straight into the
// parameters go through Gloo's allgather with the input inside the output.
TEST(Sharding, PerParameterBucketsOverGlooWithinRounding) {
  auto spec = worker_spec({"zero", "sgd", "stage2_per_param"}, 2);
  spec.env["RONDE_SHM"] = "0";
  JobResult r = run_job(spec);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(Sharding, RefusesAnOptimizerNeedingWholeTensors) {
  JobResult r = run_job(worker_spec({"zero_refused"}, 2));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(Sharding, CheckpointsMoveBetweenShardedUnshardedAndRankCounts) {
  const std::string dir = ronde::testing::make_temp_dir();
  JobResult saved = run_job(worker_spec({"zero_ckpt", dir, "save"}, 4));
  ASSERT_TRUE(saved.all_succeeded()) << saved.dump();
  JobResult resumed = run_job(worker_spec({"zero_ckpt", dir, "resume"}, 2));
  EXPECT_TRUE(resumed.all_succeeded()) << resumed.dump();
  ronde::testing::remove_temp_dir(dir);
}

}  // namespace
