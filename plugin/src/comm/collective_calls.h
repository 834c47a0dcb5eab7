// The collectives as ronde's own adapters call them: with the choice, per
// call, between queueing the job on the set's worker (blocking false, as
// the _async forms) and letting it run on the caller's thread when nothing
// is queued (blocking true, as the blocking forms; the caller then waits at
// once). The c10d backend learns per call whether torch will wait at once.
// Each returns the Handle the public forms return or wait on.
#pragma once

#include <ronde/collectives.h>

#include <cstdint>
#include <vector>

namespace ronde::detail {

Handle allreduce_call(
    const at::Tensor& tensor,
    const AllreduceOptions& options,
    bool in_place,
    bool blocking);
Handle broadcast_call(
    const at::Tensor& tensor,
    int root_rank,
    const CollectiveOptions& options,
    bool in_place,
    bool blocking);
// With `into`: an allgather (a reduce-scatter) into a buffer the caller
// keeps (the sharded engine's pool of gather buffers, the c10d backend's
// output tensors): the result is `into`'s first elements, shaped as the
// collective's, when `into` is contiguous, large enough and of the input's
// type and device (for a reduce-scatter, apart from the input too); a new
// tensor otherwise. Handle::result() returns it either way. With `whole`
// (the sharded engine gathering into a parameter): only when `into` holds
// exactly the result; else it is left untouched. The input may be this
// rank's own block of `into`.
Handle allgather_call(
    const at::Tensor& tensor,
    const CollectiveOptions& options,
    bool blocking,
    const at::Tensor& into = at::Tensor(),
    bool whole = false);
// With `into`: what comes is written there, as above, when the rows
// received from each rank equal `expect` (else a new tensor, so that the
// caller can report the mismatch with its output untouched).
Handle alltoall_call(
    const at::Tensor& tensor,
    const AlltoallOptions& options,
    bool blocking,
    const at::Tensor& into = at::Tensor(),
    const std::vector<int64_t>& expect = {});
Handle reducescatter_call(
    const at::Tensor& tensor,
    const ReducescatterOptions& options,
    bool blocking,
    const at::Tensor& into = at::Tensor());
Handle barrier_call(const ProcessSet& process_set, bool blocking);

// A zeroed buffer for `numel` elements that `set` will all-reduce in
// place, again and again (the gradient buckets): where the set's backend
// moves it without copying it in (Communicator::shared_zeros), else plain
// memory.
at::Tensor bucket_zeros(
    const ProcessSet& set, int64_t numel, const at::TensorOptions& options);

}  // namespace ronde::detail
