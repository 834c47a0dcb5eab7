// The shared-memory backend as a Communicator: tensors to raw buffers for
// comm/shm/shm_transport, the job's store as its rendezvous, and its
// failures as BackendFailure. Device tensors are staged through host
// memory, as for Gloo.
#include "comm/communicator.h"
#include "comm/host_types.h"
#include "comm/shm/shm_arena.h"
#include "comm/shm/shm_transport.h"
#include "runtime/error_text.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <mutex>

namespace ronde::detail {
namespace {

CommError::Kind error_kind(shm::Failure::Kind k) {
  switch (k) {
    case shm::Failure::Kind::Timeout:
      return CommError::Kind::Timeout;
    case shm::Failure::Kind::Broken:
    case shm::Failure::Kind::Interrupted:
      return CommError::Kind::Broken;
    case shm::Failure::Kind::PeerGone:
      return CommError::Kind::PeerFailure;
  }
  return CommError::Kind::PeerFailure;
}

class ShmCommunicator final : public Communicator {
 public:
  explicit ShmCommunicator(std::unique_ptr<shm::Transport> transport)
      : transport_(std::move(transport)) {}

  const char* backend() const override {
    return "shm";
  }
  // A round trip costs about what copying the frames does (measured: 4 KiB
  // inline was slower than a header and the all-reduce).
  bool prefers_inline_payloads() const override {
    return false;
  }
  int rank() const override {
    return transport_->rank();
  }
  int size() const override {
    return transport_->size();
  }

  void allreduce(const at::Tensor& tensor, BackendOp op) override {
    allreduce_host(tensor, op, 1.0);
  }
  bool allreduce_scaled(
      const at::Tensor& tensor, BackendOp op, double scale) override {
    const auto dtype =
        static_cast<DType>(checked_host_dtype(tensor, "shared-memory"));
    if (!shm::Transport::can_scale(dtype))
      return false;
    allreduce_host(tensor, op, scale);
    return true;
  }

  void reduce_scatter(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<int64_t>& counts,
      BackendOp op) override {
    const int dtype = checked_host_dtype(in, "shared-memory");
    at::Tensor hi = host(in);
    at::Tensor ho = host(out);
    std::vector<size_t> c(counts.begin(), counts.end());
    run([&](shm::Transport& t) {
      t.reduce_scatter(
          hi.data_ptr(),
          ho.data_ptr(),
          c.data(),
          static_cast<DType>(dtype),
          host_reduction(op));
    });
    copy_back(out, ho);
  }

  void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) override {
    at::Tensor hi = host(in);
    at::Tensor ho = host(out);
    run([&](shm::Transport& t) {
      t.allgatherv(hi.data_ptr(), ho.data_ptr(), bytes.data());
    });
    copy_back(out, ho);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    at::Tensor h = host(tensor);
    run([&](shm::Transport& t) {
      t.broadcast(h.data_ptr(), h.nbytes(), root);
    });
    copy_back(tensor, h);
  }

  void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) override {
    at::Tensor hi = host(in);
    at::Tensor ho = host(out);
    run([&](shm::Transport& t) {
      t.alltoallv(
          hi.data_ptr(), send_bytes.data(), ho.data_ptr(), recv_bytes.data());
    });
    copy_back(out, ho);
  }

  void barrier() override {
    run([](shm::Transport& t) { t.barrier(); });
  }

  // The frames and, when every rank's frame says so, the all-reduce in the
  // same step: a small all-reduce costs one step, its check included.
  bool exchange_frames(
      const uint8_t* mine,
      size_t frame_bytes,
      uint8_t* frames,
      const FusedAllreduce* fused) override {
    if (fused == nullptr) {  // the frames alone: an all-gather
      run([&](shm::Transport& t) {
        std::vector<size_t> bytes(t.size(), frame_bytes);
        t.allgatherv(mine, frames, bytes.data());
      });
      return false;
    }
    bool reduced = false;
    run([&](shm::Transport& t) {
      reduced = t.exchange_frames(
          mine,
          frame_bytes,
          frames,
          fused->work.data_ptr(),
          fused->work.numel(),
          static_cast<DType>(checked_host_dtype(fused->work, "shared-memory")),
          host_reduction(fused->op),
          [&](const void* all) {
            return fused->settled(static_cast<const uint8_t*>(all));
          });
    });
    return reduced;
  }
  size_t fused_capacity(size_t frame_bytes) const override {
    return transport_->fused_capacity(frame_bytes);
  }
  bool reads_in_place(const at::Tensor& t) const override {
    return t.device().is_cpu() &&
           transport_->arena_claim(t.data_ptr(), t.nbytes()).has_value();
  }

  std::optional<at::Tensor> shared_zeros(
      int64_t numel, const at::TensorOptions& options) override {
    const std::shared_ptr<shm::Arena>& arena = transport_->arena();
    if (!arena || options.device().type() != c10::DeviceType::CPU)
      return std::nullopt;
    const size_t bytes =
        static_cast<size_t>(numel) *
        c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
    // Beyond what is read in place, a buffer gains nothing in the arena.
    if (!transport_->zero_copy_fits(bytes))
      return std::nullopt;
    std::optional<size_t> at = arena->allocate(bytes);
    if (!at)
      return std::nullopt;
    // The deleter keeps the arena mapped for as long as the buffer lives.
    return at::from_blob(
        arena->base() + *at,
        {numel},
        [arena, off = *at, bytes](void*) { arena->release(off, bytes); },
        options.requires_grad(false));
  }

  void abort() override {
    transport_->interrupt();
  }
  void interrupt() override {
    transport_->interrupt();
  }

 private:
  // The all-reduce of `tensor` (staged through host memory when it is on
  // a device), each element then times `scale`.
  void allreduce_host(const at::Tensor& tensor, BackendOp op, double scale) {
    const int dtype = checked_host_dtype(tensor, "shared-memory");
    at::Tensor h = host(tensor);
    run([&](shm::Transport& t) {
      t.allreduce(
          h.data_ptr(),
          h.numel(),
          static_cast<DType>(dtype),
          host_reduction(op),
          scale);
    });
    copy_back(tensor, h);
  }

  template <typename F>
  void run(F&& fn) {
    try {
      fn(*transport_);
    } catch (const shm::Failure& e) {
      BackendFailure f(error_kind(e.kind), e.what());
      if (e.exited && e.peer >= 0)
        f.exited.push_back(e.peer);
      throw f;
    }
  }

  std::unique_ptr<shm::Transport> transport_;
};

}  // namespace

std::unique_ptr<Communicator> make_shm_communicator(
    const CommConfig& config, const CommGroup& group) {
  const c10::intrusive_ptr<c10d::Store>& store = config.store;
  const std::string& prefix = group.prefix;
  const std::chrono::milliseconds timeout = config.timeout;
  shm::Options o;
  static_cast<ShmTuning&>(o) = config.shm.tuning;
  o.rank = group.rank;
  o.size = group.size;
  o.timeout = timeout;
  shm::Rendezvous rv;
  rv.set = [&](const std::string& k, const std::string& v) {
    store->set(prefix + k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [&](const std::string& k) {
    store->wait({prefix + k}, timeout);
    auto v = store->get(prefix + k);
    return std::string(v.begin(), v.end());
  };
  try {
    return std::make_unique<ShmCommunicator>(shm::Transport::connect(o, rv));
  } catch (const shm::Unavailable& e) {
    throw ShmUnavailable(e.what());
  } catch (const shm::Failure& e) {
    throw BackendFailure(error_kind(e.kind), e.what());
  } catch (const std::exception& e) {
    throw BackendFailure(
        CommError::Kind::Rendezvous,
        std::string("shared-memory rendezvous: ") + error_text(e));
  }
}

}  // namespace ronde::detail
