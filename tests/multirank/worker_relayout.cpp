// Scenarios of the bucket layout changing under training: buckets rebuilt
// from the order gradients become ready (rebuild), and autotune's search
// for bucket sizes, agreed by every rank and kept by a checkpoint.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// A model that registers its layers in the reverse of the order it uses
// them: reverse registration order then predicts backward wrongly, and the
// first bucket (the first layer's) is ready only when backward ends.
struct ShuffledImpl : torch::nn::Module {
  ShuffledImpl() {
    c = register_module("c", torch::nn::Linear(16, 4));
    b = register_module("b", torch::nn::Linear(16, 16));
    a = register_module("a", torch::nn::Linear(8, 16));
  }
  torch::Tensor forward(torch::Tensor x) {
    return c->forward(torch::tanh(b->forward(torch::tanh(a->forward(x)))));
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Shuffled);

Shuffled make_shuffled() {
  torch::manual_seed(11);
  Shuffled net;
  net->to(torch::kDouble);
  return net;
}

// The buckets rebuilt from the first step's ready order: the first bucket
// then launches while backward still runs, and training still equals one
// process over the global batch (SGD or Adam; with rebuild_buckets(false)
// the layout stays as it was).
int scenario_rebuild(const std::string& name, bool rebuild) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const int64_t b = 4;
  torch::manual_seed(7);
  torch::Tensor X = torch::randn({n * b, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({n * b, 4}, torch::kDouble);
  auto make_opt =
      [&](Shuffled& net) -> std::shared_ptr<torch::optim::Optimizer> {
    if (name == "adam")
      return std::make_shared<torch::optim::Adam>(
          net->parameters(), torch::optim::AdamOptions(0.01));
    return std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.05));
  };
  Shuffled ref = make_shuffled();
  auto ref_opt = make_opt(ref);
  Shuffled net = make_shuffled();
  ronde::DistributedOptimizer opt(
      make_opt(net),
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .fusion_threshold_mb(0.001)
          .first_bucket_mb(0.0005)
          .rebuild_buckets(rebuild));
  const auto before = opt.buckets();
  std::vector<int64_t> first_launch;
  for (int s = 0; s < 12; ++s) {
    ref_opt->zero_grad();
    torch::mse_loss(ref->forward(X), Y).backward();
    ref_opt->step();
    opt.zero_grad();
    torch::mse_loss(net->forward(X.narrow(0, r * b, b)), Y.narrow(0, r * b, b))
        .backward();
    opt.step();
    first_launch.push_back(opt.last_step_profile().hooks_before_launch[0]);
  }
  const auto after = opt.buckets();
  const int64_t hooks = opt.last_step_profile().hooks;
  CHECK_W(hooks == 6, "hooks ", hooks);
  CHECK_W(
      before.front().front().rfind("a.", 0) == 0,
      "the first bucket did not start with layer a: ",
      before.front().front());
  CHECK_W(
      first_launch[0] == hooks,
      "before the rebuild the first bucket should wait for all ",
      hooks,
      " gradients, launched after ",
      first_launch[0]);
  if (rebuild) {
    CHECK_W(
        after.front().front().rfind("c.", 0) == 0,
        "rebuilt buckets should start with layer c: ",
        after.front().front());
    CHECK_W(
        first_launch.back() < hooks,
        "after the rebuild the first bucket still launched after ",
        first_launch.back(),
        " of ",
        hooks);
  } else {
    CHECK_W(after == before, "rebuild_buckets(false) changed the buckets");
    CHECK_W(first_launch.back() == hooks, "layout changed without rebuild");
  }
  std::cout << "first bucket launched after " << first_launch.front()
            << " then " << first_launch.back() << " of " << hooks
            << " gradients" << std::endl;
  auto mine = params_flat(*net), want = params_flat(*ref);
  CHECK_W(
      torch::allclose(mine, want, 1e-6, 1e-9),
      "differs from one process: ",
      (mine - want).abs().max().item<double>());
  check_replicas_identical(mine);
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(rebuild) {
  return scenario_rebuild(
      argc > 2 ? argv[2] : "sgd", !(argc > 3 && std::string(argv[3]) == "off"));
}

// Autotune: every rank times steps with an injected clock whose costs
// disagree (rank 0 finds fewer buckets faster, the others more), yet all
// switch together and end on rank 0's choice; the training still equals
// one process; a checkpoint brings the choice back without a new search.
RONDE_SCENARIO(autotune) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  torch::manual_seed(3);
  // Four 1 MiB weights: bucket sizes from 0.5 to 4 MiB lay out differently.
  torch::nn::Sequential model;
  for (int i = 0; i < 4; ++i)
    model->push_back(torch::nn::Linear(512, 512));
  torch::nn::Sequential ref;
  for (int i = 0; i < 4; ++i)
    ref->push_back(torch::nn::Linear(512, 512));
  {
    torch::NoGradGuard g;
    auto src = model->parameters();
    auto dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].copy_(src[i]);
  }
  ronde::broadcast_parameters(model->named_parameters(), 0);
  double fake_seconds = 0;
  auto options = ronde::DistributedOptimizerOptions()
                     .autotune(true)
                     .autotune_warmup_steps(0)
                     // The fewest steps whose times can leave the starting
                     // sizes (autotune.h: the Mann-Whitney test).
                     .autotune_steps_per_trial(3)
                     .autotune_clock([&] { return fake_seconds; });
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.01));
  auto ref_opt = std::make_shared<torch::optim::SGD>(
      ref->parameters(), torch::optim::SGDOptions(0.01));
  auto opt = std::make_unique<ronde::DistributedOptimizer>(
      base, model->named_parameters(), options);
  const int64_t b = 2;
  torch::manual_seed(8);
  torch::Tensor X = torch::randn({50, n * b, 512});
  int steps = 0;
  for (; steps < 50 && !opt->bucket_sizing().autotuned; ++steps) {
    ref_opt->zero_grad();
    ref->forward(X[steps]).pow(2).mean().backward();
    ref_opt->step();
    opt->zero_grad();
    model->forward(X[steps].narrow(0, r * b, b)).pow(2).mean().backward();
    const double buckets = static_cast<double>(opt->buckets().size());
    fake_seconds += r == 0 ? buckets : 1.0 / buckets;
    opt->step();
  }
  const ronde::BucketSizing chosen = opt->bucket_sizing();
  CHECK_W(chosen.autotuned, "autotune did not finish in ", steps, " steps");
  CHECK_W(steps <= 49, "autotune took ", steps, " steps");  // 16 trials of 3
  at::Tensor mine = at::tensor(
      std::vector<double>{
          chosen.fusion_threshold_mb,
          chosen.first_bucket_mb,
          static_cast<double>(opt->buckets().size())},
      at::kDouble);
  at::Tensor all = ronde::allgather(mine.unsqueeze(0));
  for (int q = 1; q < n; ++q)
    CHECK_W(torch::equal(all[q], all[0]), "rank ", q, " chose otherwise");
  // Rank 0's clock favours one bucket for all four weights.
  CHECK_W(
      opt->buckets().size() == 1 && chosen.fusion_threshold_mb >= 4,
      "expected rank 0's choice (one bucket), got ",
      opt->buckets().size(),
      " buckets of ",
      chosen.fusion_threshold_mb,
      " MiB");
  const auto trained = params_flat(*model), expected = params_flat(*ref);
  CHECK_W(
      torch::allclose(trained, expected, 1e-4, 1e-6),
      "autotuned training differs from one process: ",
      (trained - expected).abs().max().item<float>());
  // The choice survives a checkpoint: a new optimizer that loads it does
  // not search again.
  std::stringstream saved;
  torch::save(*opt, saved);
  opt.reset();  // its hooks go before the next optimizer's come
  ronde::DistributedOptimizer again(
      std::make_shared<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.01)),
      model->named_parameters(),
      options);
  torch::load(again, saved);
  for (int s = 0; s < 4; ++s) {
    again.zero_grad();
    model->forward(X[s].narrow(0, r * b, b)).pow(2).mean().backward();
    fake_seconds += 1;
    again.step();
  }
  const ronde::BucketSizing restored = again.bucket_sizing();
  CHECK_W(
      restored.autotuned &&
          restored.fusion_threshold_mb == chosen.fusion_threshold_mb &&
          restored.first_bucket_mb == chosen.first_bucket_mb,
      "the checkpoint did not restore autotune's choice: ",
      restored.fusion_threshold_mb,
      " MiB");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
