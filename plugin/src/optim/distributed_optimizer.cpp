// DistributedOptimizer: the wrapped optimizer's param groups seen through
// this object, LR scaling with the number of replicas, and the gradient
// engine (engine/) that averages gradients before each step.
#include <ronde/optimizer.h>

#include "engine/blobs.h"
#include "engine/gradient_engine.h"
#include "optim/shard_state.h"

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <map>
#include <optional>

namespace ronde {
namespace detail {

struct ShardedOptimizerState {
  FullGroups groups;  // the user's, of full parameters
  ShardSpots spots;   // where the wrapped optimizer's shards sit
  // consolidate_state_dict()'s result, on its rank, until the next step.
  std::optional<FullState> consolidated;
};

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
  const bool sharded =
      options_.shard_optimizer_state() || options_.shard_gradients();
  if (sharded)
    detail::check_elementwise(*optimizer_);
  engine_ = detail::make_engine(
      named_parameters.keys(), named_parameters.values(), options_);
  if (sharded) {
    shard_ = std::make_shared<detail::ShardedOptimizerState>();
    shard_->groups = groups;
    // State the optimizer already has (a step taken before wrapping, a
    // load) is sliced like a saved one.
    std::optional<detail::FullState> existing;
    if (!optimizer_->state().empty()) {
      torch::serialize::OutputArchive out;
      optimizer_->save(out);
      torch::serialize::InputArchive in;
      detail::reopen(out, in);
      existing = detail::read_full(in, *optimizer_, shard_->groups);
    }
    engine_->take_shards_changed();
    point_groups_at_shards();
    optimizer_->state().clear();
    if (existing)
      detail::load_slices(
          *optimizer_, *existing, shard_->spots, shard_->groups);
  }
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
  // The wrapped optimizer gets its full groups back; its state, being that
  // of this rank's shards only, goes (a destructor cannot gather it).
  if (shard_) {
    for (size_t g = 0; g < shard_->groups.size(); ++g)
      optimizer_->param_groups()[g].params() = shard_->groups[g];
    optimizer_->state().clear();
  }
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
  if (shard_)
    shard_->consolidated.reset();
  torch::Tensor out = engine_->step(
      [this](LossClosure c) { return optimizer_->step(std::move(c)); },
      std::move(closure),
      /*synchronize=*/true);
  if (shard_)
    follow_shards();
  return out;
}

void DistributedOptimizer::zero_grad(bool set_to_none) {
  optimizer_->zero_grad(set_to_none);
  if (!shard_)
    return;
  for (const auto& group : shard_->groups) {
    for (const auto& p : group) {
      at::Tensor& grad = const_cast<at::Tensor&>(p).mutable_grad();
      if (!grad.defined())
        continue;
      grad = grad.detach();
      if (set_to_none)
        grad.reset();
      else
        grad.zero_();
    }
  }
}

bool DistributedOptimizer::sharded() const {
  return shard_ != nullptr;
}

// The wrapped optimizer's groups hold this rank's shards: for each group,
// the pieces of its parameters, in the engine's piece order.
void DistributedOptimizer::point_groups_at_shards() {
  const auto pieces = engine_->shard_pieces();
  const auto shards = engine_->shard_tensors();
  const auto params = engine_->parameters();
  std::map<const void*, std::pair<int64_t, int64_t>> where;
  for (size_t g = 0; g < shard_->groups.size(); ++g) {
    for (size_t j = 0; j < shard_->groups[g].size(); ++j) {
      where[shard_->groups[g][j].unsafeGetTensorImpl()] = {
          static_cast<int64_t>(g), static_cast<int64_t>(j)};
    }
  }
  std::vector<std::vector<torch::Tensor>> lists(shard_->groups.size());
  shard_->spots.assign(shard_->groups.size(), {});
  for (size_t k = 0; k < pieces.size(); ++k) {
    auto it = where.find(params[pieces[k].param].unsafeGetTensorImpl());
    TORCH_INTERNAL_ASSERT(it != where.end());
    const auto [g, j] = it->second;
    lists[g].push_back(shards[k]);
    shard_->spots[g].push_back({g, j, pieces[k].param_offset, pieces[k].numel});
  }
  for (size_t g = 0; g < lists.size(); ++g)
    optimizer_->param_groups()[g].params() = std::move(lists[g]);
}

// After the buckets were laid out again (the first step's rebuild, an
// autotune trial), ownership moved: the state goes through its full form
// into the new shards.
void DistributedOptimizer::follow_shards() {
  if (!engine_->take_shards_changed())
    return;
  const ProcessSet& set = options_.process_set();
  const auto blobs = detail::exchange_blobs(
      detail::shard_blob(*optimizer_, shard_->spots), set, -1);
  detail::FullState full = detail::assemble(blobs, shard_->groups);
  point_groups_at_shards();
  detail::load_slices(*optimizer_, full, shard_->spots, shard_->groups);
}

void DistributedOptimizer::consolidate_state_dict(int to) {
  const bool hook_state = engine_->comm_hook()->stateful();
  TORCH_CHECK(
      shard_ || hook_state,
      "ronde: consolidate_state_dict() on an optimizer that neither shards "
      "nor has a communication hook with state (rank ",
      ronde::rank(),
      ")");
  const ProcessSet& set = options_.process_set();
  TORCH_CHECK(
      to >= 0 && to < set.size(),
      "ronde: consolidate_state_dict(",
      to,
      ") on rank ",
      ronde::rank(),
      ": the set has ",
      set.size(),
      " ranks");
  if (hook_state)
    engine_->consolidate_hook_state(to);
  if (!shard_)
    return;
  auto blobs = detail::exchange_blobs(
      detail::shard_blob(*optimizer_, shard_->spots), set, to);
  if (set.rank() == to)
    shard_->consolidated = detail::assemble(blobs, shard_->groups);
}

const std::shared_ptr<CommHook>& DistributedOptimizer::comm_hook() const {
  return engine_->comm_hook();
}

int64_t DistributedOptimizer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer_->state()) {
    torch::serialize::OutputArchive out;
    state->serialize(out);
    torch::serialize::InputArchive in;
    detail::reopen(out, in);
    for (const std::string& name : in.keys()) {
      c10::IValue v;
      in.read(name, v);
      if (v.isTensor())
        bytes += static_cast<int64_t>(v.toTensor().nbytes());
    }
  }
  return bytes;
}

double DistributedOptimizer::clip_grad_norm(double max_norm, double norm_type) {
  TORCH_CHECK(
      max_norm >= 0 && norm_type > 0,
      "ronde: clip_grad_norm needs max_norm >= 0 and norm_type > 0, got ",
      max_norm,
      " and ",
      norm_type,
      " (rank ",
      ronde::rank(),
      ")");
  const double norm = engine_->gradient_norm(norm_type);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    if (shard_) {
      for (const auto& t : engine_->shard_tensors()) {
        if (t.grad().defined())
          grads.push_back(t.grad());
      }
    } else {
      for (const auto& p : engine_->parameters()) {
        if (p.grad().defined())
          grads.push_back(p.grad());
      }
    }
    if (!grads.empty())
      at::_foreach_mul_(grads, at::Scalar(coef));
  }
  return norm;
}

bool DistributedOptimizer::found_anywhere(bool found_here) {
  const ProcessSet& set = options_.process_set();
  if (!shard_ || set.size() == 1)
    return found_here;
  at::Tensor flag = at::tensor({found_here ? 1.0f : 0.0f});
  ronde::allreduce_(
      flag,
      AllreduceOptions()
          .op(ReduceOp::Max)
          .name("ronde.amp.found_inf")
          .process_set(set));
  return flag.item<float>() > 0;
}

double clip_grad_norm_(
    DistributedOptimizer& optimizer, double max_norm, double norm_type) {
  return optimizer.clip_grad_norm(max_norm, norm_type);
}

void DistributedOptimizer::adapt_to_world() {
  TORCH_CHECK(
      !shard_,
      "ronde: a sharded optimizer cannot follow a change of world: the lost "
      "ranks' shards of its state are gone with them (rank ",
      ronde::rank(),
      ")");
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
  if (shard_) {
    std::optional<detail::FullState> local;
    const detail::FullState* full = nullptr;
    if (shard_->consolidated) {
      full = &*shard_->consolidated;
    } else if (options_.process_set().size() == 1) {
      local = detail::assemble(
          {detail::shard_blob(*optimizer_, shard_->spots)}, shard_->groups);
      full = &*local;
    }
    TORCH_CHECK(
        full,
        "ronde: save() of a sharded DistributedOptimizer on rank ",
        ronde::rank(),
        " needs consolidate_state_dict(",
        options_.process_set().rank(),
        ") on every rank of its set first (a Checkpointer does this)");
    detail::write_full(archive, *full, *optimizer_, shard_->groups);
  } else {
    optimizer_->save(archive);
  }
  archive.write("ronde_base_lrs", at::tensor(base_lrs_, at::kDouble));
  archive.write(
      "ronde_lr_scale_factor", at::tensor({lr_scale_factor_}, at::kDouble));
  const BucketSizing b = engine_->bucket_sizing();
  archive.write(
      "ronde_bucket_sizing",
      at::tensor(
          std::vector<double>{
              b.fusion_threshold_mb,
              b.first_bucket_mb,
              b.autotuned ? 1.0 : 0.0},
          at::kDouble));
  engine_->save_hook_state(archive);
}

void DistributedOptimizer::load(torch::serialize::InputArchive& archive) {
  // The saved LRs are already scaled: they are restored as they are, and the
  // saved base LRs are what the destructor's division leads back to.
  if (shard_) {
    const detail::FullState full =
        detail::read_full(archive, *optimizer_, shard_->groups);
    detail::load_slices(*optimizer_, full, shard_->spots, shard_->groups);
  } else {
    optimizer_->load(archive);
  }
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
    engine_->set_bucket_sizing(
        BucketSizing{sizing[0].item<double>(), sizing[1].item<double>(), true});
  }
  engine_->load_hook_state(archive);
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
