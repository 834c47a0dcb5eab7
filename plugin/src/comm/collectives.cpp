// The public collectives: each call checks its input and prepares its
// tensors on the caller's thread, then queues a job (comm/jobs.h) that runs
// the collective's body (comm/collective_bodies.h) on the backend. The job
// checks the call across ranks first (comm/call_check.h), so a mismatch
// fails on every rank. ronde::join() is in comm/join.cpp.
#include <ronde/collectives.h>

#include "comm/autograd.h"
#include "comm/collective_bodies.h"
#include "comm/collective_calls.h"
#include "comm/host_types.h"
#include "comm/jobs.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace ronde {

namespace detail {
namespace {

bool is_floating(const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type());
}

std::string check_dtype(const at::Tensor& t) {
  if (!t.defined())
    return "";
  if (host_dtype(t.scalar_type()) >= 0)  // a row of comm/dtype_table.h
    return "";
  return std::string("dtype ") + c10::toString(t.scalar_type()) +
         " is not supported (floating types and integers are)";
}

std::string check_reduction(
    const at::Tensor& t, ReduceOp op, double pre, double post) {
  std::string e = check_dtype(t);
  if (!e.empty() || !t.defined())
    return e;
  if (!is_floating(t)) {
    if (op == ReduceOp::Average) {
      return "an average of integer tensors is not defined; use "
             "ReduceOp::Sum";
    }
    if (pre != 1.0 || post != 1.0) {
      return "prescale/postscale factors need a floating-point tensor";
    }
  }
  return "";
}

// The buffer a collective works in: in place, the caller's own storage when
// it is contiguous; otherwise a contiguous copy (copied back afterwards when
// in place). A copy records no gradient: the collective writes into it, and
// only the blocking forms' autograd nodes (autograd.h) know its gradient.
at::Tensor working_copy(const at::Tensor& tensor, bool in_place) {
  if (in_place && tensor.is_contiguous())
    return tensor;
  at::NoGradGuard no_grad;
  return tensor.contiguous().clone();
}

// What is wrong with `out` as the caller's output (the _into forms) of a
// collective on `tensor` whose result has `rows` rows (-1: known only once
// the ranks' rows are exchanged) and `tensor`'s other dims. `out` must not
// overlap what the collective reads: `tensor` itself when it is contiguous,
// else a contiguous copy, which nothing overlaps. Empty when nothing is.
std::string check_out(
    const at::Tensor& tensor, const at::Tensor& out, int64_t rows) {
  if (!out.defined())
    return "out is undefined";
  if (!tensor.defined() || tensor.dim() == 0)
    return "";  // the input's own complaint
  if (out.scalar_type() != tensor.scalar_type()) {
    return std::string("out is ") + c10::toString(out.scalar_type()) +
           ", the input " + c10::toString(tensor.scalar_type());
  }
  if (out.device() != tensor.device())
    return "out is on " + out.device().str() + ", the input on " +
           tensor.device().str();
  if (!out.is_contiguous())
    return "out is not contiguous";
  if (out.dim() != tensor.dim() ||
      out.sizes().slice(1) != tensor.sizes().slice(1)) {
    return "out's shape " + c10::str(out.sizes()) + " differs from the " +
           "input's " + c10::str(tensor.sizes()) + " beyond dim 0";
  }
  if (rows >= 0 && out.size(0) != rows) {
    return "out has " + std::to_string(out.size(0)) + " rows, this rank's " +
           "part " + std::to_string(rows);
  }
  if (tensor.is_contiguous() &&
      at::get_overlap_status(out, tensor) != at::MemOverlapStatus::No)
    return "out overlaps the input, which the collective reads";
  return "";
}

// After a collective into the caller's `out`: its result went elsewhere
// only when the rows that came are not what `out` holds (check_out() ruled
// out the rest). Fails on this rank alone: the collective itself ran
// everywhere, and `out` is as it was.
void expect_out(
    const Call& c, const at::Tensor& result, const at::Tensor& out) {
  if (result.data_ptr() == out.data_ptr() && result.numel() == out.numel())
    return;
  TORCH_CHECK(
      false,
      "ronde: ",
      to_string(c.kind),
      c.group->label(),
      c.name.empty() ? "" : " '" + c.name + "'",
      " on rank ",
      world(to_string(c.kind)).rank,
      ": out has ",
      out.size(0),
      " rows, but ",
      result.size(0),
      " came; out is left as it was");
}

Handle allreduce_impl(
    const at::Tensor& tensor,
    const AllreduceOptions& o,
    bool in_place,
    bool blocking) {
  Group& group = group_of(o.process_set(), "allreduce");
  std::string error = check_reduction(
      tensor, o.op(), o.prescale_factor(), o.postscale_factor());
  Call call = make_call(
      group,
      OpKind::Allreduce,
      tensor,
      o.name(),
      o.verify(),
      static_cast<int>(o.op()),
      -1,
      error);
  at::Tensor work =
      error.empty() ? working_copy(tensor, in_place) : at::Tensor();
  if (work.defined() && work.is_cpu()) {
    call.payload = work;
    if (o.prescale_factor() == 1.0)
      call.fused_op = backend_op(o.op());
  }
  // Only what the body reads: a copy of the options would copy the name.
  return submit(
      std::move(call),
      [tensor,
       work,
       in_place,
       op = o.op(),
       pre = o.prescale_factor(),
       post = o.postscale_factor()](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        allreduce_work(comm, ex, c, work, op, pre, post);
        if (in_place && !work.is_same(tensor))
          tensor.copy_(work);
        state.result = in_place ? tensor : work;
      },
      {tensor, work},
      blocking);
}

Handle broadcast_impl(
    const at::Tensor& tensor,
    int root,
    const CollectiveOptions& o,
    bool in_place,
    bool blocking) {
  Group& group = group_of(o.process_set(), "broadcast");
  std::string error = check_dtype(tensor);
  const int n = group.size;
  if (error.empty() && (root < 0 || root >= n)) {
    error = "root rank " + std::to_string(root) + " is outside [0, " +
            std::to_string(n) + ")";
  }
  Call call = make_call(
      group, OpKind::Broadcast, tensor, o.name(), o.verify(), -1, root, error);
  at::Tensor work =
      error.empty() ? working_copy(tensor, in_place) : at::Tensor();
  if (work.defined() && work.is_cpu())
    call.payload = work;
  return submit(
      std::move(call),
      [=](Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        broadcast_work(comm, ex, c, work, root);
        if (in_place && !work.is_same(tensor))
          tensor.copy_(work);
        state.result = in_place ? tensor : work;
      },
      {tensor, work},
      blocking);
}

// `exact`: `into` is the caller's `out` (allgather_into), which must be
// the result's exact shape; else a buffer used when it fits (with `whole`,
// only when it holds exactly the result, else left untouched).
Handle allgather_impl(
    const at::Tensor& tensor,
    const CollectiveOptions& options,
    bool blocking,
    const at::Tensor& into = at::Tensor(),
    bool exact = false,
    bool whole = false) {
  Group& group = group_of(options.process_set(), "allgather");
  std::string error = check_dtype(tensor);
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "allgather needs at least one dimension (it concatenates dim 0)";
  }
  if (error.empty() && exact)
    error = check_out(tensor, into, -1);
  // Always exchanged: the descriptors carry every rank's dim 0.
  Call call = make_call(
      group,
      OpKind::Allgather,
      tensor,
      options.name(),
      /*verify=*/true,
      -1,
      -1,
      error);
  at::Tensor in = error.empty() ? tensor.contiguous() : at::Tensor();
  if (in.defined() && in.is_cpu())
    call.payload = in;
  return submit(
      std::move(call),
      [in, into, exact, whole](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        state.result = allgather_work(comm, ex, c, in, into, exact || whole);
        if (exact)
          expect_out(c, state.result, into);
      },
      {in, into},
      blocking);
}

// The splits of an alltoall, checked: `error` says what is wrong with them.
std::vector<int64_t> alltoall_splits(
    const at::Tensor& tensor,
    const std::vector<int64_t>& given,
    int n,
    std::string& error) {
  std::vector<int64_t> splits = given;
  if (!error.empty() || !tensor.defined())
    return splits;
  if (tensor.dim() == 0) {
    error = "alltoall needs at least one dimension (it splits dim 0)";
  } else if (splits.empty()) {
    if (tensor.size(0) % n != 0) {
      error = "dim 0 (" + std::to_string(tensor.size(0)) +
              ") does not divide by the world size " + std::to_string(n) +
              "; pass splits";
    } else {
      splits.assign(n, tensor.size(0) / n);
    }
  } else if (static_cast<int>(splits.size()) != n) {
    error = "splits has " + std::to_string(splits.size()) +
            " entries, expected one per rank (" + std::to_string(n) + ")";
  } else {
    int64_t total = 0;
    for (int64_t s : splits) {
      if (s < 0)
        error = "splits must not be negative";
      total += s;
    }
    if (error.empty() && total != tensor.size(0)) {
      error = "splits sum to " + std::to_string(total) + ", but dim 0 is " +
              std::to_string(tensor.size(0));
    }
  }
  return splits;
}

Handle alltoall_impl(
    const at::Tensor& tensor,
    const AlltoallOptions& options,
    bool blocking,
    const at::Tensor& into = at::Tensor(),
    std::vector<int64_t> expect = {},
    bool exact = false) {
  Group& group = group_of(options.process_set(), "alltoall");
  const int n = group.size;
  std::string error = check_dtype(tensor);
  const std::vector<int64_t> splits =
      alltoall_splits(tensor, options.splits(), n, error);
  if (error.empty() && exact)
    error = check_out(tensor, into, -1);
  Call call = make_call(
      group,
      OpKind::Alltoall,
      tensor,
      options.name(),
      options.verify(),
      -1,
      -1,
      error);
  at::Tensor in = error.empty() ? tensor.contiguous() : at::Tensor();
  // The splits ride in the check's frame when they fit: one exchange less.
  if (error.empty())
    call.payload = at::tensor(splits, at::kLong);
  return submit(
      std::move(call),
      [in, splits, into, expect = std::move(expect), exact](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        state.result = alltoall_work(
            comm, ex, c, in, splits, state.splits, into, expect, exact);
        if (exact)
          expect_out(c, state.result, into);
      },
      {in, into},
      blocking);
}

Handle reducescatter_impl(
    const at::Tensor& tensor,
    const ReducescatterOptions& o,
    bool blocking,
    const at::Tensor& into = at::Tensor(),
    bool exact = false) {
  Group& group = group_of(o.process_set(), "reducescatter");
  std::string error = check_reduction(
      tensor, o.op(), o.prescale_factor(), o.postscale_factor());
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "reducescatter needs at least one dimension (it splits dim 0)";
  }
  if (error.empty() && exact && group.rank >= 0) {
    const int64_t rows = tensor.defined() ? tensor.size(0) : 0;
    error = check_out(tensor, into, block_rows(rows, group.size, group.rank));
  }
  Call call = make_call(
      group,
      OpKind::Reducescatter,
      tensor,
      o.name(),
      o.verify(),
      static_cast<int>(o.op()),
      -1,
      error);
  // The input is only read: copied when it must be made contiguous or
  // prescaled.
  at::Tensor in;
  if (error.empty()) {
    in = tensor.contiguous();
    if (o.prescale_factor() != 1.0)
      in = scaled(in, o.prescale_factor());
  }
  if (in.defined() && in.is_cpu())
    call.payload = in;
  return submit(
      std::move(call),
      [in, o, into, exact](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        state.result = reducescatter_work(
            comm, ex, c, in, o.op(), o.postscale_factor(), into, exact);
        if (exact)
          expect_out(c, state.result, into);
      },
      {in, into},
      blocking);
}

Handle barrier_impl(const ProcessSet& set, bool blocking) {
  // The descriptor exchange is itself an all-gather, which no rank leaves
  // before every rank entered: it is the barrier, and it checks the call.
  Group& group = group_of(set, "barrier");
  Call call =
      make_call(group, OpKind::Barrier, at::Tensor(), "", true, -1, -1, "");
  return submit(
      std::move(call),
      [](Communicator&, HandleState&, const Exchanged&, const Call&) {},
      {},
      blocking);
}

}  // namespace

Handle allreduce_call(
    const at::Tensor& tensor,
    const AllreduceOptions& options,
    bool in_place,
    bool blocking) {
  return allreduce_impl(tensor, options, in_place, blocking);
}

Handle broadcast_call(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options,
    bool in_place,
    bool blocking) {
  return broadcast_impl(tensor, root_rank, options, in_place, blocking);
}

Handle allgather_call(
    const at::Tensor& tensor,
    const CollectiveOptions& options,
    bool blocking,
    const at::Tensor& into,
    bool whole) {
  return allgather_impl(tensor, options, blocking, into, false, whole);
}

Handle alltoall_call(
    const at::Tensor& tensor,
    const AlltoallOptions& options,
    bool blocking,
    const at::Tensor& into,
    const std::vector<int64_t>& expect) {
  return alltoall_impl(tensor, options, blocking, into, expect);
}

Handle reducescatter_call(
    const at::Tensor& tensor,
    const ReducescatterOptions& options,
    bool blocking,
    const at::Tensor& into) {
  return reducescatter_impl(tensor, options, blocking, into);
}

Handle barrier_call(const ProcessSet& process_set, bool blocking) {
  return barrier_impl(process_set, blocking);
}

}  // namespace detail

// The blocking forms wait at once: their job may run on the caller's thread.
constexpr bool kAsync = false;
constexpr bool kBlocking = true;

Handle allreduce_async(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  return detail::allreduce_impl(tensor, options, /*in_place=*/false, kAsync);
}

at::Tensor allreduce(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  if (detail::wants_grad(tensor))
    return detail::allreduce_with_grad(tensor, options);
  return detail::allreduce_impl(tensor, options, false, kBlocking).result();
}

Handle allreduce_async_(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  return detail::allreduce_impl(tensor, options, /*in_place=*/true, kAsync);
}

void allreduce_(const at::Tensor& tensor, const AllreduceOptions& options) {
  detail::allreduce_impl(tensor, options, true, kBlocking).wait();
}

Handle allgather_async(
    const at::Tensor& tensor, const CollectiveOptions& options) {
  return detail::allgather_impl(tensor, options, kAsync);
}

at::Tensor allgather(
    const at::Tensor& tensor, const CollectiveOptions& options) {
  if (detail::wants_grad(tensor))
    return detail::allgather_with_grad(tensor, options);
  return detail::allgather_impl(tensor, options, kBlocking).result();
}

Handle broadcast_async(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  return detail::broadcast_impl(tensor, root_rank, options, false, kAsync);
}

at::Tensor broadcast(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  if (detail::wants_grad(tensor))
    return detail::broadcast_with_grad(tensor, root_rank, options);
  return detail::broadcast_impl(tensor, root_rank, options, false, kBlocking)
      .result();
}

Handle broadcast_async_(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  return detail::broadcast_impl(tensor, root_rank, options, true, kAsync);
}

void broadcast_(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  detail::broadcast_impl(tensor, root_rank, options, true, kBlocking).wait();
}

Handle alltoall_async(
    const at::Tensor& tensor, const AlltoallOptions& options) {
  return detail::alltoall_impl(tensor, options, kAsync);
}

at::Tensor alltoall(const at::Tensor& tensor, const AlltoallOptions& options) {
  if (detail::wants_grad(tensor))
    return detail::alltoall_with_grad(tensor, options);
  return detail::alltoall_impl(tensor, options, kBlocking).result();
}

Handle reducescatter_async(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  return detail::reducescatter_impl(tensor, options, kAsync);
}

at::Tensor reducescatter(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  if (detail::wants_grad(tensor))
    return detail::reducescatter_with_grad(tensor, options);
  return detail::reducescatter_impl(tensor, options, kBlocking).result();
}

Handle allgather_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const CollectiveOptions& options) {
  return detail::allgather_impl(tensor, options, kAsync, out, /*exact=*/true);
}

void allgather_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const CollectiveOptions& options) {
  detail::allgather_impl(tensor, options, kBlocking, out, true).wait();
}

Handle alltoall_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const AlltoallOptions& options) {
  return detail::alltoall_impl(tensor, options, kAsync, out, {}, true);
}

std::vector<int64_t> alltoall_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const AlltoallOptions& options) {
  return detail::alltoall_impl(tensor, options, kBlocking, out, {}, true)
      .received_splits();
}

Handle reducescatter_into_async(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const ReducescatterOptions& options) {
  return detail::reducescatter_impl(tensor, options, kAsync, out, true);
}

void reducescatter_into(
    const at::Tensor& tensor,
    const at::Tensor& out,
    const ReducescatterOptions& options) {
  detail::reducescatter_impl(tensor, options, kBlocking, out, true).wait();
}

Handle barrier_async(const ProcessSet& process_set) {
  return detail::barrier_impl(process_set, kAsync);
}

void barrier(const ProcessSet& process_set) {
  detail::barrier_impl(process_set, kBlocking).wait();
}

}  // namespace ronde
