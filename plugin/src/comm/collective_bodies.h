// The collectives' bodies (comm/collective_bodies.cpp), shared by the
// public collectives (comm/collectives.cpp) and by a rank in ronde::join()
// (comm/join.cpp): one body per collective, whoever runs it. Each runs in a
// job, after the call check, and reports a backend failure through
// guarded() (comm/jobs.h).
#pragma once

#include "comm/jobs.h"

#include <ronde/collectives.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ronde::detail {

// The backend's reduction for `op` (an average is summed, then divided).
BackendOp backend_op(ReduceOp op);

// `t` times `factor`, in place or as a new tensor; half and bfloat16 in
// float, rounded once.
void scale_in_place(const at::Tensor& t, double factor);
at::Tensor scaled(const at::Tensor& t, double factor);

// An all-reduce of `work` in place: from the check's frames when they
// carried every input, else on the backend; scaled and averaged (over the
// ranks not in ronde::join()).
void allreduce_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& work,
    ReduceOp op,
    double pre,
    double post);

// `root`'s `work` into every rank's `work`.
void broadcast_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& work,
    int root);

// Every rank's rows of `in` (dim 0 as each rank's descriptor says),
// concatenated in rank order: into the first elements of `into` (a buffer
// the caller keeps: no fresh pages to fault in, no copy out) when it is
// contiguous, of `in`'s type and device and large enough (`in` may be its
// own block there); else into a new tensor. With `exact`, into `into` only
// when it holds exactly the result's elements.
at::Tensor allgather_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    const at::Tensor& into = at::Tensor(),
    bool exact = false);

// Sends splits[r] rows of `in` to rank r; returns what came, and in `recv`
// how many rows from each rank. What came is written into `into` (as
// allgather_work() does, when `into` does not overlap `in`) if `recv`
// equals `expect`, or `expect` is empty.
at::Tensor alltoall_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    const std::vector<int64_t>& splits,
    std::vector<int64_t>& recv,
    const at::Tensor& into = at::Tensor(),
    const std::vector<int64_t>& expect = {},
    bool exact = false);

// The rows of block `r` when a reduce-scatter splits `rows` among `n`
// ranks: as evenly as it goes, the first rows % n blocks one row longer.
inline int64_t block_rows(int64_t rows, int n, int r) {
  return rows / n + (r < rows % n);
}

// `in` prescaled already; returns this rank's block of the reduction,
// written into `into` as allgather_work() does when `into` does not
// overlap `in`.
at::Tensor reducescatter_work(
    Communicator& comm,
    const Exchanged& ex,
    const Call& c,
    const at::Tensor& in,
    ReduceOp op,
    double post,
    const at::Tensor& into = at::Tensor(),
    bool exact = false);

}  // namespace ronde::detail
