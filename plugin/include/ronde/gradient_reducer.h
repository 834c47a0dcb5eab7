// GradientReducer: ronde's gradient engine on its own, for training loops
// whose optimizer is not a torch::optim::Optimizer, and GradientSync, what
// step helpers need from it or DistributedOptimizer (optimizer.h). Their
// options are in optimizer_options.h.
#pragma once

#include <ronde/collectives.h>
#include <ronde/optimizer_options.h>

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

// The bucket sizes the engine uses now: the options', or autotune's choice
// once `autotuned`.
struct BucketSizing {
  double fusion_threshold_mb = 0;
  double first_bucket_mb = 0;
  bool autotuned = false;
};

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
  // Whether any rank found an overflow, given this rank's verdict over its
  // gradient_buffers(): ranks that each hold only their shard agree here.
  virtual bool found_anywhere(bool found_here) {
    return found_here;
  }
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
  // After an elastic change of world, a collective of the new world:
  // forgets the step in flight (its all-reduces failed with the old world)
  // and takes rank 0's bucket layout, so that a joining rank matches.
  void adapt_to_world();
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
  // The hook that reduces the buckets (see DistributedOptimizer), and this
  // rank's state of it as bytes (LibTorch's archive format; empty for a
  // hook without state) and back: what Python's state_dict() keeps.
  const std::shared_ptr<CommHook>& comm_hook() const;
  std::string comm_hook_state() const;
  void load_comm_hook_state(const std::string& bytes);

  // Sharded (shard_optimizer_state or shard_gradients; docs/sharding.md):
  // this rank's pieces of the parameters. `tensor` is what an optimizer
  // steps: a flat view of elements [offset, offset + numel) of `param`,
  // whose .grad synchronize() points at the averaged range; step() then
  // all-gathers the updated ranges into the parameters. The pieces change
  // when the buckets are laid out again, which shards_changed() reports
  // once (the optimizer's state must then follow them).
  struct Shard {
    torch::Tensor param;
    int64_t offset = 0;
    int64_t numel = 0;
    torch::Tensor tensor;
  };
  std::vector<Shard> shards() const;
  bool shards_changed();
  // The global norm of the averaged gradients (see
  // DistributedOptimizer::clip_grad_norm), synchronising first.
  double gradient_norm(double norm_type);
  // The names of the parameters it reduces (requires_grad only), in the
  // order given.
  const std::vector<std::string>& names() const;

 private:
  std::shared_ptr<detail::GradientEngine> engine_;
};

}  // namespace ronde
