// The two-level all-reduce for jobs with several ranks on each of several
// hosts, as Horovod's hierarchical all-reduce: the ranks of each host
// reduce-scatter the tensor among themselves (shared memory), each then
// all-reduces its block with the ranks of the same local rank on the other
// hosts (Gloo over TCP: every local rank's group at once, each carrying
// 1/local_size of the bytes), and the host's ranks all-gather the blocks.
// Every element is reduced by exactly one cross group, in host order, after
// a reduction in rank order within each host, so every rank ends with the
// same bits. The other collectives take the flat Gloo mesh over all ranks.
#include "comm/communicator.h"
#include "runtime/topology.h"

#include <ATen/ATen.h>

#include <iostream>

namespace ronde::detail {
namespace {

class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(
      std::unique_ptr<Communicator> flat,
      std::unique_ptr<Communicator> local,
      std::unique_ptr<Communicator> cross)
      : flat_(std::move(flat)),
        local_(std::move(local)),
        cross_(std::move(cross)) {}

  const char* backend() const override {
    return "hierarchical";
  }
  int rank() const override {
    return flat_->rank();
  }
  int size() const override {
    return flat_->size();
  }

  void allreduce(const at::Tensor& tensor, BackendOp op) override {
    const int64_t n = tensor.numel();
    const int L = local_->size();
    if (n < L) {
      // Too small to split: every local rank carries the whole host sum
      // across, in its own group; the groups compute the same bits.
      local_->allreduce(tensor, op);
      cross_->allreduce(tensor, op);
      return;
    }
    std::vector<int64_t> counts(L, n / L);
    for (int i = 0; i < n % L; ++i)
      ++counts[i];
    const int me = local_->rank();
    at::Tensor flat = tensor.view(-1);
    at::Tensor block = at::empty({counts[me]}, tensor.options());
    local_->reduce_scatter(flat, block, counts, op);
    if (cross_->size() > 1)
      cross_->allreduce(block, op);
    std::vector<size_t> bytes(L);
    for (int i = 0; i < L; ++i)
      bytes[i] = static_cast<size_t>(counts[i]) * tensor.element_size();
    local_->allgather(block, flat, bytes);
  }
  void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) override {
    flat_->allgather(in, out, bytes);
  }
  void broadcast(const at::Tensor& tensor, int root) override {
    flat_->broadcast(tensor, root);
  }
  void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) override {
    flat_->alltoall(in, send_bytes, out, recv_bytes);
  }
  // reduce_scatter: the default, over this all-reduce.
  void barrier() override {
    flat_->barrier();
  }
  void abort() override {
    cross_->abort();
    local_->abort();
    flat_->abort();
  }
  void interrupt() override {
    cross_->interrupt();
    local_->interrupt();
    flat_->interrupt();
  }

 private:
  std::unique_ptr<Communicator> flat_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Communicator> cross_;
};

std::string layout_text(const Topology& t) {
  std::string out;
  for (const auto& h : t.host_ranks)
    out += (out.empty() ? "" : ",") + std::to_string(h.size());
  return out;
}

}  // namespace

std::unique_ptr<Communicator> make_hierarchical_communicator(
    const CommConfig& config, std::unique_ptr<Communicator> flat) {
  const Topology t = derive_topology(config.hosts, config.rank);
  const bool several_per_host = t.hosts > 1 && t.hosts < config.size;
  if (!config.hierarchical.value_or(several_per_host))
    return flat;
  if (!t.even()) {
    if (config.rank == 0) {
      std::cerr << "ronde: the hosts run uneven numbers of ranks ("
                << layout_text(t)
                << "): all-reduces take the flat ring, not the "
                   "hierarchical one"
                << std::endl;
    }
    return flat;
  }
  // Host k (in the order of its lowest rank) and local rank j name the
  // groups; every member builds its groups in the same order.
  size_t host_index = 0;
  for (size_t k = 0; k < t.host_ranks.size(); ++k) {
    if (t.host_ranks[k].front() == t.local_ranks(config.rank).front())
      host_index = k;
  }
  auto gloo_group = [&](const std::string& name, int rank, int size) {
    return make_gloo_communicator(
        config.store,
        config.prefix + name,
        rank,
        size,
        config.hostname,
        config.timeout,
        config.host_algorithm,
        config.gloo);
  };
  std::unique_ptr<Communicator> local;
  const std::string host_tag = std::to_string(host_index) + "/";
  if (t.local_size == 1) {
    local = make_self_communicator();
  } else if (config.shm.enabled) {
    try {
      local = make_shm_communicator(
          config.store,
          config.prefix + "shm-local/" + host_tag,
          t.local_rank,
          t.local_size,
          config.timeout,
          config.shm);
    } catch (const ShmUnavailable& e) {
      if (t.local_rank == 0) {
        std::cerr << "ronde: warning: shared memory is unavailable on rank "
                  << config.rank << "'s host (" << e.what()
                  << "); its ranks reduce through Gloo over loopback"
                  << std::endl;
      }
    }
  }
  if (!local) {
    local =
        gloo_group("gloo-local/" + host_tag, t.local_rank, t.local_size);
  }
  std::unique_ptr<Communicator> cross = t.cross_size == 1
      ? make_self_communicator()
      : gloo_group(
            "gloo-cross/" + std::to_string(t.local_rank) + "/",
            t.cross_rank,
            t.cross_size);
  return std::make_unique<HierarchicalCommunicator>(
      std::move(flat), std::move(local), std::move(cross));
}

}  // namespace ronde::detail
