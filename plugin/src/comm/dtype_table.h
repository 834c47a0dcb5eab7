// The element types ronde reduces, listed once: each row names the type, its
// C++ storage type, its code (the Gloo module's ABI codes, the shared-memory
// transport's dtype) and LibTorch's at::ScalarType. The kernels, the host
// backends' type mapping and NCCL's derive from it. No LibTorch here: the
// Gloo module and comm/shm/ include it.
#pragma once

#include <cstddef>
#include <cstdint>

// X(name, storage type, code, at::ScalarType enumerator, reduced by NCCL).
// fp16 and bf16 are stored as their bits and reduced in float; NCCL has no
// int16, so the router keeps int16 on the host backend.
#define RONDE_DTYPES(X)                \
  X(F32, float, 0, Float, true)        \
  X(F64, double, 1, Double, true)      \
  X(F16, uint16_t, 2, Half, true)      \
  X(BF16, uint16_t, 3, BFloat16, true) \
  X(I8, int8_t, 4, Char, true)         \
  X(U8, uint8_t, 5, Byte, true)        \
  X(I16, int16_t, 6, Short, false)     \
  X(I32, int32_t, 7, Int, true)        \
  X(I64, int64_t, 8, Long, true)

namespace ronde::detail {

enum class DType : int {
#define RONDE_DTYPE_ENUM(name, type, code, torch, nccl) name = code,
  RONDE_DTYPES(RONDE_DTYPE_ENUM)
#undef RONDE_DTYPE_ENUM
};

// The reductions of the host kernels; the codes are the Gloo module's.
enum class Reduction : int { Sum = 0, Min = 1, Max = 2, Product = 3 };

// Bytes of one element; 0 for a code outside the table.
constexpr size_t dtype_size(DType d) {
  switch (d) {
#define RONDE_DTYPE_SIZE(name, type, code, torch, nccl) \
  case DType::name:                                     \
    return sizeof(type);
    RONDE_DTYPES(RONDE_DTYPE_SIZE)
#undef RONDE_DTYPE_SIZE
  }
  return 0;
}

// Whether `code` is a row of the table.
constexpr bool dtype_known(int code) {
  switch (code) {
#define RONDE_DTYPE_CODE(name, type, code, torch, nccl) case code:
    RONDE_DTYPES(RONDE_DTYPE_CODE)
#undef RONDE_DTYPE_CODE
    return true;
  }
  return false;
}

// Whether NCCL reduces the type of `code`; false outside the table.
constexpr bool dtype_on_nccl(int code) {
  switch (code) {
#define RONDE_DTYPE_NCCL(name, type, code, torch, nccl) \
  case code:                                            \
    return nccl;
    RONDE_DTYPES(RONDE_DTYPE_NCCL)
#undef RONDE_DTYPE_NCCL
  }
  return false;
}

}  // namespace ronde::detail
