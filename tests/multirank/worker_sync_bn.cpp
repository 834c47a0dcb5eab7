// SyncBatchNorm scenarios of the worker: every rank also runs one
// torch::nn::BatchNorm2d on the whole global batch (the single-process
// reference) and compares its own rows, the summed weight and bias
// gradients and the running statistics with it.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <torch/torch.h>

#include <iostream>

namespace {

// Step `step`'s global batch: every rank's rows (8 each; the last step
// ragged), and the weights of the loss sum(y * w).
struct Batch {
  std::vector<int64_t> sizes;
  torch::Tensor x, w;
};

Batch batch_of(int step, int size) {
  Batch b;
  const int64_t ragged[] = {8, 5, 3, 8};
  for (int r = 0; r < size; ++r)
    b.sizes.push_back(step < 2 ? 8 : ragged[r % 4]);
  int64_t total = 0;
  for (int64_t s : b.sizes)
    total += s;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  b.x = torch::randn({total, 3, 4, 4}, gen) * 2 + 0.5;
  b.w = torch::randn({total, 3, 4, 4}, gen);
  return b;
}

template <typename BN>
void init_params(BN& bn) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  torch::NoGradGuard no_grad;
  bn->weight.copy_(torch::rand({3}, gen) + 0.5);
  bn->bias.copy_(torch::randn({3}, gen));
}

// How far `a` is from `b` in units of the tolerance 1e-6 + 1e-6 |b|
// (torch::allclose's rule at rtol = atol = 1e-6): at most 1 passes.
double excess(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs() / (b.abs() * 1e-6 + 1e-6)).max().item<double>();
}

RONDE_SCENARIO(sync_bn) {
  ronde::init();
  const int rank = ronde::rank(), size = ronde::size();
  auto opts = torch::nn::BatchNormOptions(3).momentum(0.2);
  ronde::nn::SyncBatchNorm sync(opts);
  torch::nn::BatchNorm2d ref(opts);
  init_params(sync);
  init_params(ref);
  double worst = 0;
  auto track =
      [&](const char* what, const torch::Tensor& a, const torch::Tensor& b) {
        const double e = excess(a, b);
        worst = std::max(worst, e);
        CHECK_W(e <= 1.0, what, ": off by ", e, " x (1e-6 + 1e-6 |ref|)");
      };
  for (int step = 0; step < 3; ++step) {
    Batch b = batch_of(step, size);
    int64_t lo = 0;
    for (int r = 0; r < rank; ++r)
      lo += b.sizes[r];
    const int64_t n = b.sizes[rank];
    torch::Tensor mine = b.x.narrow(0, lo, n).clone().requires_grad_();
    torch::Tensor y = sync(mine);
    (y * b.w.narrow(0, lo, n)).sum().backward();
    torch::Tensor all = b.x.clone().requires_grad_();
    torch::Tensor y_ref = ref(all);
    (y_ref * b.w).sum().backward();
    track("output", y, y_ref.narrow(0, lo, n));
    track("input gradient", mine.grad(), all.grad().narrow(0, lo, n));
    // Local sums: the job's sum is the one BatchNorm's gradient.
    track(
        "weight gradient",
        ronde::allreduce(
            sync->weight.grad(),
            ronde::AllreduceOptions().op(ronde::ReduceOp::Sum)),
        ref->weight.grad());
    track(
        "bias gradient",
        ronde::allreduce(
            sync->bias.grad(),
            ronde::AllreduceOptions().op(ronde::ReduceOp::Sum)),
        ref->bias.grad());
    sync->weight.mutable_grad() = torch::Tensor();
    sync->bias.mutable_grad() = torch::Tensor();
    ref->weight.mutable_grad() = torch::Tensor();
    ref->bias.mutable_grad() = torch::Tensor();
  }
  track("running mean", sync->running_mean, ref->running_mean);
  track("running var", sync->running_var, ref->running_var);
  CHECK_W(sync->num_batches_tracked.item<int64_t>() == 3, "batches tracked");
  sync->eval();
  ref->eval();
  Batch e = batch_of(9, size);
  track("eval output", sync(e.x.narrow(0, 0, 4)), ref(e.x.narrow(0, 0, 4)));
  if (rank == 0) {
    // Eval mode does not communicate: rank 0 alone runs it again (a
    // collective here would wait for the others until the timeout).
    sync(e.x.narrow(0, 4, 4));
  }
  std::cout << "rank " << rank
            << ": SYNC_BN worst difference, in units of 1e-6 + 1e-6 |ref|: "
            << worst << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// A ResNet-style block: its BatchNorms inside Sequentials, and one
// registered only.
struct Block : torch::nn::Module {
  torch::nn::Sequential body, shortcut;
  Block() {
    body = register_module(
        "body",
        torch::nn::Sequential(
            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
            torch::nn::BatchNorm2d(4),
            torch::nn::ReLU(),
            torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 3, 1)),
            torch::nn::BatchNorm2d(
                torch::nn::BatchNormOptions(3).momentum(0.3).eps(1e-3))));
    shortcut = register_module(
        "shortcut",
        torch::nn::Sequential(
            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 3, 1)),
            torch::nn::BatchNorm2d(3)));
    register_module("loose", torch::nn::BatchNorm1d(5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(body->forward(x) + shortcut->forward(x));
  }
};

std::map<std::string, torch::Tensor> state_of(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> s;
  for (const auto& p : m.named_parameters())
    s[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers())
    s[b.key()] = b.value().clone();
  return s;
}

RONDE_SCENARIO(convert_sync_bn) {
  ronde::init();
  torch::manual_seed(3);
  auto block = std::make_shared<Block>();
  torch::optim::SGD opt(block->parameters(), 0.1);
  // Running statistics of some data first, so that there is state to keep.
  block->train();
  block->forward(torch::randn({6, 3, 5, 5}));
  block->eval();
  const torch::Tensor probe = torch::randn({2, 3, 5, 5});
  const torch::Tensor before = block->forward(probe);
  const auto state = state_of(*block);
  const int64_t replaced = ronde::convert_sync_batchnorm(*block);
  CHECK_W(replaced == 4, "replaced ", replaced);
  CHECK_W(
      std::dynamic_pointer_cast<ronde::nn::SyncBatchNormImpl>(
          block->body->ptr(1)) != nullptr,
      "the Sequential's entry is the SyncBatchNorm");
  const auto after_state = state_of(*block);
  CHECK_W(after_state.size() == state.size(), "state size");
  for (const auto& [name, t] : state) {
    auto it = after_state.find(name);
    CHECK_W(it != after_state.end(), "lost ", name);
    if (it != after_state.end())
      CHECK_W(torch::equal(it->second, t), name, " changed");
  }
  CHECK_W(torch::equal(block->forward(probe), before), "eval output changed");
  // The optimizer made before trains the converted module's parameters.
  block->train();
  block->zero_grad();
  block->forward(probe).sum().backward();
  auto bn = std::dynamic_pointer_cast<ronde::nn::SyncBatchNormImpl>(
      block->body->ptr(1));
  const torch::Tensor w = bn->weight.detach().clone();
  opt.step();
  CHECK_W(!torch::equal(bn->weight.detach(), w), "the optimizer moved it");
  // A BatchNorm the parent also holds in a member cannot be swapped.
  struct Held : torch::nn::Module {
    torch::nn::BatchNorm2d bn{nullptr};
    Held() {
      bn = register_module("bn", torch::nn::BatchNorm2d(3));
    }
  } held;
  ronde::testing::expect_error(
      [&] { ronde::convert_sync_batchnorm(held); },
      {"'bn' is also held by its parent's own member"});
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
