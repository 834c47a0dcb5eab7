// Scenarios of what the optimizer and the data see of the job's size: LR
// scaling and warmup (never compounding), and the distributed sampler's
// disjoint shards.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

namespace {

using namespace ronde::testing;

// LR scaling at construction, never compounding.
RONDE_SCENARIO(lr_scaling) {
  ronde::init();
  const int n = ronde::size();
  torch::nn::Linear model(4, 2);
  auto lr_of = [](torch::optim::Optimizer& o) {
    return o.param_groups()[0].options().get_lr();
  };
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1));
  {
    ronde::DistributedOptimizer opt(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions().lr_scaling(
            ronde::LrScaling::Linear));
    CHECK_W(std::abs(lr_of(*base) - 0.1 * n) < 1e-12, "linear: ", lr_of(*base));
    CHECK_W(
        std::abs(lr_of(opt) - 0.1 * n) < 1e-12,
        "seen through the wrapper: ",
        lr_of(opt));
    // Warmup from the base LR to the scaled LR, multiplier read from opt.
    ronde::WarmupScheduler sched(opt, ronde::WarmupOptions().warmup_steps(4));
    CHECK_W(
        std::abs(lr_of(*base) - 0.1) < 1e-12,
        "warmup starts at the base LR: ",
        lr_of(*base));
    for (int i = 0; i < 4; ++i)
      sched.step();
    CHECK_W(
        std::abs(lr_of(*base) - 0.1 * n) < 1e-12,
        "warmup ends at the scaled LR");
  }
  // Unwrapped: the wrapper divided its scaling back out.
  CHECK_W(
      std::abs(lr_of(*base) - 0.1) < 1e-12,
      "after the wrapper: ",
      lr_of(*base));
  {
    // Wrapped a second time: still base x n, not base x n x n.
    ronde::DistributedOptimizer opt(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .lr_scaling(ronde::LrScaling::Linear)
            .backward_passes_per_step(2));
    CHECK_W(
        std::abs(lr_of(*base) - 0.1 * n * 2) < 1e-12,
        "rewrapped: ",
        lr_of(*base));
    torch::serialize::OutputArchive out;
    opt.save(out);
    std::stringstream ss;
    out.save_to(ss);
    torch::serialize::InputArchive in;
    in.load_from(ss);
    opt.load(in);
    CHECK_W(
        std::abs(lr_of(*base) - 0.1 * n * 2) < 1e-12,
        "after load: ",
        lr_of(*base));
  }
  {
    auto fresh = std::make_shared<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(0.01));
    ronde::DistributedOptimizer opt(
        fresh,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions().lr_scaling(
            ronde::LrScaling::Sqrt));
    CHECK_W(
        std::abs(lr_of(*fresh) - 0.01 * std::sqrt(n)) < 1e-12,
        "sqrt: ",
        lr_of(*fresh));
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Each rank's shard is disjoint from the others' and all of them together
// are the dataset.
RONDE_SCENARIO(sampler) {
  ronde::init();
  const int n = ronde::size();
  for (int64_t epoch : {0, 1}) {
    ronde::DistributedSampler sampler(
        1001, ronde::DistributedSamplerOptions().seed(9));
    sampler.set_epoch(epoch);
    std::vector<int64_t> mine;
    while (auto b = sampler.next(64))
      mine.insert(mine.end(), b->begin(), b->end());
    auto all = ronde::allgather(
        torch::tensor(mine).unsqueeze(0));  // same length everywhere
    CHECK_W(all.size(0) == n, "ranks read different amounts");
    auto flat = all.reshape({-1});
    auto unique = std::get<0>(torch::_unique(flat));
    CHECK_W(
        unique.numel() == 1001, "union covers ", unique.numel(), " of 1001");
    CHECK_W(
        flat.numel() == ((1001 + n - 1) / n) * n,
        "padded to a multiple of ranks");
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
