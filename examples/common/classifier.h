// What the Fashion-MNIST examples share: the model, the data as tensors, the
// evaluation on every rank's share of the test set, and thread set-up.
#pragma once

#include "fashion_mnist.h"

#include <ronde/ronde.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <thread>
#include <utility>

namespace examples {

// A small CNN: two 3x3 convolution blocks (16 and 32 channels) and two linear
// layers. No dropout and no batch norm by default, so training is a function
// of the data order alone: 1, 2 or 4 ranks at one global batch train the same
// model. `batch_norm` adds one after each convolution: torch's BatchNorm2d,
// whose statistics are each rank's own batch, or with `sync` ronde's
// SyncBatchNorm, whose statistics are the global batch's.
struct FashionNetImpl : torch::nn::Module {
  explicit FashionNetImpl(bool batch_norm = false, bool sync = false)
      : conv1(register_module(
            "conv1",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {
    if (batch_norm) {
      bn1 = norm("bn1", 16, sync);
      bn2 = norm("bn2", 32, sync);
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = conv1(x);
    if (!bn1.is_empty())
      x = bn1.forward(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    x = conv2(x);
    if (!bn2.is_empty())
      x = bn2.forward(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  // Either kind of batch norm, called the same way.
  torch::nn::AnyModule bn1, bn2;

 private:
  torch::nn::AnyModule norm(const std::string& name, int64_t c, bool sync) {
    if (sync) {
      ronde::nn::SyncBatchNorm bn(c);
      register_module(name, bn);
      return torch::nn::AnyModule(bn);
    }
    torch::nn::BatchNorm2d bn(c);
    register_module(name, bn);
    return torch::nn::AnyModule(bn);
  }
};
TORCH_MODULE(FashionNet);

struct Tensors {
  torch::Tensor images;  // float [N, 1, 28, 28], normalised
  torch::Tensor labels;  // int64 [N]
  int64_t size() const {
    return labels.size(0);
  }
};

// The first `limit` samples (0: all), normalised with the Fashion-MNIST
// training set's mean and standard deviation.
inline Tensors to_tensors(const Split& split, int64_t limit = 0) {
  int64_t n = limit > 0 ? std::min(limit, split.count) : split.count;
  auto images = torch::from_blob(
                    const_cast<uint8_t*>(split.images.data()),
                    {n, 1, 28, 28},
                    torch::kUInt8)
                    .to(torch::kFloat)
                    .div_(255)
                    .sub_(0.2860)
                    .div_(0.3530);
  auto labels =
      torch::from_blob(
          const_cast<uint8_t*>(split.labels.data()), {n}, torch::kUInt8)
          .to(torch::kLong);
  return {images, labels};
}

struct Evaluation {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // percent
};

// Rank r evaluates samples r, r + n, r + 2n, ... of `data` (each sample
// exactly once over the job); the sums are all-reduced, so every rank returns
// the figures of the whole set.
inline Evaluation evaluate(
    FashionNet& model, const Tensors& data, int64_t batch = 1000) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto mine = torch::arange(ronde::rank(), data.size(), ronde::size());
  double sums[3] = {0, 0, 0};  // loss sum, correct, count
  for (int64_t at = 0; at < mine.size(0); at += batch) {
    auto idx = mine.slice(0, at, std::min(at + batch, mine.size(0)));
    auto logits = model->forward(data.images.index_select(0, idx));
    auto labels = data.labels.index_select(0, idx);
    sums[0] += torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum)
                   .item<double>();
    sums[1] += logits.argmax(1).eq(labels).sum().item<double>();
    sums[2] += static_cast<double>(idx.size(0));
  }
  model->train();
  auto total = ronde::allreduce(
      torch::tensor({sums[0], sums[1], sums[2]}, torch::kDouble),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).name("evaluate"));
  auto v = total.accessor<double, 1>();
  return {v[0] / v[2], 100.0 * v[1] / v[2]};
}

// Intra-op threads: `requested`, or (0) this rank's share of the cores, so
// that ranks on one machine do not oversubscribe it.
inline void set_threads(int64_t requested) {
  int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  int64_t n = requested > 0 ? requested
                            : std::max<int64_t>(1, cores / ronde::local_size());
  torch::set_num_threads(static_cast<int>(n));
}

// The LR for a global batch: `lr` is the LR for kReferenceBatch samples,
// scaled linearly with the global batch (Goyal et al. 2017). The optimizer is
// built with that LR divided by the replicas x backward passes, and
// DistributedOptimizer's LrScaling::Linear multiplies it back, so the base LR
// it records is the one a single replica with the same per-replica batch
// would use.
inline constexpr int64_t kReferenceBatch = 64;

// Runs an example's body; an exception becomes one line on stderr naming
// the program and the rank ("fashion_mnist: rank 1: ...") and exit code 1.
template <class Body>
int run_example(const char* program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::cerr << program << ": ";
    if (ronde::is_initialized()) {
      std::cerr << "rank " << ronde::rank() << ": ";
    }
    std::cerr << (c10_error ? c10_error->what_without_backtrace() : e.what())
              << std::endl;
    return 1;
  }
}

}  // namespace examples
