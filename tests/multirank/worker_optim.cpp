// DistributedOptimizer scenarios for the multirank worker. Each trains the
// same small model twice: once distributed (every rank on its shard of the
// global batch) and once as a single process on the whole global batch, in
// the same program, and compares the parameters after 20 steps.
#include <ronde/ronde.h>

#include "test_net.h"
#include "worker_checks.h"

#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>

namespace {

using ronde::testing::expect_error;

using ronde::testing::Net;

Net make_net(bool use_extra) {
  torch::manual_seed(42);
  Net net(8, 16, 4, use_extra);
  net->to(torch::kDouble);
  return net;
}

// A user-defined optimizer: plain SGD written against the Optimizer API.
struct PlainSgdOptions
    : torch::optim::OptimizerCloneableOptions<PlainSgdOptions> {
  explicit PlainSgdOptions(double lr) : lr_(lr) {}
  TORCH_ARG(double, lr);
  double get_lr() const override {
    return lr();
  }
  void set_lr(const double lr) override {
    this->lr(lr);
  }
};

class PlainSgd : public torch::optim::Optimizer {
 public:
  PlainSgd(
      const std::vector<torch::optim::OptimizerParamGroup>& groups,
      PlainSgdOptions defaults)
      : Optimizer(groups, std::make_unique<PlainSgdOptions>(defaults)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure)
      loss = closure();
    for (auto& group : param_groups()) {
      double lr = group.options().get_lr();
      for (auto& p : group.params()) {
        if (p.grad().defined())
          p.add_(p.grad(), -lr);
      }
    }
    return loss;
  }
};

using Groups = std::vector<torch::optim::OptimizerParamGroup>;

// Two groups when asked: the first two layers (given half the LR below).
Groups make_groups(Net& net, bool two_groups) {
  if (!two_groups)
    return {torch::optim::OptimizerParamGroup(net->parameters())};
  std::vector<torch::Tensor> first, rest;
  for (auto& item : net->named_parameters()) {
    (item.key().rfind("fc1", 0) == 0 || item.key().rfind("fc2", 0) == 0 ? first
                                                                        : rest)
        .push_back(item.value());
  }
  return {
      torch::optim::OptimizerParamGroup(first),
      torch::optim::OptimizerParamGroup(rest)};
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, Net& net, bool two_groups) {
  Groups groups = make_groups(net, two_groups);
  std::shared_ptr<torch::optim::Optimizer> opt;
  if (name == "sgd") {
    opt = std::make_shared<torch::optim::SGD>(
        groups, torch::optim::SGDOptions(0.05).momentum(0.9));
  } else if (name == "sgd_nesterov") {
    opt = std::make_shared<torch::optim::SGD>(
        groups,
        torch::optim::SGDOptions(0.05)
            .momentum(0.9)
            .nesterov(true)
            .weight_decay(1e-3));
  } else if (name == "adam") {
    opt = std::make_shared<torch::optim::Adam>(
        groups, torch::optim::AdamOptions(1e-2));
  } else if (name == "adamw") {
    opt = std::make_shared<torch::optim::AdamW>(
        groups, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  } else if (name == "rmsprop") {
    opt = std::make_shared<torch::optim::RMSprop>(
        groups, torch::optim::RMSpropOptions(1e-3).momentum(0.5));
  } else if (name == "adagrad") {
    opt = std::make_shared<torch::optim::Adagrad>(
        groups, torch::optim::AdagradOptions(0.05));
  } else if (name == "lbfgs") {
    opt = std::make_shared<torch::optim::LBFGS>(
        groups, torch::optim::LBFGSOptions(0.5).max_iter(4));
  } else if (name == "custom") {
    opt = std::make_shared<PlainSgd>(groups, PlainSgdOptions(0.1));
  } else {
    TORCH_CHECK(false, "unknown optimizer ", name);
  }
  if (two_groups)
    opt->param_groups()[0].options().set_lr(
        opt->param_groups()[0].options().get_lr() * 0.5);
  return opt;
}

// Every parameter of `m`, flattened into one tensor.
torch::Tensor params_flat(const torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters())
    v.push_back(p.detach().reshape({-1}));
  return torch::cat(v);
}

// Replicas identical, bit for bit: every rank's `mine` equals rank 0's.
void check_replicas_identical(const torch::Tensor& mine) {
  auto all = ronde::allgather(mine.unsqueeze(0));
  for (int q = 1; q < ronde::size(); ++q) {
    CHECK_W(torch::equal(all[q], all[0]), "rank ", q, " differs from rank 0");
  }
}

int scenario_optim(const std::string& name, const std::string& variant) {
  // Settings are read once, at init().
  if (variant == "copywhole")
    ::setenv("RONDE_BUCKET_COPY", "whole", 1);
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
  const bool small = variant == "smallbuckets" || copy_whole;
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
  std::cout << "buckets: " << opt.buckets().size() << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

int scenario_optim_errors() {
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
int scenario_optim_overlap() {
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

// An inf in one rank's gradient: every rank skips the same step, backs off
// the scale, and the replicas stay bitwise identical.
int scenario_amp_overflow() {
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
int scenario_compression() {
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

// LR scaling at construction, never compounding.
int scenario_lr_scaling() {
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
int scenario_sampler() {
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
  auto make_opt = [&](Shuffled& net) -> std::shared_ptr<torch::optim::Optimizer> {
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
    torch::mse_loss(
        net->forward(X.narrow(0, r * b, b)), Y.narrow(0, r * b, b))
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

// Autotune: every rank times steps with an injected clock whose costs
// disagree (rank 0 finds fewer buckets faster, the others more), yet all
// switch together and end on rank 0's choice; the training still equals
// one process; a checkpoint brings the choice back without a new search.
int scenario_autotune() {
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
                     .autotune_steps_per_trial(1)
                     .autotune_clock([&] { return fake_seconds; });
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.01));
  auto ref_opt = std::make_shared<torch::optim::SGD>(
      ref->parameters(), torch::optim::SGDOptions(0.01));
  auto opt = std::make_unique<ronde::DistributedOptimizer>(
      base, model->named_parameters(), options);
  const int64_t b = 2;
  torch::manual_seed(8);
  torch::Tensor X = torch::randn({30, n * b, 512});
  int steps = 0;
  for (; steps < 30 && !opt->bucket_sizing().autotuned; ++steps) {
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
  CHECK_W(steps <= 16, "autotune took ", steps, " steps");
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

// Trains until a peer is lost (the test kills a host's ranks after
// "STEP 3"): the survivors must fail with a CommError naming the lost ranks.
int scenario_train_until_killed() {
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

// Returns -1 for a name that is not an optimizer scenario.
// Two halves of the job train two models at once, each averaging over its
// own process set (sets of one rank at 2 and 3 ranks): each model equals
// one process trained on its half's global batch, with the LR scaled by the
// half's size; the job's own collectives run between the steps.
int scenario_two_models() {
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

// Uneven inputs: rank r has kJoinBatches[r] steps of data (10, 7, 3, 5)
// and then calls ronde::join(). The last to join (rank 0) must end where
// one process ends that trains on the same batches in the same order, each
// step averaging over the ranks that still had data (variant "setsize":
// dividing by the set's size); "bpps2": two backward passes per step;
// "set": everything on a process set of every rank; "amp": rank 0's loss
// overflows at step 5, after rank 2 joined, and the step is skipped.
constexpr int kJoinBatches[] = {10, 7, 3, 5};

int scenario_join(const std::string& variant) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  ronde::ProcessSet set;
  if (variant == "set") {
    std::vector<int> all;
    for (int q = n - 1; q >= 0; --q)
      all.push_back(q);
    set = ronde::add_process_set(all);
  }
  const bool by_set = variant == "setsize";
  const bool amp = variant == "amp";
  const int64_t k = variant == "bpps2" ? 2 : 1;
  const int64_t rows = 4;
  const int bad_step = 5;
  int steps = 0;
  for (int q = 0; q < n; ++q)
    steps = std::max(steps, kJoinBatches[q]);
  torch::manual_seed(21);
  torch::Tensor X = torch::randn({steps, k, n, rows, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({steps, k, n, rows, 4}, torch::kDouble);
  auto active_at = [&](int s) {
    std::vector<int> a;
    for (int q = 0; q < n; ++q) {
      if (s < kJoinBatches[q])
        a.push_back(q);
    }
    return a;
  };

  Net ref = make_net(true);
  auto ref_opt = make_optimizer("sgd", ref, false);
  for (int s = 0; s < steps; ++s) {
    const std::vector<int> a = active_at(s);
    if (amp && s == bad_step)
      continue;  // every rank skips it
    ref_opt->zero_grad();
    torch::Tensor loss = torch::zeros({}, torch::kDouble);
    for (int64_t j = 0; j < k; ++j) {
      for (int q : a)
        loss = loss + torch::mse_loss(ref->forward(X[s][j][q]), Y[s][j][q]);
    }
    (loss / (static_cast<double>(by_set ? n : a.size()) * k)).backward();
    ref_opt->step();
  }

  Net net = make_net(true);
  ronde::broadcast_parameters(net->named_parameters(), 0, set);
  auto base = make_optimizer("sgd", net, false);
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .process_set(set)
          .backward_passes_per_step(k)
          .divide_by_set_size(by_set)
          .fusion_threshold_mb(0.001)
          .first_bucket_mb(0.0005));
  ronde::GradScaler scaler(ronde::GradScalerOptions().init_scale(1024));
  for (int s = 0; s < kJoinBatches[me]; ++s) {
    const std::vector<int> a = active_at(s);
    // Another collective each step, which joined ranks answer with zeros:
    // the sum of the active ranks' losses (their replicas are equal).
    double want = 0;
    {
      torch::NoGradGuard g;
      for (int q : a)
        want += torch::mse_loss(net->forward(X[s][0][q]), Y[s][0][q])
                    .item<double>();
    }
    opt.zero_grad();
    for (int64_t j = 0; j < k; ++j) {
      auto loss = torch::mse_loss(net->forward(X[s][j][me]), Y[s][j][me]);
      if (j == 0) {
        at::Tensor sum = ronde::allreduce(
            loss.detach().reshape({1}),
            ronde::AllreduceOptions()
                .op(ronde::ReduceOp::Sum)
                .name("loss")
                .process_set(set));
        CHECK_W(
            std::abs(sum.item<double>() - want) < 1e-9 * (1 + want),
            "step ",
            s,
            ": the loss sum over the active ranks is ",
            sum.item<double>(),
            ", expected ",
            want);
      }
      if (amp) {
        if (s == bad_step && me == 0)
          loss = loss * std::numeric_limits<double>::infinity();
        scaler.scale(loss).backward();
      } else {
        loss.backward();
      }
    }
    if (amp) {
      const bool stepped = scaler.step(opt);
      scaler.update();
      CHECK_W(stepped == (s != bad_step), "step ", s, " stepped=", stepped);
    } else {
      opt.step();
    }
  }
  const int last = ronde::join(set);
  CHECK_W(last == 0, "join() returned ", last, ", expected rank 0");
  ronde::broadcast_parameters(net->named_parameters(), last, set);
  auto mine = params_flat(*net);
  auto want = params_flat(*ref);
  CHECK_W(
      torch::allclose(mine, want, 1e-7, 1e-10),
      "join/",
      variant,
      " differs from the single-process reference: max abs diff ",
      (mine - want).abs().max().item<double>());
  // A second join by every rank at once: the highest rank counts as last,
  // and the job goes on.
  const int again = ronde::join(set);
  CHECK_W(again == n - 1, "second join() returned ", again);
  at::Tensor one = ronde::allreduce(
      torch::ones({1}),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).process_set(set));
  CHECK_W(one.item<float>() == n, "allreduce after join");
  // A joined rank cannot be a broadcast's root: every rank fails alike.
  if (me == n - 1) {
    expect_error(
        [&] { ronde::join(set); },
        {"broadcast 'from_joined' from rank " + std::to_string(n - 1),
         "in ronde::join()"});
  } else {
    expect_error(
        [&] {
          ronde::broadcast(
              torch::ones({2}),
              n - 1,
              ronde::CollectiveOptions().name("from_joined").process_set(set));
        },
        {"broadcast 'from_joined' from rank " + std::to_string(n - 1),
         "in ronde::join()"});
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Ranks 0 and 1 run out of data and wait in join() while the last rank
// trains on, then dies: they fail with a CommError, within the timeout.
int scenario_join_killed() {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  Net net = make_net(true);
  ronde::DistributedOptimizer opt(
      make_optimizer("sgd", net, false), net->named_parameters());
  torch::manual_seed(3);
  torch::Tensor X = torch::randn({4, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({4, 4}, torch::kDouble);
  const int mine = me == n - 1 ? 6 : 2;
  for (int s = 0; s < mine; ++s) {
    if (me == n - 1 && s == 4)
      ::kill(::getpid(), SIGKILL);
    opt.zero_grad();
    torch::mse_loss(net->forward(X), Y).backward();
    opt.step();
  }
  try {
    ronde::join();
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    return 3;
  }
}

int run_optim_scenario(int argc, char** argv) {
  std::string name = argc > 1 ? argv[1] : "";
  if (name == "optim") {
    return scenario_optim(
        argc > 2 ? argv[2] : "sgd", argc > 3 ? argv[3] : "plain");
  }
  if (name == "optim_errors")
    return scenario_optim_errors();
  if (name == "optim_overlap")
    return scenario_optim_overlap();
  if (name == "amp_overflow")
    return scenario_amp_overflow();
  if (name == "compression")
    return scenario_compression();
  if (name == "lr_scaling")
    return scenario_lr_scaling();
  if (name == "sampler")
    return scenario_sampler();
  if (name == "train_until_killed")
    return scenario_train_until_killed();
  if (name == "rebuild") {
    return scenario_rebuild(
        argc > 2 ? argv[2] : "sgd", !(argc > 3 && std::string(argv[3]) == "off"));
  }
  if (name == "autotune")
    return scenario_autotune();
  if (name == "two_models")
    return scenario_two_models();
  if (name == "join")
    return scenario_join(argc > 2 ? argv[2] : "contrib");
  if (name == "join_killed")
    return scenario_join_killed();
  return -1;
}
