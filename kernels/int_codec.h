// IntSGD's integer codec (Mishchenko, Wang, Kovalev and Richtarik, "IntSGD: Adaptive Floatless
// Compression of Stochastic Gradients", ICLR 2022; ../shared/specs/intsgd.md), as element functions
// that the host launchers (intsgd.h) and the CUDA kernels share, and the scalar rule for alpha.
//
// A rank sends m = clip(Int(alpha * x)) in the wire type (int8, int16 or int32); the ranks add the
// integers without decoding; every rank decodes the sum S as S / (n * alpha) (an average) or
// S / alpha (a sum). Int is the paper's randomized rounding, Int(t) = floor(t) + [u < t - floor(t)]
// with u ~ U[0, 1), so E[Int(t)] = t and Var = p(1 - p) <= 1/4 (Lemma 1), or round to nearest even.
//
// Where the sum travels. In the wire type, added with wrapping (two's complement) arithmetic, after a
// per-rank clip to [lo, hi] = [-floor(2^(b-1) / n), floor((2^(b-1) - 1) / n)]: then every sum of n
// clipped values lies in [-2^(b-1), 2^(b-1) - 1], so the final sum is exact whatever the order of
// the additions, even when a partial sum wrapped on the way (addition is exact modulo 2^b). The
// wire never widens, so each hop moves b/8 bytes per value; the price is log2(n) bits of each rank's
// range (int8 at 4 ranks keeps [-32, 31]). The bounds are computed in integer arithmetic: a float32
// bound rounds up ((2^31 - 1) / 16 becomes 2^27, and 16 * 2^27 overflows int32; intsgd.md §2).
//
// Decode error per element, when no value was clipped: |S / (n alpha) - mean(x)| < 1/alpha for
// randomized rounding and <= 1/(2 alpha) to nearest, plus float32 rounding of alpha * x and of the
// result (each rank's error is below 1 resp. 1/2 in units of 1/alpha, and the mean of n such errors
// is too).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/hd.h"

namespace qccl::kernels {

// A rank's clip range: lo and hi as integers, and as the float32 values encode compares with (the
// nearest float32 inside [lo, hi]: an integer-valued float above hi_f is above hi too, since no float
// lies in (hi_f, hi]).
struct IntClip {
  int32_t lo = 0, hi = 0;
  float lo_f = 0, hi_f = 0;
};

inline IntClip int_clip(int bits, int nranks) {
  const int64_t half = int64_t{1} << (bits - 1);
  IntClip c;
  c.lo = static_cast<int32_t>(-(half / nranks));
  c.hi = static_cast<int32_t>((half - 1) / nranks);
  c.hi_f = static_cast<float>(c.hi);
  if (static_cast<int64_t>(c.hi_f) > c.hi) c.hi_f = std::nextafter(c.hi_f, 0.0f);
  c.lo_f = static_cast<float>(c.lo);
  if (static_cast<int64_t>(c.lo_f) < c.lo) c.lo_f = std::nextafter(c.lo_f, 0.0f);
  return c;
}

// One value's wire integer (as float32: a whole number in [lo_f, hi_f]), for u in [0, 1): randomized
// rounding when stochastic, else round half to even. t - floor(t) is exact in float32 for t >= 0; for
// t < 0 it rounds (1 + t is not always a float) by at most 2^-25, below u's grid of 2^-24, so the
// rounding's bias stays under 2^-24 per value (Lemma 1's unbiasedness up to that). A value that
// is not finite is sent as 0 and reported (*nonfinite); one outside the range is clipped (*clipped;
// alpha * x overflowing to +-Inf is clipped too).
QCCL_HD float int_encode_value(float x, float alpha, float u, bool stochastic, IntClip clip, bool* clipped,
                               bool* nonfinite) {
  *nonfinite = !(x - x == 0.0f);
  if (*nonfinite) {
    *clipped = false;
    return 0.0f;
  }
  const float t = alpha * x;
  const float f = floorf(t);
  float v = stochastic ? f + (u < t - f ? 1.0f : 0.0f) : rintf(t);
  *clipped = !(v <= clip.hi_f && v >= clip.lo_f);
  if (v > clip.hi_f) v = clip.hi_f;
  if (v < clip.lo_f) v = clip.lo_f;
  return v;
}

// A decoded value: S * scale in double (exact for every int32 sum), rounded once to float32.
QCCL_HD float int_decode_value(int32_t sum, double scale) {
  return static_cast<float>(static_cast<double>(sum) * scale);
}

// ---- The shared scale (host only: double arithmetic in a fixed order, so that every rank computes
// the same bits from the same replicated inputs) ----------------------------------------------------

// Proposition 2: alpha = sqrt(d) / sqrt(2 n r / eta^2 + eps^2), with r the moving average of the
// squared step length ||x^k - x^(k-1)||^2; in the learning-rate-free form (the authors' code) r
// averages ||g~||^2 instead and eta = 1. eps > 0 keeps alpha finite when r = 0 (alpha = sqrt(d)/eps).
inline double intsgd_alpha(double d, int nranks, double r, double eta, double eps) {
  return std::sqrt(d) / std::sqrt(2.0 * nranks * r / (eta * eta) + eps * eps);
}

// r_k = beta r_(k-1) + (1 - beta) v_k.
inline double intsgd_moving_average(double r, double v, double beta) { return beta * r + (1.0 - beta) * v; }

}  // namespace qccl::kernels
