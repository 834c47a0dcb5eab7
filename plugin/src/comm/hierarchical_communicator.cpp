// The two-level all-reduce for jobs with several ranks on each of several
// hosts, as Horovod's hierarchical all-reduce: the ranks of each host
// reduce-scatter the tensor among themselves (shared memory), each then
// all-reduces its block with the ranks of the same local rank on the other
// hosts (Gloo over TCP: every local rank's group at once, each carrying
// 1/local_size of the bytes), and the host's ranks all-gather the blocks.
// Every element is reduced by exactly one cross group, in host order, after
// a reduction in rank order within each host, so every rank ends with the
// same bits. Large tensors go in pieces, pipelined: the next piece is
// reduced in memory while the previous one crosses the link. The other
// collectives take the flat Gloo mesh over all ranks.
// See docs/multi_host.md, "Hierarchical all-reduce".
#include "comm/communicator.h"
#include "runtime/topology.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

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
  bool prefers_inline_payloads() const override {
    return flat_->prefers_inline_payloads();  // its all-gathers run there
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
    // Pieces of about kPieceBytes, each split into L blocks.
    const int64_t esize = tensor.element_size();
    const int64_t piece = std::max<int64_t>(L, kPieceBytes / esize);
    std::vector<Piece> pieces;
    int64_t scratch = 0;
    for (int64_t start = 0; start < n; start += pieces.back().count) {
      Piece p;
      p.start = start;
      p.count = std::min(piece, n - start);
      // A tail shorter than L would leave a rank an empty block: the last
      // piece takes it instead.
      if (n - (start + p.count) < L)
        p.count = n - start;
      p.counts.assign(L, p.count / L);
      for (int i = 0; i < p.count % L; ++i)
        ++p.counts[i];
      p.block_offset = scratch;
      scratch += p.counts[local_->rank()];
      pieces.push_back(std::move(p));
    }
    at::Tensor blocks = scratch_for(scratch, tensor);
    at::Tensor flat = tensor.view(-1);
    auto block_of = [&](const Piece& p) {
      return blocks.narrow(0, p.block_offset, p.counts[local_->rank()]);
    };
    auto gather = [&](const Piece& p) {
      std::vector<size_t> bytes(L);
      for (int i = 0; i < L; ++i)
        bytes[i] = static_cast<size_t>(p.counts[i] * esize);
      local_->allgather(block_of(p), flat.narrow(0, p.start, p.count), bytes);
    };
    auto scatter = [&](const Piece& p) {
      local_->reduce_scatter(
          flat.narrow(0, p.start, p.count), block_of(p), p.counts, op);
    };
    if (pieces.size() == 1 || cross_->size() == 1) {
      for (const Piece& p : pieces) {
        scatter(p);
        cross_->allreduce(block_of(p), op);
        gather(p);
      }
      return;
    }
    // A pipeline: this thread reduces piece k+1 within the host (memory,
    // CPU) while a second thread all-reduces piece k across hosts (the
    // link), then gathers piece k. Every local rank runs the shared-memory
    // steps in the same order, and every member of a cross group the cross
    // steps, so the order of each communicator's collectives is fixed.
    Pipeline line;
    std::thread across([&] {
      for (size_t k = 0; k < pieces.size(); ++k) {
        {
          std::unique_lock<std::mutex> lock(line.mutex);
          line.cv.wait(lock, [&] { return line.reduced > k || line.stop; });
          if (line.stop)
            return;
        }
        try {
          cross_->allreduce(block_of(pieces[k]), op);
        } catch (...) {
          std::lock_guard<std::mutex> lock(line.mutex);
          line.error = std::current_exception();
          line.cv.notify_all();
          return;
        }
        std::lock_guard<std::mutex> lock(line.mutex);
        line.crossed = k + 1;
        line.cv.notify_all();
      }
    });
    auto wait_crossed = [&](size_t k) {
      std::unique_lock<std::mutex> lock(line.mutex);
      line.cv.wait(lock, [&] { return line.crossed > k || line.error; });
      if (line.error)
        throw PipelineStopped{};
    };
    try {
      for (size_t k = 0; k < pieces.size(); ++k) {
        scatter(pieces[k]);
        {
          std::lock_guard<std::mutex> lock(line.mutex);
          line.reduced = k + 1;
          line.cv.notify_all();
        }
        if (k > 0) {
          wait_crossed(k - 1);
          gather(pieces[k - 1]);
        }
      }
      wait_crossed(pieces.size() - 1);
      gather(pieces.back());
    } catch (const PipelineStopped&) {
      across.join();
      std::rethrow_exception(line.error);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(line.mutex);
        line.stop = true;
        line.cv.notify_all();
      }
      // The cross step may be blocked on peers that wait for this rank.
      cross_->interrupt();
      across.join();
      throw;
    }
    across.join();
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
  // The engine's buckets in this rank's arena on its host: the reduce-
  // scatter within the host then reads every local rank's bucket where it
  // lies (the pieces are slices of it) instead of copying it in.
  std::optional<at::Tensor> shared_zeros(
      int64_t numel, const at::TensorOptions& options) override {
    return local_->shared_zeros(numel, options);
  }
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
  // Large all-reduces move in pieces of this size, pipelined.
  static constexpr int64_t kPieceBytes = int64_t{8} << 20;

  struct Piece {
    int64_t start = 0, count = 0;  // elements of the flat tensor
    std::vector<int64_t> counts;   // its blocks, one per local rank
    int64_t block_offset = 0;      // this rank's block in the scratch
  };
  struct Pipeline {
    std::mutex mutex;
    std::condition_variable cv;
    size_t reduced = 0;  // pieces reduced within the host
    size_t crossed = 0;  // pieces all-reduced across hosts
    bool stop = false;
    std::exception_ptr error;
  };
  struct PipelineStopped {};

  // This rank's blocks, kept between calls (1/local_size of the largest
  // tensor all-reduced so far) so that a large all-reduce does not fault
  // fresh pages in every time.
  at::Tensor scratch_for(int64_t elements, const at::Tensor& like) {
    const int64_t bytes = elements * like.element_size();
    if (!scratch_.defined() || scratch_.numel() < bytes ||
        scratch_.device() != like.device()) {
      scratch_ = at::empty({bytes}, like.options().dtype(at::kByte));
    }
    return scratch_.narrow(0, 0, bytes).view(like.scalar_type());
  }

  at::Tensor scratch_;
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
    const CommConfig& config,
    const CommGroup& group,
    std::unique_ptr<Communicator> flat) {
  const Topology t = derive_topology(group.hosts, group.rank);
  const bool several_per_host = t.hosts > 1 && t.hosts < group.size;
  if (!config.hierarchical.value_or(several_per_host))
    return flat;
  if (!t.even()) {
    if (group.rank == 0) {
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
    if (t.host_ranks[k].front() == t.local_ranks(group.rank).front())
      host_index = k;
  }
  // A group of this group's ranks under `name` in the store; no host
  // identities: its members are known to share memory or not to.
  auto part = [&](const std::string& name, int rank, int size) {
    CommGroup g;
    g.prefix = group.prefix + name;
    g.rank = rank;
    g.size = size;
    return g;
  };
  auto gloo_group = [&](const std::string& name, int rank, int size) {
    return make_gloo_communicator(config, part(name, rank, size));
  };
  std::unique_ptr<Communicator> local;
  const std::string host_tag = std::to_string(host_index) + "/";
  if (t.local_size == 1) {
    local = make_self_communicator();
  } else if (config.shm.enabled) {
    try {
      local = make_shm_communicator(
          config, part("shm-local/" + host_tag, t.local_rank, t.local_size));
    } catch (const ShmUnavailable& e) {
      if (t.local_rank == 0) {
        std::cerr << "ronde: warning: shared memory is unavailable on rank "
                  << group.rank << "'s host (" << e.what()
                  << "); its ranks reduce through Gloo over loopback"
                  << std::endl;
      }
    }
  }
  if (!local) {
    local = gloo_group("gloo-local/" + host_tag, t.local_rank, t.local_size);
  }
  std::unique_ptr<Communicator> cross =
      t.cross_size == 1
          ? make_self_communicator()
          : gloo_group(
                "gloo-cross/" + std::to_string(t.local_rank) + "/",
                t.cross_rank,
                t.cross_size);
  return std::make_unique<HierarchicalCommunicator>(
      std::move(flat), std::move(local), std::move(cross));
}

}  // namespace ronde::detail
