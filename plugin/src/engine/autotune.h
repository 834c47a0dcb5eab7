// The bucket-size search of DistributedOptimizerOptions().autotune(): which
// sizes to try, how long each trial lasts, and which one wins. Pure
// arithmetic, unit tested apart from the engine. The engine feeds it one
// step time per step and, at each trial's end, makes every rank adopt rank
// 0's proposal (relayout.cpp), so ranks never split on local timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ronde::detail {

struct BucketSizes {
  double fusion_mb = 0;
  double first_mb = 0;
  bool operator==(const BucketSizes& o) const {
    return fusion_mb == o.fusion_mb && first_mb == o.first_mb;
  }
};

// The search, in three phases of trials, each trial `warmup` unmeasured
// steps then `steps` measured ones, scored by the median of the measured:
//  1. the bucket size on a log2 scale, from 0.5 MiB to the first power of
//     two that holds every gradient in one bucket (at most 10 sizes, the
//     largest kept), with the first bucket at `start.first_mb`;
//  2. the first bucket at 0.25 and 4 MiB (no larger than the bucket), with
//     the best bucket size of phase 1;
//  3. the best sizes so far (the finalist) against the starting sizes
//     (what the job runs without autotune), in four trials ordered start,
//     finalist, finalist, start: a drift of the machine's speed over the
//     search, or a change of level in the middle of it, falls on both
//     alike, where measuring one after the other would credit it to the
//     one measured later.
// At most 16 trials. The finalist wins only when its phase-3 steps,
// measured after it was picked (so not biased low by the picking), were
// faster than the starting sizes' phase-3 steps beyond noise: a one-sided
// Mann-Whitney U test (p below kAutotuneAlpha), a median at least
// kAutotuneMinGain lower, and a lower median in each half (the first
// start and finalist trials, and the last two). Otherwise the starting
// sizes stay; they stay at once, without phase 3, when they were the best
// of phases 1 and 2.
constexpr double kAutotuneAlpha = 0.05;
constexpr double kAutotuneMinGain = 0.01;

// The one-sided Mann-Whitney U test: the probability, were both samples
// from one distribution, of `a` being below `b` at least as often as it
// was (normal approximation, continuity-corrected; ties count half). 1
// when either is empty.
double p_lower(const std::vector<double>& a, const std::vector<double>& b);

class Autotuner {
 public:
  Autotuner(BucketSizes start, double total_mb, int warmup, int steps);

  // The sizes of the trial running now.
  const BucketSizes& current() const {
    return current_;
  }
  // Records the time of one step taken with current(). True when that step
  // ended a trial: call next() then (on every rank at the same step, since
  // trials have a fixed length).
  bool record(double seconds);
  // After a trial: the sizes to run next, or the winner once done().
  BucketSizes next();
  // Instead of next(), on the ranks that follow another's decision: makes
  // `sizes` the sizes running now, and `done` whether the search is over.
  void adopt(const BucketSizes& sizes, bool done);
  bool done() const {
    return done_;
  }
  // "bucket 25 MiB, first 1 MiB: 208.1 ms; ..." over every trial, in order.
  std::string summary() const;
  // The median of every measured step with `sizes` (0 if none).
  double score(const BucketSizes& sizes) const;
  size_t trials() const {
    return history_.size();
  }

 private:
  struct Trial {
    BucketSizes sizes;
    std::vector<double> seconds;
    int phase = 1;
  };
  // The sizes of the lowest score (the first of them on a tie; the first
  // trial's when none has a measured step).
  BucketSizes best() const;
  // The finalist, when it beat the starting sizes beyond noise in phase 3;
  // else those.
  BucketSizes decide();
  // Every measured step with `sizes` in phase `from` or later, in the
  // trials [first, last) of the history.
  std::vector<double> steps_of(
      const BucketSizes& sizes,
      int from = 1,
      size_t first = 0,
      size_t last = SIZE_MAX) const;
  void queue_phase2();
  void queue_phase3();

  const int warmup_;
  const int steps_;
  const BucketSizes start_;
  BucketSizes current_;
  std::vector<BucketSizes> queue_;  // trials still to run in this phase
  int phase_ = 1;
  int seen_ = 0;  // steps of the current trial so far
  std::vector<Trial> history_;
  bool done_ = false;
  std::string verdict_;   // why the choice won, once done
  BucketSizes finalist_;  // phase 3's challenger of the starting sizes
  size_t phase3_at_ = 0;  // the history index of phase 3's first trial
};

}  // namespace ronde::detail
