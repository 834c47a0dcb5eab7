#include "engine/autotune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ronde::detail {
namespace {

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

double p_lower(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || b.empty())
    return 1.0;
  double u = 0;  // pairs in which a's step was the faster
  for (double x : a) {
    for (double y : b)
      u += x < y ? 1.0 : x == y ? 0.5 : 0.0;
  }
  const double n1 = static_cast<double>(a.size());
  const double n2 = static_cast<double>(b.size());
  const double mean = n1 * n2 / 2;
  const double sd = std::sqrt(n1 * n2 * (n1 + n2 + 1) / 12);
  const double z = (u - mean - 0.5) / sd;
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

Autotuner::Autotuner(BucketSizes start, double total_mb, int warmup, int steps)
    : warmup_(std::max(warmup, 0)), steps_(std::max(steps, 1)), start_(start) {
  std::vector<double> sizes;
  double mb = 0.5;
  for (;; mb *= 2) {
    sizes.push_back(mb);
    if (mb >= total_mb)
      break;
  }
  if (sizes.size() > 10)
    sizes.erase(sizes.begin(), sizes.end() - 10);
  for (double s : sizes)
    queue_.push_back({s, start.first_mb});
  current_ = queue_.front();
  queue_.erase(queue_.begin());
  history_.push_back({current_, {}});
}

bool Autotuner::record(double seconds) {
  if (done_)
    return false;
  ++seen_;
  if (seen_ > warmup_)
    history_.back().seconds.push_back(seconds);
  if (seen_ < warmup_ + steps_)
    return false;
  seen_ = 0;
  return true;
}

std::vector<double> Autotuner::steps_of(
    const BucketSizes& sizes, int from, size_t first, size_t last) const {
  std::vector<double> all;
  for (size_t i = first; i < history_.size() && i < last; ++i) {
    const Trial& t = history_[i];
    if (t.sizes == sizes && t.phase >= from)
      all.insert(all.end(), t.seconds.begin(), t.seconds.end());
  }
  return all;
}

double Autotuner::score(const BucketSizes& sizes) const {
  return median(steps_of(sizes));
}

BucketSizes Autotuner::decide() {
  if (finalist_ == start_) {
    verdict_ = "the starting sizes measured best";
    return start_;
  }
  // Only phase 3's steps: after the pick, start and finalist alternating.
  const BucketSizes& b = finalist_;
  const std::vector<double> win = steps_of(b, 3), base = steps_of(start_, 3);
  const size_t mid = phase3_at_ + 2;  // start, finalist | finalist, start
  const bool each_half =
      median(steps_of(b, 3, phase3_at_, mid)) <
          median(steps_of(start_, 3, phase3_at_, mid)) &&
      median(steps_of(b, 3, mid)) < median(steps_of(start_, 3, mid));
  const double p = p_lower(win, base);
  const double win_ms = median(win) * 1e3, base_ms = median(base) * 1e3;
  // (p is 1 when either has no step.)
  const bool beyond_noise = p < kAutotuneAlpha &&
                            1.0 - win_ms / base_ms >= kAutotuneMinGain &&
                            each_half;
  char line[240];
  std::snprintf(
      line,
      sizeof(line),
      "bucket %g MiB, first %g MiB: %.1f ms after the pick, against the "
      "starting sizes' %.1f ms in the same trials (p = %.2g%s): %s",
      b.fusion_mb,
      b.first_mb,
      win_ms,
      base_ms,
      p,
      each_half ? "" : ", not faster in both halves",
      beyond_noise ? "taken" : "within noise, the starting sizes stay");
  verdict_ = line;
  return beyond_noise ? b : start_;
}

BucketSizes Autotuner::best() const {
  BucketSizes winner = history_.front().sizes;
  double low = -1;
  for (const Trial& t : history_) {
    const double s = score(t.sizes);
    if (s > 0 && (low < 0 || s < low)) {
      low = s;
      winner = t.sizes;
    }
  }
  return winner;
}

void Autotuner::queue_phase2() {
  const BucketSizes b = best();
  for (double first : {0.25, 4.0}) {
    if (first != b.first_mb && first <= b.fusion_mb)
      queue_.push_back({b.fusion_mb, first});
  }
}

void Autotuner::queue_phase3() {
  // The best of phases 1 and 2 against the starting sizes, ABBA.
  finalist_ = best();
  if (!(finalist_ == start_))
    queue_ = {start_, finalist_, finalist_, start_};
}

BucketSizes Autotuner::next() {
  if (done_)
    return current_;
  while (queue_.empty() && phase_ < 4) {
    ++phase_;
    if (phase_ == 2) {
      queue_phase2();
    } else if (phase_ == 3) {
      queue_phase3();
      phase3_at_ = history_.size();
    }
  }
  if (queue_.empty()) {
    done_ = true;
    current_ = decide();
    return current_;
  }
  current_ = queue_.front();
  queue_.erase(queue_.begin());
  history_.push_back({current_, {}, phase_});
  return current_;
}

void Autotuner::adopt(const BucketSizes& sizes, bool done) {
  current_ = sizes;
  done_ = done;
  seen_ = 0;
  if (!done)
    history_.push_back({sizes, {}});
}

std::string Autotuner::summary() const {
  std::string out;
  char line[96];
  for (const Trial& t : history_) {
    if (t.seconds.empty())
      continue;
    std::snprintf(
        line,
        sizeof(line),
        "%sbucket %g MiB, first %g MiB: %.1f ms",
        out.empty() ? "" : "; ",
        t.sizes.fusion_mb,
        t.sizes.first_mb,
        median(t.seconds) * 1e3);
    out += line;
  }
  if (!verdict_.empty())
    out += "; " + verdict_;
  return out;
}

}  // namespace ronde::detail
