// What the docs' C++ blocks are compiled with (tests/docs/snippets.py): every
// public header, and the names a `cpp fragment` block may use without
// declaring them. docs/guide/README.md lists the names for readers.
//
// A fragment is compiled, never run, as the body of a function whose
// parameters are RONDE_SNIPPET_PARAMETERS; its own declarations shadow them.
#pragma once

#include <ronde/c10d.h>
#include <ronde/ronde.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace ronde_snippets {

// A model with a feature extractor and a head (mixed precision runs the
// first in 16 bits, the second in float32).
struct NetImpl : torch::nn::Module {
  NetImpl()
      : body(register_module("body", torch::nn::Linear(16, 16))),
        out(register_module("out", torch::nn::Linear(16, 2))) {}
  torch::Tensor features(torch::Tensor x) {
    return torch::relu(body(x));
  }
  torch::Tensor head(torch::Tensor f) {
    return out(f);
  }
  torch::Tensor forward(torch::Tensor x) {
    return head(features(x));
  }
  torch::nn::Linear body, out;
};
TORCH_MODULE(Net);

// A dataset of (input, class) examples.
struct Dataset : torch::data::datasets::Dataset<Dataset> {
  torch::data::Example<> get(size_t i) override {
    return {torch::randn({16}), torch::tensor(static_cast<int64_t>(i % 2))};
  }
  std::optional<size_t> size() const override {
    return 1024;
  }
};

inline torch::Tensor loss_fn(
    const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// A batch of a rank's shard: inputs and targets.
struct Batch {
  torch::Tensor data, target;
};

inline auto make_loader(Dataset d, ronde::DistributedSampler s, size_t b) {
  return torch::data::make_data_loader(
      d.map(torch::data::transforms::Stack<>()), std::move(s), b);
}
using Loader = decltype(make_loader(
    std::declval<Dataset>(), std::declval<ronde::DistributedSampler>(), 1));

}  // namespace ronde_snippets

using namespace ronde_snippets;  // NOLINT: the fragments' names

// model: a Net; base: the optimizer a DistributedOptimizer wraps; opt: that
// DistributedOptimizer; sched, scaler, sampler: a WarmupScheduler,
// GradScaler and DistributedSampler; dataset, loader: a dataset of (input,
// class) examples and a loader over this rank's shard, batches stacked;
// my_shard_of_the_data: this rank's batches; batch: samples per step;
// step, epoch: counters; epochs, total_steps: the run's length; t, x, y:
// tensors (a tensor to reduce, inputs, targets).
#define RONDE_SNIPPET_PARAMETERS                                            \
  Net &model, std::shared_ptr<torch::optim::SGD> base,                      \
      ronde::DistributedOptimizer &opt, ronde::WarmupScheduler &sched,      \
      ronde::GradScaler &scaler, ronde::DistributedSampler &sampler,        \
      Dataset &dataset, Loader &loader,                                     \
      std::vector<Batch>&my_shard_of_the_data, size_t batch, int64_t &step, \
      int64_t &epoch, int64_t epochs, int64_t total_steps, torch::Tensor t, \
      torch::Tensor x, torch::Tensor y
