// DistributedOptimizer: the wrapped optimizer's param groups seen through
// this object, LR scaling with the number of replicas, and the gradient
// engine (engine/) that averages gradients before each step.
#include <ronde/optimizer.h>

#include "engine/gradient_engine.h"

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <torch/serialize.h>

namespace ronde {
namespace detail {
namespace {

// Param-group options that forward the learning rate to the wrapped
// optimizer's group, looked up on every call: LibTorch's LR schedulers act
// on whichever object they are given and both see one value. (Looked up by
// index, since the wrapped optimizer's load() replaces its options objects.)
class ForwardingOptions : public torch::optim::OptimizerOptions {
 public:
  // group < 0 forwards to the wrapped optimizer's defaults.
  ForwardingOptions(torch::optim::Optimizer* target, int group)
      : target_(target), group_(group) {}
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<ForwardingOptions>(target_, group_);
  }
  double get_lr() const override {
    return resolve().get_lr();
  }
  void set_lr(const double lr) override {
    resolve().set_lr(lr);
  }

 private:
  torch::optim::OptimizerOptions& resolve() const {
    if (group_ < 0)
      return target_->defaults();
    TORCH_CHECK(
        static_cast<size_t>(group_) < target_->param_groups().size(),
        "ronde: the wrapped optimizer lost param group ",
        group_);
    return target_->param_groups()[group_].options();
  }
  torch::optim::Optimizer* target_;  // owned by the DistributedOptimizer
  int group_;
};

std::vector<torch::optim::OptimizerParamGroup> forwarding_groups(
    torch::optim::Optimizer& wrapped) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < wrapped.param_groups().size(); ++g) {
    groups.emplace_back(
        wrapped.param_groups()[g].params(),
        std::make_unique<ForwardingOptions>(&wrapped, static_cast<int>(g)));
  }
  return groups;
}

// Multiplies (or, with 1/factor, divides) every group's LR.
void scale_lrs(torch::optim::Optimizer& opt, double factor) {
  for (auto& g : opt.param_groups())
    g.options().set_lr(g.options().get_lr() * factor);
}

}  // namespace
}  // namespace detail

DistributedOptimizer::DistributedOptimizer(
    std::shared_ptr<torch::optim::Optimizer> optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : torch::optim::Optimizer(
          detail::forwarding_groups(*optimizer),
          std::make_unique<detail::ForwardingOptions>(optimizer.get(), -1)),
      optimizer_(std::move(optimizer)),
      options_(options) {
  TORCH_CHECK(
      optimizer_ != nullptr,
      "ronde: DistributedOptimizer needs an optimizer to wrap");
  // Optimizer's constructor merges group options with the defaults and may
  // keep a copy of the defaults instead: point each group at its twin again.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(std::make_unique<detail::ForwardingOptions>(
        optimizer_.get(), static_cast<int>(g)));
  }
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& group : optimizer_->param_groups()) {
    groups.push_back(group.params());
  }
  check_param_groups_covered(named_parameters.values(), groups);
  engine_ = detail::make_engine(
      named_parameters.keys(), named_parameters.values(), options_);
  lr_scale_factor_ = ronde::lr_scale_factor(
      options_.lr_scaling(),
      options_.process_set().size(),
      options_.backward_passes_per_step());
  // The base LRs live here, with the optimizer that scaled them: the
  // wrapped optimizer holds them times the factor while this object lives
  // and is divided back when it goes (see the destructor), so that wrapping
  // it again starts from the base, never compounding.
  for (auto& g : optimizer_->param_groups())
    base_lrs_.push_back(g.options().get_lr());
  detail::scale_lrs(*optimizer_, lr_scale_factor_);
}

DistributedOptimizer::~DistributedOptimizer() {
  // Undoes the scaling, keeping whatever a schedule did to the LRs since.
  if (lr_scale_factor_ != 1.0)
    detail::scale_lrs(*optimizer_, 1.0 / lr_scale_factor_);
}

void DistributedOptimizer::synchronize() {
  engine_->synchronize();
}

void DistributedOptimizer::skip_step() {
  engine_->skip_step();
}

std::vector<torch::Tensor> DistributedOptimizer::gradient_buffers() const {
  return engine_->gradient_buffers();
}

torch::Tensor DistributedOptimizer::step(LossClosure closure) {
  return engine_->step(
      [this](LossClosure c) { return optimizer_->step(std::move(c)); },
      std::move(closure),
      /*synchronize=*/true);
}

void DistributedOptimizer::zero_grad(bool set_to_none) {
  optimizer_->zero_grad(set_to_none);
}

void DistributedOptimizer::adapt_to_world() {
  engine_->adapt_to_world();
  const double factor = ronde::lr_scale_factor(
      options_.lr_scaling(),
      options_.process_set().size(),
      options_.backward_passes_per_step());
  if (factor != lr_scale_factor_)
    detail::scale_lrs(*optimizer_, factor / lr_scale_factor_);
  lr_scale_factor_ = factor;
}

void DistributedOptimizer::save(
    torch::serialize::OutputArchive& archive) const {
  optimizer_->save(archive);
  archive.write("ronde_base_lrs", at::tensor(base_lrs_, at::kDouble));
  archive.write(
      "ronde_lr_scale_factor", at::tensor({lr_scale_factor_}, at::kDouble));
  const BucketSizing b = engine_->bucket_sizing();
  archive.write(
      "ronde_bucket_sizing",
      at::tensor(
          std::vector<double>{
              b.fusion_threshold_mb, b.first_bucket_mb, b.autotuned ? 1.0 : 0.0},
          at::kDouble));
}

void DistributedOptimizer::load(torch::serialize::InputArchive& archive) {
  // The saved LRs are already scaled: they are restored as they are, and the
  // saved base LRs are what the destructor's division leads back to.
  optimizer_->load(archive);
  at::Tensor base;
  if (archive.try_read("ronde_base_lrs", base) &&
      base.numel() == static_cast<int64_t>(base_lrs_.size())) {
    for (size_t g = 0; g < base_lrs_.size(); ++g)
      base_lrs_[g] = base[g].item<double>();
  }
  // The LRs were saved scaled for the saving job's world.
  at::Tensor saved_factor;
  if (archive.try_read("ronde_lr_scale_factor", saved_factor) &&
      saved_factor.numel() == 1) {
    const double then = saved_factor.item<double>();
    if (then > 0 && then != lr_scale_factor_)
      detail::scale_lrs(*optimizer_, lr_scale_factor_ / then);
  }
  // Autotune's choice comes back; sizes that were only the options' stay
  // the options' (which may have changed since).
  at::Tensor sizing;
  if (archive.try_read("ronde_bucket_sizing", sizing) && sizing.numel() == 3 &&
      sizing[2].item<double>() != 0) {
    engine_->set_bucket_sizing(BucketSizing{
        sizing[0].item<double>(), sizing[1].item<double>(), true});
  }
}

std::vector<std::vector<std::string>> DistributedOptimizer::buckets() const {
  return engine_->bucket_names();
}

StepProfile DistributedOptimizer::last_step_profile() const {
  return engine_->last_profile();
}

BucketSizing DistributedOptimizer::bucket_sizing() const {
  return engine_->bucket_sizing();
}

}  // namespace ronde
