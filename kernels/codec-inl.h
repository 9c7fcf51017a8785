// Highway building blocks of the codec host launchers (kernels/codec.cc), compiled once per target.
// Only codec.cc includes this file, after foreach_target.h, which re-includes it for every target;
// the toggled guard below is Highway's convention for such headers.
//
// Every block computes exactly what the scalar element functions of quant.h, philox.h and half.h
// compute, in the same order of IEEE operations, so that every target (and the CUDA path, which calls
// the element functions) writes the same bytes. The things that would break that are spelled out where
// they matter: the bucket minimum and maximum order -0 below +0 so that no evaluation order can show;
// quantize is (x - m) / s + u, Floor, then the clamp (a true division: a multiply by 1/s rounds
// differently); dequantize is m + s * c with no fused multiply-add (codec.cc turns contraction off);
// Philox is the same 10 rounds on 32-bit lanes.
//
// Work is done in tiles of kTile values: a bucket of up to 2^20 values is scanned once, then
// quantized tile by tile into one byte per code (uint8_t tile), which the packers squeeze to N bits.
// Keeping quantize and pack apart costs one L1 round trip per value and lets one quantize loop serve
// every bit width.

#if defined(QCCL_KERNELS_CODEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QCCL_KERNELS_CODEC_INL_H_
#undef QCCL_KERNELS_CODEC_INL_H_
#else
#define QCCL_KERNELS_CODEC_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/half-inl.h"
#include "kernels/half.h"
#include "kernels/levels.h"
#include "kernels/philox-inl.h"
#include "kernels/philox.h"
#include "kernels/quant.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Values per tile: a multiple of 8 (one code group) and of every target's uint8_t lane count.
constexpr size_t kTile = 256;
// Room for a tile plus one vector of any target, so that tails can be computed a whole vector at a
// time in scratch memory.
constexpr size_t kTilePad = kTile + HWY_MAX_BYTES;

HWY_INLINE size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

// Runs step(in + i, out + i) for every whole vector of w values, then once on zero-padded copies of
// the last n % w (out's copy holds out's values, for accumulation), so that nothing is read or
// written past n and the tail computes exactly what a whole vector would.
template <typename TIn, typename TOut, class Step>
HWY_INLINE void ForEachVector(const TIn* in, TOut* out, size_t n, size_t w, const Step& step) {
  size_t i = 0;
  for (; i + w <= n; i += w) step(in + i, out + i);
  if (i == n) return;
  HWY_ALIGN TIn in_tail[HWY_MAX_BYTES / sizeof(TIn)] = {};
  HWY_ALIGN TOut out_tail[HWY_MAX_BYTES / sizeof(TOut)] = {};
  memcpy(in_tail, in + i, (n - i) * sizeof(TIn));
  memcpy(out_tail, out + i, (n - i) * sizeof(TOut));
  step(in_tail, out_tail);
  memcpy(out + i, out_tail, (n - i) * sizeof(TOut));
}

// ---- Bucket range ---------------------------------------------------------------------------------

struct BucketRange {
  float lo, hi;
  bool finite;  // no NaN or Inf in the bucket
};

// Minimum and maximum in IEEE order with -0 below +0, so that they are one well-defined value
// whatever the lane count or the order of the reduction (x86 minps/maxps and std::min return
// whichever zero comes first). Computed on the bits: as signed integers the positive floats sort
// correctly and all lie above the negative ones; as unsigned integers the negative floats sort by
// magnitude above all positive ones, and the others sort as floats. Hence
//   min = (any sign bit set, i.e. unsigned max >= 2^31) ? unsigned max : unsigned min,
//   max = (any sign bit clear, i.e. signed max >= 0) ? signed max : unsigned min,
// and NaN or Inf is present exactly when the signed max reaches +Inf's bits or the unsigned max
// reaches -Inf's. Three integer min/max per vector (a signed minimum would add nothing), no float
// compare.
HWY_INLINE BucketRange ScanBucket(const float* x, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t w = hn::Lanes(df);
  auto smax = hn::Set(di, hwy::LimitsMin<int32_t>());
  auto umin = hn::Set(du, hwy::LimitsMax<uint32_t>()), umax = hn::Zero(du);
  auto scan = [&](hn::Vec<decltype(df)> v) {
    const auto u = hn::BitCast(du, v);
    smax = hn::Max(smax, hn::BitCast(di, v));
    umin = hn::Min(umin, u), umax = hn::Max(umax, u);
  };
  size_t i = 0;
  for (; i + w <= n; i += w) scan(hn::LoadU(df, x + i));
  if (i < n) {
    // Pad with x[0]: repeating a value changes neither the minimum nor the maximum.
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    for (size_t j = 0; j < w; ++j) tail[j] = x[i + j < n ? i + j : 0];
    scan(hn::Load(df, tail));
  }
  const int32_t s_hi = hn::GetLane(hn::MaxOfLanes(di, smax));
  const uint32_t u_lo = hn::GetLane(hn::MinOfLanes(du, umin)), u_hi = hn::GetLane(hn::MaxOfLanes(du, umax));
  const float lo = bits_to_float(u_hi >= 0x80000000u ? u_hi : u_lo);
  const float hi = bits_to_float(s_hi >= 0 ? static_cast<uint32_t>(s_hi) : u_lo);
  return BucketRange{lo, hi, s_hi < 0x7F800000 && u_hi < 0xFF800000u};
}

// ---- Philox uniforms --------------------------------------------------------------------------------

// Floats FillUniforms may write: a tile's blocks (one more when it starts mid-block), rounded up to
// whole steps, four words each.
constexpr size_t kUniformScratch = (kTile / 4 + 1 + kMaxBlocksPerStep - 1) / kMaxBlocksPerStep * kMaxBlocksPerStep * 4;

// u[j] = philox_uniform(key, e0 + j) for j < n <= kTile. `scratch` holds kUniformScratch floats;
// the returned pointer points into it.
HWY_INLINE const float* FillUniforms(const PhiloxKey& key, uint64_t e0, size_t n, float* scratch) {
  const uint64_t first_block = e0 >> 2, end_block = (e0 + n + 3) >> 2;
#if HWY_TARGET == HWY_SCALAR
  for (uint64_t b = first_block; b < end_block; ++b) {
    const PhiloxBlock r = philox4x32_10(key, b);
    for (int w = 0; w < 4; ++w) scratch[4 * (b - first_block) + w] = uniform_from_bits(r.v[w]);
  }
#else
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToFloat<decltype(du)> df;
  const hn::RebindToSigned<decltype(du)> di;
  const size_t w = hn::Lanes(du);
  const auto scale = hn::Set(df, 0x1p-24f);
  for (uint64_t b = first_block; b < end_block; b += kPhiloxGroups * w) {
    hn::Vec<decltype(du)> v[kPhiloxGroups][4];
    PhiloxBlocks(du, key, b, v);
    for (size_t g = 0; g < kPhiloxGroups; ++g) {
      hn::Vec<decltype(df)> u[4];
      for (int word = 0; word < 4; ++word)  // uniform_from_bits: the top 24 bits times 2^-24, exact
        u[word] = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<8>(v[g][word]))), scale);
      hn::StoreInterleaved4(u[0], u[1], u[2], u[3], df, scratch + 4 * (b - first_block + g * w));
    }
  }
#endif
  return scratch + (e0 & 3);
}

// ---- Quantize and dequantize one tile -----------------------------------------------------------------

// codes[i] for i < n from code_of(x + i, u ? u + i : nullptr), which returns the codes of a whole
// vector of values (u: their uniforms, or null) as 32-bit words whose low byte is the code, then 0
// from n up to RoundUp8(n); exactly RoundUp8(n) bytes written. The last part vector is computed on
// copies padded with m.min, whose code is 0 (x - m = 0, u < 1).
template <class CodeOf>
HWY_INLINE void StoreTileCodes(const float* x, const float* u, size_t n, BucketMeta m, uint8_t* codes,
                               const CodeOf& code_of) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t w = hn::Lanes(df);
  size_t i = 0;
#if HWY_TARGET == HWY_AVX2
  // Four vectors' codes narrowed together: two 32-to-16-bit packs, one 16-to-8 and a permute of the
  // 32-bit groups back into order, 4 shuffles for 32 codes where TruncateTo takes 3 for each 8 (the
  // packs saturate, so the words are cut to their low byte first). 10% of q8's encode on Zen 3.
  const __m256i low_byte = _mm256_set1_epi32(0xFF);
  const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 4 * w <= n; i += 4 * w) {
    auto words = [&](size_t k) {
      return _mm256_and_si256(code_of(x + i + k * w, u ? u + i + k * w : nullptr).raw, low_byte);
    };
    const __m256i low = _mm256_packus_epi32(words(0), words(1));   // codes 0-3, 8-11 | 4-7, 12-15
    const __m256i high = _mm256_packus_epi32(words(2), words(3));  // 16-19, 24-27 | 20-23, 28-31
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(low, high), in_order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), bytes);
  }
#endif
  for (; i + w <= n; i += w) hn::StoreU(hn::TruncateTo(d8, code_of(x + i, u ? u + i : nullptr)), d8, codes + i);
  const size_t n8 = RoundUp8(n);
  if (i < n) {
    HWY_ALIGN float xt[HWY_MAX_BYTES / sizeof(float)] = {}, ut[HWY_MAX_BYTES / sizeof(float)] = {};
    memcpy(xt, x + i, (n - i) * sizeof(float));
    if (u) memcpy(ut, u + i, (n - i) * sizeof(float));
    for (size_t j = n - i; j < w; ++j) xt[j] = m.min;
    uint8_t ct[HWY_MAX_BYTES / sizeof(float)];
    hn::StoreU(hn::TruncateTo(d8, code_of(xt, u ? ut : nullptr)), d8, ct);
    const size_t k = std::min(w, n8 - i);
    memcpy(codes + i, ct, k);
    i += k;
  }
  for (; i < n8; ++i) codes[i] = 0;
}

// codes[i] = quantize(x[i], m, u[i], levels) for i < n (u == nullptr: round to nearest, u = 1/2),
// and 0 from n up to RoundUp8(n) (quant.h pads the last group with zeros). Writes exactly
// RoundUp8(n) bytes. The bucket must have a finite step > 0 and a finite range max - m (codec.cc
// sends every other bucket as all zeros), and m is the minimum of every x: then (x - m) / s + u is
// finite and >= +0, so quant.h's lower clamp and NaN case cannot occur and only the upper clamp is
// computed.
HWY_INLINE void QuantizeTile(const float* x, const float* u, size_t n, BucketMeta m, uint32_t levels, uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto min = hn::Set(df, m.min), step = hn::Set(df, m.step), half = hn::Set(df, 0.5f);
  const auto top = hn::Set(df, static_cast<float>(levels)), magic = hn::Set(df, 0x1p23f);
  StoreTileCodes(x, u, n, m, codes, [&](const float* xp, const float* up) {
    const auto uv = up ? hn::LoadU(df, up) : half;
    const auto c = hn::Min(hn::Floor(hn::Add(hn::Div(hn::Sub(hn::LoadU(df, xp), min), step), uv)), top);
    // c is a whole number in [0, 255]: adding 2^23 puts it in the low mantissa bits exactly, and
    // its low byte is the code (cheaper than Highway's float-to-int conversion with its overflow
    // fix-up).
    return hn::BitCast(du, hn::Add(c, magic));
  });
}

// Tables of up to this many learned levels are searched by comparing with every level.
constexpr uint32_t kLevelsByCompare = 32;

// Learned levels (levels.h): codes[i] = quantize_with_levels(x[i], m, u[i], g.g, g.count) for i < n
// (u == nullptr: to the nearest level), 0 from n up to RoundUp8(n); QuantizeTile's preconditions.
// Every lane finds the two levels around its t (by comparing with each level, or for large tables
// by quantize_to_levels' halving search with gathers), and the same float operations as the element
// function choose between them, so the codes are the element function's.
HWY_INLINE void QuantizeTileLevels(const float* x, const float* u, size_t n, BucketMeta m, const LevelPositions& g,
                                   uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto min = hn::Set(df, m.min), step = hn::Set(df, m.step), zero = hn::Zero(df);
  const auto g_top = hn::Set(df, g.g[g.count - 1]);
  const auto top = hn::Set(di, static_cast<int32_t>(g.count - 1)), one = hn::Set(di, 1);
  StoreTileCodes(x, u, n, m, codes, [&](const float* xp, const float* uv) {
    const auto t = hn::Div(hn::Sub(hn::LoadU(df, xp), min), step);
    // lo: the last level at or below t, and hi = lo + 1 (lanes with t at or above the top level are
    // replaced below, so neither may pass the table's end).
    auto lo = hn::Zero(di);
    auto g_lo = hn::Set(df, g.g[0]), g_hi = g_top;
    if (g.count <= kLevelsByCompare) {
      // Up to 32 levels a compare and a select per level with no gathers (those take 20-30 cycles on
      // x86): lo counts the inner levels at or below t; g_lo is the last of them, g_hi the first above.
      for (uint32_t k = 1; k + 1 < g.count; ++k) {
        const auto level = hn::Set(df, g.g[k]);
        const auto at_or_below = hn::Not(hn::Lt(t, level));
        lo = hn::Sub(lo, hn::VecFromMask(di, hn::RebindMask(di, at_or_below)));
        g_lo = hn::IfThenElse(at_or_below, level, g_lo);
      }
      for (uint32_t k = g.count - 2; k >= 1; --k) {
        const auto level = hn::Set(df, g.g[k]);
        g_hi = hn::IfThenElse(hn::Lt(t, level), level, g_hi);
      }
    } else {
      for (uint32_t left = g.count; left > 1;) {  // quantize_to_levels' halving search, lane by lane
        const uint32_t half = left / 2;
        const auto candidate = hn::Add(lo, hn::Set(di, static_cast<int32_t>(half)));
        lo = hn::IfThenElse(hn::RebindMask(di, hn::Lt(t, hn::GatherIndex(df, g.g, candidate))), lo, candidate);
        left -= half;
      }
      lo = hn::Min(lo, hn::Sub(top, one));
      g_lo = hn::GatherIndex(df, g.g, lo);
      g_hi = hn::GatherIndex(df, g.g, hn::Add(lo, one));
    }
    const auto hi = hn::Add(lo, one);
    const auto below = hn::Sub(t, g_lo), gap = hn::Sub(g_hi, g_lo);
    const auto up = uv ? hn::Lt(hn::LoadU(df, uv), hn::Div(below, gap)) : hn::Gt(below, hn::Sub(gap, below));
    auto code = hn::IfThenElse(hn::RebindMask(di, up), hi, lo);
    // t at or above the top level: the top code; t <= 0 (the minimum, or -0): code 0.
    code = hn::IfThenElse(hn::RebindMask(di, hn::Not(hn::Lt(t, g_top))), top, code);
    code = hn::IfThenElse(hn::RebindMask(di, hn::Not(hn::Gt(t, zero))), hn::Zero(di), code);
    return hn::BitCast(du, code);
  });
}

// y[i] = m.min + m.step * g[codes[i]] (kAccumulate: y[i] += that) for i < n; m finite: levels.h's
// dequantize_from_levels, operation for operation.
template <bool kAccumulate>
HWY_INLINE void DequantizeTileLevels(const uint8_t* codes, size_t n, BucketMeta m, const LevelPositions& g, float* y) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto min = hn::Set(df, m.min), step = hn::Set(df, m.step);
  // A table that fits a vector is looked up with one permute; larger ones with a gather.
  const bool in_vector = g.count <= hn::Lanes(df);
  const auto table = hn::LoadU(df, g.g);  // g.g holds 256 floats: a whole vector is there
  ForEachVector(codes, y, n, hn::Lanes(df), [&](const uint8_t* c, float* out) {
    const auto code = hn::PromoteTo(di, hn::LoadU(d8, c));
    const auto level = in_vector ? hn::TableLookupLanes(table, hn::IndicesFromVec(df, code))
                                 : hn::GatherIndex(df, g.g, code);
    auto v = hn::Add(min, hn::Mul(step, level));
    if (kAccumulate) v = hn::Add(hn::LoadU(df, out), v);
    hn::StoreU(v, df, out);
  });
}

// y[i] = m.min + m.step * codes[i] (kAccumulate: y[i] += that) for i < n; m finite.
template <bool kAccumulate>
HWY_INLINE void DequantizeTile(const uint8_t* codes, size_t n, BucketMeta m, float* y) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto min = hn::Set(df, m.min), step = hn::Set(df, m.step);
  ForEachVector(codes, y, n, hn::Lanes(df), [&](const uint8_t* c, float* out) {
    auto v = hn::Add(min, hn::Mul(step, hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, c)))));
    if (kAccumulate) v = hn::Add(hn::LoadU(df, out), v);
    hn::StoreU(v, df, out);
  });
}

// ---- Packing: one byte per code <-> N bits per code -------------------------------------------------

// Any width, one group of 8 codes at a time, with shifts inside a 64-bit word (the host is
// little-endian, so the word's low bytes are the first bytes in memory, as pack8 writes them).
// `wide`: the 8 bytes at `out` (at `in`) may be written (read) whole, which saves the byte-by-byte
// path; a group's spare bytes are overwritten by the next group, written after it.
template <int kBits>
HWY_INLINE void PackGroup(const uint8_t* codes, uint8_t* out, bool wide) {
  uint64_t w;
  memcpy(&w, codes, 8);
  w = (w & 0x00FF00FF00FF00FFull) | ((w & 0xFF00FF00FF00FF00ull) >> (8 - kBits));       // pairs
  w = (w & 0x0000FFFF0000FFFFull) | ((w & 0xFFFF0000FFFF0000ull) >> (16 - 2 * kBits));  // quads
  w = (w & 0x00000000FFFFFFFFull) | ((w >> 32) << (4 * kBits));                         // all 8
  if (wide) {
    memcpy(out, &w, 8);
  } else {
    for (int b = 0; b < kBits; ++b) out[b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

template <int kBits>
HWY_INLINE void UnpackGroup(const uint8_t* in, uint8_t* codes, bool wide) {
  constexpr uint64_t kMask8 = (uint64_t{1} << (8 * kBits)) - 1;
  constexpr uint64_t kMask4 = (uint64_t{1} << (4 * kBits)) - 1;
  constexpr uint64_t kMask2 = ((uint64_t{1} << (2 * kBits)) - 1) * 0x0000000100000001ull;
  constexpr uint64_t kMask1 = ((uint64_t{1} << kBits) - 1) * 0x0001000100010001ull;
  uint64_t w = 0;
  if (wide) {
    memcpy(&w, in, 8);
    w &= kMask8;
  } else {  // byte by byte: a kBits-byte memcpy into w would go through the stack and stall
    for (int b = 0; b < kBits; ++b) w |= static_cast<uint64_t>(in[b]) << (8 * b);
  }
  w = (w & kMask4) | ((w >> (4 * kBits)) << 32);
  w = (w & kMask2) | (((w >> (2 * kBits)) & kMask2) << 16);
  w = (w & kMask1) | (((w >> kBits) & kMask1) << 8);
  memcpy(codes, &w, 8);
}

// The scalar target has single-lane vectors, which cannot be viewed as wider lanes: it packs with
// PackGroup.
#undef QCCL_CODEC_VECTOR_PACKING
#if HWY_TARGET != HWY_SCALAR
#define QCCL_CODEC_VECTOR_PACKING 1
// Widths 4, 2 and 1, a whole uint8_t vector of codes at a time: neighbours are merged inside 16-
// and 32-bit lanes and the low bytes are kept (codes are < 2^N, so the saturating demotions are
// exact); one bit per code is exactly Highway's mask-bit layout.
template <int kBits, class D8>
HWY_INLINE void PackVector(D8 d8, hn::Vec<D8> codes, uint8_t* out) {
  const hn::Repartition<uint16_t, D8> d16;
  const hn::Repartition<uint32_t, D8> d32;
  if constexpr (kBits == 4) {
    const auto x = hn::BitCast(d16, codes);
    const auto y = hn::And(hn::Or(x, hn::ShiftRight<4>(x)), hn::Set(d16, 0xFF));
    const hn::Rebind<uint8_t, decltype(d16)> dh;
    hn::StoreU(hn::DemoteTo(dh, hn::BitCast(hn::RebindToSigned<decltype(d16)>(), y)), dh, out);
  } else if constexpr (kBits == 2) {
    const auto x = hn::BitCast(d16, codes);
    const auto y = hn::BitCast(d32, hn::And(hn::Or(x, hn::ShiftRight<6>(x)), hn::Set(d16, 0x0F)));
    const auto z = hn::And(hn::Or(y, hn::ShiftRight<12>(y)), hn::Set(d32, 0xFF));
    const hn::Rebind<uint8_t, decltype(d32)> dq;
    hn::StoreU(hn::DemoteTo(dq, hn::BitCast(hn::RebindToSigned<decltype(d32)>(), z)), dq, out);
  } else {
    static_assert(kBits == 1, "PackVector: widths 4, 2 and 1");
    hn::StoreMaskBits(d8, hn::Ne(codes, hn::Zero(d8)), out);
  }
}

template <int kBits, class D8>
HWY_INLINE hn::Vec<D8> UnpackVector(D8 d8, const uint8_t* in) {
  const hn::Repartition<uint16_t, D8> d16;
  const hn::Repartition<uint32_t, D8> d32;
  if constexpr (kBits == 4) {
    const auto x = hn::PromoteTo(d16, hn::LoadU(hn::Rebind<uint8_t, decltype(d16)>(), in));
    const auto y = hn::Or(hn::And(x, hn::Set(d16, 0x0F)), hn::ShiftLeft<4>(hn::And(x, hn::Set(d16, 0xF0))));
    return hn::BitCast(d8, y);
  } else if constexpr (kBits == 2) {
    const auto x = hn::PromoteTo(d32, hn::LoadU(hn::Rebind<uint8_t, decltype(d32)>(), in));
    const auto y =
        hn::BitCast(d16, hn::Or(hn::And(x, hn::Set(d32, 0x0F)), hn::ShiftLeft<12>(hn::And(x, hn::Set(d32, 0xF0)))));
    const auto z = hn::Or(hn::And(y, hn::Set(d16, 0x03)), hn::ShiftLeft<6>(hn::And(y, hn::Set(d16, 0x0C))));
    return hn::BitCast(d8, z);
  } else {
    static_assert(kBits == 1, "UnpackVector: widths 4, 2 and 1");
    return hn::IfThenElseZero(hn::LoadMaskBits(d8, in), hn::Set(d8, 1));
  }
}

#else
#define QCCL_CODEC_VECTOR_PACKING 0
#endif

template <int kBits>
constexpr bool kVectorPacking = QCCL_CODEC_VECTOR_PACKING && (kBits == 4 || kBits == 2 || kBits == 1);

// Packs codes[0 .. RoundUp8(n)) (zero-padded past n) into RoundUp8(n) / 8 * kBits bytes at out
// (kBits < 8). codes must be readable up to a whole uint8_t vector past RoundUp8(n) (the tile is).
template <int kBits>
HWY_INLINE void PackTile(const uint8_t* codes, size_t n, uint8_t* out) {
  static_assert(kBits < 8, "8-bit codes need no packing");
  const size_t n8 = RoundUp8(n);
#if QCCL_CODEC_VECTOR_PACKING
  if constexpr (kVectorPacking<kBits>) {
    const hn::ScalableTag<uint8_t> d8;
    const size_t w = hn::Lanes(d8);
    size_t i = 0;
    for (; i + w <= n8; i += w) PackVector<kBits>(d8, hn::LoadU(d8, codes + i), out + i / 8 * kBits);
    if (i < n8) {
      uint8_t tail[HWY_MAX_BYTES];
      PackVector<kBits>(d8, hn::LoadU(d8, codes + i), tail);
      memcpy(out + i / 8 * kBits, tail, (n8 - i) / 8 * kBits);
    }
    return;
  }
#endif
  const size_t bytes = n8 / 8 * kBits;
  for (size_t i = 0, at = 0; i < n8; i += 8, at += kBits) PackGroup<kBits>(codes + i, out + at, at + 8 <= bytes);
}

// The inverse: codes[0 .. RoundUp8(n)) from RoundUp8(n) / 8 * kBits bytes at in (kBits < 8).
template <int kBits>
HWY_INLINE void UnpackTile(const uint8_t* in, size_t n, uint8_t* codes) {
  const size_t n8 = RoundUp8(n);
#if QCCL_CODEC_VECTOR_PACKING
  if constexpr (kVectorPacking<kBits>) {
    const hn::ScalableTag<uint8_t> d8;
    const size_t w = hn::Lanes(d8);
    size_t i = 0;
    for (; i + w <= n8; i += w) hn::StoreU(UnpackVector<kBits>(d8, in + i / 8 * kBits), d8, codes + i);
    if (i < n8) {
      uint8_t tail[HWY_MAX_BYTES] = {};
      memcpy(tail, in + i / 8 * kBits, (n8 - i) / 8 * kBits);
      hn::StoreU(UnpackVector<kBits>(d8, tail), d8, codes + i);  // codes has room for a whole vector
    }
    return;
  }
#endif
  const size_t bytes = n8 / 8 * kBits;
  for (size_t i = 0, at = 0; i < n8; i += 8, at += kBits) UnpackGroup<kBits>(in + at, codes + i, at + 8 <= bytes);
}

// float16 / bfloat16 <-> float32: Float16 and Bfloat16 of kernels/half-inl.h, shared with reduce.cc.

// ---- Counting non-finite values ----------------------------------------------------------------------

// Running maximum of |x| as float32 bits, one vector at a time; a tile whose maximum reaches the
// threshold is recounted exactly (rare: it holds NaN, Inf or a value the cast overflows).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> AbsBitsMax(DF /*df*/, hn::Vec<hn::RebindToSigned<DF>> max, hn::Vec<DF> v) {
  const hn::RebindToSigned<DF> di;
  return hn::Max(max, hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF)));
}

// The wire buffers need not be aligned (only the vector loads, which allow it, touch them in bulk),
// so values are read one at a time through memcpy.
HWY_INLINE size_t CountAtLeast(const float* x, size_t n, int32_t threshold) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    memcpy(&bits, reinterpret_cast<const unsigned char*>(x) + i * sizeof bits, sizeof bits);
    count += static_cast<int32_t>(bits & 0x7FFFFFFFu) >= threshold ? 1 : 0;
  }
  return count;
}

template <class Codec>
HWY_INLINE size_t CountNonfinite16(const uint16_t* h, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    memcpy(&bits, reinterpret_cast<const unsigned char*>(h) + i * sizeof bits, sizeof bits);
    count += Codec::IsNonfinite(bits) ? 1 : 0;
  }
  return count;
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#endif  // QCCL_KERNELS_CODEC_INL_H_
