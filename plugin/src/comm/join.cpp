// ronde::join(): a rank that ran out of data keeps answering the others'
// collectives, with inputs that change nothing, until every rank of the set
// has joined. See README.md, "Uneven inputs: join".
//
// How: a joined rank's frame in the call check says so (comm/call_check.cpp
// records it and, while anyone is joined, has every call checked); its
// descriptor then stands in for the call the others made, and it runs that
// collective's one body (comm/collective_bodies.h) with an identity input.
#include <ronde/collectives.h>

#include "comm/collective_bodies.h"
#include "comm/jobs.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <limits>

namespace ronde {

namespace detail {
namespace {

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
// descriptor stands in for theirs: call_check.cpp), through the same body, with
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

}  // namespace ronde
