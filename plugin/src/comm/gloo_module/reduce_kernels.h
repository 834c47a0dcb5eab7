// The element-wise reductions of ronde's host backends, on raw buffers: every
// dtype ronde accepts and every op, fp16/bf16 reduced in float and rounded
// once per element, integer sums wrapping as LibTorch's. Header-only with
// internal linkage on purpose: each library that includes it (the Gloo
// module, which must share no symbol with libronde) gets its own copy.
#pragma once

#include "../dtype_table.h"
#include "gloo_module_api.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace {

// IEEE half and bfloat16 are reduced in float and rounded back once per
// element, as LibTorch's own CPU kernels do.
float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: renormalise.
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    // Inf stays inf; NaN stays a quiet NaN.
    return static_cast<uint16_t>(
        sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {
    return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  }
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: shift with round-to-nearest-even.
    if (abs < 0x33000000u) {
      return static_cast<uint16_t>(sign);
    }
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_m & 1u))) {
      ++half_m;
    }
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
    ++h;
  }
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  }
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Product {
  template <typename T>
  static T apply(T a, T b) {
    return a * b;
  }
};
// Min and max propagate NaN, as torch.minimum / torch.maximum do.
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b))
        return std::numeric_limits<T>::quiet_NaN();
    }
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b))
        return std::numeric_limits<T>::quiet_NaN();
    }
    return a < b ? b : a;
  }
};

// Integer sums wrap like LibTorch's (two's complement), without the
// undefined behaviour of signed overflow.
template <typename Op, typename T>
T apply_int(T a, T b) {
  if constexpr (std::is_same_v<Op, Sum> || std::is_same_v<Op, Product>) {
    using U = std::make_unsigned_t<T>;
    U r = std::is_same_v<Op, Sum>
              ? static_cast<U>(static_cast<U>(a) + static_cast<U>(b))
              : static_cast<U>(static_cast<U>(a) * static_cast<U>(b));
    return static_cast<T>(r);
  } else {
    return Op::apply(a, b);
  }
}

// target_clones lets the hot loops use AVX2 where the CPU has it while the
// module still runs on any x86-64.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define RONDE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RONDE_VECTOR_CLONES
#endif

template <typename Op, typename T>
RONDE_VECTOR_CLONES void reduce_plain(
    void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      out[i] = Op::apply(x[i], y[i]);
    } else {
      out[i] = apply_int<Op>(x[i], y[i]);
    }
  }
}

template <typename Op, float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = Store(Op::apply(Load(x[i]), Load(y[i])));
  }
}

#if defined(__x86_64__)
// Half-precision sums (the gradient path with FP16 compression) through the
// F16C conversions, 8 lanes at a time: the same float add and
// round-to-nearest-even as the scalar loop, several times faster.
__attribute__((target("avx,f16c"))) void sum_half_f16c(
    void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 fx = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    __m256 fy = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + i),
        _mm256_cvtps_ph(_mm256_add_ps(fx, fy), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    out[i] = float_to_half(half_to_float(x[i]) + half_to_float(y[i]));
  }
}

bool has_f16c() {
  static const bool yes =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// The module's ABI codes are the table's.
#define RONDE_DTYPE_ABI(name, type, code, torch, nccl) \
  static_assert(code == RONDE_GLOO_##name, "dtype code of " #name);
RONDE_DTYPES(RONDE_DTYPE_ABI)
#undef RONDE_DTYPE_ABI
static_assert(
    static_cast<int>(ronde::detail::Reduction::Sum) == RONDE_GLOO_SUM &&
    static_cast<int>(ronde::detail::Reduction::Min) == RONDE_GLOO_MIN &&
    static_cast<int>(ronde::detail::Reduction::Max) == RONDE_GLOO_MAX &&
    static_cast<int>(ronde::detail::Reduction::Product) == RONDE_GLOO_PRODUCT);

// The kernel of one row of the dtype table: fp16 and bf16 through float,
// every other type on itself.
template <typename Op, ronde::detail::DType D, typename T>
ReduceFn reduce_fn_of() {
  using ronde::detail::DType;
  if constexpr (D == DType::F16) {
#if defined(__x86_64__)
    if constexpr (std::is_same_v<Op, Sum>) {
      if (has_f16c())
        return &sum_half_f16c;
    }
#endif
    return &reduce_16<Op, half_to_float, float_to_half>;
  } else if constexpr (D == DType::BF16) {
    return &reduce_16<Op, bf16_to_float, float_to_bf16>;
  } else {
    return &reduce_plain<Op, T>;
  }
}

template <typename Op>
ReduceFn pick_for_op(int dtype) {
  switch (dtype) {
#define RONDE_PICK(name, type, code, torch, nccl) \
  case code:                                      \
    return reduce_fn_of<Op, ronde::detail::DType::name, type>();
    RONDE_DTYPES(RONDE_PICK)
#undef RONDE_PICK
    default:
      return nullptr;
  }
}

[[maybe_unused]] ReduceFn pick_reduce(int dtype, int op) {
  switch (op) {
    case RONDE_GLOO_SUM:
      return pick_for_op<Sum>(dtype);
    case RONDE_GLOO_MIN:
      return pick_for_op<Min>(dtype);
    case RONDE_GLOO_MAX:
      return pick_for_op<Max>(dtype);
    case RONDE_GLOO_PRODUCT:
      return pick_for_op<Product>(dtype);
    default:
      return nullptr;
  }
}

// Bytes of one element of an ABI dtype code; 0 for an unknown one.
[[maybe_unused]] size_t element_size(int dtype) {
  switch (dtype) {
#define RONDE_SIZE(name, type, code, torch, nccl) \
  case code:                                      \
    return sizeof(type);
    RONDE_DTYPES(RONDE_SIZE)
#undef RONDE_SIZE
    default:
      return 0;
  }
}

}  // namespace
