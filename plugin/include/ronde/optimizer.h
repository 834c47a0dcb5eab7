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
  // As the wrapped optimizer's. zero_grad(false) keeps gradients as bucket
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
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
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
};

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
