// Elastic training under ronderun --min-np: a rank (launch rank K) dies of
// SIGKILL at step S, where the test says; the survivors go on. At the end
// rank 0 checks its parameters against one process applying the same
// global batches (derived from the sampler's rule and the sizes the world
// had), that every sample of every epoch was used once, and the LR.
#include <ronde/collectives.h>
#include <ronde/data.h>
#include <ronde/elastic.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kSamples = 48;
constexpr int64_t kDim = 4;
constexpr int64_t kEpochs = 2;
// Commits when the job has read a multiple of this many samples of the
// epoch: what is left then divides by 2, 3 and 4 ranks, so that every
// sample is read once whatever the world becomes at a commit.
constexpr int64_t kCommitSamples = 12;
constexpr int64_t kSeed = 7;
constexpr double kLr = 0.02;

at::Tensor inputs() {
  auto i = torch::arange(kSamples, torch::kDouble).unsqueeze(1);
  auto j = torch::arange(kDim, torch::kDouble).unsqueeze(0);
  return torch::sin(0.37 * i + 1.3 * j).to(torch::kFloat);
}

at::Tensor targets(const at::Tensor& x) {
  auto w = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f}).unsqueeze(1);
  auto i = torch::arange(kSamples, torch::kFloat).unsqueeze(1);
  return x.matmul(w) + 0.1 * torch::cos(i);
}

void init_weights(torch::nn::Linear& model) {
  torch::NoGradGuard no_grad;
  model->weight.copy_(torch::tensor({{0.1f, 0.2f, 0.3f, 0.4f}}));
  model->bias.zero_();
}

// When a world of `size` ranks took over: at global step `from`.
struct Era {
  int64_t from;
  int64_t size;
};

// One process, the same global batches: the rest of each epoch's
// permutation in steps of one sample per rank of the world in force.
torch::Tensor reference(const std::vector<Era>& eras) {
  torch::nn::Linear model(kDim, 1);
  init_weights(model);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLr));
  const auto x = inputs(), y = targets(x);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed + epoch);
    auto order =
        at::randperm(kSamples, gen, at::TensorOptions().dtype(at::kLong));
    for (int64_t at_sample = 0; at_sample < kSamples; ++step) {
      int64_t n = eras.front().size;
      for (const Era& e : eras) {
        if (e.from <= step)
          n = e.size;
      }
      auto idx = order.slice(0, at_sample, at_sample + n);
      at_sample += n;
      for (auto& g : sgd.param_groups())
        g.options().set_lr(kLr * static_cast<double>(n));
      sgd.zero_grad();
      torch::mse_loss(model->forward(x.index({idx})), y.index({idx}))
          .backward();
      sgd.step();
    }
  }
  return torch::cat({model->weight.flatten(), model->bias}).detach();
}

}  // namespace

// argv: elastic_train STEP [LAUNCH_RANK WHERE]...: each LAUNCH_RANK dies
// of SIGKILL at global step STEP, at WHERE: "forward" (before backward: the
// others wait in the next collective), "backward" (after it, all-reduces in
// flight), "commit" (where it would commit), or "reset" (in the callback of
// the first change of world, whatever STEP: a failure during recovery).
// "sleep MS" among them makes each step last MS more (time for ranks to
// join). A process started to join (RONDE_ELASTIC_JOIN) runs the same.
RONDE_SCENARIO(elastic_train) {
  const int64_t kill_step = argc > 2 ? std::atoll(argv[2]) : -1;
  std::vector<std::pair<int, std::string>> kills;
  int step_ms = 0;
  for (int a = 3; a + 1 < argc; a += 2) {
    if (std::string(argv[a]) == "sleep")
      step_ms = std::atoi(argv[a + 1]);
    else
      kills.emplace_back(std::atoi(argv[a]), argv[a + 1]);
  }
  ronde::init();
  // A joining process is rank 0 of a world of one until admitted: it is
  // nobody's launch rank.
  const int launch_rank = ronde::elastic::joining() ? -1 : ronde::rank();
  auto doomed = [&](const std::string& where) {
    for (const auto& [k, w] : kills) {
      if (k == launch_rank && w == where)
        return true;
    }
    return false;
  };
  auto die = [] {
    std::cout << "dying" << std::endl;
    ::kill(::getpid(), SIGKILL);
  };

  torch::nn::Linear model(kDim, 1);
  init_weights(model);
  auto sgd = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(kLr));
  ronde::DistributedOptimizer opt(
      sgd,
      model->named_parameters(),
      ronde::DistributedOptimizerOptions().lr_scaling(
          ronde::LrScaling::Linear));
  ronde::DistributedSampler sampler(
      kSamples, ronde::DistributedSamplerOptions().seed(kSeed));
  int64_t epoch = 0, step = 0;
  at::Tensor seen = at::zeros({kEpochs, kSamples}, at::kLong);
  std::vector<Era> eras = {{0, ronde::size()}};

  ronde::elastic::State state;
  state.add("model", *model)
      .add("optimizer", opt)
      .add("sampler", sampler)
      .add("epoch", epoch)
      .add("step", step)
      .add(
          "seen",
          [&](torch::serialize::OutputArchive& a) { a.write("seen", seen); },
          [&](torch::serialize::InputArchive& a) {
            at::Tensor t;
            a.read("seen", t);
            seen.copy_(t);
          });
  state.on_reset([&] {
    eras.push_back({step, ronde::size()});
    std::cout << "reset " << state.resets() << ": " << ronde::size()
              << " ranks from step " << step << ", rank " << ronde::rank()
              << std::endl;
    if (state.resets() == 1 && doomed("reset"))
      die();
  });

  const auto x = inputs(), y = targets(x);
  ronde::elastic::run(state, [&] {
    for (; epoch < kEpochs; ++epoch, sampler.set_epoch(epoch)) {
      while (auto batch = sampler.next(1)) {
        if (step == kill_step && doomed("forward"))
          die();
        auto idx = torch::tensor(
            std::vector<int64_t>(batch->begin(), batch->end()), torch::kLong);
        opt.zero_grad();
        torch::mse_loss(model->forward(x.index({idx})), y.index({idx}))
            .backward();
        if (step == kill_step && doomed("backward"))
          die();
        opt.step();
        auto used = at::zeros({kSamples}, at::kLong);
        used.index_put_({idx}, 1);
        ronde::allreduce_(
            used, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
        seen[epoch] += used;
        ++step;
        if (step_ms > 0) {
          // Paced runs are watched from outside (the cluster's partition
          // test cuts a link at a step).
          if (ronde::rank() == 0)
            std::cout << "STEP " << step << std::endl;
          std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        }
        if (sampler.consumed() % kCommitSamples == 0) {
          if (step == kill_step && doomed("commit"))
            die();
          state.commit();
        }
      }
    }
  });

  if (ronde::rank() == 0) {
    std::string history;
    for (const Era& e : eras)
      history += " " + std::to_string(e.from) + ":" + std::to_string(e.size);
    std::cout << "eras:" << history << std::endl;
    auto mine = torch::cat({model->weight.flatten(), model->bias}).detach();
    auto want = reference(eras);
    const bool close = torch::allclose(mine, want, 1e-4, 1e-5);
    std::cout << "parameters " << (close ? "match" : "DIFFER")
              << " the reference" << std::endl;
    if (!close)
      std::cout << "mine " << mine << "\nwant " << want << std::endl;
    const bool once = seen.eq(1).all().item<bool>();
    std::cout << "every sample once: " << (once ? "yes" : "NO") << std::endl;
    if (!once)
      std::cout << seen << std::endl;
    const double lr = sgd->param_groups()[0].options().get_lr();
    std::cout << "lr " << lr << " for " << ronde::size() << " ranks"
              << std::endl;
    const bool lr_ok = std::abs(lr - kLr * ronde::size()) < 1e-12;
    if (!close || !once || !lr_ok)
      ++ronde::testing::check_failures();
  }
  std::cout << "finished at step " << step << " with " << ronde::size()
            << " ranks over " << ronde::host_backend() << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}
