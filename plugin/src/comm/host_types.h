// What the host backends (Gloo, shared memory) share in adapting tensors to
// their raw-buffer kernels: the element-type and reduction codes of
// gloo_module_api.h, and staging of device tensors through host memory.
#pragma once

#include "comm/communicator.h"
#include "comm/gloo_module/gloo_module_api.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ronde::detail {

// -1 for a type the host kernels cannot reduce.
inline int host_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return RONDE_GLOO_F32;
    case at::kDouble:
      return RONDE_GLOO_F64;
    case at::kHalf:
      return RONDE_GLOO_F16;
    case at::kBFloat16:
      return RONDE_GLOO_BF16;
    case at::kChar:
      return RONDE_GLOO_I8;
    case at::kByte:
      return RONDE_GLOO_U8;
    case at::kShort:
      return RONDE_GLOO_I16;
    case at::kInt:
      return RONDE_GLOO_I32;
    case at::kLong:
      return RONDE_GLOO_I64;
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
