// Bucketed min-max quantization to N bits (QSGD-style grid; QSDP §5.1 and CGX's MaxMin codec), as
// element functions that host loops and CUDA kernels share.
//
// A bucket of up to B values (B a multiple of 8) is sent as its minimum m and step s = (max - m) /
// (2^N - 1), both float32, followed by one N-bit code per value, packed least significant bit first:
// 8 consecutive codes fill exactly N bytes, so a bucket of L values takes ceil(L / 8) * N bytes.
//
//   encode: c = clamp(floor((x - m) / s + u), 0, 2^N - 1), u = 1/2 (nearest) or u ~ U[0, 1)
//           (stochastic, QSDP eq. for P[q(v) = q_{i+1}] = (v - q_i)/(q_{i+1} - q_i), unbiased), or
//           (shift) one u ~ U[0, 1) for the whole bucket: QSDP's quantization by random shift
//           (Definition 1: the grid m + s(Z - u) shifted by a random r shared by all coordinates,
//           values rounded to nearest on it), unbiased per value with the variance of Lemma 5,
//           s^2 f (1 - f) for a value at fraction f of its step; the bucket's uniform is the Philox
//           uniform of its first element (shift_uniform_index), so chunking changes nothing.
//   decode: x' = m + s * c
//
// Numerical promise, for finite inputs, with s the bucket's step:
//   nearest:    |x' - x| <= s/2 + e,   stochastic, shift: |x' - x| < s + e,   E[x'] = x (not nearest)
// where e = 2^-13 * s + 2^-22 * max(|m|, |max|) + 2^(N-149) covers float32 rounding: (x - m) / s + u
// is off by less than 2^-14 codes, which can move a code boundary by that much; m + s * c rounds
// once; and a step in float32's subnormal range (or one that underflows to 0) is off by up to half
// a subnormal ulp, 2^-150, which the 2^N - 1 levels multiply.
// The minimum and maximum order -0 below +0, as the host and device scans both do.
// The clamp keeps every code in [0, 2^N - 1] even when rounding pushes (x - m) / s + u past the top
// (CGX's missing clamp, qsdp.md F3). A bucket whose values are all equal has s = 0 and decodes
// exactly. A bucket holding NaN or Inf is marked with s = NaN and decodes to NaN everywhere, so a
// non-finite input is never turned into finite values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace qccl::kernels {

struct BucketMeta {
  float min;
  float step;  // 0: all values equal; NaN: the bucket held NaN or Inf
};

QCCL_HD uint32_t quant_levels(int bits) { return (1u << bits) - 1u; }

// round=shift: the Philox element whose uniform a bucket shares, the index of its first value in
// the whole buffer.
QCCL_HD uint64_t shift_uniform_index(uint64_t bucket_first) { return bucket_first; }

// x - x is 0 exactly when x is finite (NaN and Inf give NaN); no <cmath> needed on either side.
QCCL_HD bool finite_float(float x) { return x - x == 0.0f; }

// Meta of a bucket from its minimum and maximum (both NaN-free when finite is true). A bucket whose
// range or top code overflows float32 (e.g. [-FLT_MAX, 0]) could not be decoded: it is sent as
// non-finite like one holding NaN, so that decode reports it instead of returning Inf silently.
QCCL_HD BucketMeta bucket_meta(float lo, float hi, bool finite, int bits) {
  const float levels = static_cast<float>(quant_levels(bits));
  const BucketMeta m{lo, (hi - lo) / levels};
  if (finite && finite_float(m.step) && finite_float(m.min + m.step * levels)) return m;
  return BucketMeta{NAN, NAN};
}

QCCL_HD bool meta_is_nonfinite(BucketMeta m) { return !(m.step == m.step); }

// The code of x in a bucket whose step is positive and finite (bucket_meta's), for a uniform u in
// [0, 1) (0.5 for round to nearest). Clamped to [0, levels] by min and max, not branches (v is a
// number: floorf of a finite sum); a CUDA thread took a branch per value here.
QCCL_HD uint32_t quantize_stepped(float x, BucketMeta m, float u, uint32_t levels) {
  const float v = floorf((x - m.min) / m.step + u);
  return static_cast<uint32_t>(fminf(fmaxf(v, 0.0f), static_cast<float>(levels)));
}

// The code of x in any bucket: 0 where all values are equal (or the bucket is non-finite: the code is
// irrelevant).
QCCL_HD uint32_t quantize(float x, BucketMeta m, float u, uint32_t levels) {
  return m.step > 0.0f ? quantize_stepped(x, m, u, levels) : 0;
}

QCCL_HD float dequantize(uint32_t code, BucketMeta m) {
  if (meta_is_nonfinite(m)) return NAN;
  return m.min + m.step * static_cast<float>(code);
}

// Packs 8 codes of `bits` bits into `bits` bytes, least significant bit first.
QCCL_HD void pack8(const uint32_t codes[8], int bits, uint8_t* out) {
  uint64_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(codes[i]) << (i * bits);
  for (int b = 0; b < bits; ++b) out[b] = static_cast<uint8_t>(word >> (8 * b));
}

QCCL_HD void unpack8(const uint8_t* in, int bits, uint32_t codes[8]) {
  uint64_t word = 0;
  for (int b = 0; b < bits; ++b) word |= static_cast<uint64_t>(in[b]) << (8 * b);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (int i = 0; i < 8; ++i) codes[i] = static_cast<uint32_t>((word >> (i * bits)) & mask);
}

// Layout of an encoded run of n values (n counted from a bucket boundary): every bucket's meta first,
// then every bucket's packed codes.
QCCL_HD size_t quant_buckets(size_t n, size_t bucket) { return (n + bucket - 1) / bucket; }
QCCL_HD size_t quant_meta_bytes(size_t n, size_t bucket) { return quant_buckets(n, bucket) * sizeof(BucketMeta); }
QCCL_HD size_t quant_code_bytes(size_t n, int bits) { return (n + 7) / 8 * static_cast<size_t>(bits); }
QCCL_HD size_t quant_encoded_bytes(size_t n, size_t bucket, int bits) {
  return quant_meta_bytes(n, bucket) + quant_code_bytes(n, bits);
}

}  // namespace qccl::kernels
