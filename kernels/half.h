// IEEE binary16 ("half") and bfloat16 conversions, as element functions that host launchers and
// CUDA kernels share (QCCL_HD), so that both paths round the same way.
//
// Promise:
//   - *_to_float widen exactly; half_to_float also makes a signalling NaN quiet (payload kept), as
//     F16C's vcvtph2ps does, while bf16_to_float is the plain 16-bit shift, NaNs included;
//   - float_to_* round to nearest, ties to even; values beyond the largest finite one round to ±Inf
//     (binary16: |x| >= 65520, the first value that rounds past 65504); float16 subnormals are
//     produced exactly as IEEE says (no flush to zero);
//   - a NaN stays a NaN and comes out quiet: sign and the top payload bits are kept and the quiet
//     bit is set, as F16C's vcvtps2ph does, so a NaN whose payload lives only in the low bits never
//     turns into Inf. The positive NaN with every payload bit set (0x7FFFFFFF) becomes 0x7FFF.
// The work is integer bit manipulation: constexpr on the bit patterns (*_bits functions), and
// independent of the FPU's rounding mode and of flush-to-zero/denormals-are-zero settings.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.h"

namespace qccl::kernels {

QCCL_HD constexpr uint32_t half_bits_to_float_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t em = h & 0x7FFFu;                                             // exponent and mantissa
  if (em == 0x7C00u) return sign | 0x7F800000u;                          // Inf
  if (em > 0x7C00u) return sign | 0x7FC00000u | ((em & 0x3FFu) << 13);   // NaN, made quiet
  if (em >= 0x0400u) return sign | ((em << 13) + ((127u - 15u) << 23));  // normal: rebias
  if (em == 0) return sign;
  // Subnormal m * 2^-24: shift the leading one up to the implicit-bit position (bit 10).
  uint32_t exp = 127u - 14u;
  while ((em & 0x400u) == 0) {
    em <<= 1;
    --exp;
  }
  return sign | (exp << 23) | ((em & 0x3FFu) << 13);
}

QCCL_HD constexpr uint16_t float_bits_to_half_bits(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t x = f & 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));  // NaN
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (or Inf): Inf
  if (x >= 0x38800000u) {
    // Normal result (>= 2^-14). Adding 0xFFF plus the lowest kept bit rounds to nearest even in
    // one carry; a carry out of the mantissa correctly bumps the exponent (up to Inf at 65520).
    const uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u) - ((127u - 15u) << 23);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (x < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (a tie at most): ±0
  // Subnormal result: the value is m * 2^(e - 150); the result counts units of 2^-24, so shift m
  // right by 126 - e (14..24 here) with round to nearest even. Reaching 0x400 encodes 2^-14.
  const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - (x >> 23);
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t up = (rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));
}

QCCL_HD constexpr uint32_t bf16_bits_to_float_bits(uint16_t h) {
  return static_cast<uint32_t>(h) << 16;
}

QCCL_HD constexpr uint16_t float_bits_to_bf16_bits(uint32_t f) {
  // NaN first: the rounding carry below would turn a NaN whose payload sits in the low 16 bits into
  // Inf (or into the other NaN sign's neighbour). Setting the quiet bit keeps it a NaN.
  if ((f & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((f >> 16) | 0x0040u);
  // Round to nearest even; the carry may run into the exponent, up to Inf, which is the right
  // answer.
  return static_cast<uint16_t>((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
}

QCCL_HD uint32_t float_to_bits(float f) {
  uint32_t u = 0;
  memcpy(&u, &f, sizeof u);
  return u;
}

QCCL_HD float bits_to_float(uint32_t u) {
  float f = 0;
  memcpy(&f, &u, sizeof f);
  return f;
}

QCCL_HD float half_to_float(uint16_t h) { return bits_to_float(half_bits_to_float_bits(h)); }
QCCL_HD uint16_t float_to_half(float f) { return float_bits_to_half_bits(float_to_bits(f)); }
QCCL_HD float bf16_to_float(uint16_t h) { return bits_to_float(bf16_bits_to_float_bits(h)); }
QCCL_HD uint16_t float_to_bf16(float f) { return float_bits_to_bf16_bits(float_to_bits(f)); }

}  // namespace qccl::kernels
