// ronde as a torch.distributed backend: a c10d::Backend whose operations are
// ronde collectives on a process set, so that DDP, FSDP,
// ZeroRedundancyOptimizer and every torch.distributed call run on ronde's
// data plane (shared memory on one host, hierarchical across hosts).
//
// From Python, `import ronde.torch` registers it as "ronde":
//
//   dist.init_process_group("ronde")            # or "cpu:ronde,cuda:nccl"
//
// From C++, make a c10d::ProcessGroup with it:
//
//   auto pg = ronde::c10d::new_process_group(store, rank, size, timeout);
//   pg->allreduce(tensors)->wait();
//
// The first ronde group of a process that ronde::init() did not start
// initialises ronde through that group's store, as `rank` of `size`, with
// its timeout; when ronde::init() came first, the group must have ronde's
// rank and size, and uses ronde's world as it is. Either way the default
// group and ronde's global process set are one communicator and one worker
// (one order of collectives); a subgroup (new_group) is a process set that
// its members create among themselves. docs/c10d_backend.md has the whole
// contract.
#pragma once

#include <ronde/process_set.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ronde::detail {
class PointToPoint;
}

// Inside namespace ronde, `c10d::` names this namespace once this header
// is seen: ronde's own sources that include it name torch's as `::c10d::`
// (and include their private headers before it).
namespace ronde::c10d {

// What c10d hands a backend it creates.
struct BackendOptions {
  c10::intrusive_ptr<::c10d::Store> store;
  int rank = 0;  // within the group
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // The group's ranks in the default group; empty: the default group
  // itself (every rank, in order).
  std::vector<int> global_ranks;
  // The group's name, the same on every member ("0" for the default
  // group); names a subgroup's keys in the store.
  std::string group_name = "0";
};

class Backend : public ::c10d::Backend {
 public:
  // Joins (or starts, see above) ronde's world and, for a subgroup,
  // connects its process set among its members. Throws ronde::CommError
  // when the ranks do not meet within the timeout, c10::Error for a group
  // that ronde's world cannot serve.
  explicit Backend(const BackendOptions& options);
  ~Backend() override;

  const std::string getBackendName() const override {
    return "ronde";
  }
  // The ronde process set the group's collectives run on.
  const ProcessSet& process_set() const {
    return set_;
  }

  c10::intrusive_ptr<::c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_splits,
      std::vector<int64_t>& input_splits,
      const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> barrier(
      const ::c10d::BarrierOptions& opts) override;
  void monitoredBarrier(
      const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<::c10d::Work> send(
      std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(
      std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override;
  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
  }
  // c10d's sequence numbers, kept as gloo keeps them: 0 when the group is
  // made, one more for each operation this rank starts on it, so that
  // ranks out of step show different numbers.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }

 private:
  // allreduce() of a bool tensor.
  c10::intrusive_ptr<::c10d::Work> allreduce_bool(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts);

  ProcessSet set_;
  std::vector<int> global_ranks_;  // by group rank
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<ronde::detail::PointToPoint> p2p_;  // send and recv
  std::atomic<uint64_t> seq_{0};  // operations started, for c10d
};

// A ProcessGroup whose CPU collectives run on a ronde Backend made from
// these values (BackendOptions for a default group), for C++ programs.
c10::intrusive_ptr<::c10d::ProcessGroup> new_process_group(
    const c10::intrusive_ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout = std::chrono::minutes(30));

}  // namespace ronde::c10d
