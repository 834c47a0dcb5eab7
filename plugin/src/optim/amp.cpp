// GradScaler and AutocastGuard.
#include <ronde/amp.h>

#include <ronde/gradient_reducer.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <map>

namespace ronde {

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(options.init_scale()) {
  TORCH_CHECK(options_.init_scale() > 0, "ronde: init_scale must be positive");
  TORCH_CHECK(
      options_.growth_factor() > 1,
      "ronde: growth_factor must be > 1, got ",
      options_.growth_factor());
  TORCH_CHECK(
      options_.backoff_factor() > 0 && options_.backoff_factor() < 1,
      "ronde: backoff_factor must be in (0, 1), got ",
      options_.backoff_factor());
  TORCH_CHECK(
      options_.growth_interval() >= 1,
      "ronde: growth_interval must be >= 1, got ",
      options_.growth_interval());
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled())
    return loss;
  return loss * scale_;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled())
    return;
  TORCH_CHECK(
      !unscaled_,
      "ronde: unscale() was already called since the "
      "last update()");
  TORCH_CHECK(!stepped_, "ronde: unscale() after step(): call update() first");
  std::vector<at::Tensor> grads;
  if (GradientSync* d = gradient_sync_of(optimizer)) {
    d->synchronize();  // all ranks now hold the same averaged gradients
    grads = d->gradient_buffers();
  } else {
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) {
        if (p.grad().defined())
          grads.push_back(p.grad());
      }
    }
  }
  // The fused kernel wants one device per call.
  std::map<std::string, std::vector<at::Tensor>> by_device;
  for (auto& g : grads)
    by_device[g.device().str()].push_back(g);
  bool found = false;
  for (auto& [dev, list] : by_device) {
    auto opts =
        at::TensorOptions().dtype(at::kFloat).device(list.front().device());
    at::Tensor found_inf = at::zeros({1}, opts);
    at::Tensor inv_scale = at::full({1}, 1.0 / scale_, opts);
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_inf, inv_scale);
    found |= found_inf.item<float>() > 0;
  }
  if (GradientSync* d = gradient_sync_of(optimizer))
    found = d->found_anywhere(found);
  found_inf_ = found;
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    last_skipped_ = false;
    return true;
  }
  TORCH_CHECK(!stepped_, "ronde: step() called twice without update()");
  if (!unscaled_)
    unscale(optimizer);
  stepped_ = true;
  last_skipped_ = found_inf_;
  if (found_inf_) {
    if (GradientSync* d = gradient_sync_of(optimizer))
      d->skip_step();
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled())
    return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
  stepped_ = false;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("ronde_scaler_scale", at::tensor({scale_}, at::kDouble));
  archive.write(
      "ronde_scaler_growth_tracker", at::tensor({growth_tracker_}, at::kLong));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  at::Tensor s, g;
  archive.read("ronde_scaler_scale", s);
  archive.read("ronde_scaler_growth_tracker", g);
  scale_ = s.item<double>();
  growth_tracker_ = g.item<int64_t>();
}

AutocastGuard::AutocastGuard(
    c10::DeviceType device, std::optional<c10::ScalarType> dtype, bool enabled)
    : device_(device),
      prev_enabled_(at::autocast::is_autocast_enabled(device)),
      prev_dtype_(at::autocast::get_autocast_dtype(device)) {
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(
      device, dtype.value_or(device == c10::kCUDA ? at::kHalf : at::kBFloat16));
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Casts are cached while autocast is on; the outermost guard drops them.
  if (at::autocast::decrement_nesting() == 0)
    at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

}  // namespace ronde
