// The collectives' bodies: what a job runs on the backend once the call is
// checked, from the check's frames when they carried every input. A rank
// in ronde::join() runs these same bodies (comm/join.cpp), so that it does
// on the wire exactly what the others do.
#include "comm/collective_bodies.h"

#include "comm/host_types.h"
#include "comm/shm/reduce_n.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace ronde::detail {

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

namespace {

// The output of a collective that writes `numel` elements shaped `shape`
// like `in`: `into`'s first elements when it can hold them (with `exact`,
// only when it holds exactly that many), else a new tensor. With `apart`,
// only when they do not overlap `in` either.
at::Tensor output_for(
    const at::Tensor& in,
    at::IntArrayRef shape,
    int64_t numel,
    const at::Tensor& into,
    bool apart,
    bool exact) {
  if (into.defined() && into.is_contiguous() &&
      into.scalar_type() == in.scalar_type() && into.device() == in.device() &&
      (exact ? into.numel() == numel : into.numel() >= numel)) {
    const auto* a = static_cast<const uint8_t*>(into.data_ptr());
    const auto* b = static_cast<const uint8_t*>(in.data_ptr());
    const size_t a_bytes = static_cast<size_t>(numel) * in.element_size();
    const size_t b_bytes = in.numel() * in.element_size();
    if (!apart || a_bytes == 0 || b_bytes == 0 || a + a_bytes <= b ||
        b + b_bytes <= a)
      return into.view({-1}).narrow(0, 0, numel).view(shape);
  }
  return at::empty(shape, in.options());
}

// Half and bfloat16: at::mul_ by a double rounds the factor to the
// tensor's precision first (an ulp off); these are scaled in float and
// rounded once, as one process and Horovod compute them.
bool reduced_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

}  // namespace

void scale_in_place(const at::Tensor& t, double factor) {
  if (reduced_precision(t))
    t.copy_(t.to(at::kFloat).mul_(factor));
  else
    t.mul_(factor);
}

at::Tensor scaled(const at::Tensor& t, double factor) {
  return reduced_precision(t)
             ? t.to(at::kFloat).mul_(factor).to(t.scalar_type())
             : t.mul(factor);
}

namespace {

// After the sum: the average's division and the postscale.
void finish_reduction(const at::Tensor& work, int n, ReduceOp op, double post) {
  // Division by one is exact: at one rank the average is the tensor itself
  // (a full pass over every bucket saved).
  if (op == ReduceOp::Average && n > 1)
    work.div_(n);
  if (post != 1.0)
    scale_in_place(work, post);
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
      scale_in_place(
          at::from_blob(
              ex.payloads[r],
              {static_cast<int64_t>(ex.payload_bytes[r] / elem)},
              out.options()),
          pre);
    }
  }
  if (count < 0)
    count = numel;
  std::vector<const void*> in(n);
  for (size_t r = 0; r < n; ++r)
    in[r] = ex.payloads[r] + first * elem;
  ReduceNFn fn = pick_reduce_n(
      static_cast<DType>(host_dtype(out.scalar_type())),
      host_reduction(backend_op(op)));
  TORCH_INTERNAL_ASSERT(fn != nullptr, "no host reduction for this dtype");
  if (count > 0)
    fn(out.data_ptr(), in.data(), static_cast<int>(n), count);
}

// The ranks whose inputs count: those not in ronde::join() (an average
// divides by them).
int contributors(const Communicator& comm, const Exchanged& ex) {
  return comm.size() - ex.joined_count;
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

}  // namespace

// An all-reduce of `work` in place: done already when the backend carried
// it with the check's frames; from the frames when they carried every
// input; else on the backend. Then scaled and averaged.
void allreduce_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& work,
    ReduceOp op,
    double pre,
    double post) {
  if (ex.reduced) {
    // Call::fused_op is set only without a prescale.
    TORCH_INTERNAL_ASSERT(
        pre == 1.0, "ronde: a fused all-reduce with a prescale");
  } else if (!ex.payloads.empty()) {
    reduce_payloads(ex, work, op, pre);
  } else {
    if (pre != 1.0)
      scale_in_place(work, pre);
    guarded(comm, c, [&] {
      // A sum's postscale taken by the backend saves a pass over memory
      // (the engine's 1/n on every bucket); an average divides after.
      // (Backends scale float and double only: half and bfloat16 are
      // scaled by scale_in_place() below.)
      if (op != ReduceOp::Average && post != 1.0 &&
          comm.allreduce_scaled(work, backend_op(op), post)) {
        post = 1.0;
      } else {
        comm.allreduce(work, backend_op(op));
      }
    });
  }
  finish_reduction(work, contributors(comm, ex), op, post);
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

at::Tensor allgather_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    const at::Tensor& into,
    bool exact) {
  const std::vector<Descriptor>& all = ex.all;
  const int64_t row = row_bytes(in);
  std::vector<size_t> bytes(all.size());
  int64_t rows = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    bytes[r] = static_cast<size_t>(all[r].dims[0] * row);
    rows += all[r].dims[0];
  }
  // A buffer the caller keeps (the sharded engine's pool) when it fits:
  // no fresh pages to fault in on every call. `in` may be this rank's own
  // block of it (torch's in-place all_gather_into_tensor, as FSDP calls
  // it): the backends write that block from `in` itself.
  at::Tensor out = output_for(
      in,
      shape_with_dim0(in, rows),
      rows * row / in.element_size(),
      into,
      /*apart=*/false,
      exact);
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

// Sends splits[r] rows of `in` to rank r; returns what came, and in `recv`
// how many rows from each rank.
at::Tensor alltoall_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    const std::vector<int64_t>& splits,
    std::vector<int64_t>& recv,
    const at::Tensor& into,
    const std::vector<int64_t>& expect,
    bool exact) {
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
  // Into the caller's buffer only when what comes is what it expects (the
  // caller reports a mismatch before anything is written), and apart from
  // `in`, which is read while the output is written.
  at::Tensor out = output_for(
      in,
      shape_with_dim0(in, rows),
      rows * row / in.element_size(),
      expect.empty() || recv == expect ? into : at::Tensor(),
      /*apart=*/true,
      exact);
  guarded(comm, c, [&] { comm.alltoall(in, send_bytes, out, recv_bytes); });
  return out;
}

// `in` prescaled already; returns this rank's block of the reduction.
at::Tensor reducescatter_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    ReduceOp op,
    double post,
    const at::Tensor& into,
    bool exact) {
  const int n = comm.size();
  const int me = comm.rank();
  const int64_t rows = in.size(0);
  const int64_t row = row_bytes(in) / in.element_size();
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r)
    counts[r] = block_rows(rows, n, r) * row;
  // Apart from `in`, which every block of is read while this one is
  // written (the in-place form gets a new tensor, copied out).
  at::Tensor out = output_for(
      in,
      shape_with_dim0(in, block_rows(rows, n, me)),
      counts[me],
      into,
      /*apart=*/true,
      exact);
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

}  // namespace ronde::detail
