// The bucket-size search (engine/autotune.h) on made-up step times.
#include "engine/autotune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

namespace {

using ronde::detail::Autotuner;
using ronde::detail::BucketSizes;

// Runs a search to its end, each step costing cost(sizes); returns the
// choice and counts the trials.
BucketSizes search(
    Autotuner& t,
    const std::function<double(const BucketSizes&)>& cost,
    int* trials = nullptr) {
  int n = 1;
  for (int step = 0; step < 1000 && !t.done(); ++step) {
    if (t.record(cost(t.current()))) {
      t.next();
      n += t.done() ? 0 : 1;
    }
  }
  if (trials)
    *trials = n;
  return t.current();
}

TEST(Autotune, FindsTheFastestSizeWithinTheTrialBudget) {
  // ResNet-50's gradients (about 98 MiB), fastest at 32 MiB and first 4.
  Autotuner t({25, 1}, 98, 1, 5);
  int trials = 0;
  BucketSizes got = search(
      t,
      [](const BucketSizes& s) {
        return 0.2 + 0.01 * std::abs(std::log2(s.fusion_mb / 32)) +
            0.001 * std::abs(std::log2(s.first_mb / 4));
      },
      &trials);
  EXPECT_TRUE(t.done());
  EXPECT_EQ(got.fusion_mb, 32);
  EXPECT_EQ(got.first_mb, 4);
  EXPECT_LE(trials, 15);
  EXPECT_EQ(trials, static_cast<int>(t.trials()));
  EXPECT_NE(t.summary().find("bucket 32 MiB, first 4 MiB"), std::string::npos)
      << t.summary();
}

TEST(Autotune, SizesStopAtOneBucketForEverything) {
  // 3 MiB in all: the grid is 0.5, 1, 2, 4 MiB, nothing larger (25 MiB is
  // the starting size, measured in the last phase).
  Autotuner t({25, 1}, 3, 0, 1);
  std::set<double> tried;
  search(t, [&](const BucketSizes& s) {
    tried.insert(s.fusion_mb);
    return 1.0;
  });
  EXPECT_EQ(tried, (std::set<double>{0.5, 1, 2, 4, 25}));
}

TEST(Autotune, KeepsTheStartingSizesUnlessSomethingWasFaster) {
  // Everything on the grid is slower than the sizes the job started with.
  Autotuner t({25, 1}, 98, 0, 2);
  BucketSizes got = search(t, [](const BucketSizes& s) {
    return s.fusion_mb == 25 && s.first_mb == 1 ? 1.0 : 2.0;
  });
  EXPECT_EQ(got.fusion_mb, 25);
  EXPECT_EQ(got.first_mb, 1);
}

TEST(Autotune, WarmupStepsAreNotScoredAndMediansResistOutliers) {
  // Each trial's first step (its warm-up) is slow; one step of the 1 MiB
  // trial is an outlier that a mean would let decide.
  Autotuner t({25, 1}, 2, 1, 3);
  int step = 0;
  BucketSizes got = search(t, [&](const BucketSizes& s) {
    ++step;
    if (step % 4 == 1)
      return 100.0;  // warm-up
    if (s.fusion_mb == 1 && step == 7)
      return 50.0;
    return s.fusion_mb == 1 ? 1.0 : 2.0;
  });
  EXPECT_EQ(got.fusion_mb, 1);
}

TEST(Autotune, FollowersAdoptTheLeadersDecisions) {
  Autotuner leader({25, 1}, 8, 0, 2), follower({25, 1}, 8, 0, 2);
  for (int step = 0; step < 200 && !leader.done(); ++step) {
    // Opposite local timings: the follower's own would choose otherwise.
    bool a = leader.record(leader.current().fusion_mb);
    bool b = follower.record(1.0 / follower.current().fusion_mb);
    ASSERT_EQ(a, b) << "trials must end at the same step everywhere";
    if (a) {
      BucketSizes next = leader.next();
      follower.adopt(next, leader.done());
    }
    ASSERT_EQ(leader.current(), follower.current());
  }
  EXPECT_TRUE(follower.done());
  EXPECT_EQ(follower.current().fusion_mb, 0.5);
}

}  // namespace
