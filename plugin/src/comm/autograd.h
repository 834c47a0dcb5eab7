// Gradients through the blocking out-of-place collectives (autograd.cpp):
// when the input requires a gradient and grad mode is on, ronde::allreduce,
// broadcast, allgather, alltoall and reducescatter return an output whose
// grad_fn applies Horovod's backward rule, instead of a copy whose gradient
// would silently be the identity's.
#pragma once

#include <ronde/collectives.h>

#include <ATen/Tensor.h>
#include <c10/core/GradMode.h>

namespace ronde::detail {

// Whether a collective on `tensor` must record its gradient.
inline bool wants_grad(const at::Tensor& tensor) {
  return tensor.defined() && tensor.requires_grad() &&
         c10::GradMode::is_enabled();
}

at::Tensor allreduce_with_grad(
    const at::Tensor& tensor, const AllreduceOptions& options);
at::Tensor broadcast_with_grad(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options);
at::Tensor allgather_with_grad(
    const at::Tensor& tensor, const CollectiveOptions& options);
at::Tensor alltoall_with_grad(
    const at::Tensor& tensor, const AlltoallOptions& options);
at::Tensor reducescatter_with_grad(
    const at::Tensor& tensor, const ReducescatterOptions& options);

}  // namespace ronde::detail
