// Collectives across the ranks of the job, or of a process set
// (ronde/process_set.h): allreduce, allgather, broadcast, alltoall,
// reducescatter, barrier. Each has a blocking form and an _async form
// returning a Handle. Every call checks, across ranks, that the tensors
// agree (shape, dtype, op, root, name) and fails on every rank with one
// message when they do not. Ranks, roots and splits are numbered within the
// set the call runs on (the job's ranks for the global set).
#pragma once

#include <ronde/process_set.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ronde {

enum class ReduceOp { Sum, Average, Min, Max, Product };

const char* to_string(ReduceOp op);

struct AllreduceOptions {
  // Average is what data-parallel gradients need; Horovod defaults alike.
  TORCH_ARG(ReduceOp, op) = ReduceOp::Average;
  // Multiplies the input before the reduction (e.g. to keep fp16 sums in
  // range) and the result after it. 1: no scaling.
  TORCH_ARG(double, prescale_factor) = 1.0;
  TORCH_ARG(double, postscale_factor) = 1.0;
  // Names the tensor in errors and traces. Ranks must use the same name.
  TORCH_ARG(std::string, name) = "";
  // Exchange a small descriptor first to check that every rank passed a
  // matching tensor. Turn off only for traffic already verified once (the
  // optimizer's buckets do this after their first step).
  TORCH_ARG(bool, verify) = true;
  // The ranks that take part: the whole job by default. A rank outside
  // the set that calls a collective on it gets a c10::Error.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
};

struct AlltoallOptions {
  // splits[r]: rows (along dim 0) sent to rank r; must sum to size(0).
  // Empty: size(0) split evenly, which must then divide by the world size.
  TORCH_ARG(std::vector<int64_t>, splits) = {};
  TORCH_ARG(std::string, name) = "";
  TORCH_ARG(bool, verify) = true;
  // The ranks that take part: the whole job by default. A rank outside
  // the set that calls a collective on it gets a c10::Error.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
};

struct ReducescatterOptions {
  TORCH_ARG(ReduceOp, op) = ReduceOp::Average;
  TORCH_ARG(double, prescale_factor) = 1.0;
  TORCH_ARG(double, postscale_factor) = 1.0;
  TORCH_ARG(std::string, name) = "";
  TORCH_ARG(bool, verify) = true;
  // The ranks that take part: the whole job by default. A rank outside
  // the set that calls a collective on it gets a c10::Error.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
};

struct CollectiveOptions {
  TORCH_ARG(std::string, name) = "";
  TORCH_ARG(bool, verify) = true;
  // The ranks that take part: the whole job by default. A rank outside
  // the set that calls a collective on it gets a c10::Error.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
};

namespace detail {
struct HandleState;
}

// A collective in flight. The collectives of a process set run in
// submission order on that set's communication thread; a Handle waits for
// one of them.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::HandleState> state);

  // True once the collective finished, successfully or not (on a device:
  // once the device finished it).
  bool done() const;
  // Waits for the collective (which the communicator's timeout bounds) and
  // rethrows its error, if any. For CUDA tensors on NCCL it returns once the
  // collective is queued, having made this thread's current stream wait for
  // it: work queued after it sees the result, the host is not held.
  // RONDE_BLOCKING_WAIT=1 makes it wait on the host until the device is done.
  void wait() const;
  // Waits at most `timeout`, on the host: false if the collective is still
  // running, true once it finished (rethrowing its error, if any).
  bool wait(std::chrono::milliseconds timeout) const;
  // Waits, then returns the collective's output tensor.
  at::Tensor result() const;
  // For alltoall: the rows received from each rank. Waits first.
  std::vector<int64_t> received_splits() const;

  // The state the worker finishes, for ronde's own adapters (the c10d
  // backend attaches its completion to it); null for an empty Handle.
  const std::shared_ptr<detail::HandleState>& state() const {
    return state_;
  }

 private:
  std::shared_ptr<detail::HandleState> state_;
};

// Gradients: the blocking out-of-place forms below (allreduce, allgather,
// broadcast, alltoall, reducescatter) are differentiable. When the input
// requires a gradient and grad mode is on, the output's grad_fn applies
// Horovod's backward rule: allreduce, the same all-reduce of the gradients
// (Product: their sum times the product over the input; Min and Max refuse such
// an input); broadcast, the gradients averaged over the set on the root and
// zero elsewhere; allgather, the averaged gradients of this rank's rows;
// alltoall, the gradients sent back along the received splits;
// reducescatter (Sum, Average), an allgather of the gradients, times the
// set's size for Sum and times the scale factors. Every rank must then
// backpropagate through the same collectives. The asynchronous, in-place
// and _into forms record no gradient: their outputs do not require one.

// Returns a new tensor; the input is left untouched.
Handle allreduce_async(
    const at::Tensor& tensor, const AllreduceOptions& options = {});
at::Tensor allreduce(
    const at::Tensor& tensor, const AllreduceOptions& options = {});
// Reduces in place: the tensor's storage receives the result.
Handle allreduce_async_(
    const at::Tensor& tensor, const AllreduceOptions& options = {});
void allreduce_(const at::Tensor& tensor, const AllreduceOptions& options = {});

// Concatenates every rank's tensor along dim 0, in rank order. Dim 0 may
// differ between ranks; the other dims must agree.
Handle allgather_async(
    const at::Tensor& tensor, const CollectiveOptions& options = {});
at::Tensor allgather(
    const at::Tensor& tensor, const CollectiveOptions& options = {});

// Every rank receives root_rank's tensor. The out-of-place form returns it;
// the in-place form overwrites `tensor` on non-root ranks.
Handle broadcast_async(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options = {});
at::Tensor broadcast(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options = {});
Handle broadcast_async_(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options = {});
void broadcast_(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options = {});

// Sends rows splits[r] to rank r and returns the rows received from every
// rank, concatenated in rank order (see Handle::received_splits).
Handle alltoall_async(
    const at::Tensor& tensor, const AlltoallOptions& options = {});
at::Tensor alltoall(
    const at::Tensor& tensor, const AlltoallOptions& options = {});

// Reduces across ranks, then gives rank r its part of dim 0: rows are split
// as evenly as possible, the first size(0) % world_size ranks getting one
// more.
Handle reducescatter_async(
    const at::Tensor& tensor, const ReducescatterOptions& options = {});
at::Tensor reducescatter(
    const at::Tensor& tensor, const ReducescatterOptions& options = {});

// allgather, alltoall and reducescatter into `out`, a tensor the caller
// keeps: no new tensor per call, so a large result's fresh pages are not
// faulted in on every call. `out` must be contiguous, of the input's dtype
// and device, the input's shape beyond dim 0, apart from the input, and
// have the result's rows: every rank's rows for allgather, the rows
// received for alltoall, this rank's part for reducescatter. A wrong dtype,
// device, layout, shape, overlap or (reducescatter) row count fails on
// every rank before anything moves, as a mismatched input does. Rows that
// arrive otherwise than `out` holds (allgather, alltoall: known once the
// ranks' rows are exchanged) fail on this rank only, with `out` left as it
// was; the collective itself ran on every rank, which go on.
// alltoall_into() returns the rows received from each rank.
Handle allgather_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const CollectiveOptions& options = {});
void allgather_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const CollectiveOptions& options = {});
Handle alltoall_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const AlltoallOptions& options = {});
std::vector<int64_t> alltoall_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const AlltoallOptions& options = {});
Handle reducescatter_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const ReducescatterOptions& options = {});
void reducescatter_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const ReducescatterOptions& options = {});

// Returns once every rank of the set has entered it.
Handle barrier_async(const ProcessSet& process_set = {});
void barrier(const ProcessSet& process_set = {});

// Join, for ranks with uneven amounts of data (Horovod's hvd.join): a rank
// that has run out calls join(), which returns once every rank of the set
// has called it. Until then it takes part in the collectives the others
// make on the set (DistributedOptimizer's gradient all-reduces, and any
// other checked collective) with an input that changes nothing: zeros to a
// sum or average, no rows to an allgather or alltoall, the identity of a
// min, max or product. An average then divides by the ranks that
// contributed, not by the set's size. Returns the set rank that joined
// last (of several joining at once, the highest), whose parameters are the
// ones trained on every batch: broadcast_parameters(..., last) makes the
// others' equal. A joined rank cannot be the root of a broadcast (every
// rank then fails with a c10::Error), answers only host (CPU) collectives,
// and cannot answer a call made with verify(false) while it is joined
// (DistributedOptimizer's buckets keep their first check every step for
// this). A peer failure ends join() with a CommError, as any collective.
int join(const ProcessSet& process_set = {});

}  // namespace ronde
