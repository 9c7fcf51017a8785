// Learned quantization levels (QSDP's distribution-aware levels: Markov et al., ICML 2023, §5.2 and
// Algorithm 2; shared/specs/qsdp.md §1.4): the bucketed min-max codec of quant.h with its 2^N evenly
// spaced levels replaced by 2^N levels fitted to the data. The wire format is quant.h's (per bucket
// the minimum m and the step s = (max - m) / (2^N - 1) in float32, then N-bit codes packed least
// significant bit first), so the bytes per value do not change; only the meaning of a code does.
//
// Levels are given in [0, 1] (normalized to the bucket's range), strictly increasing, with the
// endpoints pinned: l_0 = 0 and l_(2^N - 1) = 1, so that every value of a bucket lies between two
// levels and stochastic rounding stays unbiased. With L = 2^N - 1 and t = (x - m) / s in [0, L], the
// level table is g_k = l_k * L (float32), and
//
//   encode, nearest:    c = the k minimizing |t - g_k| (the lower one on a tie)
//   encode, stochastic: c = k + 1 with probability (t - g_k) / (g_(k+1) - g_k), else k, for
//                       g_k <= t < g_(k+1) (u the element's Philox uniform: up when u < p; with
//                       round=shift the bucket's one uniform, as in quant.h)
//   decode:             x' = m + s * g_c
//
// Numerical promise, for finite inputs, with G = max_k (g_(k+1) - g_k) the widest gap in steps:
//   nearest:    |x' - x| <= s * G / 2 + e,   stochastic: |x' - x| < s * G + e,   E[x'] = x (stochastic)
// with e as in quant.h (2^-13 s G + 2^-22 max(|m|, |max|) + 2^(N-149) covers t's and the decode's
// float32 rounding). Uniform levels (l_k = k / L) have G = 1: quant.h's bound. Buckets with equal
// values (s = 0) decode exactly; buckets with NaN or Inf decode to NaN, as in quant.h.
#pragma once

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/quant.h"

namespace qccl::kernels {

// The code of t = (x - m) / s (already clamped to [0, L] or not) among the `count` level positions
// g[0] = 0 < ... < g[count - 1] = L, for a uniform u in [0, 1) (stochastic) or u < 0 (nearest).
QCCL_HD uint32_t quantize_to_levels(float t, const float* g, uint32_t count, float u) {
  if (!(t > 0.0f)) return 0;  // also NaN: the code is irrelevant for a non-finite bucket
  const uint32_t top = count - 1;
  if (t >= g[top]) return top;
  // lo: the last level at or below t (g[0] = 0 < t), by halving with a select rather than a branch
  // (the form the host's vector loops take lane by lane for large tables, codec-inl.h).
  uint32_t lo = 0;
  for (uint32_t n = count; n > 1;) {
    const uint32_t half = n / 2;
    lo = g[lo + half] <= t ? lo + half : lo;
    n -= half;
  }
  const uint32_t hi = lo + 1;  // t < g[top], so lo < top
  const float below = t - g[lo], gap = g[hi] - g[lo];
  if (u < 0.0f) return below <= gap - below ? lo : hi;  // nearest; the lower one on a tie
  return u < below / gap ? hi : lo;
}

// The level positions g_k = l_k * L in steps, with g_(count-1) exactly L (whatever l * L rounds to):
// a table small enough to live on the stack, or in a CUDA kernel's parameters (codec_cuda.cu).
struct LevelPositions {
  float g[256];
  uint32_t count;
};

// The code of x in a bucket with meta m: 0 for a bucket of equal values (or a non-finite one, whose
// code is irrelevant), else quantize_to_levels of t = (x - m) / s.
QCCL_HD uint32_t quantize_with_levels(float x, BucketMeta m, float u, const float* g, uint32_t count) {
  if (!(m.step > 0.0f)) return 0;
  return quantize_to_levels((x - m.min) / m.step, g, count, u);
}

QCCL_HD float dequantize_from_levels(uint32_t code, BucketMeta m, const float* g) {
  if (meta_is_nonfinite(m)) return NAN;
  return m.min + m.step * g[code];
}

}  // namespace qccl::kernels
