// Mixed precision for custom training steps: dynamic loss scaling that keeps
// every rank's decision to skip a step identical, and an autocast guard.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <optional>

namespace ronde {

struct GradScalerOptions {
  // 2^16: large enough that small fp16 gradients survive, backed off at once
  // if it overflows (the defaults of torch.amp.GradScaler).
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  // Clean steps in a row before the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  // Off: scale() returns the loss, step() always steps (bf16 needs no
  // scaling but can keep the same code).
  TORCH_ARG(bool, enabled) = true;
};

// Typical step:
//   scaler.scale(loss).backward();
//   scaler.unscale(opt);            // optional: to clip gradients first
//   scaler.step(opt);               // skips on inf/NaN, on every rank alike
//   scaler.update();
// With a DistributedOptimizer, unscale() waits for the all-reduce first and
// unscales the averaged gradients in place (over the bucket buffers), so
// every rank checks the same numbers and reaches the same verdict.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  torch::Tensor scale(const torch::Tensor& loss) const;
  // Unscales the optimizer's gradients once per step and records whether
  // any was inf or NaN.
  void unscale(torch::optim::Optimizer& optimizer);
  // Steps the optimizer unless a gradient overflowed; returns whether it
  // stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Backs the scale off after an overflow, grows it after growth_interval
  // clean steps.
  void update();

  double get_scale() const {
    return scale_;
  }
  bool is_enabled() const {
    return options_.enabled();
  }
  // Whether the last step() skipped the optimizer.
  bool last_step_skipped() const {
    return last_skipped_;
  }
  int64_t growth_tracker() const {
    return growth_tracker_;
  }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;   // this step's gradients are unscaled
  bool found_inf_ = false;  // ... and one of them overflowed
  bool stepped_ = false;    // step() was called this step
  bool last_skipped_ = false;
};

// Runs the enclosed ops under autocast: bfloat16 on CPU, float16 on CUDA by
// default. Keep the output layer and the loss in float32 (compute them after
// the guard's scope, or cast their inputs with .to(torch::kFloat)).
class AutocastGuard {
 public:
  explicit AutocastGuard(
      c10::DeviceType device = c10::kCPU,
      std::optional<c10::ScalarType> dtype = std::nullopt,
      bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
};

}  // namespace ronde
