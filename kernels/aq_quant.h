// AQ-SGD's quantizer (Wang et al., "Fine-tuning Language Models over Slow Networks using Activation
// Quantization with Guarantees", NeurIPS 2022; shared/specs/aqsgd.md §2.2): values normalized by a
// max-abs scale per channel and rounded onto 2^b levels k s / 2^F, F = b - 1, k in [-2^F, 2^F - 1].
// The element functions the host (aq_codec.cc) and the device (codec_cuda.cu) share, so that both
// write the same bits.
//
// A run of n values is a row-major matrix of rows of `channels` values (the activation's last
// dimension, hidden size H); it is cut into blocks of `rows` rows (rows = 0: the whole run is one
// block, the reference's one scale per channel per micro-batch). A block's channel c has the scale
// s_c = max |x| over the block's values of channel c, rounded up to fp16, and each value x the code
//   u = clamp(round(x * r_c), -2^F, 2^F - 1) + 2^F,   r_c = 2^F / s_c (0 when s_c = 0)
// (nearest: round half to even, the reference's; stochastic: floor(y + U), U uniform in [0, 1) from
// Philox, unbiased wherever y stays inside the grid), decoded as ((u - 2^F) / 2^F) s_c, which is
// exact in float32 (at most 8 + 11 significant bits), so every decoder gets the same bits.
// Error per value, nearest: at most s_c / 2^b, and s_c / 2^F for the values the top level clips
// (x near +s_c, which the grid cannot reach); s_c exceeds the largest magnitude m by less than 2^-10 m
// (m >= 2^-14, fp16's normal range) or 2^-24 (below). The reference rounds s_c to nearest, which
// can fall short of m.
//
// A channel that holds NaN or Inf, or whose largest magnitude exceeds float16's range (65504), gets
// the scale NaN: its values decode to NaN, and the encoder counts it as non-finite.
//
// Block layout, little-endian: min(values, channels) fp16 scales, then the codes, `bits` bits each,
// value j of the block at bit j * bits of the code bytes, least significant bit first (groups of 8
// values fill `bits` whole bytes); ceil(values * bits / 8) code bytes. An encoded run is its blocks
// back to back; its size depends on n and the spec only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/half.h"
#include "kernels/hd.h"

namespace qccl::kernels {

constexpr uint16_t kAqNanScale = 0x7E00;  // fp16 NaN: a channel that cannot be encoded

// 2^F = 2^(bits - 1): the grid's half width.
QCCL_HD uint32_t aq_half(int bits) { return 1u << (bits - 1); }

// The fp16 scale of a channel whose largest magnitude is m >= 0, rounded up: never below m, so that
// no value lies beyond the grid's scale (fp16's nearest fell up to 2^-11 m short in its normal range,
// and below it, 2^-14, by up to half its subnormal step: a channel of magnitudes under 2^-25 got
// the scale 0 and decoded to 0). NaN when m is NaN or Inf, or exceeds 65504, fp16's largest.
QCCL_HD uint16_t aq_scale_bits(float m) {
  if (!(m - m == 0.0f)) return kAqNanScale;
  uint16_t h = float_to_half(m);
  if (half_to_float(h) < m) ++h;  // the next fp16 up: m >= 0, whose fp16 patterns order as their values
  return h >= 0x7C00u ? kAqNanScale : h;
}

// A scale that decodes its channel to NaN: NaN (what the encoder sends for a channel it cannot
// encode), or Inf, which no encoder writes (a malformed payload): read as NaN too, so that its values
// are NaN and counted alike on host and device (0 * Inf and k * Inf gave NaN and Inf, uncounted on
// the host, and an AQ-SGD delta store took them).
QCCL_HD bool aq_scale_is_nonfinite(uint16_t s) { return (s & 0x7FFFu) >= 0x7C00u; }

// The scale a decoder works with: NaN for a non-finite one.
QCCL_HD float aq_scale_value(uint16_t s) { return aq_scale_is_nonfinite(s) ? NAN : half_to_float(s); }

// 2^F / s: what a value of the channel is multiplied by to land on the grid's units, 0 for a channel
// of zeros (s = 0: every code is then 2^F, which decodes to 0). One division per channel, so that
// each value costs a multiply: y = x * (2^F / s) rounds once, where the reference's x / s * 2^F
// rounds at the division; the two differ only for a y within a float32 ulp of a rounding boundary.
// The reference divides by fp16(s + 1e-6) and decodes with s: for a channel whose s is small enough
// that the 1e-6 is not absorbed (s below about 2e-3), every value then shrank by s / (s + 1e-6)
// (9% at s = 1e-5), against the paper's unbiased grid k s / 2^F and the error bound qccl.h states.
QCCL_HD float aq_factor(float s, int bits) { return s > 0 ? static_cast<float>(aq_half(bits)) / s : 0.0f; }

// The code of x under a channel's factor r (aq_factor) for a uniform u in [0, 1); nearest rounding
// ignores u.
QCCL_HD uint32_t aq_quantize(float x, float r, float u, bool stochastic, int bits) {
  const float half = static_cast<float>(aq_half(bits));
  const float y = x * r;
  float k = stochastic ? floorf(y + u) : rintf(y);
  if (!(k >= -half)) k = -half;  // also NaN (a NaN scale's channel: its codes do not matter)
  if (k > half - 1.0f) k = half - 1.0f;
  return static_cast<uint32_t>(static_cast<int32_t>(k) + static_cast<int32_t>(aq_half(bits)));
}

// ((u - 2^F) / 2^F) s: exact in float32; NaN for a NaN scale (the same NaN on host and device, where
// NaN * x would give each its own).
QCCL_HD float aq_dequantize(uint32_t code, float s, int bits) {
  if (s != s) return NAN;
  const float half = static_cast<float>(aq_half(bits));
  return (static_cast<float>(static_cast<int32_t>(code) - static_cast<int32_t>(aq_half(bits))) / half) * s;
}

// ---- Layout ----------------------------------------------------------------------------------------

// Values in a block of a run of n values (the last block may be shorter).
QCCL_HD size_t aq_block_values(uint32_t rows, uint32_t channels, size_t n) {
  return rows ? static_cast<size_t>(rows) * channels : n;
}
QCCL_HD size_t aq_block_scales(size_t values, uint32_t channels) { return values < channels ? values : channels; }
QCCL_HD size_t aq_code_bytes(size_t values, int bits) { return (values * static_cast<size_t>(bits) + 7) / 8; }
QCCL_HD size_t aq_block_bytes(size_t values, uint32_t channels, int bits) {
  return 2 * aq_block_scales(values, channels) + aq_code_bytes(values, bits);
}
QCCL_HD size_t aq_encoded_bytes(size_t n, uint32_t rows, uint32_t channels, int bits) {
  if (n == 0) return 0;
  const size_t block = aq_block_values(rows, channels, n);
  const size_t whole = n / block, tail = n % block;
  return whole * aq_block_bytes(block, channels, bits) + (tail ? aq_block_bytes(tail, channels, bits) : 0);
}

}  // namespace qccl::kernels
