// The element operations of kernels/reduce.h, one scalar at a time and marked QCCL_HD, for the CUDA
// launcher (reduce_cuda.cu). The host launcher (reduce.cc) computes the same bits with Highway
// vectors and keeps its code private to its translation unit, so this is a second spelling of
// reduce.h's promise: codec_cuda_test compares the two over every type and operator.
//
// The promise (reduce.h): integer sum and product wrap; float32/float64 do one IEEE operation;
// float16/bfloat16 widen to float32, operate and round back (half.h); every floating NaN result is
// the canonical NaN (positive, quiet, all payload bits set); floating max/min propagate NaN and order
// -0 below +0, so op(a, b) and op(b, a) give the same bits. Build with one rounding per operator
// (nvcc --fmad=false), as for the codecs.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/half.h"
#include "kernels/hd.h"

namespace qccl::kernels {

QCCL_HD float canonical_nan(float) { return bits_to_float(0x7FFFFFFFu); }
QCCL_HD double canonical_nan(double) {
  const uint64_t bits = 0x7FFFFFFFFFFFFFFFull;
  double d = 0;
  memcpy(&d, &bits, sizeof d);
  return d;
}

template <class F>
QCCL_HD F canonicalize_nan(F x) {
  return x != x ? canonical_nan(x) : x;
}

// Bitwise AND (kAnd) or OR of two floating values: among equal values, max keeps +0 over -0 (AND of
// the sign bits) and min keeps -0 (OR), and any other equal pair is returned as it is.
template <bool kAnd, class F>
QCCL_HD F combine_bits(F a, F b) {
  using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
  U ua = 0, ub = 0;
  memcpy(&ua, &a, sizeof a);
  memcpy(&ub, &b, sizeof b);
  const U r = kAnd ? (ua & ub) : (ua | ub);
  F f = 0;
  memcpy(&f, &r, sizeof f);
  return f;
}

// Integers go through the unsigned type of their width: wraparound is the promise, and signed
// overflow would be undefined. (uint8_t products are promoted to int and cannot overflow it.)
struct ReduceSum {
  template <class T>
  QCCL_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return canonicalize_nan(a + b);
    } else {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  }
};

struct ReduceProd {
  template <class T>
  QCCL_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return canonicalize_nan(a * b);
    } else {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    }
  }
};

template <bool kMax>
struct ReduceMaxMin {
  template <class T>
  QCCL_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a || b != b) return canonical_nan(a);
      if (a == b) return combine_bits<kMax>(a, b);
    }
    return kMax ? (a > b ? a : b) : (a < b ? a : b);
  }
};

// finish_average's division: integers in 64 bits, truncating toward zero; floating types divide by
// nranks converted to their own type (float32 for float16/bfloat16). b is ignored.
struct DivideByRanks {
  int nranks;
  template <class T>
  QCCL_HD T operator()(T a, T /*b*/) const {
    if constexpr (std::is_floating_point_v<T>) {
      return canonicalize_nan(a / static_cast<T>(nranks));
    } else {
      using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
      return static_cast<T>(static_cast<Wide>(a) / static_cast<Wide>(nranks));
    }
  }
};

// float16 (kHalf) or bfloat16 bits: widen both, apply op in float32, round back to nearest even.
template <bool kHalf, class Op>
struct OnFloat16 {
  Op op;
  QCCL_HD uint16_t operator()(uint16_t a, uint16_t b) const {
    const float fa = kHalf ? half_to_float(a) : bf16_to_float(a);
    const float fb = kHalf ? half_to_float(b) : bf16_to_float(b);
    const float r = op(fa, fb);
    return kHalf ? float_to_half(r) : float_to_bf16(r);
  }
};

}  // namespace qccl::kernels
