// Reductions of n inputs at once, for the shared-memory backend: out[i] =
// in[0][i] op in[1][i] op ... op in[n-1][i], always in that order, so every
// rank that reduces the same inputs gets the same bits. The output may be
// in[0] or in[1] (their elements are read before it is written there),
// never another input, and not the only input. fp16 and bf16 are
// accumulated in float over all n inputs and rounded once. Built on the
// element kernels of the Gloo module (reduce_kernels.h); internal linkage.
#pragma once

#include "comm/gloo_module/reduce_kernels.h"

#include <algorithm>

namespace {

// Elements per block: the partial result of a block stays in L1 while the n
// inputs stream past it.
constexpr size_t kReduceBlock = 2048;

using ReduceNFn = void (*)(void*, const void* const*, int, size_t);

template <typename Op, typename T>
RONDE_VECTOR_CLONES void reduce_n_plain(
    void* out, const void* const* in, int n, size_t count) {
  T* o = static_cast<T*>(out);
  for (size_t base = 0; base < count; base += kReduceBlock) {
    const size_t m = std::min(kReduceBlock, count - base);
    T* ob = o + base;
    const T* a = static_cast<const T*>(in[0]) + base;
    if (n == 1) {
      std::memcpy(ob, a, m * sizeof(T));
      continue;
    }
    const T* b = static_cast<const T*>(in[1]) + base;
    for (size_t i = 0; i < m; ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        ob[i] = Op::apply(a[i], b[i]);
      } else {
        ob[i] = apply_int<Op>(a[i], b[i]);
      }
    }
    for (int k = 2; k < n; ++k) {
      const T* x = static_cast<const T*>(in[k]) + base;
      for (size_t i = 0; i < m; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          ob[i] = Op::apply(ob[i], x[i]);
        } else {
          ob[i] = apply_int<Op>(ob[i], x[i]);
        }
      }
    }
  }
}

template <typename Op, float (*Load)(uint16_t), uint16_t (*Store)(float)>
RONDE_VECTOR_CLONES void reduce_n_16(
    void* out, const void* const* in, int n, size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  float acc[kReduceBlock];
  for (size_t base = 0; base < count; base += kReduceBlock) {
    const size_t m = std::min(kReduceBlock, count - base);
    const auto* a = static_cast<const uint16_t*>(in[0]) + base;
    for (size_t i = 0; i < m; ++i)
      acc[i] = Load(a[i]);
    for (int k = 1; k < n; ++k) {
      const auto* x = static_cast<const uint16_t*>(in[k]) + base;
      for (size_t i = 0; i < m; ++i)
        acc[i] = Op::apply(acc[i], Load(x[i]));
    }
    for (size_t i = 0; i < m; ++i)
      o[base + i] = Store(acc[i]);
  }
}

#if defined(__x86_64__)
// fp16 sums and products through F16C, 8 lanes at a time: the same float
// arithmetic and the same single round-to-nearest-even as reduce_n_16.
template <bool kProduct>
__attribute__((target("avx,f16c"))) void reduce_n_half_f16c(
    void* out, const void* const* in, int n, size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
            static_cast<const uint16_t*>(in[0]) + i)));
    for (int k = 1; k < n; ++k) {
      __m256 x =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
              static_cast<const uint16_t*>(in[k]) + i)));
      acc = kProduct ? _mm256_mul_ps(acc, x) : _mm256_add_ps(acc, x);
    }
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(o + i),
        _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < count; ++i) {
    float acc = half_to_float(static_cast<const uint16_t*>(in[0])[i]);
    for (int k = 1; k < n; ++k) {
      const float x = half_to_float(static_cast<const uint16_t*>(in[k])[i]);
      acc = kProduct ? acc * x : acc + x;
    }
    o[i] = float_to_half(acc);
  }
}
#endif

// The n-input kernel of one row of the dtype table: fp16 and bf16 through
// float, every other type on itself.
template <typename Op, ronde::detail::DType D, typename T>
ReduceNFn reduce_n_fn_of() {
  using ronde::detail::DType;
  if constexpr (D == DType::F16) {
#if defined(__x86_64__)
    if constexpr (std::is_same_v<Op, Sum> || std::is_same_v<Op, Product>) {
      if (has_f16c())
        return &reduce_n_half_f16c<std::is_same_v<Op, Product>>;
    }
#endif
    return &reduce_n_16<Op, half_to_float, float_to_half>;
  } else if constexpr (D == DType::BF16) {
    return &reduce_n_16<Op, bf16_to_float, float_to_bf16>;
  } else {
    return &reduce_n_plain<Op, T>;
  }
}

template <typename Op>
ReduceNFn pick_n_for_op(ronde::detail::DType dtype) {
  switch (dtype) {
#define RONDE_PICK_N(name, type, code, torch, nccl) \
  case ronde::detail::DType::name:                  \
    return reduce_n_fn_of<Op, ronde::detail::DType::name, type>();
    RONDE_DTYPES(RONDE_PICK_N)
#undef RONDE_PICK_N
  }
  return nullptr;
}

// nullptr for an unknown dtype or op.
[[maybe_unused]] ReduceNFn pick_reduce_n(
    ronde::detail::DType dtype, ronde::detail::Reduction op) {
  using ronde::detail::Reduction;
  switch (op) {
    case Reduction::Sum:
      return pick_n_for_op<Sum>(dtype);
    case Reduction::Min:
      return pick_n_for_op<Min>(dtype);
    case Reduction::Max:
      return pick_n_for_op<Max>(dtype);
    case Reduction::Product:
      return pick_n_for_op<Product>(dtype);
  }
  return nullptr;
}

}  // namespace
