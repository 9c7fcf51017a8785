// Host launchers of AQ-SGD's quantizer (aq_quant.h), vectorized with Highway and bit-identical to its
// element functions (which the CUDA kernels call):
//   scales  one pass over a block, row by row, keeping each channel's largest |x| as the integer
//           max of |x|'s bits (the order of non-negative floats, NaN above Inf above every finite
//           value, so a NaN sticks whatever the order), then aq_scale_bits per channel;
//   encode  per tile of kTile values, the Philox uniforms (codec-inl.h), then per run of
//           consecutive channels inside the tile y = x * r (r the channels' factors 2^F / d, loaded
//           alongside), Floor(y + u) or Round (half to even), the clamp, codes into a byte tile,
//           packed 8 at a time into `bits` bytes;
//   decode  the codes of a tile unpacked, then ((u - 2^F) / 2^F) * s per run of channels;
//   deltas  AQ-SGD's delta messages (aq_delta.h) fused from the same pieces, over rows that need not
//           lie together: per tile, the channels' maxima of x - float(m), m widened in registers
//           (first pass), then float(m) and x - float(m) gathered into the stack, the codes, and
//           float(m) + the decoded value rounded back into the rows (second pass); the receiver's
//           one pass unpacks, adds to float(m) and writes x_out and m. m's casts are half-inl.h's,
//           in line (the codec's casts, without their dispatch and non-finite count).
// Built without FMA contraction (kernels/CMakeLists.txt), so every product rounds once, as in the
// element functions.
#include "kernels/aq_codec.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/aq_delta.h"
#include "kernels/aq_quant.h"
#include "kernels/half.h"
#include "kernels/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/aq_codec.cc"
#include <hwy/foreach_target.h>  // must come before highway.h: re-includes this file per target
#include <hwy/highway.h>

#include "kernels/codec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The largest |x| bits of each channel of a block of n values (h = min(n, channels) channels).
void ChannelMaxBits(const float* x, size_t n, uint32_t channels, int32_t* m) {
  const hn::ScalableTag<int32_t> di;
  const size_t w = hn::Lanes(di);
  const auto abs_mask = hn::Set(di, 0x7FFFFFFF);
  const size_t h = std::min<size_t>(n, channels);
  std::fill(m, m + h, 0);
  if (channels == 1) {  // one scale: a running maximum over the block, reduced at the end
    auto acc = hn::Zero(di);
    const auto* bits = reinterpret_cast<const int32_t*>(x);
    size_t i = 0;
    for (; i + w <= n; i += w) acc = hn::Max(acc, hn::And(hn::LoadU(di, bits + i), abs_mask));
    m[0] = hn::GetLane(hn::MaxOfLanes(di, acc));
    for (; i < n; ++i) m[0] = std::max(m[0], static_cast<int32_t>(float_to_bits(x[i]) & 0x7FFFFFFFu));
    return;
  }
  for (size_t row = 0; row < n; row += channels) {
    const size_t width = std::min<size_t>(channels, n - row);
    const auto* r = reinterpret_cast<const int32_t*>(x + row);  // read by vector loads only
    size_t c = 0;
    for (; c + w <= width; c += w)
      hn::StoreU(hn::Max(hn::LoadU(di, m + c), hn::And(hn::LoadU(di, r + c), abs_mask)), di, m + c);
    for (; c < width; ++c) m[c] = std::max(m[c], static_cast<int32_t>(float_to_bits(x[row + c]) & 0x7FFFFFFFu));
  }
}

// codes[k] for values j0 .. j0 + len - 1 of a block (channel of value j: j % channels), r the
// channels' factors, u the tile's uniforms (null: nearest).
void QuantizeRun(const float* x, size_t j0, size_t len, uint32_t channels, const float* r, const float* u,
                 int bits, uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t w = hn::Lanes(df);
  const float half = static_cast<float>(aq_half(bits));
  const auto halfv = hn::Set(df, half), lo = hn::Set(df, -half), hi = hn::Set(df, half - 1.0f);  // halfv: code offset
  // One channel: every value shares r[0] (a run is the whole tile); else runs of consecutive channels.
  const bool one = channels == 1;
  size_t k = 0;
  while (k < len) {
    const size_t c0 = one ? 0 : (j0 + k) % channels;
    const size_t run = one ? len : std::min<size_t>(channels - c0, len - k);  // consecutive channels from c0
    size_t i = 0;
    for (; i + w <= run; i += w) {
      const auto rv = one ? hn::Set(df, r[0]) : hn::LoadU(df, r + c0 + i);
      const auto y = hn::Mul(hn::LoadU(df, x + k + i), rv);
      auto q = u ? hn::Floor(hn::Add(y, hn::LoadU(df, u + k + i))) : hn::Round(y);
      q = hn::IfThenElse(hn::Ge(q, lo), q, lo);  // NaN too, as aq_quantize
      q = hn::Min(q, hi);
      // 0 .. 2^b - 1 fits a byte: truncating (U8FromU32) is exact and cheaper than a saturating demote
      const auto code = hn::BitCast(hn::RebindToUnsigned<decltype(df)>(), hn::ConvertTo(di, hn::Add(q, halfv)));
      hn::StoreU(hn::U8FromU32(code), d8, codes + k + i);
    }
    for (; i < run; ++i)
      codes[k + i] = static_cast<uint8_t>(aq_quantize(x[k + i], r[one ? 0 : c0 + i], u ? u[k + i] : 0.0f, u != nullptr, bits));
    k += run;
  }
}

// out[k] (+)= the value of codes[k] for values j0 .. j0 + len - 1 of a block, s the scales.
template <bool kAccumulate>
void DequantizeRun(const uint8_t* codes, size_t j0, size_t len, uint32_t channels, const float* s, int bits,
                   float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t w = hn::Lanes(df);
  const float half = static_cast<float>(aq_half(bits));
  const auto inv_half = hn::Set(df, 1.0f / half), nan = hn::Set(df, NAN);
  const auto half_i = hn::Set(di, static_cast<int32_t>(aq_half(bits)));
  const bool one = channels == 1;  // as in QuantizeRun
  size_t k = 0;
  while (k < len) {
    const size_t c0 = one ? 0 : (j0 + k) % channels;
    const size_t run = one ? len : std::min<size_t>(channels - c0, len - k);
    size_t i = 0;
    for (; i + w <= run; i += w) {
      const auto code = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(df)>(), hn::LoadU(d8, codes + k + i)));
      const auto sv = one ? hn::Set(df, s[0]) : hn::LoadU(df, s + c0 + i);
      // * 2^-F is the division by 2^F exactly (a small integer scaled by a power of two)
      auto v = hn::Mul(hn::Mul(hn::ConvertTo(df, hn::Sub(code, half_i)), inv_half), sv);
      v = hn::IfThenElse(hn::IsNaN(sv), nan, v);
      if constexpr (kAccumulate) v = hn::Add(hn::LoadU(df, out + k + i), v);
      hn::StoreU(v, df, out + k + i);
    }
    for (; i < run; ++i) {
      const float v = aq_dequantize(codes[k + i], s[one ? 0 : c0 + i], bits);
      out[k + i] = kAccumulate ? out[k + i] + v : v;
    }
    k += run;
  }
}

// Packs the m codes of a tile (from a group boundary) into ceil(m * kBits / 8) bytes, least
// significant bit first (aq_quant.h): whole groups of 8 with codec-inl.h's packing (the q codecs'
// layout is the same there), a last partial group into only the bytes it fills (where the q codecs
// pad it to kBits). codes has kTilePad bytes (codec-inl.h reads a vector past the groups).
template <int kBits>
void AqPackTile(uint8_t* codes, size_t m, uint8_t* dst) {
  const size_t whole = m / 8 * 8;
  if constexpr (kBits == 8) {
    std::memcpy(dst, codes, m);
    return;
  } else {
    if (whole) PackTile<kBits>(codes, whole, dst);
    if (whole < m) {
      uint64_t word = 0;
      for (size_t i = whole; i < m; ++i) word |= static_cast<uint64_t>(codes[i]) << ((i - whole) * kBits);
      for (size_t b = 0; b < aq_code_bytes(m - whole, kBits); ++b)
        dst[whole / 8 * kBits + b] = static_cast<uint8_t>(word >> (8 * b));
    }
  }
}

// The inverse: codes[0 .. m) from ceil(m * kBits / 8) bytes; codes has kTilePad bytes.
template <int kBits>
void AqUnpackTile(const uint8_t* src, size_t m, uint8_t* codes) {
  const size_t whole = m / 8 * 8;
  if constexpr (kBits == 8) {
    std::memcpy(codes, src, m);
    return;
  } else {
    if (whole) UnpackTile<kBits>(src, whole, codes);
    if (whole < m) {
      uint64_t word = 0;
      for (size_t b = 0; b < aq_code_bytes(m - whole, kBits); ++b)
        word |= static_cast<uint64_t>(src[whole / 8 * kBits + b]) << (8 * b);
      for (size_t i = whole; i < m; ++i)
        codes[i] = static_cast<uint8_t>((word >> ((i - whole) * kBits)) & ((1u << kBits) - 1u));
    }
  }
}

template <class F>
HWY_INLINE void WithAqBits(int bits, const F& f) {
  switch (bits) {
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    case 4: return f(std::integral_constant<int, 4>());
    case 5: return f(std::integral_constant<int, 5>());
    case 6: return f(std::integral_constant<int, 6>());
    case 7: return f(std::integral_constant<int, 7>());
    default: return f(std::integral_constant<int, 8>());
  }
}

// One block of n values (value 0 is value `first` of the whole run): scales, then codes. Returns the
// channels sent as NaN.
size_t EncodeBlock(const CodecConfig& c, const float* x, size_t n, uint8_t* out, const PhiloxKey& key,
                   uint64_t first, std::vector<int32_t>& max_bits, std::vector<float>& factors) {
  const size_t h = aq_block_scales(n, c.channels);
  max_bits.resize(h), factors.resize(h);
  ChannelMaxBits(x, n, c.channels, max_bits.data());
  size_t bad = 0;
  for (size_t ch = 0; ch < h; ++ch) {
    const uint16_t s = aq_scale_bits(bits_to_float(static_cast<uint32_t>(max_bits[ch])));
    std::memcpy(out + 2 * ch, &s, 2);
    bad += aq_scale_is_nonfinite(s);
    factors[ch] = aq_factor(half_to_float(s), c.bits);
  }
  uint8_t* packed = out + 2 * h;
  const bool stochastic = c.rounding == Rounding::kStochastic;
  HWY_ALIGN float uniforms[kUniformScratch];
  HWY_ALIGN uint8_t codes[kTilePad];
  for (size_t t0 = 0; t0 < n; t0 += kTile) {  // kTile is a multiple of 8: groups never straddle tiles
    const size_t m = std::min(kTile, n - t0);
    const float* u = stochastic ? FillUniforms(key, first + t0, m, uniforms) : nullptr;
    QuantizeRun(x + t0, t0, m, c.channels, factors.data(), u, c.bits, codes);
    WithAqBits(c.bits, [&](auto bits) { AqPackTile<bits()>(codes, m, packed + t0 / 8 * bits()); });
  }
  return bad;
}

template <bool kAccumulate>
size_t DecodeBlock(const CodecConfig& c, const uint8_t* in, size_t n, float* out, std::vector<float>& scales) {
  const size_t h = aq_block_scales(n, c.channels);
  scales.resize(h);
  size_t bad_values = 0;
  for (size_t ch = 0; ch < h; ++ch) {
    uint16_t s;
    std::memcpy(&s, in + 2 * ch, 2);
    scales[ch] = aq_scale_value(s);
    // a NaN channel's values: one per whole row, and one more if the partial last row reaches it
    if (aq_scale_is_nonfinite(s)) bad_values += n / c.channels + (ch < n % c.channels ? 1 : 0);
  }
  const uint8_t* packed = in + 2 * h;
  HWY_ALIGN uint8_t codes[kTilePad];
  for (size_t t0 = 0; t0 < n; t0 += kTile) {
    const size_t m = std::min(kTile, n - t0);
    WithAqBits(c.bits, [&](auto bits) { AqUnpackTile<bits()>(packed + t0 / 8 * bits(), m, codes); });
    DequantizeRun<kAccumulate>(codes, t0, m, c.channels, scales.data(), c.bits, out + t0);
  }
  return bad_values;
}

// Per-channel scratch, grown once per thread (encode and decode allocate nothing per call after that).
thread_local std::vector<int32_t> tl_max_bits;
thread_local std::vector<float> tl_channel_floats;

size_t AqEncodeImpl(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                    uint64_t first) {
  auto* bytes = static_cast<uint8_t*>(out);
  const size_t block = aq_block_values(c.rows, c.channels, count);
  std::vector<int32_t>& max_bits = tl_max_bits;
  std::vector<float>& factors = tl_channel_floats;
  size_t bad = 0;
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b);
    bad += EncodeBlock(c, in + b, n, bytes, key, first + b, max_bits, factors);
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return bad;
}

size_t AqDecodeImpl(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate) {
  const auto* bytes = static_cast<const uint8_t*>(in);
  const size_t block = aq_block_values(c.rows, c.channels, count);
  std::vector<float>& scales = tl_channel_floats;
  size_t bad = 0;
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b);
    bad += accumulate ? DecodeBlock<true>(c, bytes, n, out + b, scales) : DecodeBlock<false>(c, bytes, n, out + b, scales);
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return bad;
}

// ---- AQ-SGD's delta messages (aq_delta.h) ------------------------------------------------------------

// f(r, o, k, len) for the pieces of values v0 .. v0 + n - 1 of a run of rows of `row` values: value
// v0 + k is value o of row r, and the piece runs on for len values within that row.
template <class F>
HWY_INLINE void ForEachPiece(size_t row, size_t v0, size_t n, const F& f) {
  for (size_t k = 0; k < n;) {
    const size_t v = v0 + k, r = v / row, o = v % row, len = std::min(row - o, n - k);
    f(r, o, k, len);
    k += len;
  }
}

// m's stored values as float32 vectors and scalars, per stored type (exact for every type).
struct StoredFloat32 {
  template <class DF>
  static HWY_INLINE hn::VFromD<DF> Load(DF df, const uint8_t* m, size_t i) {
    return hn::LoadU(df, reinterpret_cast<const float*>(m) + i);
  }
  static float Scalar(const uint8_t* m, size_t i) {
    float v;
    std::memcpy(&v, m + i * sizeof v, sizeof v);
    return v;
  }
};
template <class Cast>  // Float16 or Bfloat16 (half-inl.h)
struct StoredHalf {
  template <class DF>
  static HWY_INLINE hn::VFromD<DF> Load(DF df, const uint8_t* m, size_t i) {
    return Cast::Widen(df, hn::LoadU(hn::Rebind<uint16_t, DF>(), reinterpret_cast<const uint16_t*>(m) + i));
  }
  static float Scalar(const uint8_t* m, size_t i) {
    uint16_t h;
    std::memcpy(&h, m + i * sizeof h, sizeof h);
    return std::is_same_v<Cast, Float16> ? half_to_float(h) : bf16_to_float(h);
  }
};
template <class F>
HWY_INLINE void WithStored(DataType t, const F& f) {
  if (t == DataType::kFloat16) f(StoredHalf<Float16>{});
  else if (t == DataType::kBfloat16) f(StoredHalf<Bfloat16>{});
  else f(StoredFloat32{});
}

// out = float(m) for len values of m's type t, in line: the casts of half-inl.h that DecodeCast
// runs, without its dispatch and its non-finite count, which the tiles' callers do not need (a
// float16 or bfloat16 is a float32 exactly: any conversion gives these bits).
HWY_INLINE void WidenStored(DataType t, const uint8_t* m, float* out, size_t len) {
  WithStored(t, [&](auto stored) {
    using Stored = decltype(stored);
    const hn::ScalableTag<float> df;
    const size_t w = hn::Lanes(df);
    size_t i = 0;
    for (; i + w <= len; i += w) hn::StoreU(Stored::Load(df, m, i), df, out + i);
    for (; i < len; ++i) out[i] = Stored::Scalar(m, i);
  });
}

// m = round_t(in) for len values: EncodeCast's casts (half-inl.h, bit-identical to half.h), in line.
HWY_INLINE void NarrowStored(DataType t, const float* in, uint8_t* m, size_t len) {
  if (t == DataType::kFloat32) {
    std::memcpy(m, in, len * sizeof(float));
    return;
  }
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  const size_t w = hn::Lanes(df);
  auto* h = reinterpret_cast<uint16_t*>(m);
  size_t i = 0;
  if (t == DataType::kFloat16) {
    for (; i + w <= len; i += w) hn::StoreU(Float16::Narrow(d16, hn::LoadU(df, in + i)), d16, h + i);
    for (; i < len; ++i) h[i] = float_to_half(in[i]);
  } else {
    for (; i + w <= len; i += w) hn::StoreU(Bfloat16::Narrow(d16, hn::LoadU(df, in + i)), d16, h + i);
    for (; i < len; ++i) h[i] = float_to_bf16(in[i]);
  }
}

// mf = float(m) for values v0 .. v0 + n - 1 of the run, and (x given) d = x - mf.
void GatherDeltaTile(const AqDeltaRows& rows, const float* const* x, size_t v0, size_t n, float* mf, float* d) {
  const size_t es = element_size(rows.t);
  ForEachPiece(rows.row, v0, n, [&](size_t r, size_t o, size_t k, size_t len) {
    WidenStored(rows.t, static_cast<const uint8_t*>(rows.m[r]) + o * es, mf + k, len);
    if (!x) return;
    const hn::ScalableTag<float> df;
    const size_t w = hn::Lanes(df);
    const float* xr = x[r] + o;
    size_t i = 0;
    for (; i + w <= len; i += w) hn::StoreU(hn::Sub(hn::LoadU(df, xr + i), hn::LoadU(df, mf + k + i)), df, d + k + i);
    for (; i < len; ++i) d[k + i] = xr[i] - mf[k + i];
  });
}

// x_out = mf (x_out given) and m_out = round_t(mf) for values v0 .. v0 + n - 1 of the run.
void ScatterDeltaTile(const AqDeltaRows& rows, float* const* x_out, size_t v0, size_t n, const float* mf) {
  const size_t es = element_size(rows.t);
  ForEachPiece(rows.row, v0, n, [&](size_t r, size_t o, size_t k, size_t len) {
    if (x_out) std::memcpy(x_out[r] + o, mf + k, len * sizeof(float));
    NarrowStored(rows.t, mf + k, static_cast<uint8_t*>(rows.m_out[r]) + o * es, len);
  });
}

// The first pass's tile: m[c] = max(m[c], |x - float(m_rows)|'s bits) for values v0 .. v0 + n - 1 of
// the run, value v0 + k being value j0 + k of its block; float(m) and the differences stay in
// registers (the second pass makes them again), so this pass writes nothing but the maxima.
void DeltaMaxTile(const AqDeltaRows& rows, const float* const* x, size_t v0, size_t j0, size_t n, uint32_t channels,
                  int32_t* m) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t w = hn::Lanes(df);
  const auto abs_mask = hn::Set(di, 0x7FFFFFFF);
  const size_t es = element_size(rows.t);
  auto scalar_bits = [](float d) { return static_cast<int32_t>(float_to_bits(d) & 0x7FFFFFFFu); };
  WithStored(rows.t, [&](auto stored) {
    using Stored = decltype(stored);
    ForEachPiece(rows.row, v0, n, [&](size_t r, size_t o, size_t k, size_t len) {
      const uint8_t* mr = static_cast<const uint8_t*>(rows.m[r]) + o * es;
      const float* xr = x[r] + o;
      auto bits_of = [&](size_t i) {
        return hn::And(hn::BitCast(di, hn::Sub(hn::LoadU(df, xr + i), Stored::Load(df, mr, i))), abs_mask);
      };
      auto scalar = [&](size_t i) { return scalar_bits(xr[i] - Stored::Scalar(mr, i)); };
      if (channels == 1) {
        auto acc = hn::Zero(di);
        size_t i = 0;
        for (; i + w <= len; i += w) acc = hn::Max(acc, bits_of(i));
        m[0] = std::max(m[0], static_cast<int32_t>(hn::GetLane(hn::MaxOfLanes(di, acc))));
        for (; i < len; ++i) m[0] = std::max(m[0], scalar(i));
        return;
      }
      for (size_t p = 0; p < len;) {  // runs of consecutive channels
        const size_t c0 = (j0 + k + p) % channels, run = std::min<size_t>(channels - c0, len - p);
        size_t i = 0;
        for (; i + w <= run; i += w)
          hn::StoreU(hn::Max(hn::LoadU(di, m + c0 + i), bits_of(p + i)), di, m + c0 + i);
        for (; i < run; ++i) m[c0 + i] = std::max(m[c0 + i], scalar(p + i));
        p += run;
      }
    });
  });
}

thread_local std::vector<float> tl_channel_scales;

// Every block's scales first (so that a NaN channel anywhere leaves m_out alone), then its codes and
// the new m, tile by tile.
size_t AqDeltaSendImpl(const CodecConfig& c, const float* const* x, const AqDeltaRows& rows, void* out,
                       const PhiloxKey& key, uint64_t first) {
  const size_t count = rows.rows * rows.row;
  if (count == 0) return 0;
  const size_t block = aq_block_values(c.rows, c.channels, count);
  std::vector<int32_t>& max_bits = tl_max_bits;
  std::vector<float>& factors = tl_channel_floats;
  std::vector<float>& scales = tl_channel_scales;
  HWY_ALIGN float mf[kTile];
  HWY_ALIGN float d[kTile];
  auto* bytes = static_cast<uint8_t*>(out);
  size_t bad = 0;
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b), h = aq_block_scales(n, c.channels);
    max_bits.assign(h, 0);
    for (size_t t0 = 0; t0 < n; t0 += kTile) {
      const size_t m = std::min(kTile, n - t0);
      DeltaMaxTile(rows, x, b + t0, t0, m, c.channels, max_bits.data());
    }
    for (size_t ch = 0; ch < h; ++ch) {
      const uint16_t s = aq_scale_bits(bits_to_float(static_cast<uint32_t>(max_bits[ch])));
      std::memcpy(bytes + 2 * ch, &s, 2);
      bad += aq_scale_is_nonfinite(s);
    }
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  const bool stochastic = c.rounding == Rounding::kStochastic;
  HWY_ALIGN float uniforms[kUniformScratch];
  HWY_ALIGN uint8_t codes[kTilePad];
  bytes = static_cast<uint8_t*>(out);
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b), h = aq_block_scales(n, c.channels);
    factors.resize(h), scales.resize(h);
    for (size_t ch = 0; ch < h; ++ch) {
      uint16_t s;
      std::memcpy(&s, bytes + 2 * ch, 2);
      scales[ch] = aq_scale_value(s);
      factors[ch] = aq_factor(scales[ch], c.bits);
    }
    uint8_t* packed = bytes + 2 * h;
    for (size_t t0 = 0; t0 < n; t0 += kTile) {
      const size_t m = std::min(kTile, n - t0);
      GatherDeltaTile(rows, x, b + t0, m, mf, d);
      const float* u = stochastic ? FillUniforms(key, first + b + t0, m, uniforms) : nullptr;
      QuantizeRun(d, t0, m, c.channels, factors.data(), u, c.bits, codes);
      WithAqBits(c.bits, [&](auto bits) { AqPackTile<bits()>(codes, m, packed + t0 / 8 * bits()); });
      if (bad) continue;
      DequantizeRun<true>(codes, t0, m, c.channels, scales.data(), c.bits, mf);  // what the receiver computes
      ScatterDeltaTile(rows, nullptr, b + t0, m, mf);
    }
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return bad;
}

size_t AqDeltaReceiveImpl(const CodecConfig& c, const void* in, const AqDeltaRows& rows, float* const* x_out) {
  const size_t count = rows.rows * rows.row;
  if (count == 0) return 0;
  const size_t block = aq_block_values(c.rows, c.channels, count);
  const auto* bytes = static_cast<const uint8_t*>(in);
  size_t bad = 0;  // NaN channels' values, counted as DecodeBlock counts them: nothing is written then
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b), h = aq_block_scales(n, c.channels);
    for (size_t ch = 0; ch < h; ++ch) {
      uint16_t s;
      std::memcpy(&s, bytes + 2 * ch, 2);
      if (aq_scale_is_nonfinite(s)) bad += n / c.channels + (ch < n % c.channels ? 1 : 0);
    }
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  if (bad) return bad;
  std::vector<float>& scales = tl_channel_scales;
  HWY_ALIGN float mf[kTile];
  HWY_ALIGN uint8_t codes[kTilePad];
  bytes = static_cast<const uint8_t*>(in);
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b), h = aq_block_scales(n, c.channels);
    scales.resize(h);
    for (size_t ch = 0; ch < h; ++ch) {
      uint16_t s;
      std::memcpy(&s, bytes + 2 * ch, 2);
      scales[ch] = aq_scale_value(s);
    }
    const uint8_t* packed = bytes + 2 * h;
    for (size_t t0 = 0; t0 < n; t0 += kTile) {
      const size_t m = std::min(kTile, n - t0);
      WithAqBits(c.bits, [&](auto bits) { AqUnpackTile<bits()>(packed + t0 / 8 * bits(), m, codes); });
      GatherDeltaTile(rows, nullptr, b + t0, m, mf, nullptr);
      DequantizeRun<true>(codes, t0, m, c.channels, scales.data(), c.bits, mf);
      ScatterDeltaTile(rows, x_out, b + t0, m, mf);
    }
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return 0;
}

void AqReserveImpl(const CodecConfig& c, size_t count) {
  const size_t h = aq_block_scales(aq_block_values(c.rows, c.channels, count), c.channels);
  for (auto* v : {&tl_channel_floats, &tl_channel_scales})
    if (v->size() < h) v->resize(h);
  if (tl_max_bits.size() < h) tl_max_bits.resize(h);
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

HWY_EXPORT(AqEncodeImpl);
HWY_EXPORT(AqDecodeImpl);
HWY_EXPORT(AqDeltaSendImpl);
HWY_EXPORT(AqDeltaReceiveImpl);
HWY_EXPORT(AqReserveImpl);

size_t aq_encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                 uint64_t first) {
  return HWY_DYNAMIC_DISPATCH(AqEncodeImpl)(c, in, count, out, key, first);
}

size_t aq_decode(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate) {
  return HWY_DYNAMIC_DISPATCH(AqDecodeImpl)(c, in, count, out, accumulate);
}

void aq_reserve(const CodecConfig& c, size_t count) { HWY_DYNAMIC_DISPATCH(AqReserveImpl)(c, count); }

size_t aq_delta_send_rows(const CodecConfig& c, const float* const* x, const AqDeltaRows& rows, void* out,
                          const PhiloxKey& key, uint64_t first) {
  return HWY_DYNAMIC_DISPATCH(AqDeltaSendImpl)(c, x, rows, out, key, first);
}

size_t aq_delta_receive_rows(const CodecConfig& c, const void* in, const AqDeltaRows& rows, float* const* x_out) {
  return HWY_DYNAMIC_DISPATCH(AqDeltaReceiveImpl)(c, in, rows, x_out);
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
