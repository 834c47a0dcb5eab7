// The optimizer state of a sharded DistributedOptimizer, moved between its
// shards and the consolidated form: the format an unsharded optimizer
// saves (LibTorch's: "state" by parameter, "param_groups" with each
// group's parameters and options), assembled from every rank's shards and
// sliced back into them. Element-wise state (tensors shaped like the
// piece) is concatenated; any other value (a step count) must agree across
// a parameter's pieces. Also how state follows a change of bucket layout.
#pragma once

#include <ronde/process_set.h>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ronde::detail {

// Where a shard of the wrapped optimizer sits: its parameter's position
// among the full groups (group, index) and its elements there.
struct ShardSpot {
  int64_t group = 0;
  int64_t index = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};
// By group, in the order of the wrapped optimizer's (shard) parameters.
using ShardSpots = std::vector<std::vector<ShardSpot>>;
// The user's groups of full parameters.
using FullGroups = std::vector<std::vector<at::Tensor>>;

struct FullState {
  // [group][index]: the parameter's state by name (empty: none).
  std::vector<std::vector<std::map<std::string, c10::IValue>>> params;
  // Per group, read from a saved state; empty: the wrapped optimizer's own.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
};

// What `out` holds, readable as `in` (through LibTorch's zip format: the
// one way between the two archive kinds).
void reopen(
    torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in);

// Whether shard_optimizer_state may split this optimizer's parameters;
// throws naming it and why not.
void check_elementwise(const torch::optim::Optimizer& optimizer);

// This rank's shards' state (the wrapped optimizer's save()) with where each
// shard sits, as bytes.
std::string shard_blob(
    const torch::optim::Optimizer& wrapped, const ShardSpots& spots);
// The full state from every rank's blobs.
FullState assemble(
    const std::vector<std::string>& blobs, const FullGroups& groups);

// LibTorch's optimizer format, as an unsharded optimizer over `groups`
// would write it, with `wrapped`'s group options.
void write_full(
    torch::serialize::OutputArchive& archive,
    const FullState& full,
    const torch::optim::Optimizer& wrapped,
    const FullGroups& groups);
// That format (an unsharded job's, or write_full's) as a FullState.
FullState read_full(
    torch::serialize::InputArchive& archive,
    const torch::optim::Optimizer& wrapped,
    const FullGroups& groups);
// Replaces the wrapped optimizer's state by this rank's slices of `full`
// (its groups hold the shards at `spots`), and its group options by the
// saved ones when `full` has them.
void load_slices(
    torch::optim::Optimizer& wrapped,
    const FullState& full,
    const ShardSpots& spots,
    const FullGroups& groups);

}  // namespace ronde::detail
