// ronde::nn::SyncBatchNorm on 2 and 4 real ranks, each rank comparing with
// one torch::nn::BatchNorm2d over the global batch (worker_sync_bn.cpp),
// and convert_sync_batchnorm on a ResNet-style block.
#include "harness.h"

#include <gtest/gtest.h>

namespace {

using ronde::testing::JobResult;
using ronde::testing::run_job;
using ronde::testing::worker_spec;

class SyncBatchNormRanks : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormRanks, MatchesOneBatchNormOnTheGlobalBatch) {
  // Three steps: per-replica batches of 8, then a ragged last one.
  JobResult r = run_job(worker_spec({"sync_bn"}, GetParam()));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_NE(rank.output.find("SYNC_BN worst difference"), std::string::npos)
        << r.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SyncBatchNormRanks, ::testing::Values(2, 4));

TEST(SyncBatchNorm, ConvertKeepsEveryStateTensorAndRefusesMemberHeldOnes) {
  JobResult r = run_job(worker_spec({"convert_sync_bn"}, 2));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

}  // namespace
