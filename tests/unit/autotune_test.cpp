// The bucket-size search (engine/autotune.h) on made-up step times.
#include "engine/autotune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <vector>

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
  EXPECT_LE(trials, 16);
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
  Autotuner t({25, 1}, 2, 1, 5);
  int step = 0;
  BucketSizes got = search(t, [&](const BucketSizes& s) {
    ++step;
    if (step % 6 == 1)
      return 100.0;  // warm-up
    if (s.fusion_mb == 1 && step == 9)
      return 50.0;
    return s.fusion_mb == 1 ? 1.0 : 2.0;
  });
  EXPECT_EQ(got.fusion_mb, 1);
}

TEST(Autotune, FollowersAdoptTheLeadersDecisions) {
  Autotuner leader({25, 1}, 8, 0, 4), follower({25, 1}, 8, 0, 4);
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

// Step times of one distribution for every size: the fastest median is
// noise, and the starting sizes must stay.
TEST(Autotune, NoiseAloneKeepsTheStartingSizes) {
  Autotuner t({25, 1}, 98, 1, 5);
  uint64_t x = 12345;
  BucketSizes got = search(t, [&](const BucketSizes&) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return 0.2 *
           (1.0 + 0.2 * static_cast<double>(x >> 11) / 9007199254740992.0);
  });
  EXPECT_EQ(got, (BucketSizes{25, 1})) << t.summary();
  // Another size had the lowest median: only the test kept the start.
  EXPECT_NE(t.summary().find("within noise"), std::string::npos) << t.summary();
}

// A size consistently faster, through noise as large as the difference,
// is taken; the same difference below the minimum gain is not.
TEST(Autotune, AGainBeyondNoiseIsTakenAndATinyOneIsNot) {
  for (double gain : {0.10, 0.005}) {
    Autotuner t({25, 1}, 98, 1, 5);
    uint64_t x = 777;
    BucketSizes got = search(t, [&](const BucketSizes& s) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double noise =
          0.1 * static_cast<double>(x >> 11) / 9007199254740992.0;
      return (s.fusion_mb == 8 ? 1.0 - gain : 1.0) + noise;
    });
    if (gain > 0.05)
      EXPECT_EQ(got.fusion_mb, 8) << t.summary();
    else
      EXPECT_EQ(got, (BucketSizes{25, 1})) << t.summary();
  }
}

// The machine slows down steadily while every size costs the same: the
// sizes measured last look slowest, which must not decide.
TEST(Autotune, DriftAloneKeepsTheStartingSizes) {
  Autotuner t({25, 1}, 98, 1, 5);
  int step = 0;
  BucketSizes got =
      search(t, [&](const BucketSizes&) { return 1.0 + 0.01 * ++step; });
  EXPECT_EQ(got, (BucketSizes{25, 1})) << t.summary();
}

// The machine changes level (here: becomes twice as fast) just after the
// first trial of the starting sizes in the last phase, whatever the size:
// the finalist's trials all come after it, but it did not win both halves.
TEST(Autotune, AChangeOfLevelKeepsTheStartingSizes) {
  Autotuner t({25, 1}, 98, 1, 5);
  const BucketSizes start{25, 1};
  bool start_seen = false, fast = false;
  BucketSizes got = search(t, [&](const BucketSizes& s) {
    if (s == start)
      start_seen = true;
    else if (start_seen)
      fast = true;
    return fast ? 1.0 : 2.0;
  });
  EXPECT_EQ(got, start) << t.summary();
  EXPECT_NE(t.summary().find("not faster in both halves"), std::string::npos)
      << t.summary();
}

TEST(Autotune, MannWhitneyTellsSeparatedFromMixedSamples) {
  using ronde::detail::p_lower;
  const std::vector<double> low = {1, 2, 3, 4, 5}, high = {6, 7, 8, 9, 10};
  EXPECT_LT(p_lower(low, high), 0.01);
  EXPECT_GT(p_lower(high, low), 0.99);
  const std::vector<double> odd = {1, 3, 5, 7, 9}, even = {2, 4, 6, 8, 10};
  EXPECT_GT(p_lower(odd, even), 0.2);
  EXPECT_EQ(p_lower({}, high), 1.0);
  // Equal samples: no evidence either way.
  EXPECT_GT(p_lower({1, 1, 1}, {1, 1, 1}), 0.5);
}

}  // namespace
