// The NCCL backend: CUDA tensors, reduced by NCCL on a stream of its own.
//
// NCCL is used directly rather than through c10d::ProcessGroupNCCL: the
// Communicator interface needs only "enqueue this on your stream" and
// "tell me when it is late", and NCCL's C API gives exactly that and is
// stable across releases, where ProcessGroupNCCL's C++ API changes with each
// LibTorch release, brings a second watchdog and, by default, tears the
// process down on a timeout. libnccl.so.2 is the same library LibTorch loads,
// so there is no second copy to clash with (unlike Gloo, see CONTRIBUTING.md).
//
// The communicator runs in NCCL's non-blocking mode: every call returns at
// once and is then polled, so that connecting, or an enqueue that waits for
// peers, is bounded by the timeout and can be aborted. Enqueued work is
// watched by a thread of its own: work that outlives the timeout, or an
// asynchronous error NCCL reports (a peer gone), aborts the communicator;
// the work fails, waiting kernels end, and every later call raises.
#include "comm/communicator.h"
#include "comm/host_types.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

namespace ronde::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kConnectFloor{60000};

// By the rows of comm/dtype_table.h (a new row is a -Wswitch warning here).
ncclDataType_t nccl_type(at::ScalarType t) {
  switch (static_cast<DType>(host_dtype(t))) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I8:
      return ncclInt8;
    case DType::U8:
      return ncclUint8;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::I16:  // the table's on-NCCL column says no
      break;
  }
  TORCH_CHECK(
      false,
      "ronde: NCCL cannot reduce ",
      c10::toString(t),
      " tensors (the router sends them to the host backend)");
}

ncclRedOp_t nccl_op(BackendOp op) {
  switch (op) {
    case BackendOp::Sum:
      return ncclSum;
    case BackendOp::Product:
      return ncclProd;
    case BackendOp::Min:
      return ncclMin;
    case BackendOp::Max:
      return ncclMax;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown reduction");
}

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& prefix,
      int rank,
      int size,
      c10::Device device,
      std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        device_(device),
        timeout_(timeout),
        stream_(c10::cuda::getStreamFromPool(
            /*isHighPriority=*/true, device.index())) {
    ncclUniqueId id;
    const std::string key = prefix + "unique_id";
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw failure(CommError::Kind::Rendezvous, "ncclGetUniqueId", r);
      if (size > 1) {
        const auto* p = reinterpret_cast<const uint8_t*>(&id);
        store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
      }
    } else {
      std::vector<uint8_t> bytes;
      try {
        store->wait({key}, timeout);
        bytes = store->get(key);
      } catch (const std::exception& e) {
        throw BackendFailure(
            CommError::Kind::Rendezvous,
            std::string("nccl: rank ") + std::to_string(rank) +
                " got no NCCL id from rank 0: " + e.what());
      }
      TORCH_INTERNAL_ASSERT(bytes.size() == sizeof(id));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    c10::cuda::CUDAGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::lock_guard<std::mutex> lock(mutex_);
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    // Setting NCCL up (topology, proxy threads, buffers) takes seconds on
    // its own: connecting is bounded by the timeout, but never by less than
    // kConnectFloor.
    settle_locked(r, "connecting", std::max(timeout_, kConnectFloor));
    watchdog_ = std::thread([this] { watchdog(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable())
      watchdog_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    if (honor_request_locked())
      return;  // aborted, now or before
    // Let enqueued work finish (bounded), then leave the clique cleanly.
    c10::cuda::CUDAGuard guard(device_);
    const auto deadline = Clock::now() + timeout_;
    bool finished = false;
    while (Clock::now() < deadline) {
      cudaError_t e = cudaStreamQuery(stream_.stream());
      if (e == cudaSuccess) {
        finished = true;
        break;
      }
      if (e != cudaErrorNotReady)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (finished) {
      ncclResult_t r = ncclCommFinalize(comm_);
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ncclCommGetAsyncError(comm_, &r);
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
        comm_ = nullptr;
        return;
      }
    }
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const char* backend() const override {
    return "nccl";
  }
  int rank() const override {
    return rank_;
  }
  int size() const override {
    return size_;
  }

  std::optional<c10::Stream> stream_for(const at::Tensor& t) override {
    TORCH_INTERNAL_ASSERT(t.device() == device_);
    return stream_.unwrap();
  }

  void watch(
      const at::Tensor&, const std::shared_ptr<DeviceWork>& work) override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      if (!failure_) {
        // No wake-up: the watchdog's 100 ms tick is soon enough, and waking
        // it on every bucket would contend for the communicator's mutex.
        inflight_.push_back(Watched{work, Clock::now() + timeout_});
        return;
      }
    }
    // Already broken: the work cannot complete meaningfully.
    work->fail(failure_exception("the NCCL communicator was aborted"));
  }

  void allreduce(const at::Tensor& t, BackendOp op) override {
    if (t.numel() == 0)
      return;
    const ncclDataType_t type = nccl_type(t.scalar_type());
    enqueue("allreduce", [&] {
      return ncclAllReduce(
          t.data_ptr(),
          t.data_ptr(),
          static_cast<size_t>(t.numel()),
          type,
          nccl_op(op),
          comm_,
          stream_.stream());
    });
  }

  void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) override {
    bool equal = true;
    for (size_t b : bytes)
      equal = equal && b == bytes[0];
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    if (equal) {
      if (bytes[0] == 0)
        return;
      enqueue("allgather", [&] {
        return ncclAllGather(
            in.data_ptr(), dst, bytes[0], ncclUint8, comm_, stream_.stream());
      });
      return;
    }
    // Ragged: one broadcast per rank, grouped into one launch.
    enqueue("allgather", [&] {
      ncclResult_t r = ncclGroupStart();
      size_t offset = 0;
      for (int root = 0; root < size_ && r == ncclSuccess; ++root) {
        if (bytes[root] > 0) {
          r = ncclBroadcast(
              in.data_ptr(),
              dst + offset,
              bytes[root],
              ncclUint8,
              root,
              comm_,
              stream_.stream());
        }
        offset += bytes[root];
      }
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void broadcast(const at::Tensor& t, int root) override {
    if (t.numel() == 0)
      return;
    enqueue("broadcast", [&] {
      return ncclBroadcast(
          t.data_ptr(),
          t.data_ptr(),
          t.numel() * t.element_size(),
          ncclUint8,
          root,
          comm_,
          stream_.stream());
    });
  }

  void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) override {
    const auto* src = static_cast<const uint8_t*>(in.data_ptr());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    enqueue("alltoall", [&] {
      ncclResult_t r = ncclGroupStart();
      int64_t send_off = 0, recv_off = 0;
      for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
        if (send_bytes[peer] > 0) {
          r = ncclSend(
              src + send_off,
              send_bytes[peer],
              ncclUint8,
              peer,
              comm_,
              stream_.stream());
        }
        if (r == ncclSuccess && recv_bytes[peer] > 0) {
          r = ncclRecv(
              dst + recv_off,
              recv_bytes[peer],
              ncclUint8,
              peer,
              comm_,
              stream_.stream());
        }
        send_off += send_bytes[peer];
        recv_off += recv_bytes[peer];
      }
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  // The router sends barriers to the host backend; this one is complete
  // for its own sake: a one-element all-reduce, waited for on the host.
  void barrier() override {
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDAStreamGuard on_stream(stream_);
    at::Tensor one = at::ones({1}, at::TensorOptions().device(device_));
    allreduce(one, BackendOp::Sum);
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_.stream());
      if (e == cudaSuccess)
        return;
      check_async();
      if (e != cudaErrorNotReady || Clock::now() >= deadline) {
        abort();
        throw BackendFailure(
            CommError::Kind::Timeout,
            "nccl: barrier did not finish within " + seconds_text(timeout_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_locked("aborted after a failure");
  }

  void interrupt() override {
    request_abort(
        CommError::Kind::PeerFailure,
        "interrupted: another rank gave up on this job");
  }

 private:
  struct Watched {
    std::shared_ptr<DeviceWork> work;
    Clock::time_point deadline;
  };
  struct AbortRequest {
    CommError::Kind kind = CommError::Kind::Broken;
    std::string why;
  };

  BackendFailure failure(
      CommError::Kind kind, const std::string& what, ncclResult_t r) const {
    std::string text = std::string("nccl: ") + what + " on rank " +
                       std::to_string(rank_) +
                       " failed: " + ncclGetErrorString(r);
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last != '\0')
        text += std::string(" (") + last + ")";
    }
    return BackendFailure(kind, text);
  }

  std::exception_ptr failure_exception(const std::string& why) const {
    return std::make_exception_ptr(CommError(
        CommError::Kind::Broken, "collective", "", rank_, {}, "nccl", why));
  }

  // From any thread (the watchdog, the stall inspector): aborts now when
  // the communicator is free; when the communication thread is inside a
  // call, fails the watched work now and leaves the abort to whichever
  // comes first: that thread's next poll or call, or the watchdog's tick.
  void request_abort(CommError::Kind kind, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      if (!requested_)
        requested_ = AbortRequest{kind, why};
    }
    abort_requested_ = true;
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      honor_request_locked();
    } else {
      fail_inflight(why);
    }
  }

  // Under mutex_: carries out a requested abort. True once the
  // communicator is aborted, by this request or earlier.
  bool honor_request_locked() {
    if (abort_requested_ && comm_ != nullptr) {
      AbortRequest r;
      {
        std::lock_guard<std::mutex> lock(watch_mutex_);
        r = *requested_;
      }
      failed_kind_ = r.kind;
      abort_locked(r.why);
    }
    return comm_ == nullptr;
  }

  // Runs one NCCL call on this device, then polls it to completion of its
  // enqueue. Throws BackendFailure once the communicator is unusable.
  template <typename F>
  void enqueue(const char* what, F&& call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (honor_request_locked()) {
      throw BackendFailure(
          failed_kind_,
          std::string("nccl: ") + what + " on an aborted communicator (" +
              abort_reason_ + ")");
    }
    c10::cuda::CUDAGuard guard(device_);
    settle_locked(call(), what);
  }

  // Non-blocking mode: a call may return ncclInProgress; poll until it is
  // done, the timeout passes, or an abort is requested.
  void settle_locked(
      ncclResult_t r,
      const char* what,
      std::optional<std::chrono::milliseconds> limit = std::nullopt) {
    const std::chrono::milliseconds bound = limit.value_or(timeout_);
    const auto start = Clock::now();
    const auto deadline = start + bound;
    while (r == ncclInProgress) {
      if (honor_request_locked()) {
        throw BackendFailure(
            failed_kind_,
            std::string("nccl: ") + what + " on rank " + std::to_string(rank_) +
                " abandoned: " + abort_reason_);
      }
      if (Clock::now() >= deadline) {
        abort_locked(std::string(what) + " timed out");
        throw BackendFailure(
            CommError::Kind::Timeout,
            std::string("nccl: ") + what + " on rank " + std::to_string(rank_) +
                " did not finish within " + seconds_text(bound) +
                "; the NCCL communicator was aborted");
      }
      // A launch is usually done within microseconds: yield for the first
      // 200 us (a sleep can oversleep by far more than that, and the step
      // waits for this enqueue), then poll every 20 us.
      if (Clock::now() - start < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
      if (q != ncclSuccess)
        r = q;
    }
    if (r != ncclSuccess) {
      BackendFailure f = failure(
          r == ncclRemoteError || r == ncclSystemError
              ? CommError::Kind::PeerFailure
              : CommError::Kind::Broken,
          what,
          r);
      abort_locked(f.what());
      throw f;
    }
  }

  // Fails the watched work first: ncclCommAbort ends NCCL's kernels, so
  // their done events complete, and work seen complete before it was
  // failed would pass for a success.
  void abort_locked(const std::string& why) {
    fail_inflight(why);
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      abort_reason_ = why;
    }
  }

  void fail_inflight(const std::string& why) {
    std::deque<Watched> failed;
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      if (!failure_)
        failure_ = true;
      failed.swap(inflight_);
    }
    for (auto& w : failed)
      w.work->fail(failure_exception(why));
  }

  // Raises the error NCCL reports for work already enqueued, if any.
  void check_async() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr)
      return;
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
    if (q != ncclSuccess)
      r = q;
    if (r == ncclSuccess || r == ncclInProgress)
      return;
    BackendFailure f =
        failure(CommError::Kind::PeerFailure, "asynchronous work", r);
    failed_kind_ = CommError::Kind::PeerFailure;
    abort_locked(f.what());
    throw f;
  }

  // Retires finished work; fails and aborts on the first late or failed one.
  void watchdog() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      while (!inflight_.empty() && inflight_.front().work->finished())
        inflight_.pop_front();
      std::string why;
      CommError::Kind kind = CommError::Kind::Timeout;
      if (!inflight_.empty() && Clock::now() >= inflight_.front().deadline) {
        why = "'" + inflight_.front().work->what() + "' on rank " +
              std::to_string(rank_) + " did not finish within " +
              seconds_text(timeout_);
      }
      lock.unlock();
      if (abort_requested_) {
        // Requested while the communication thread held the communicator
        // (so only the work was failed): carry it out now, since no later
        // call may come to do it, and NCCL's kernels must end.
        std::lock_guard<std::mutex> comm_lock(mutex_);
        honor_request_locked();
      } else if (why.empty()) {
        try {
          check_async();
        } catch (const BackendFailure& e) {
          why = e.what();
          kind = CommError::Kind::PeerFailure;
        }
      }
      if (!why.empty()) {
        std::cerr << "ronde: rank " << rank_ << ": nccl: " << why
                  << "; aborting the NCCL communicator" << std::endl;
        request_abort(kind, why);
      }
      lock.lock();
    }
  }

  const int rank_;
  const int size_;
  const c10::Device device_;
  const std::chrono::milliseconds timeout_;
  const c10::cuda::CUDAStream stream_;

  // Guards the NCCL communicator: calls into it are made under it.
  std::mutex mutex_;
  ncclComm_t comm_ = nullptr;
  std::string abort_reason_;                               // guarded by mutex_
  CommError::Kind failed_kind_ = CommError::Kind::Broken;  // likewise
  // Set (once requested_ is) by request_abort(), from any thread.
  std::atomic<bool> abort_requested_{false};

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::deque<Watched> inflight_;           // guarded by watch_mutex_, in order
  std::optional<AbortRequest> requested_;  // likewise; the first one
  bool failure_ = false;                   // likewise
  bool stopping_ = false;                  // likewise
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(
    const CommConfig& config, const CommGroup& group, c10::Device device) {
  TORCH_CHECK(
      device.is_cuda() && device.has_index(),
      "ronde: the NCCL backend needs a CUDA device with an index, got ",
      device);
  const CommGroup& g = group;
  return std::make_unique<NcclCommunicator>(
      config.store, g.prefix, g.rank, g.size, device, config.timeout);
}

}  // namespace ronde::detail
