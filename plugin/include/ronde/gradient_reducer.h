// GradientReducer: ronde's gradient engine on its own, for training loops
// whose optimizer is not a torch::optim::Optimizer, with the options it
// shares with DistributedOptimizer (optimizer.h) and GradientSync, what step
// helpers need from either.
#pragma once

#include <ronde/collectives.h>
#include <ronde/schedule.h>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ronde {

namespace detail {
class GradientEngine;
}

// What travels on the wire: buckets of float32/float64 gradients can be cast
// to 16 bits for the all-reduce and back after it, halving the bytes at the
// cost of rounding (about 3 decimal digits for FP16, 2 for BF16).
enum class Compression { None, FP16, BF16 };

struct DistributedOptimizerOptions {
  // Bucket size in MiB: gradients are packed into buckets of about this size
  // and each bucket is all-reduced in one call. 0: RONDE_FUSION_THRESHOLD
  // (bytes, as Horovod's HOROVOD_FUSION_THRESHOLD), else the default chosen
  // from benchmarks/fusion_bench (see kDefaultFusionThresholdMb).
  TORCH_ARG(double, fusion_threshold_mb) = 0;
  // The first bucket is smaller so that communication starts early in
  // backward. 1 MiB, as c10d's Reducer.
  TORCH_ARG(double, first_bucket_mb) = 1;
  // Backward passes accumulated locally before one all-reduce; step() must
  // be called after exactly this many.
  TORCH_ARG(int64_t, backward_passes_per_step) = 1;
  // With backward_passes_per_step > 1: divide the accumulated gradient by
  // that count too, so a step sees the mean over every micro-batch of every
  // rank (what one process would compute on the global batch).
  TORCH_ARG(bool, average_aggregated_gradients) = true;
  // Average (the mean gradient, the default) or Sum over ranks.
  TORCH_ARG(ReduceOp, op) = ReduceOp::Average;
  // Divide by this before the all-reduce and multiply after it, to keep
  // low-precision sums in range. 1: no effect.
  TORCH_ARG(double, gradient_predivide_factor) = 1.0;
  // Make each parameter's .grad a view into its bucket, so packing costs no
  // copy. Off: gradients are copied into and out of the buckets.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  // Multiply every param group's LR at construction by the number of
  // replicas x backward_passes_per_step (Linear) or its square root (Sqrt).
  // The base LR is remembered: wrapping the same optimizer again, or
  // loading state through this object, never compounds the scaling.
  TORCH_ARG(LrScaling, lr_scaling) = LrScaling::None;
  TORCH_ARG(Compression, compression) = Compression::None;
  // Rebuild the buckets once, at the end of the first step, in the order
  // the gradients became ready during it (rank 0's order, on every rank),
  // as c10d's Reducer does after its first iteration: the first bucket then
  // holds the first gradients backward produces, whatever order the model
  // registered its parameters in.
  TORCH_ARG(bool, rebuild_buckets) = true;
  // Tune fusion_threshold_mb and first_bucket_mb on the running job: from
  // the second step, trials of autotune_warmup_steps unmeasured and
  // autotune_steps_per_trial measured steps each try bucket sizes on a log2
  // scale, then first-bucket sizes, then the two best and the starting
  // sizes again (at most 15 trials; the starting sizes stay unless
  // something was faster); rank 0 scores each by its median step time and
  // every rank switches to rank 0's choice at the same step. One log line
  // gives the choice and its figures; bucket_sizing() reads it and
  // checkpoints keep it. RONDE_AUTOTUNE=1|0, when set, overrides this.
  TORCH_ARG(bool, autotune) = false;
  TORCH_ARG(int64_t, autotune_warmup_steps) = 1;
  TORCH_ARG(int64_t, autotune_steps_per_trial) = 5;
  // The clock autotune times steps with, in seconds; null: a steady clock.
  // For tests, which inject one.
  TORCH_ARG(std::function<double()>, autotune_clock) = nullptr;
  // The ranks that train this model together: gradients are averaged over
  // this set (its size also sets the LR scaling). Default: the whole job.
  // Two sets can train two models at once; a rank outside the set cannot
  // construct the optimizer for it.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
  // While ranks are in ronde::join() (uneven inputs), an average divides
  // the gradient sum by the ranks that contributed (the default: the step
  // equals one process over the samples actually seen, each rank's batch
  // weighing alike), or with this option by the set's size, as DDP's
  // divide_by_initial_world_size: g = (1/N) * sum over active ranks of g_r.
  // Without joined ranks both are the mean over the set.
  TORCH_ARG(bool, divide_by_set_size) = false;
};

// The bucket sizes the engine uses now: the options', or autotune's choice
// once `autotuned`.
struct BucketSizing {
  double fusion_threshold_mb = 0;
  double first_bucket_mb = 0;
  bool autotuned = false;
};

// The default bucket size, from benchmarks/fusion_bench on 2 CPU ranks (see
// benchmarks/README.md for the measurement).
constexpr double kDefaultFusionThresholdMb = 25;

// What the last step did, for progress lines and tests.
struct StepProfile {
  // Gradient hooks that had fired when each bucket was launched, in launch
  // order: a value below `hooks` means the bucket went out while backward
  // was still producing gradients.
  std::vector<int64_t> hooks_before_launch;
  int64_t hooks = 0;
  // Seconds step() spent waiting for all-reduces after backward.
  double wait_seconds = 0;
};

// Throws unless every parameter in `param_groups` that requires a gradient
// is one of `parameters` (compared by identity): a parameter the optimizer
// steps but nobody averages would let the replicas drift apart silently.
// DistributedOptimizer checks this itself; GradientReducer users (the
// Python bindings) call it with their optimizer's groups.
void check_param_groups_covered(
    const std::vector<torch::Tensor>& parameters,
    const std::vector<std::vector<torch::Tensor>>& param_groups);

// What GradScaler and WarmupScheduler need from a distributed optimizer,
// found through this interface rather than through the optimizer's concrete
// type: DistributedOptimizer implements it.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Waits for the all-reduces and writes the averaged gradients into .grad.
  virtual void synchronize() = 0;
  // Ends the step without an update, still completing its all-reduces.
  virtual void skip_step() = 0;
  // The tensors that hold this step's averaged gradients after
  // synchronize().
  virtual std::vector<torch::Tensor> gradient_buffers() const = 0;
  // The factor lr_scaling applied to the base LRs (1 without scaling).
  virtual double lr_scale_factor() const = 0;
};

// The GradientSync behind `optimizer` (a DistributedOptimizer), or null.
GradientSync* gradient_sync_of(torch::optim::Optimizer& optimizer);

// The gradient engine of DistributedOptimizer, without an optimizer: a hook
// on each parameter's gradient accumulator, fused buckets all-reduced
// asynchronously during backward, the used-mask, compression and local
// accumulation over backward_passes_per_step. For training loops whose
// optimizer is not a torch::optim::Optimizer (the Python bindings drive a
// torch.optim.Optimizer with it). A step is: backward pass(es), then
// synchronize(), then the optimizer's update, then finish_step().
class GradientReducer {
 public:
  // Parameters with requires_grad=false are left out. Checks across ranks
  // that every rank has the same parameters; registers the hooks, released
  // when this object is destroyed.
  GradientReducer(
      const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
      const DistributedOptimizerOptions& options = {});
  GradientReducer(
      const std::vector<std::string>& names,
      const std::vector<torch::Tensor>& parameters,
      const DistributedOptimizerOptions& options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Launches the buckets not yet launched, waits for every all-reduce and
  // writes the averaged gradients into .grad. Does nothing if this step is
  // already synchronised.
  void synchronize();
  // Whether synchronize() ran since the last finish_step().
  bool synchronized() const;
  // Ends the step: the next backward pass starts a new one.
  void finish_step();
  // synchronize() then finish_step(): a step whose update is skipped (a
  // GradScaler overflow) still completes its all-reduces on every rank.
  void skip_step();
  // The closure an optimizer's step() may evaluate (LBFGS); may return an
  // undefined tensor.
  using Closure = std::function<torch::Tensor()>;
  // One whole step: synchronize() (or, with synchronize=false, the check
  // that it already ran), then `update` (the optimizer's own step, called
  // with the closure to evaluate, or null), then finish_step(). With a
  // closure, `update` gets one that synchronises each evaluation and
  // returns its loss averaged over ranks, so that line searches decide
  // alike on every rank; that needs backward_passes_per_step = 1.
  torch::Tensor step(
      const std::function<torch::Tensor(Closure)>& update,
      Closure closure = nullptr,
      bool synchronize = true);
  // The tensors holding this step's averaged gradients after synchronize():
  // the bucket buffers when gradients are bucket views, else the gradients.
  std::vector<torch::Tensor> gradient_buffers() const;
  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> buckets() const;
  StepProfile last_step_profile() const;
  // The bucket sizes in use (see BucketSizing).
  BucketSizing bucket_sizing() const;
  // Lays the buckets out with `sizing` (between steps; every rank alike):
  // how a restored checkpoint brings back autotune's choice. An autotuned
  // sizing ends any search still running.
  void set_bucket_sizing(const BucketSizing& sizing);
  const DistributedOptimizerOptions& options() const;
  // The names of the parameters it reduces (requires_grad only), in the
  // order given.
  const std::vector<std::string>& names() const;

 private:
  std::shared_ptr<detail::GradientEngine> engine_;
};

}  // namespace ronde
