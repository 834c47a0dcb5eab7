// Learning-rate scaling with the number of replicas, warmup-then-decay
// schedules, and global-batch arithmetic: what training guides tell every
// team to do by hand.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <vector>

namespace ronde {

enum class LrScaling {
  None,    // keep the base LR
  Linear,  // x replicas x backward passes per step (Goyal et al. 2017)
  Sqrt,  // x sqrt(replicas x backward passes per step), for adaptive optimizers
};

// The factor a base LR is multiplied by for `replicas` ranks each
// accumulating `backward_passes_per_step` micro-batches per step.
double lr_scale_factor(
    LrScaling scaling, int64_t replicas, int64_t backward_passes_per_step = 1);
// base_lr x that factor, with replicas = ronde::size() (1 before init()).
double scale_lr(
    double base_lr, LrScaling scaling, int64_t backward_passes_per_step = 1);

enum class WarmupShape {
  Linear,       // eta (1 + (k-1) t/T): Goyal et al.'s gradual warmup
  Exponential,  // eta k^(t/T)
  Constant,     // eta until T, then k eta
};

enum class DecayShape { Constant, Step, MultiStep, Cosine, Polynomial };

// What follows the warmup; `t` counts steps since the warmup ended.
struct Decay {
  DecayShape shape = DecayShape::Constant;
  int64_t step_size = 1;            // Step: multiply by gamma every step_size
  double gamma = 0.1;               // Step, MultiStep
  std::vector<int64_t> milestones;  // MultiStep: steps (after warmup)
  int64_t total_steps = 1;          // Cosine, Polynomial: length of the decay
  double floor_factor = 0;          // Cosine, Polynomial: end LR / peak LR
  double power = 1;                 // Polynomial

  static Decay constant() {
    return Decay();
  }
  static Decay step(int64_t step_size, double gamma);
  static Decay multi_step(std::vector<int64_t> milestones, double gamma);
  static Decay cosine(int64_t total_steps, double floor_factor = 0);
  static Decay polynomial(
      int64_t total_steps, double power = 1, double floor_factor = 0);
};

struct WarmupOptions {
  // Steps from the base LR to the peak (scaled) LR. 0: start at the peak.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(WarmupShape, shape) = WarmupShape::Linear;
  // peak LR / base LR (the k above). 0: read it from a DistributedOptimizer's
  // lr_scaling (its scale factor), else 1.
  TORCH_ARG(double, multiplier) = 0;
  TORCH_ARG(Decay, then) = Decay::constant();
};

// The LR factor (relative to the peak LR) at step t; a pure function.
double schedule_factor(
    const WarmupOptions& options, double multiplier, int64_t t);

// Sets every param group's LR from its peak LR (the LR the group has when
// the scheduler is made, typically already scaled), keeping the ratios
// between groups. Works on any torch::optim::Optimizer, wrapped or not.
// step() advances one optimizer step; construction applies step 0.
class WarmupScheduler {
 public:
  WarmupScheduler(torch::optim::Optimizer& optimizer, WarmupOptions options);
  void step();
  int64_t step_count() const {
    return step_;
  }
  // The LRs the groups have now.
  std::vector<double> current_lrs() const;
  const std::vector<double>& peak_lrs() const {
    return peak_lrs_;
  }
  double multiplier() const {
    return multiplier_;
  }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;  // must outlive the scheduler
  WarmupOptions options_;
  double multiplier_;
  std::vector<double> peak_lrs_;
  int64_t step_ = 0;
};

// Global batch = per-replica batch x replicas x backward passes per step.
// Always derived from the per-replica batch, never the other way round.
class GlobalBatch {
 public:
  static GlobalBatch per_replica(
      int64_t batch, int64_t backward_passes_per_step = 1);
  // Fails, naming both numbers, when `batch` does not divide evenly.
  static GlobalBatch global(
      int64_t batch, int64_t backward_passes_per_step = 1);

  int64_t per_replica_batch() const {
    return per_replica_;
  }
  int64_t global_batch() const {
    return per_replica_ * replicas_ * passes_;
  }
  int64_t replicas() const {
    return replicas_;
  }
  int64_t backward_passes_per_step() const {
    return passes_;
  }

 private:
  GlobalBatch(int64_t per_replica, int64_t replicas, int64_t passes)
      : per_replica_(per_replica), replicas_(replicas), passes_(passes) {}
  int64_t per_replica_;
  int64_t replicas_;
  int64_t passes_;
};

}  // namespace ronde
