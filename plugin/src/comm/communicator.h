// The one interface between ronde and a communication backend. Everything
// outside comm/ talks to the collectives; only comm/ knows that Gloo and NCCL
// exist. Calls are made by one thread at a time: the communication thread,
// or a caller whose blocking collective runs inline (CommWorker::submit);
// only interrupt() may come from another thread. A host backend
// (Gloo, one rank) is done with the tensors when a call returns; a device
// backend (NCCL) only enqueues the work on its own stream (stream_for) and
// watches it (watch) until it finishes or times out.
#pragma once

#include <ronde/errors.h>

#include "runtime/tuning.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

// The reductions a backend performs. Averaging is not one of them: the
// collective sums and divides, the same way on every backend.
enum class BackendOp { Sum, Min, Max, Product };

// Raised by a backend when a peer or the network failed; collectives turn it
// into a ronde::CommError that names the tensor and the suspect ranks.
struct BackendFailure : std::runtime_error {
  BackendFailure(CommError::Kind kind, const std::string& msg)
      : std::runtime_error(msg), kind(kind) {}
  CommError::Kind kind;
  // Ranks of the communicator whose processes are known to be gone (the
  // shared-memory backend sees a peer's exit): nobody waits for their
  // failure notice.
  std::vector<int> exited;
};

// Device work of one collective, enqueued on a stream and not yet known to
// be finished. The waiter orders its own stream after it (block) or polls it
// (query); the backend's watchdog fails it when it does not finish in time.
class DeviceWork {
 public:
  DeviceWork(c10::Event done, std::string what)
      : done_(std::move(done)), what_(std::move(what)) {}
  // True once the device finished the work; rethrows its failure.
  bool query();
  // Makes the calling thread's current stream on the work's device wait for
  // the work, without blocking the host, and returns that stream; rethrows
  // a failure already known.
  c10::Stream block_current();
  // Called by the backend when the work failed or timed out.
  void fail(std::exception_ptr error);
  // The event's state alone, never throwing, for the backend's watchdog: a
  // device error fails the work and counts as finished.
  bool finished();
  const std::string& what() const {
    return what_;
  }

 private:
  void rethrow_if_failed() const;

  c10::Event done_;
  std::string what_;
  mutable std::mutex mutex_;
  std::exception_ptr error_;  // guarded by mutex_
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // The backend's name, for messages.
  virtual const char* backend() const = 0;
  // Whether the call check's frames should carry small inputs
  // (comm/call_check.cpp): yes where a round trip costs more than copying a
  // few KiB of frames. The backend that runs the job's host exchanges answers.
  virtual bool prefers_inline_payloads() const {
    return true;
  }
  // The backend that serves `tensor` ("gloo", "nccl", "self"). Ranks must
  // agree on it: it travels in the collective's descriptor.
  virtual const char* backend_for(const at::Tensor& tensor) const {
    (void)tensor;
    return backend();
  }
  // The stream a device backend enqueues `tensor`'s work on; nullopt when a
  // call has finished with the tensor by the time it returns.
  virtual std::optional<c10::Stream> stream_for(const at::Tensor& tensor) {
    (void)tensor;
    return std::nullopt;
  }
  // Takes charge of device work for `tensor` that ends with work's event:
  // a device backend fails it, and aborts itself, when it does not finish
  // within the timeout. Host backends have nothing to watch.
  virtual void watch(
      const at::Tensor& tensor, const std::shared_ptr<DeviceWork>& work) {
    (void)tensor;
    (void)work;
  }
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Tensors are contiguous. allreduce is in place.
  virtual void allreduce(const at::Tensor& tensor, BackendOp op) = 0;
  // allreduce() and then tensor.mul_(scale), the same bits, where the
  // backend can scale while the result is in cache (shared memory: float
  // and double on the host): true when it did both, false when it did
  // neither and the caller must.
  virtual bool allreduce_scaled(
      const at::Tensor& tensor, BackendOp op, double scale) {
    (void)tensor;
    (void)op;
    (void)scale;
    return false;
  }
  // out holds every rank's bytes in rank order; bytes[r] is rank r's share.
  virtual void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) = 0;
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) = 0;
  // in holds one block per rank in rank order, counts[r] elements for rank
  // r (dim 0 split as the public reducescatter splits it); out receives this
  // rank's block reduced over every rank. The default reduces all of `in`
  // and keeps this rank's block (twice the traffic); shared memory
  // reduces each block only where it is needed.
  virtual void reduce_scatter(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<int64_t>& counts,
      BackendOp op);
  virtual void barrier() = 0;

  // The call check's frame exchange (comm/call_check.cpp): the
  // `frame_bytes` at `mine` to every rank, every rank's frame (each as large)
  // into `frames` in rank order. Raw bytes, not tensors: this runs on every
  // checked call, where making tensors costs a measurable share of a small
  // one. `fused`, when set, is this rank's in-place all-reduce, which a
  // backend may carry in the same exchange (see fused_capacity()): when
  // fused->settled(frames) holds, it reduced fused->work and returns true.
  // Every rank sees the same frames, so every rank answers alike. The
  // default: an all-gather of the frames, never fused.
  struct FusedAllreduce {
    at::Tensor work;  // contiguous, on the host
    BackendOp op;
    // From the frames alone (never throws): did every rank post its input?
    std::function<bool(const uint8_t* frames)> settled;
  };
  virtual bool exchange_frames(
      const uint8_t* mine,
      size_t frame_bytes,
      uint8_t* frames,
      const FusedAllreduce* fused);
  // The bytes of an all-reduce that exchange_frames() can carry beside
  // frames of `frame_bytes`; 0 where it carries none.
  virtual size_t fused_capacity(size_t frame_bytes) const {
    (void)frame_bytes;
    return 0;
  }
  // Whether this backend's all-reduce of `t` offers it to the peers where
  // it lies (a shared_zeros() buffer of that size; it is read there when
  // the peers' are too): copying it beside the frames would cost more
  // than the step it saves.
  virtual bool reads_in_place(const at::Tensor& t) const {
    (void)t;
    return false;
  }

  // A zeroed buffer of `numel` elements that this backend's all-reduce
  // moves without copying it in (shared memory: in the rank's arena, where
  // peers read it); nullopt where the backend has none, would copy a
  // buffer of that size anyway, or has no room left.
  // Any thread; the buffer may outlive the communicator. Each call learns
  // where every rank's buffer lies (shared memory: the claims), so such a
  // buffer is never wrong: where a peer's is in plain memory, it is only
  // copied as any other.
  virtual std::optional<at::Tensor> shared_zeros(
      int64_t numel, const at::TensorOptions& options) {
    (void)numel;
    (void)options;
    return std::nullopt;
  }

  // Closes every connection so that peers blocked on this rank fail now
  // rather than at their timeout. The communicator is unusable afterwards.
  virtual void abort() = 0;
  // Closes every connection from any thread, freeing nothing: collectives
  // of peers blocked on this rank fail at once. Then abort() as above.
  virtual void interrupt() {}
};

// Where the Gloo backend module is and how to open it.
struct GlooModuleConfig {
  std::string path;              // empty: next to libronde
  std::optional<bool> deepbind;  // RTLD_DEEPBIND; unset: by build
};

// The shared-memory backend for ranks that share a host (RONDE_SHM=0 turns
// it off).
struct ShmConfig {
  bool enabled = true;
  ShmTuning tuning;
};

// What the runtime knows when it connects a job, the same for every
// communicator of the job (the global one, process sets, the groups of the
// hierarchical all-reduce).
struct CommConfig {
  c10::intrusive_ptr<c10d::Store> store;  // null for a job of one rank
  std::string hostname;                   // this rank's address for peers
  std::chrono::milliseconds timeout = kDefaultTimeout;
  GlooTuning gloo_tuning;  // the CPU backend's all-reduce algorithm
  GlooModuleConfig gloo;
  ShmConfig shm;
  // RONDE_HIERARCHICAL; unset: the two-level all-reduce where several
  // hosts run several ranks each.
  std::optional<bool> hierarchical;
  // "nccl" or "gloo" for CUDA tensors; empty: NCCL when built.
  std::string cuda_backend;
};

// The ranks one communicator connects: this rank's place among them and
// where in the store they meet.
struct CommGroup {
  std::string prefix;  // the group's keys in the store
  int rank = 0;
  int size = 1;
  // Every member's host identity (runtime/rendezvous.h: boot id and network
  // namespace), in group rank order; empty for a job of one rank. Ranks with
  // equal identities share memory.
  std::vector<std::string> hosts;
};

// Checks what the backends need before the rendezvous (the Gloo module for
// a job of several ranks, a valid CUDA backend choice), so that a broken
// installation fails on every rank at once, not at a timeout. Throws
// c10::Error naming the problem.
void load_backends(const CommConfig& config, const CommGroup& group);

// The job's communicator: CPU tensors to the host backend (Gloo; for one
// rank, local copies), device tensors to the device backend (NCCL, when
// built, connected on first use), chosen per tensor. cuda_backend "gloo"
// sends CUDA tensors through the host backend instead. Throws BackendFailure
// when the host backend cannot connect.
std::unique_ptr<Communicator> make_communicator(
    const CommConfig& config, const CommGroup& group);

// A job of one rank: every collective is a local copy, no network.
std::unique_ptr<Communicator> make_self_communicator();

// Loads and checks the Gloo backend module (once per process: the first
// call's config wins); throws c10::Error naming the problem.
void load_gloo_backend(const GlooModuleConfig& config);

// Whether this ronde was built with the NCCL backend.
#ifdef RONDE_WITH_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif

// Connects the group's ranks through the system Gloo, rendezvousing
// through the store under the group's prefix.
std::unique_ptr<Communicator> make_gloo_communicator(
    const CommConfig& config, const CommGroup& group);

// Connects the group's ranks, all on one host, through shared memory,
// rendezvousing through the store under the group's prefix. Throws
// ShmUnavailable, on every rank alike, when shared memory cannot be set up
// (the caller then uses Gloo), and BackendFailure when a peer fails during
// the rendezvous.
std::unique_ptr<Communicator> make_shm_communicator(
    const CommConfig& config, const CommGroup& group);

struct ShmUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// For a group on several hosts (group.hosts): the two-level all-reduce
// (reduce-scatter within each host, all-reduce across hosts, all-gather
// within each host) over `flat`, which keeps the other collectives; or
// `flat` itself when config.hierarchical turns it off, when no host runs
// several ranks (unless forced), or, with one log line, when the hosts run
// uneven numbers of ranks.
std::unique_ptr<Communicator> make_hierarchical_communicator(
    const CommConfig& config,
    const CommGroup& group,
    std::unique_ptr<Communicator> flat);

#ifdef RONDE_WITH_NCCL
// The group's NCCL communicator on one CUDA device, connected through the
// store under the group's prefix (or, for one rank, on its own).
// Collectives are enqueued on its own stream; a watchdog aborts it when work
// outlives the config's timeout.
std::unique_ptr<Communicator> make_nccl_communicator(
    const CommConfig& config, const CommGroup& group, c10::Device device);
#endif

}  // namespace ronde::detail
