// SyncBatchNorm: the statistics of the global batch through one allgather
// forward and one allreduce backward, in a custom autograd function.
#include <ronde/collectives.h>
#include <ronde/runtime.h>
#include <ronde/sync_batch_norm.h>

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>

#include <atomic>
#include <ostream>

namespace ronde {
namespace nn {
namespace {

std::atomic<int64_t> g_next_name{0};

// The set a saved id names (backward: saved data holds no ProcessSet); the
// global set is 0.
ProcessSet set_of(int64_t id) {
  if (id == 0)
    return global_process_set();
  for (const ProcessSet& s : process_sets()) {
    if (s.id() == id)
      return s;
  }
  TORCH_CHECK(
      false,
      "ronde: SyncBatchNorm: process set ",
      id,
      " is not registered (made with add_process_set()?), or was removed "
      "between forward and backward");
}

struct SyncBatchNormFunction
    : public torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& input,
      const torch::Tensor& weight,
      const torch::Tensor& bias,
      torch::Tensor running_mean,
      torch::Tensor running_var,
      double eps,
      double momentum,
      const ProcessSet& set,
      const std::string& name) {
    const int64_t channels = input.size(1);
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < input.dim(); ++d)
      dims.push_back(d);
    std::vector<int64_t> shape(input.dim(), 1);
    shape[1] = channels;
    const bool wide =
        input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble;
    const torch::Tensor x = wide ? input : input.to(at::kFloat);
    const int64_t count = channels > 0 ? input.numel() / channels : 0;
    torch::Tensor mean, var;
    if (count > 0) {
      std::tie(var, mean) = at::var_mean(x, dims, /*correction=*/0);
    } else {
      mean = var = at::zeros({channels}, x.options());
    }
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    torch::Tensor mine = at::cat(
        {at::full({1}, static_cast<double>(count), f64),
         mean.to(at::kCPU, at::kDouble),
         var.to(at::kCPU, at::kDouble) * static_cast<double>(count)});
    torch::Tensor every = allgather(
        mine.unsqueeze(0),
        CollectiveOptions().name(name + ".stats").process_set(set));
    torch::Tensor counts = every.narrow(1, 0, 1);
    const double total = counts.sum().item<double>();
    TORCH_CHECK(
        total > 0,
        "ronde: SyncBatchNorm '",
        name,
        "': no rank has a row in this batch");
    torch::Tensor means = every.narrow(1, 1, channels);
    torch::Tensor m2s = every.narrow(1, 1 + channels, channels);
    torch::Tensor g_mean = (counts * means).sum(0) / total;
    torch::Tensor g_m2 = (m2s + counts * (means - g_mean).pow(2)).sum(0);
    torch::Tensor g_var = g_m2 / total;
    if (running_mean.defined()) {
      torch::NoGradGuard no_grad;
      const double unbiased_div = std::max(total - 1.0, 1.0);
      running_mean.mul_(1 - momentum)
          .add_(g_mean.to(running_mean.options()), momentum);
      running_var.mul_(1 - momentum)
          .add_((g_m2 / unbiased_div).to(running_var.options()), momentum);
    }
    torch::Tensor invstd = (g_var + eps).rsqrt().to(x.options());
    torch::Tensor xhat =
        (x - g_mean.to(x.options()).view(shape)) * invstd.view(shape);
    torch::Tensor y = xhat;
    if (weight.defined())
      y = y * weight.to(x.options()).view(shape);
    if (bias.defined())
      y = y + bias.to(x.options()).view(shape);
    ctx->save_for_backward({xhat, weight, invstd});
    ctx->saved_data["total"] = total;
    ctx->saved_data["set"] = static_cast<int64_t>(set.id());
    ctx->saved_data["name"] = name;
    ctx->saved_data["bias"] = bias.defined();
    ctx->saved_data["shape"] = shape;
    ctx->saved_data["dims"] = dims;
    return y.to(input.scalar_type());
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& xhat = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& invstd = saved[2];
    const double total = ctx->saved_data["total"].toDouble();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const std::string name = ctx->saved_data["name"].toStringRef();
    const torch::Tensor dy = grads[0].to(xhat.scalar_type());
    torch::Tensor sum_dy = dy.sum(dims);
    torch::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    // The global sums in one call, in float64 for sums of many rows.
    torch::Tensor both = at::cat({sum_dy, sum_dy_xhat}).to(at::kDouble);
    allreduce_(
        both,
        AllreduceOptions()
            .op(ReduceOp::Sum)
            .name(name + ".grad")
            .process_set(set_of(ctx->saved_data["set"].toInt())));
    const int64_t channels = sum_dy.numel();
    torch::Tensor mean_dy =
        (both.narrow(0, 0, channels) / total).to(xhat.options()).view(shape);
    torch::Tensor mean_dy_xhat = (both.narrow(0, channels, channels) / total)
                                     .to(xhat.options())
                                     .view(shape);
    torch::Tensor scale =
        weight.defined() ? invstd * weight.to(invstd.options()) : invstd;
    torch::Tensor grad_input =
        (dy - mean_dy - xhat * mean_dy_xhat) * scale.view(shape);
    torch::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = sum_dy_xhat.to(weight.scalar_type());
      if (ctx->saved_data["bias"].toBool())
        grad_bias = sum_dy.to(weight.scalar_type());
    }
    return {
        grad_input.to(grads[0].scalar_type()),
        grad_weight,
        grad_bias,
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(
    const torch::nn::BatchNormOptions& options, ProcessSet process_set)
    : NormImplBase(options),
      process_set_(std::move(process_set)),
      name_("ronde.sync_batch_norm." + std::to_string(g_next_name++)) {}

void SyncBatchNormImpl::_check_input_dim(const torch::Tensor& input) {
  TORCH_CHECK(
      input.dim() >= 2 && input.dim() <= 5,
      "ronde: SyncBatchNorm expects (N, C, ...) input of 2 to 5 dimensions, "
      "got ",
      input.dim(),
      "-d");
  TORCH_CHECK(
      input.size(1) == options.num_features(),
      "ronde: SyncBatchNorm of ",
      options.num_features(),
      " features got ",
      input.size(1),
      " channels");
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  _check_input_dim(input);
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked.add_(1);
    if (!options.momentum())
      factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool synced =
      is_training() && is_initialized() && process_set_.size() > 1;
  if (!synced) {
    // As BatchNorm: batch statistics when training or untracked.
    return torch::nn::functional::detail::batch_norm(
        input,
        running_mean,
        running_var,
        weight,
        bias,
        is_training() || !options.track_running_stats(),
        factor,
        options.eps());
  }
  const bool track = options.track_running_stats();
  return SyncBatchNormFunction::apply(
      input,
      weight,
      bias,
      track ? running_mean : torch::Tensor(),
      track ? running_var : torch::Tensor(),
      options.eps(),
      factor,
      process_set_,
      name_);
}

void SyncBatchNormImpl::share_state(
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& running_mean,
    const torch::Tensor& running_var,
    const torch::Tensor& num_batches_tracked) {
  // Parameters: the tensors themselves, which optimizers hold. Buffers
  // (private to torch::nn::Module) take the values.
  if (options.affine()) {
    this->weight = parameters_["weight"] = weight;
    this->bias = parameters_["bias"] = bias;
  }
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    this->running_mean.copy_(running_mean);
    this->running_var.copy_(running_var);
    this->num_batches_tracked.copy_(num_batches_tracked);
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ronde::nn::SyncBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats()
         << ", process_set=" << process_set_.id() << ")";
}

}  // namespace nn

namespace {

// The BatchNorm options and tensors of `m`, if it is one.
template <typename Impl>
std::shared_ptr<nn::SyncBatchNormImpl> sync_from(
    const std::shared_ptr<torch::nn::Module>& m, const ProcessSet& set) {
  auto bn = std::dynamic_pointer_cast<Impl>(m);
  if (!bn)
    return nullptr;
  auto out = std::make_shared<nn::SyncBatchNormImpl>(bn->options, set);
  // The same tensors: what an optimizer holds stays what is trained.
  out->share_state(
      bn->weight,
      bn->bias,
      bn->running_mean,
      bn->running_var,
      bn->num_batches_tracked);
  out->train(bn->is_training());
  return out;
}

std::shared_ptr<torch::nn::Module> as_sync(
    const std::shared_ptr<torch::nn::Module>& m, const ProcessSet& set) {
  if (auto s = sync_from<torch::nn::BatchNorm1dImpl>(m, set))
    return s;
  if (auto s = sync_from<torch::nn::BatchNorm2dImpl>(m, set))
    return s;
  if (auto s = sync_from<torch::nn::BatchNorm3dImpl>(m, set))
    return s;
  return nullptr;
}

// Converts the tree below `m` in place; returns how many it replaced.
int64_t convert_below(
    torch::nn::Module& m, const ProcessSet& set, const std::string& path) {
  int64_t replaced = 0;
  const auto children = m.named_children();
  auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m);
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& name = children[i].key();
    const std::string child_path = path.empty() ? name : path + "." + name;
    const std::shared_ptr<torch::nn::Module>& child = children[i].value();
    std::shared_ptr<torch::nn::Module> sync = as_sync(child, set);
    if (!sync) {
      replaced += convert_below(*child, set, child_path);
      continue;
    }
    if (seq != nullptr) {
      // A Sequential calls its AnyModules: the entry is swapped too.
      auto it = seq->begin() + static_cast<std::ptrdiff_t>(i);
      TORCH_INTERNAL_ASSERT(it->ptr() == child);
      *it = torch::nn::AnyModule(nn::SyncBatchNorm(
          std::static_pointer_cast<nn::SyncBatchNormImpl>(sync)));
    } else {
      // Held by the registry and by `children`: anything more is the
      // parent's own member, which its forward() would still call.
      TORCH_CHECK(
          child.use_count() <= 2,
          "ronde::convert_sync_batchnorm: '",
          child_path,
          "' is also held by its parent's own member, which the parent's "
          "forward() calls: replacing it in the registry would change "
          "nothing. Declare it as ronde::nn::SyncBatchNorm, or hold it in a "
          "Sequential");
    }
    m.replace_module(name, sync);
    ++replaced;
  }
  return replaced;
}

}  // namespace

int64_t convert_sync_batchnorm(
    torch::nn::Module& module, const ProcessSet& process_set) {
  return convert_below(module, process_set, "");
}

}  // namespace ronde
