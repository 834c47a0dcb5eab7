// GradientReducer, the engine's public face without an optimizer, and the
// checks and lookups shared with DistributedOptimizer.
#include <ronde/gradient_reducer.h>

#include "engine/blobs.h"
#include "engine/gradient_engine.h"

#include <ronde/runtime.h>

#include <torch/serialize/archive.h>

#include <unordered_set>

namespace ronde {

GradientSync* gradient_sync_of(torch::optim::Optimizer& optimizer) {
  // A cross-cast to the interface: the step helpers never learn which
  // optimizer implements it.
  return dynamic_cast<GradientSync*>(&optimizer);
}

void check_param_groups_covered(
    const std::vector<torch::Tensor>& parameters,
    const std::vector<std::vector<torch::Tensor>>& param_groups) {
  std::unordered_set<const void*> known;
  for (const auto& p : parameters) {
    if (p.requires_grad())
      known.insert(p.unsafeGetTensorImpl());
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    for (const auto& p : param_groups[g]) {
      TORCH_CHECK(
          !p.requires_grad() || known.count(p.unsafeGetTensorImpl()),
          "ronde: rank ",
          ronde::rank(),
          ": the wrapped optimizer's param group ",
          g,
          " holds a parameter ",
          p.scalar_type(),
          p.sizes(),
          " that is not among named_parameters; its gradient would "
          "never be averaged");
    }
  }
}

namespace detail {

std::shared_ptr<GradientEngine> make_engine(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& parameters,
    const DistributedOptimizerOptions& options) {
  TORCH_CHECK(
      names.size() == parameters.size(),
      "ronde: GradientReducer got ",
      names.size(),
      " names for ",
      parameters.size(),
      " parameters");
  std::vector<std::string> kept_names;
  std::vector<at::Tensor> kept;
  for (size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK(
        parameters[i].defined(),
        "ronde: parameter '",
        names[i],
        "' is an undefined tensor");
    if (!parameters[i].requires_grad())
      continue;
    kept_names.push_back(names[i]);
    kept.push_back(parameters[i]);
  }
  return GradientEngine::create(
      std::move(kept_names), std::move(kept), options);
}

}  // namespace detail

GradientReducer::GradientReducer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : GradientReducer(
          named_parameters.keys(), named_parameters.values(), options) {}

GradientReducer::GradientReducer(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& parameters,
    const DistributedOptimizerOptions& options)
    : engine_(detail::make_engine(names, parameters, options)) {}

GradientReducer::~GradientReducer() = default;

void GradientReducer::synchronize() {
  engine_->synchronize();
}

bool GradientReducer::synchronized() const {
  return engine_->synchronized();
}

void GradientReducer::finish_step() {
  engine_->finish_step();
}

void GradientReducer::skip_step() {
  engine_->skip_step();
}

void GradientReducer::adapt_to_world() {
  engine_->adapt_to_world();
}

torch::Tensor GradientReducer::step(
    const std::function<torch::Tensor(Closure)>& update,
    Closure closure,
    bool synchronize) {
  return engine_->step(update, std::move(closure), synchronize);
}

std::vector<torch::Tensor> GradientReducer::gradient_buffers() const {
  return engine_->gradient_buffers();
}

std::vector<std::vector<std::string>> GradientReducer::buckets() const {
  return engine_->bucket_names();
}

StepProfile GradientReducer::last_step_profile() const {
  return engine_->last_profile();
}

BucketSizing GradientReducer::bucket_sizing() const {
  return engine_->bucket_sizing();
}

void GradientReducer::set_bucket_sizing(const BucketSizing& sizing) {
  engine_->set_bucket_sizing(sizing);
}

const DistributedOptimizerOptions& GradientReducer::options() const {
  return engine_->options();
}

const std::shared_ptr<CommHook>& GradientReducer::comm_hook() const {
  return engine_->comm_hook();
}

std::string GradientReducer::comm_hook_state() const {
  if (!engine_->comm_hook()->stateful())
    return "";
  torch::serialize::OutputArchive out;
  engine_->save_hook_state(out);
  return detail::bytes_of(out);
}

void GradientReducer::load_comm_hook_state(const std::string& bytes) {
  torch::serialize::InputArchive in;
  if (!bytes.empty())
    detail::load_bytes(in, bytes);
  engine_->load_hook_state(in);
}

std::vector<GradientReducer::Shard> GradientReducer::shards() const {
  const auto pieces = engine_->shard_pieces();
  const auto tensors = engine_->shard_tensors();
  const auto params = engine_->parameters();
  std::vector<Shard> out;
  for (size_t k = 0; k < pieces.size(); ++k) {
    out.push_back(
        {params[pieces[k].param],
         pieces[k].param_offset,
         pieces[k].numel,
         tensors[k]});
  }
  return out;
}

bool GradientReducer::shards_changed() {
  return engine_->take_shards_changed();
}

double GradientReducer::gradient_norm(double norm_type) {
  return engine_->gradient_norm(norm_type);
}

const std::vector<std::string>& GradientReducer::names() const {
  return engine_->names();
}

}  // namespace ronde
