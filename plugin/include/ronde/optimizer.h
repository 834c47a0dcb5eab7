// DistributedOptimizer: wraps any torch::optim::Optimizer so that each step
// uses gradients averaged over all ranks. Gradients are packed into fused
// buckets that are all-reduced while backward is still running.
#pragma once

#include <ronde/gradient_reducer.h>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>
#include <vector>

namespace ronde {

namespace detail {
struct ShardedOptimizerState;
}

// A user-written optimizer whose update of each element reads only that
// element's gradient, parameter and state, as SGD's and Adam's do: deriving
// from this (beside torch::optim::Optimizer) lets shard_optimizer_state
// split its parameters into flat ranges. Its save()/load() must use
// LibTorch's format (torch::optim::serialize), as the built-in ones do.
class ElementwiseOptimizer {
 public:
  virtual ~ElementwiseOptimizer() = default;
};

class DistributedOptimizer : public torch::optim::Optimizer,
                             public GradientSync {
 public:
  // `named_parameters` are the model's (model->named_parameters()); those
  // with requires_grad=false are left out. Checks across ranks that every
  // rank has the same parameters. Registers a hook on each gradient
  // accumulator, released when this object is destroyed.
  DistributedOptimizer(
      std::shared_ptr<torch::optim::Optimizer> optimizer,
      const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
      const DistributedOptimizerOptions& options = {});
  ~DistributedOptimizer() override;

  // Waits for every bucket's all-reduce, then steps the wrapped optimizer.
  // With a closure (LBFGS), every evaluation of it is synchronised and its
  // loss averaged over ranks, so every rank takes the same decisions.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Waits for the all-reduces and writes the averaged gradients into .grad:
  // call it to touch gradients before step() (clipping, unscaling); step()
  // then does not reduce again.
  void synchronize() override;
  // As the wrapped optimizer's (sharded, the parameters' own .grad too).
  // zero_grad(false) keeps gradients as bucket
  // views (no copy in the next backward); the default (set_to_none) makes
  // the next backward copy each gradient into its bucket once.
  void zero_grad(bool set_to_none = true);
  // Ends the step without updating the parameters (what GradScaler does
  // after an overflow): still completes this step's all-reduces, so every
  // rank stays in step.
  void skip_step() override;
  // The tensors holding this step's averaged gradients after synchronize():
  // the bucket buffers when gradients are bucket views, else the gradients.
  std::vector<torch::Tensor> gradient_buffers() const override;
  // The factor lr_scaling applied to the base LRs (1 without scaling).
  double lr_scale_factor() const override {
    return lr_scale_factor_;
  }
  // The LRs of the wrapped optimizer's groups before lr_scaling: what a
  // checkpoint saves, so that wrapping again after a restore does not scale
  // twice.
  const std::vector<double>& base_lrs() const {
    return base_lrs_;
  }

  // save() records the LR factor in force; load() rescales the LRs it
  // restores when this job's factor differs (a checkpoint of N ranks
  // loaded into a job of M, with lr_scaling).
  //
  // Sharded (shard_optimizer_state), save() writes the same consolidated
  // format as an unsharded optimizer, so either kind loads it, at any rank
  // count: on a job of several ranks it needs consolidate_state_dict(r) on
  // every rank first and then runs on rank r (the Checkpointer does both).
  // load() takes this rank's slices of a consolidated state.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // Sharded: gathers every rank's shards of the optimizer state to rank
  // `to` (numbered within the process set), for its save(). Every rank of
  // the set calls it; it holds until the next step. As PyTorch's
  // ZeroRedundancyOptimizer.consolidate_state_dict. With a communication
  // hook that keeps state (PowerSGD's error buffers, one per rank), it
  // gathers every rank's too, and save() on `to` writes them all; load()
  // takes this rank's (or, from a job of another size, starts the hook's
  // state afresh). Without it, save() writes this rank's own.
  void consolidate_state_dict(int to = 0);
  // The hook that reduces the buckets (options().comm_hook(), or the one
  // compression or the default chose): its byte counters say what went on
  // the wire.
  const std::shared_ptr<CommHook>& comm_hook() const;
  // Whether this optimizer shards its state (ZeRO stage 1 or 2).
  bool sharded() const;
  // The wrapped optimizer's state entries in bytes (tensors only): what
  // sharding divides by the set's size.
  int64_t optimizer_state_bytes() const;
  // Clips the averaged gradients (waiting for them first) so that their
  // global norm is at most max_norm, as torch::nn::utils::clip_grad_norm_
  // over every parameter; sharded, the norm is summed over the ranks'
  // shards. Returns the norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // GradientSync: sharded, whether an overflow was found on any rank.
  bool found_anywhere(bool found_here) override;
  // After a change of world (elastic::State calls it; a collective of the
  // new world): drops the step in flight, whose all-reduces died with the
  // old world, takes rank 0's bucket layout, and recomputes the LR factor
  // for the new size, rescaling the wrapped optimizer's LRs.
  void adapt_to_world();

  const std::shared_ptr<torch::optim::Optimizer>& wrapped() const {
    return optimizer_;
  }
  const DistributedOptimizerOptions& options() const {
    return options_;
  }
  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> buckets() const;
  StepProfile last_step_profile() const;
  // The bucket sizes in use; save() keeps them and load() restores an
  // autotuned choice (see GradientReducer::set_bucket_sizing()).
  BucketSizing bucket_sizing() const;

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  DistributedOptimizerOptions options_;
  std::shared_ptr<detail::GradientEngine> engine_;
  double lr_scale_factor_ = 1.0;
  std::vector<double> base_lrs_;
  // Sharded: the user's full groups, where each shard sits, a
  // consolidated state (optim/shard_state.h); null unsharded.
  std::shared_ptr<detail::ShardedOptimizerState> shard_;
  void point_groups_at_shards();
  void follow_shards();
};

// torch::nn::utils::clip_grad_norm_ for a DistributedOptimizer's averaged
// gradients, sharded or not (see DistributedOptimizer::clip_grad_norm).
double clip_grad_norm_(
    DistributedOptimizer& optimizer, double max_norm, double norm_type = 2.0);

// Copies root_rank's values into every rank's tensors (parameters, buffers),
// in place, fused into one broadcast per dtype. Names must agree across ranks.
// With a process set: among its ranks, root_rank numbered within the set.
void broadcast_parameters(
    const torch::OrderedDict<std::string, torch::Tensor>& named_tensors,
    int root_rank,
    const ProcessSet& process_set = {});

// Makes every rank's optimizer state (and param-group options) root_rank's,
// through the optimizer's own serialisation: works for any optimizer that
// implements save()/load(). A process set as for broadcast_parameters().
void broadcast_optimizer_state(
    torch::optim::Optimizer& optimizer,
    int root_rank,
    const ProcessSet& process_set = {});

}  // namespace ronde
