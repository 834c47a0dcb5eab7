// Scenarios of what changes the numbers on the way: a loss scaler's
// overflow on one rank (every rank skips the step alike) and gradients
// averaged through 16-bit wire formats.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <vector>

namespace {

using namespace ronde::testing;

// An inf in one rank's gradient: every rank skips the same step, backs off
// the scale, and the replicas stay bitwise identical.
RONDE_SCENARIO(amp_overflow) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  torch::manual_seed(5);
  torch::Tensor X = torch::randn({n * 4, 8});
  torch::Tensor Y = torch::randn({n * 4, 4});
  torch::manual_seed(11);
  torch::nn::Linear model(8, 4);
  ronde::broadcast_parameters(model->named_parameters(), 0);
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1));
  ronde::DistributedOptimizer opt(base, model->named_parameters());
  ronde::GradScaler scaler(
      ronde::GradScalerOptions().init_scale(1024).growth_interval(3));
  const int bad_step = 2;
  std::vector<double> want = {1024, 1024, 512, 512, 512, 1024};
  for (int s = 0; s < 6; ++s) {
    opt.zero_grad();
    auto before = torch::cat(
        {model->weight.detach().reshape({-1}), model->bias.detach()});
    auto loss = torch::mse_loss(
        model->forward(X.narrow(0, r * 4, 4)), Y.narrow(0, r * 4, 4));
    // Only the last rank overflows.
    if (s == bad_step && r == n - 1)
      loss = loss * std::numeric_limits<float>::infinity();
    scaler.scale(loss).backward();
    bool stepped = scaler.step(opt);
    scaler.update();
    CHECK_W(stepped == (s != bad_step), "step ", s, " stepped=", stepped);
    CHECK_W(
        scaler.get_scale() == want[s],
        "scale after step ",
        s,
        ": ",
        scaler.get_scale());
    auto after = torch::cat(
        {model->weight.detach().reshape({-1}), model->bias.detach()});
    if (s == bad_step)
      CHECK_W(torch::equal(before, after), "skipped step moved parameters");
    auto all = ronde::allgather(after.unsqueeze(0));
    for (int q = 1; q < n; ++q) {
      CHECK_W(
          torch::equal(all[q], all[0]),
          "replica ",
          q,
          " differs after step ",
          s);
    }
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Averaged gradients through 16-bit wire formats stay within the format's
// rounding of the exact average.
RONDE_SCENARIO(compression) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  for (auto c : {ronde::Compression::FP16, ronde::Compression::BF16}) {
    torch::manual_seed(21);
    torch::nn::Linear model(64, 32);
    auto base = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    ronde::DistributedOptimizer opt(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions().compression(c));
    auto x_of = [](int q) {
      torch::manual_seed(100 + q);
      return torch::randn({16, 64});
    };
    opt.zero_grad();
    model->forward(x_of(r)).pow(2).mean().backward();
    opt.synchronize();
    auto got = model->weight.grad().clone();
    // The exact average, from every rank's input, in double.
    torch::Tensor exact = torch::zeros({32, 64}, torch::kDouble);
    for (int q = 0; q < n; ++q) {
      auto w = model->weight.detach().to(torch::kDouble).requires_grad_();
      auto b = model->bias.detach().to(torch::kDouble);
      auto out = torch::addmm(b, x_of(q).to(torch::kDouble), w.t());
      auto g = torch::autograd::grad({out.pow(2).mean()}, {w})[0];
      exact += g / n;
    }
    double scale = exact.abs().max().item<double>();
    double err =
        (got.to(torch::kDouble) - exact).abs().max().item<double>() / scale;
    // One rounding to the wire format per rank, sums of n terms, one more on
    // the way back: n + 2 units of the format's epsilon, relative to the
    // largest gradient.
    double eps =
        c == ronde::Compression::FP16 ? std::pow(2, -11) : std::pow(2, -8);
    CHECK_W(
        err <= (n + 2) * eps,
        "compression error ",
        err,
        " exceeds ",
        (n + 2) * eps);
    CHECK_W(err > 0, "compression changed nothing: not on the wire?");
    std::cout << "compression "
              << (c == ronde::Compression::FP16 ? "fp16" : "bf16")
              << " max relative error " << err << std::endl;
    opt.step();
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
