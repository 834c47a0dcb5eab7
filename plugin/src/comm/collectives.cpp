// The public collectives: each call checks its input and prepares its
// tensors on the caller's thread, then queues a job (comm/jobs.h) whose body
// here runs the collective on the backend. The job exchanges the call's
// descriptor first (comm/descriptor.h), so a mismatch fails on every rank.
#include <ronde/collectives.h>

#include "comm/host_types.h"
#include "comm/jobs.h"
#include "comm/shm/reduce_n.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <limits>

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

BackendOp backend_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:  // summed, then divided
      return BackendOp::Sum;
    case ReduceOp::Min:
      return BackendOp::Min;
    case ReduceOp::Max:
      return BackendOp::Max;
    case ReduceOp::Product:
      return BackendOp::Product;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

// After the sum: the average's division and the postscale.
void finish_reduction(const at::Tensor& work, int n, ReduceOp op, double post) {
  // Division by one is exact: at one rank the average is the tensor itself
  // (a full pass over every bucket saved).
  if (op == ReduceOp::Average && n > 1)
    work.div_(n);
  if (post != 1.0)
    work.mul_(post);
}

// The reduction of every rank's payload (the check's frames) into `out`
// (`count` elements from element `first`), in rank order with the
// shared-memory backend's kernels, so every rank computes the same bits.
// Each payload is scaled by `pre` first, as the backend would see it.
void reduce_payloads(
    const Exchanged& ex,
    const at::Tensor& out,
    ReduceOp op,
    double pre,
    int64_t first = 0,
    int64_t count = -1) {
  const size_t n = ex.payloads.size();
  const int64_t numel = out.numel();
  const size_t elem = out.element_size();
  if (pre != 1.0) {
    // The frames are this job's own memory.
    for (size_t r = 0; r < n; ++r) {
      at::from_blob(
          ex.payloads[r],
          {static_cast<int64_t>(ex.payload_bytes[r] / elem)},
          out.options())
          .mul_(pre);
    }
  }
  if (count < 0)
    count = numel;
  std::vector<const void*> in(n);
  for (size_t r = 0; r < n; ++r)
    in[r] = ex.payloads[r] + first * elem;
  ReduceNFn fn = pick_reduce_n(
      host_dtype(out.scalar_type()), host_op(backend_op(op)));
  TORCH_INTERNAL_ASSERT(fn != nullptr, "no host reduction for this dtype");
  if (count > 0)
    fn(out.data_ptr(), in.data(), static_cast<int>(n), count);
}

// The ranks whose inputs count: those not in ronde::join() (an average
// divides by them).
int contributors(const Communicator& comm, const Exchanged& ex) {
  return comm.size() - ex.joined_count;
}

// An all-reduce of `work` in place: from the check's frames when they
// carried every input, else on the backend; scaled and averaged.
void allreduce_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& work,
    ReduceOp op,
    double pre,
    double post) {
  if (!ex.payloads.empty()) {
    reduce_payloads(ex, work, op, pre);
  } else {
    if (pre != 1.0)
      work.mul_(pre);
    guarded(comm, c, [&] { comm.allreduce(work, backend_op(op)); });
  }
  finish_reduction(work, contributors(comm, ex), op, post);
}

// The buffer a collective works in: in place, the caller's own storage when
// it is contiguous; otherwise a contiguous copy (copied back afterwards when
// in place).
at::Tensor working_copy(const at::Tensor& tensor, bool in_place) {
  return in_place && tensor.is_contiguous() ? tensor
                                            : tensor.contiguous().clone();
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
  if (work.defined() && work.is_cpu())
    call.payload = work;
  return submit(
      std::move(call),
      [=](Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        allreduce_work(
            comm,
            ex,
            c,
            work,
            o.op(),
            o.prescale_factor(),
            o.postscale_factor());
        if (in_place && !work.is_same(tensor))
          tensor.copy_(work);
        state.result = in_place ? tensor : work;
      },
      {tensor, work},
      blocking);
}

void broadcast_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& work,
    int root) {
  if (!ex.payloads.empty()) {
    if (ex.payload_bytes[root] > 0)
      std::memcpy(work.data_ptr(), ex.payloads[root], ex.payload_bytes[root]);
  } else {
    guarded(comm, c, [&] { comm.broadcast(work, root); });
  }
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

int64_t row_bytes(const at::Tensor& t) {
  int64_t row = t.element_size();
  for (int64_t i = 1; i < t.dim(); ++i)
    row *= t.size(i);
  return row;
}

std::vector<int64_t> shape_with_dim0(const at::Tensor& t, int64_t dim0) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = dim0;
  return shape;
}

at::Tensor allgather_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in) {
  const std::vector<Descriptor>& all = ex.all;
  const int64_t row = row_bytes(in);
  std::vector<size_t> bytes(all.size());
  int64_t rows = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    bytes[r] = static_cast<size_t>(all[r].dims[0] * row);
    rows += all[r].dims[0];
  }
  at::Tensor out = at::empty(shape_with_dim0(in, rows), in.options());
  if (!ex.payloads.empty()) {
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (size_t r = 0; r < all.size(); ++r) {
      if (bytes[r] > 0)
        std::memcpy(dst, ex.payloads[r], bytes[r]);
      dst += bytes[r];
    }
  } else {
    guarded(comm, c, [&] { comm.allgather(in, out, bytes); });
  }
  return out;
}

Handle allgather_impl(
    const at::Tensor& tensor, const CollectiveOptions& options, bool blocking) {
  Group& group = group_of(options.process_set(), "allgather");
  std::string error = check_dtype(tensor);
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "allgather needs at least one dimension (it concatenates dim 0)";
  }
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
      [in](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) { state.result = allgather_work(comm, ex, c, in); },
      {in},
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

// Sends splits[r] rows of `in` to rank r; returns what came, and in `recv`
// how many rows from each rank.
at::Tensor alltoall_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    const std::vector<int64_t>& splits,
    std::vector<int64_t>& recv) {
  const int n = comm.size();
  // Every rank's send splits, so each knows what it receives.
  std::vector<int64_t> matrix(static_cast<size_t>(n) * n);
  auto all = at::from_blob(matrix.data(), {n * n}, at::kLong);
  if (!ex.payloads.empty()) {
    for (int r = 0; r < n; ++r) {
      std::memcpy(
          matrix.data() + static_cast<size_t>(r) * n,
          ex.payloads[r],
          n * sizeof(int64_t));
    }
  } else {
    auto mine =
        at::from_blob(const_cast<int64_t*>(splits.data()), {n}, at::kLong);
    guarded(comm, c, [&] {
      comm.allgather(mine, all, std::vector<size_t>(n, n * sizeof(int64_t)));
    });
  }
  const int me = comm.rank();
  const int64_t row = row_bytes(in);
  std::vector<int64_t> send_bytes(n), recv_bytes(n);
  recv.assign(n, 0);
  int64_t rows = 0;
  for (int r = 0; r < n; ++r) {
    recv[r] = matrix[static_cast<size_t>(r) * n + me];
    rows += recv[r];
    send_bytes[r] = splits[r] * row;
    recv_bytes[r] = recv[r] * row;
  }
  at::Tensor out = at::empty(shape_with_dim0(in, rows), in.options());
  guarded(comm, c, [&] { comm.alltoall(in, send_bytes, out, recv_bytes); });
  return out;
}

Handle alltoall_impl(
    const at::Tensor& tensor, const AlltoallOptions& options, bool blocking) {
  Group& group = group_of(options.process_set(), "alltoall");
  const int n = group.size;
  std::string error = check_dtype(tensor);
  const std::vector<int64_t> splits =
      alltoall_splits(tensor, options.splits(), n, error);
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
      [in, splits](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        state.result = alltoall_work(comm, ex, c, in, splits, state.splits);
      },
      {in},
      blocking);
}

// `in` prescaled already; returns this rank's block of the reduction.
at::Tensor reducescatter_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    ReduceOp op,
    double post) {
  // Dim 0 split as evenly as it goes, the first blocks one row longer.
  const int n = comm.size();
  const int me = comm.rank();
  const int64_t rows = in.size(0);
  const int64_t row = row_bytes(in) / in.element_size();
  auto block_rows = [&](int r) { return rows / n + (r < rows % n); };
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r)
    counts[r] = block_rows(r) * row;
  at::Tensor out = at::empty(shape_with_dim0(in, block_rows(me)), in.options());
  if (!ex.payloads.empty()) {
    // Reduce this rank's block only.
    int64_t first = 0;
    for (int r = 0; r < me; ++r)
      first += counts[r];
    reduce_payloads(ex, out, op, 1.0, first, counts[me]);
  } else {
    guarded(
        comm, c, [&] { comm.reduce_scatter(in, out, counts, backend_op(op)); });
  }
  finish_reduction(out, contributors(comm, ex), op, post);
  return out;
}

Handle reducescatter_impl(
    const at::Tensor& tensor, const ReducescatterOptions& o, bool blocking) {
  Group& group = group_of(o.process_set(), "reducescatter");
  std::string error = check_reduction(
      tensor, o.op(), o.prescale_factor(), o.postscale_factor());
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "reducescatter needs at least one dimension (it splits dim 0)";
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
      in = in.mul(o.prescale_factor());
  }
  if (in.defined() && in.is_cpu())
    call.payload = in;
  return submit(
      std::move(call),
      [in, o](
          Communicator& comm,
          HandleState& state,
          const Exchanged& ex,
          const Call& c) {
        state.result =
            reducescatter_work(comm, ex, c, in, o.op(), o.postscale_factor());
      },
      {in},
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

// An input of the call `d` that changes nothing: what a rank in
// ronde::join() contributes (zeros to a sum, the largest value to a min,
// no rows to an allgather or alltoall, ...).
at::Scalar identity_of(ReduceOp op, at::ScalarType dtype) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:
      return 0;
    case ReduceOp::Product:
      return 1;
    case ReduceOp::Min:
    case ReduceOp::Max:
      break;
  }
  const bool highest = op == ReduceOp::Min;
  if (at::isFloatingType(dtype)) {
    const double inf = std::numeric_limits<double>::infinity();
    return highest ? inf : -inf;
  }
  return AT_DISPATCH_INTEGRAL_TYPES(dtype, "identity_of", [&] {
    return at::Scalar(
        highest ? std::numeric_limits<scalar_t>::max()
                : std::numeric_limits<scalar_t>::lowest());
  });
}

// A rank in ronde::join() takes part in the call the others made (its
// descriptor stands in for theirs: jobs.cpp), through the same body, with
// an input that changes nothing; the result is dropped.
void answer_as_joined(Communicator& comm, const Exchanged& ex, const Call& c) {
  const Descriptor& d = ex.all[comm.rank()];
  const auto kind = static_cast<OpKind>(d.kind);
  if (kind == OpKind::Barrier)
    return;
  const auto dtype = static_cast<at::ScalarType>(d.dtype);
  const std::vector<int64_t> shape(d.dims, d.dims + d.ndim);
  const auto options = at::TensorOptions().dtype(dtype);
  const auto op = static_cast<ReduceOp>(d.op);
  switch (kind) {
    case OpKind::Allreduce:
      allreduce_work(
          comm,
          ex,
          c,
          at::full(shape, identity_of(op, dtype), options),
          op,
          1.0,
          1.0);
      break;
    case OpKind::Broadcast:
      broadcast_work(comm, ex, c, at::empty(shape, options), d.root);
      break;
    case OpKind::Allgather:
      allgather_work(comm, ex, c, at::empty(shape, options));
      break;
    case OpKind::Alltoall: {
      std::vector<int64_t> recv;
      alltoall_work(
          comm,
          ex,
          c,
          at::empty(shape, options),
          std::vector<int64_t>(comm.size(), 0),
          recv);
      break;
    }
    case OpKind::Reducescatter:
      reducescatter_work(
          comm,
          ex,
          c,
          at::full(shape, identity_of(op, dtype), options),
          op,
          1.0);
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "join: no answer to ", to_string(kind));
  }
}

int join_impl(const ProcessSet& set) {
  Group& group = group_of(set, "join");
  for (;;) {
    Call call = make_call(
        group, OpKind::Join, at::Tensor(), "ronde.join", true, -1, -1, "");
    Handle h = submit(
        std::move(call),
        [](Communicator& comm,
           HandleState& state,
           const Exchanged& ex,
           const Call& c) {
          if (!ex.all_joined)
            answer_as_joined(comm, ex, c);
          state.result =
              at::full({1}, ex.all_joined ? ex.last_joined : -1, at::kLong);
        },
        {},
        /*blocking=*/true);
    const int64_t last = h.result().item<int64_t>();
    if (last >= 0)
      return static_cast<int>(last);
  }
}

}  // namespace
}  // namespace detail

int join(const ProcessSet& process_set) {
  return detail::join_impl(process_set);
}

// The blocking forms wait at once: their job may run on the caller's thread.
constexpr bool kAsync = false;
constexpr bool kBlocking = true;

Handle allreduce_async(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  return detail::allreduce_impl(tensor, options, /*in_place=*/false, kAsync);
}

at::Tensor allreduce(
    const at::Tensor& tensor, const AllreduceOptions& options) {
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
  return detail::allgather_impl(tensor, options, kBlocking).result();
}

Handle broadcast_async(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  return detail::broadcast_impl(tensor, root_rank, options, false, kAsync);
}

at::Tensor broadcast(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
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
  return detail::alltoall_impl(tensor, options, kBlocking).result();
}

Handle reducescatter_async(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  return detail::reducescatter_impl(tensor, options, kAsync);
}

at::Tensor reducescatter(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  return detail::reducescatter_impl(tensor, options, kBlocking).result();
}

Handle barrier_async(const ProcessSet& process_set) {
  return detail::barrier_impl(process_set, kAsync);
}

void barrier(const ProcessSet& process_set) {
  detail::barrier_impl(process_set, kBlocking).wait();
}

}  // namespace ronde
