// The model, optimizers and comparisons the optimizer scenarios share
// (worker_optim_common.h).
#include "worker_optim_common.h"

#include <ronde/collectives.h>
#include <ronde/runtime.h>

#include "worker_checks.h"

#include <vector>

namespace ronde::testing {
namespace {

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

}  // namespace

Net make_net(bool use_extra) {
  torch::manual_seed(42);
  Net net(8, 16, 4, use_extra);
  net->to(torch::kDouble);
  return net;
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

}  // namespace ronde::testing
