// The bucket-size search of DistributedOptimizerOptions().autotune(): which
// sizes to try, how long each trial lasts, and which one wins. Pure
// arithmetic, unit tested apart from the engine. The engine feeds it one
// step time per step and, at each trial's end, makes every rank adopt rank
// 0's proposal (relayout.cpp), so ranks never split on local timing.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
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
//  3. the two best sizes so far, measured once more, and the starting
//     sizes (what the job runs without autotune): each is scored by the
//     median of all its measured steps, so one noisy trial cannot decide.
// At most 15 trials. The phase-3 finalist with the lowest score wins only
// when its phase-3 steps, measured after it was picked (so not biased low
// by the picking), were faster than the starting sizes' beyond noise: a
// one-sided Mann-Whitney U test (p below kAutotuneAlpha) and a median at
// least kAutotuneMinGain lower. Otherwise the starting sizes stay.
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
  // The sizes of the lowest score among the trials `among` accepts (the
  // first of them on a tie); none when no such trial has a measured step.
  std::optional<BucketSizes> lowest(
      const std::function<bool(const Trial&)>& among) const;
  BucketSizes best() const;
  // The phase-3 finalist with the lowest score, when it beat the starting
  // sizes beyond noise; else those.
  BucketSizes decide();
  // Every measured step with `sizes` in phase `from` or later.
  std::vector<double> steps_of(const BucketSizes& sizes, int from = 1) const;
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
  std::string verdict_;  // why the choice won, once done
};

}  // namespace ronde::detail
