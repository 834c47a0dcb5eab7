// What the host backends (Gloo, shared memory) share in adapting tensors to
// their raw-buffer kernels: the element-type codes of comm/dtype_table.h
// (the Gloo module's ABI codes), the reduction codes, and staging of device
// tensors through host memory.
#pragma once

#include "comm/communicator.h"
#include "comm/dtype_table.h"
#include "comm/gloo_module/gloo_module_api.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ronde::detail {

// The dtype table's code of `t` (the Gloo module's ABI code); -1 for a
// type the host kernels cannot reduce.
inline int host_dtype(at::ScalarType t) {
  switch (t) {
#define RONDE_HOST_DTYPE(name, type, code, torch, nccl) \
  case at::ScalarType::torch:                           \
    return code;
    RONDE_DTYPES(RONDE_HOST_DTYPE)
#undef RONDE_HOST_DTYPE
    default:
      return -1;
  }
}

inline int host_op(BackendOp op) {
  switch (op) {
    case BackendOp::Sum:
      return RONDE_GLOO_SUM;
    case BackendOp::Min:
      return RONDE_GLOO_MIN;
    case BackendOp::Max:
      return RONDE_GLOO_MAX;
    case BackendOp::Product:
      return RONDE_GLOO_PRODUCT;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown reduction");
}

// The same as the table's Reduction, for the kernels of libronde itself
// (shared memory, the collectives' inline reductions).
inline Reduction host_reduction(BackendOp op) {
  return static_cast<Reduction>(host_op(op));
}

// The dtype code of a tensor a host backend is asked to reduce.
inline int checked_host_dtype(const at::Tensor& t, const char* backend) {
  const int dtype = host_dtype(t.scalar_type());
  TORCH_CHECK(
      dtype >= 0,
      "ronde: the ",
      backend,
      " backend cannot reduce dtype ",
      t.scalar_type());
  return dtype;
}

// Host backends read and write host memory: tensors on another device are
// staged through a CPU copy.
inline at::Tensor host(const at::Tensor& t) {
  return t.is_cpu() ? t : t.to(at::kCPU);
}
inline void copy_back(const at::Tensor& dst, const at::Tensor& staged) {
  if (!dst.is_same(staged))
    dst.copy_(staged);
}

}  // namespace ronde::detail
