// LR scaling, the warmup-then-decay schedule, and global-batch arithmetic.
// schedule_factor is a closed form of the step, so a restored scheduler
// continues exactly where it stopped.
#include <ronde/schedule.h>

#include <ronde/gradient_reducer.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace ronde {

double lr_scale_factor(
    LrScaling scaling, int64_t replicas, int64_t backward_passes_per_step) {
  TORCH_CHECK(replicas >= 1, "ronde: replicas must be >= 1, got ", replicas);
  TORCH_CHECK(
      backward_passes_per_step >= 1,
      "ronde: backward_passes_per_step must be >= 1, got ",
      backward_passes_per_step);
  const double n = static_cast<double>(replicas * backward_passes_per_step);
  switch (scaling) {
    case LrScaling::None:
      return 1.0;
    case LrScaling::Linear:
      return n;
    case LrScaling::Sqrt:
      return std::sqrt(n);
  }
  return 1.0;
}

double scale_lr(
    double base_lr, LrScaling scaling, int64_t backward_passes_per_step) {
  const int64_t replicas = is_initialized() ? size() : 1;
  return base_lr * lr_scale_factor(scaling, replicas, backward_passes_per_step);
}

Decay Decay::step(int64_t step_size, double gamma) {
  TORCH_CHECK(
      step_size >= 1,
      "ronde: Decay::step needs step_size >= 1, got ",
      step_size);
  Decay d;
  d.shape = DecayShape::Step;
  d.step_size = step_size;
  d.gamma = gamma;
  return d;
}

Decay Decay::multi_step(std::vector<int64_t> milestones, double gamma) {
  TORCH_CHECK(
      std::is_sorted(milestones.begin(), milestones.end()),
      "ronde: Decay::multi_step milestones must be increasing");
  Decay d;
  d.shape = DecayShape::MultiStep;
  d.milestones = std::move(milestones);
  d.gamma = gamma;
  return d;
}

Decay Decay::cosine(int64_t total_steps, double floor_factor) {
  TORCH_CHECK(total_steps >= 1, "ronde: Decay::cosine needs total_steps >= 1");
  Decay d;
  d.shape = DecayShape::Cosine;
  d.total_steps = total_steps;
  d.floor_factor = floor_factor;
  return d;
}

Decay Decay::polynomial(
    int64_t total_steps, double power, double floor_factor) {
  TORCH_CHECK(
      total_steps >= 1, "ronde: Decay::polynomial needs total_steps >= 1");
  Decay d;
  d.shape = DecayShape::Polynomial;
  d.total_steps = total_steps;
  d.power = power;
  d.floor_factor = floor_factor;
  return d;
}

double schedule_factor(const WarmupOptions& o, double k, int64_t t) {
  TORCH_CHECK(t >= 0, "ronde: schedule step must be >= 0, got ", t);
  TORCH_CHECK(k > 0, "ronde: warmup multiplier must be positive, got ", k);
  const int64_t T = o.warmup_steps();
  if (t < T) {
    const double frac = static_cast<double>(t) / T;
    switch (o.shape()) {
      case WarmupShape::Linear:
        return (1.0 + (k - 1.0) * frac) / k;
      case WarmupShape::Exponential:
        return std::pow(k, frac - 1.0);
      case WarmupShape::Constant:
        return 1.0 / k;
    }
  }
  const Decay& d = o.then();
  const int64_t s = t - T;
  switch (d.shape) {
    case DecayShape::Constant:
      return 1.0;
    case DecayShape::Step:
      return std::pow(d.gamma, static_cast<double>(s / d.step_size));
    case DecayShape::MultiStep: {
      auto passed =
          std::upper_bound(d.milestones.begin(), d.milestones.end(), s) -
          d.milestones.begin();
      return std::pow(d.gamma, static_cast<double>(passed));
    }
    case DecayShape::Cosine: {
      const double x = std::min<double>(s, d.total_steps) / d.total_steps;
      return d.floor_factor +
             (1.0 - d.floor_factor) * 0.5 * (1.0 + std::cos(M_PI * x));
    }
    case DecayShape::Polynomial: {
      const double x = std::min<double>(s, d.total_steps) / d.total_steps;
      return d.floor_factor +
             (1.0 - d.floor_factor) * std::pow(1.0 - x, d.power);
    }
  }
  return 1.0;
}

WarmupScheduler::WarmupScheduler(
    torch::optim::Optimizer& optimizer, WarmupOptions options)
    : optimizer_(optimizer), options_(std::move(options)) {
  TORCH_CHECK(
      options_.warmup_steps() >= 0,
      "ronde: warmup_steps must be >= 0, got ",
      options_.warmup_steps());
  TORCH_CHECK(
      options_.multiplier() >= 0,
      "ronde: warmup multiplier must be >= 0, got ",
      options_.multiplier());
  multiplier_ = options_.multiplier();
  if (multiplier_ == 0) {
    const GradientSync* d = gradient_sync_of(optimizer_);
    multiplier_ = d != nullptr ? d->lr_scale_factor() : 1.0;
  }
  for (auto& g : optimizer_.param_groups()) {
    peak_lrs_.push_back(g.options().get_lr());
  }
  apply();
}

void WarmupScheduler::step() {
  ++step_;
  apply();
}

void WarmupScheduler::apply() {
  const double f = schedule_factor(options_, multiplier_, step_);
  auto& groups = optimizer_.param_groups();
  TORCH_CHECK(
      groups.size() == peak_lrs_.size(),
      "ronde: the optimizer has ",
      groups.size(),
      " param groups, the scheduler was made for ",
      peak_lrs_.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].options().set_lr(peak_lrs_[i] * f);
  }
}

std::vector<double> WarmupScheduler::current_lrs() const {
  std::vector<double> out;
  for (const auto& g : optimizer_.param_groups())
    out.push_back(g.options().get_lr());
  return out;
}

void WarmupScheduler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("ronde_warmup_step", at::tensor({step_}, at::kLong));
  archive.write(
      "ronde_warmup_multiplier", at::tensor({multiplier_}, at::kDouble));
  archive.write(
      "ronde_warmup_peak_lrs",
      at::tensor(peak_lrs_, at::TensorOptions().dtype(at::kDouble)));
  const GradientSync* d = gradient_sync_of(optimizer_);
  archive.write(
      "ronde_warmup_lr_factor",
      at::tensor({d != nullptr ? d->lr_scale_factor() : 1.0}, at::kDouble));
}

void WarmupScheduler::load(torch::serialize::InputArchive& archive) {
  at::Tensor step, mult, peaks;
  archive.read("ronde_warmup_step", step);
  archive.read("ronde_warmup_multiplier", mult);
  archive.read("ronde_warmup_peak_lrs", peaks);
  TORCH_CHECK(
      peaks.numel() == static_cast<int64_t>(peak_lrs_.size()),
      "ronde: saved scheduler has ",
      peaks.numel(),
      " param groups, this optimizer has ",
      peak_lrs_.size());
  step_ = step.item<int64_t>();
  multiplier_ = mult.item<double>();
  for (size_t i = 0; i < peak_lrs_.size(); ++i) {
    peak_lrs_[i] = peaks[i].item<double>();
  }
  // Saved by a job of another size (or before a change of world): the peak
  // follows the LR factor of this job, the step stays.
  at::Tensor then;
  const GradientSync* d = gradient_sync_of(optimizer_);
  if (d != nullptr && archive.try_read("ronde_warmup_lr_factor", then) &&
      then.numel() == 1 && then.item<double>() > 0 &&
      then.item<double>() != d->lr_scale_factor()) {
    const double ratio = d->lr_scale_factor() / then.item<double>();
    for (double& peak : peak_lrs_)
      peak *= ratio;
    if (options_.multiplier() == 0)
      multiplier_ = d->lr_scale_factor();
  }
  apply();
}

GlobalBatch GlobalBatch::per_replica(
    int64_t batch, int64_t backward_passes_per_step) {
  TORCH_CHECK(batch >= 1, "ronde: per-replica batch must be >= 1, got ", batch);
  TORCH_CHECK(
      backward_passes_per_step >= 1,
      "ronde: backward_passes_per_step must be >= 1, got ",
      backward_passes_per_step);
  return GlobalBatch(
      batch, is_initialized() ? size() : 1, backward_passes_per_step);
}

GlobalBatch GlobalBatch::global(
    int64_t batch, int64_t backward_passes_per_step) {
  TORCH_CHECK(
      backward_passes_per_step >= 1,
      "ronde: backward_passes_per_step must be >= 1, got ",
      backward_passes_per_step);
  const int64_t replicas = is_initialized() ? size() : 1;
  const int64_t parts = replicas * backward_passes_per_step;
  TORCH_CHECK(
      batch >= parts && batch % parts == 0,
      "ronde: global batch ",
      batch,
      " does not divide into ",
      replicas,
      " replicas x ",
      backward_passes_per_step,
      " backward passes per step; choose the per-replica batch and "
      "derive the global batch from it (GlobalBatch::per_replica)");
  return GlobalBatch(batch / parts, replicas, backward_passes_per_step);
}

}  // namespace ronde
