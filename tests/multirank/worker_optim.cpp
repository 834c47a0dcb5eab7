// DistributedOptimizer scenarios for the multirank worker. Each trains the
// same small model twice: once distributed (every rank on its shard of the
// global batch) and once as a single process on the whole global batch, in
// the same program, and compares the parameters after 20 steps. Also the
// optimizer's errors, overlap of communication with backward, two models
// on two process sets, and training until a peer is lost.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace ronde::testing;

// Whether [p, p + bytes) lies in a mapping of a file in the shared-memory
// directory (a segment, made unnamed: "/dev/shm/#<inode> (deleted)").
bool in_shm_segment(const void* p, size_t bytes) {
  const char* env = std::getenv("RONDE_SHM_DIR");
  const std::string dir = std::string(env && *env ? env : "/dev/shm") + "/";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2)
      continue;
    if (at >= lo && at + bytes <= hi)
      return line.find(" " + dir) != std::string::npos;
  }
  return false;
}

int scenario_optim(const std::string& name, const std::string& variant) {
  // Settings are read once, at init().
  if (variant == "copywhole")
    ::setenv("RONDE_BUCKET_COPY", "whole", 1);
  // Every bucket all-reduced without a copy: split from the first byte,
  // pieces of a small chunk within each slice.
  const bool zero_copy = variant == "zerocopy";
  if (zero_copy) {  // this model's buckets are smaller than a page
    ::setenv("RONDE_SHM_ZERO_COPY_BYTES", "0", 1);
    ::setenv("RONDE_SHM_CHUNK_BYTES", "4096", 1);
  }
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const bool bpps2 = variant == "bpps2";
  const bool unused = variant == "unused";
  const bool two_groups = variant == "groups";
  const bool steplr = variant == "steplr";
  const int64_t k = bpps2 ? 2 : 1;
  const int64_t b = 4;  // rows per rank per backward pass
  const int64_t global = n * k * b;
  const int steps = 20;
  torch::manual_seed(7);
  torch::Tensor X = torch::randn({global, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({global, 4}, torch::kDouble);
  const bool closure_style = name == "lbfgs";

  // The reference: one process, the whole global batch each step.
  Net ref = make_net(!unused);
  auto ref_opt = make_optimizer(name, ref, two_groups);
  std::unique_ptr<torch::optim::StepLR> ref_sched;
  if (steplr)
    ref_sched = std::make_unique<torch::optim::StepLR>(*ref_opt, 5, 0.5);
  for (int s = 0; s < steps; ++s) {
    auto closure = [&] {
      ref_opt->zero_grad();
      auto loss = torch::mse_loss(ref->forward(X), Y);
      loss.backward();
      return loss;
    };
    if (closure_style) {
      ref_opt->step(closure);
    } else {
      closure();
      ref_opt->step();
    }
    if (ref_sched)
      ref_sched->step();
  }

  // Distributed: ranks start from different weights; broadcast fixes that.
  Net net = make_net(!unused);
  {
    torch::NoGradGuard g;
    for (auto& p : net->parameters())
      p.add_(r);
  }
  ronde::broadcast_parameters(net->named_parameters(), 0);
  auto base = make_optimizer(name, net, two_groups);
  // Copies, each bucket moved by one concatenation and one split (the CUDA
  // way; RONDE_BUCKET_COPY=whole set before init()), in several buckets.
  const bool copy_whole = variant == "copywhole";
  const bool small = variant == "smallbuckets" || copy_whole || zero_copy;
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .backward_passes_per_step(k)
          .gradient_as_bucket_view(variant != "copy" && !copy_whole)
          // Small buckets: several per step, mixed launch order.
          .fusion_threshold_mb(small ? 0.001 : 0)
          .first_bucket_mb(small ? 0.0005 : 1));
  ronde::broadcast_optimizer_state(opt, 0);
  std::unique_ptr<torch::optim::StepLR> sched;
  // Attached to the DistributedOptimizer: it must reach the wrapped groups.
  if (steplr)
    sched = std::make_unique<torch::optim::StepLR>(opt, 5, 0.5);
  for (int s = 0; s < steps; ++s) {
    if (variant == "reload" && (s == 0 || s == 7)) {
      // torch::load fills a Module with Tensor::set_, which gives each
      // parameter a new gradient accumulator, after the hooks went in.
      std::stringstream saved;
      torch::save(net, saved);
      torch::load(net, saved);
    }
    if (closure_style) {
      opt.step([&] {
        opt.zero_grad();
        auto x = X.narrow(0, r * b, b);
        auto y = Y.narrow(0, r * b, b);
        auto loss = torch::mse_loss(net->forward(x), y);
        loss.backward();
        return loss;
      });
    } else {
      opt.zero_grad(variant == "keepgrad" ? false : true);
      for (int64_t j = 0; j < k; ++j) {
        int64_t row = (j * n + r) * b;
        auto loss = torch::mse_loss(
            net->forward(X.narrow(0, row, b)), Y.narrow(0, row, b));
        loss.backward();
      }
      opt.step();
    }
    if (sched)
      sched->step();
  }
  if (steplr) {
    // 20 steps, halved every 5: four times.
    const double start = ref_opt->param_groups()[0].options().get_lr() * 16;
    CHECK_W(
        std::abs(base->param_groups()[0].options().get_lr() - start / 16) <
                1e-12 &&
            std::abs(opt.param_groups()[0].options().get_lr() - start / 16) <
                1e-12 &&
            start > 0.009,
        "StepLR did not reach the wrapped optimizer: ",
        base->param_groups()[0].options().get_lr());
  }
  auto mine = params_flat(*net);
  auto want = params_flat(*ref);
  CHECK_W(
      torch::allclose(mine, want, 1e-5, 1e-8),
      name,
      "/",
      variant,
      " differs from the single-process reference: max abs diff ",
      (mine - want).abs().max().item<double>());
  if (unused) {
    // Never used: its weights never moved (and its grad stayed undefined).
    CHECK_W(
        !net->extra->weight.grad().defined() || name == "custom",
        "unused parameter got a gradient");
  }
  check_replicas_identical(mine);
  if (zero_copy && ronde::host_backend() == "shm") {
    for (const auto& t : opt.gradient_buffers()) {
      CHECK_W(
          in_shm_segment(t.data_ptr(), t.nbytes()),
          "a bucket buffer of ",
          t.nbytes(),
          " bytes is not in the rank's shared-memory arena");
    }
  }
  std::cout << "buckets: " << opt.buckets().size() << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(optim) {
  return scenario_optim(
      argc > 2 ? argv[2] : "sgd", argc > 3 ? argv[3] : "plain");
}

RONDE_SCENARIO(optim_errors) {
  ronde::init();
  const int r = ronde::rank();
  // A model that differs on the last rank.
  {
    torch::nn::Sequential model(
        torch::nn::Linear(4, r == ronde::size() - 1 ? 5 : 6));
    auto base = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    expect_error(
        [&] {
          ronde::DistributedOptimizer opt(base, model->named_parameters());
        },
        {"ranks disagree", "'0.weight'", "[6, 4]", "[5, 4]"});
  }
  // step() after 1 of 2 backward passes.
  {
    torch::nn::Linear model(4, 2);
    auto base = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    ronde::DistributedOptimizer opt(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions().backward_passes_per_step(2));
    model->forward(torch::ones({3, 4})).sum().backward();
    expect_error(
        [&] { opt.step(); },
        {"after 1 backward passes", "backward_passes_per_step is 2"});
  }
  // A parameter the optimizer steps but that was not handed over.
  {
    torch::nn::Linear model(4, 2);
    auto extra = torch::zeros({3}, torch::requires_grad());
    std::vector<torch::Tensor> params = model->parameters();
    params.push_back(extra);
    auto base = std::make_shared<torch::optim::SGD>(
        params, torch::optim::SGDOptions(0.1));
    expect_error(
        [&] {
          ronde::DistributedOptimizer opt(base, model->named_parameters());
        },
        {"not among named_parameters"});
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Buckets launch while backward still runs; a second optimizer over the
// same parameters works once the first is gone.
RONDE_SCENARIO(optim_overlap) {
  ronde::init();
  torch::manual_seed(1);
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i)
    model->push_back(torch::nn::Linear(256, 256));
  ronde::broadcast_parameters(model->named_parameters(), 0);
  auto run_steps = [&](ronde::DistributedOptimizer& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      model->forward(torch::randn({32, 256})).pow(2).mean().backward();
      opt.step();
    }
  };
  {
    auto base = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.01));
    ronde::DistributedOptimizer opt(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .fusion_threshold_mb(0.3)
            .first_bucket_mb(0.25));
    run_steps(opt, 3);
    auto p = opt.last_step_profile();
    CHECK_W(
        opt.buckets().size() > 2,
        "expected several buckets, got ",
        opt.buckets().size());
    CHECK_W(p.hooks == 16, "hooks ", p.hooks);
    CHECK_W(
        !p.hooks_before_launch.empty() && p.hooks_before_launch[0] < p.hooks,
        "first bucket launched only after backward finished: ",
        p.hooks_before_launch.empty() ? -1 : p.hooks_before_launch[0],
        " of ",
        p.hooks);
    std::cout << "first bucket launched after " << p.hooks_before_launch[0]
              << " of " << p.hooks << " gradients" << std::endl;
  }
  {
    // The first optimizer's hooks are gone: a second one over the same
    // parameters trains and keeps replicas identical.
    auto base = std::make_shared<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(1e-3));
    ronde::DistributedOptimizer opt(base, model->named_parameters());
    torch::manual_seed(100 + ronde::rank());  // different data per rank
    run_steps(opt, 3);
    check_replicas_identical(params_flat(*model));
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Two halves of the job train two models at once, each averaging over its
// own process set (sets of one rank at 2 and 3 ranks): each model equals
// one process trained on its half's global batch, with the LR scaled by the
// half's size; the job's own collectives run between the steps.
RONDE_SCENARIO(two_models) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  std::vector<int> low, high;
  for (int q = 0; q < n; ++q)
    (q < n / 2 ? low : high).push_back(q);
  ronde::ProcessSet a = ronde::add_process_set(low);
  ronde::ProcessSet b = ronde::add_process_set(high);
  const bool in_a = me < n / 2;
  const ronde::ProcessSet& set = in_a ? a : b;
  const ronde::ProcessSet& other = in_a ? b : a;
  const int m = set.size(), r = set.rank();
  const std::string name = in_a ? "sgd" : "adam";
  const int64_t rows = 4;
  const int steps = 12;
  torch::manual_seed(in_a ? 7 : 8);
  torch::Tensor X = torch::randn({m * rows, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({m * rows, 4}, torch::kDouble);

  Net ref = make_net(true);
  auto ref_opt = make_optimizer(name, ref, false);
  for (auto& g : ref_opt->param_groups())
    g.options().set_lr(g.options().get_lr() * m);
  for (int s = 0; s < steps; ++s) {
    ref_opt->zero_grad();
    torch::mse_loss(ref->forward(X), Y).backward();
    ref_opt->step();
  }

  // Ranks start apart but for each set's first; its broadcast fixes that.
  Net net = make_net(true);
  {
    torch::NoGradGuard g;
    for (auto& p : net->parameters())
      p.add_(r);
  }
  ronde::broadcast_parameters(net->named_parameters(), 0, set);
  auto base = make_optimizer(name, net, false);
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .process_set(set)
          .lr_scaling(ronde::LrScaling::Linear)
          .fusion_threshold_mb(0.001)
          .first_bucket_mb(0.0005));
  ronde::broadcast_optimizer_state(opt, 0, set);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::mse_loss(
        net->forward(X.narrow(0, r * rows, rows)), Y.narrow(0, r * rows, rows))
        .backward();
    opt.step();
    at::Tensor count = ronde::allreduce(
        torch::ones({1}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
    CHECK_W(count.item<float>() == n, "global allreduce between steps");
  }
  auto mine = params_flat(*net);
  auto want = params_flat(*ref);
  CHECK_W(
      torch::allclose(mine, want, 1e-5, 1e-8),
      name,
      " on process set ",
      set.id(),
      " differs from the single-process reference: max abs diff ",
      (mine - want).abs().max().item<double>());
  auto all = ronde::allgather(
      mine.unsqueeze(0), ronde::CollectiveOptions().process_set(set));
  for (int q = 1; q < m; ++q)
    CHECK_W(torch::equal(all[q], all[0]), "set rank ", q, " differs");
  // A rank outside a set cannot build an optimizer for it.
  Net stray = make_net(true);
  expect_error(
      [&] {
        ronde::DistributedOptimizer bad(
            make_optimizer("sgd", stray, false),
            stray->named_parameters(),
            ronde::DistributedOptimizerOptions().process_set(other));
      },
      {"not in its process set"});
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Trains until a peer is lost (the test kills a host's ranks after
// "STEP 3"): the survivors must fail with a CommError naming the lost ranks.
RONDE_SCENARIO(train_until_killed) {
  ronde::init();
  torch::manual_seed(3);
  torch::nn::Linear net(256, 256);
  ronde::broadcast_parameters(net->named_parameters(), 0);
  auto base = std::make_shared<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0.01));
  ronde::DistributedOptimizer opt(base, net->named_parameters());
  try {
    for (int step = 0; step < 100000; ++step) {
      opt.zero_grad();
      torch::Tensor x = torch::randn({16, 256});
      torch::mse_loss(net->forward(x), x).backward();
      opt.step();
      std::cout << "STEP " << step << std::endl;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    return 3;
  }
}

}  // namespace
