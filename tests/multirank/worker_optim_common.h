// What the optimizer scenarios share: the small model, the optimizers they
// wrap (the built-in ones and a user-defined one), and the comparisons of
// parameters with a single-process reference and across replicas.
#pragma once

#include "test_net.h"

#include <torch/torch.h>

#include <memory>
#include <string>

namespace ronde::testing {

// The scenarios' Net, seeded alike on every rank, in double.
Net make_net(bool use_extra);

// "sgd", "sgd_nesterov", "adam", "adamw", "rmsprop", "adagrad", "lbfgs" or
// "custom" (a user-defined SGD) over `net`; with two_groups, the first two
// layers form a group of their own at half the LR.
std::shared_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, Net& net, bool two_groups);

// Every parameter of `m`, flattened into one tensor.
torch::Tensor params_flat(const torch::nn::Module& m);

// Replicas identical, bit for bit: every rank's `mine` equals rank 0's.
void check_replicas_identical(const torch::Tensor& mine);

}  // namespace ronde::testing
