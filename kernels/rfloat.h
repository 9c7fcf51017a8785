// The range-based N-bit float of FFT gradient sparsification (Wang et al., HPDC '20, §3.2.1,
// Algorithm 1; shared/specs/fftsparse.md §1.5), in its sign-magnitude form: a code is a sign bit
// above an (N-1)-bit magnitude index, index 0 meaning zero. A magnitude's index counts steps of the
// float32 bit pattern truncated to m mantissa bits, S(x) = bits(|x|) >> (23 - m), from the smallest
// representable magnitude eps (index 1) up to max (index P = 2^(N-1) - 1): so each binade holds 2^m
// codes, and N bits buy 1 sign bit, m mantissa bits and (N - 1 - m) bits' worth of binades. The
// paper's tuning loop for eps has the closed form S(eps) = S(max) - P + 1 (spec §1.5).
//
// Encoding, for rounding by truncation (the paper's shift; never grows a magnitude) or to nearest:
//   |x| > max (after rounding)  -> index P, counted as a clamp (both signs: the range is symmetric)
//   |x| < eps (after rounding)  -> 0 (underflow)
//   otherwise                   -> S(|x|) - S(eps) + 1
// so that eps <= |x| <= max decodes within 2^-m |x| (truncation, toward zero) or 2^-(m+1) |x|
// (nearest), and a value whose low 23 - m mantissa bits are zero round-trips exactly (spec P8).
// Integer arithmetic on bit patterns only: host and device give the same codes (spec P10).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.h"

namespace qccl::kernels {

struct RangeFloat {
  uint32_t base;   // S(eps): the pattern prefix of index 1
  uint32_t top;    // S(max): the pattern prefix of index P
  int shift;       // 23 - m
  uint32_t sign;   // 1 << (N - 1), the sign bit of a code
  bool nearest;    // round to nearest (else truncate)
};

// Why (bits, mant, max) cannot make a range float, or nullptr: N in [3, 16], m in [1, N - 1], max a
// positive normal float32, and eps = the magnitude of index 1 a positive normal float32 (enough
// binades below max for the 2^(N-1) - 1 magnitudes).
inline const char* range_float_invalid(int bits, int mant, float max) {
  if (bits < 3 || bits > 16) return "bits must be in [3, 16]";
  if (mant < 1 || mant > bits - 1) return "mant must be in [1, bits - 1]";
  if (!(max >= 1.17549435e-38f) || !(max <= 3.40282347e+38f)) return "max must be a positive normal float32";
  uint32_t pattern;
  std::memcpy(&pattern, &max, sizeof pattern);
  const uint32_t top = pattern >> (23 - mant), magnitudes = (1u << (bits - 1)) - 1;
  if (top < magnitudes - 1 + (1u << mant))  // S(eps) = top - P + 1 must have a nonzero exponent
    return "eps = max / 2^((2^(bits-1) - 1) / 2^mant) is below the smallest normal float32: lower bits or raise mant";
  return nullptr;
}

// Requires range_float_invalid(bits, mant, max) == nullptr.
inline RangeFloat make_range_float(int bits, int mant, float max, bool nearest) {
  uint32_t pattern;
  std::memcpy(&pattern, &max, sizeof pattern);
  RangeFloat r;
  r.shift = 23 - mant;
  r.top = pattern >> r.shift;
  r.base = r.top - ((1u << (bits - 1)) - 1) + 1;
  r.sign = 1u << (bits - 1);
  r.nearest = nearest;
  return r;
}

QCCL_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
QCCL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The selection ranks a segment's bins by |X|^2 times the square of this power of two, from the bit
// pattern of its largest |part| (finite): 2^-e for largest = f 2^e, f in [0.5, 1) (2^126 for a
// subnormal one), so that the scaled parts are at most 1 and their squares neither overflow (parts
// above 2^64 squared to Inf: a finite segment was sent as NaN) nor fall to subnormals (parts below
// 2^-63: ties that kept the lowest bins, not the largest). A power of two scales exactly, so the
// ranking is |X|^2's wherever |X|^2 was a normal float32. Integer arithmetic: host and device alike.
QCCL_HD float magnitude_scale(uint32_t largest_part_bits) {
  if (largest_part_bits == 0) return 1.0f;
  const int biased = static_cast<int>(largest_part_bits >> 23);
  const int power = biased == 0 ? 126 : 126 - biased;  // -128 .. 126
  if (power >= -126) return bits_float(static_cast<uint32_t>(power + 127) << 23);
  return bits_float(0x00800000u >> (-126 - power));  // 2^-127, 2^-128: subnormal, still exact
}

// The code of a finite x; *clamped is set when |x| was above max.
QCCL_HD uint32_t range_float_encode(const RangeFloat& r, float x, bool* clamped) {
  const uint32_t u = float_bits(x), magnitude = u & 0x7FFFFFFFu;
  // Rounding to nearest adds half a step below the kept bits (a carry may move to the next binade,
  // which is the next code: the truncated patterns are consecutive integers).
  const uint32_t s = (magnitude + (r.nearest ? (1u << (r.shift - 1)) : 0u)) >> r.shift;
  uint32_t index;
  if (s > r.top) {
    index = r.top - r.base + 1;
    *clamped = true;
  } else if (s < r.base) {
    return 0;
  } else {
    index = s - r.base + 1;
  }
  return (u >> 31) ? (index | r.sign) : index;
}

// The value of a code (index 0 of either sign is zero).
QCCL_HD float range_float_decode(const RangeFloat& r, uint32_t code) {
  const uint32_t index = code & (r.sign - 1);
  if (index == 0) return 0.0f;
  const uint32_t magnitude = (index + r.base - 1) << r.shift;
  return bits_float((code & r.sign) ? (magnitude | 0x80000000u) : magnitude);
}

// The smallest nonzero magnitude (index 1) and the largest (index P).
inline float range_float_eps(const RangeFloat& r) { return bits_float(r.base << r.shift); }
inline float range_float_max(const RangeFloat& r) { return bits_float(r.top << r.shift); }

}  // namespace qccl::kernels
