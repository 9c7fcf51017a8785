// Codec spec parsing and the host launchers of kernels/codec.h.
//
// The launchers are one Highway source compiled once per x86 target (SSSE3, SSE4, AVX2, AVX-512 and
// a one-lane scalar fallback) and dispatched at run time, as kernels/reduce.cc is. Every target
// writes the bytes that the element functions of quant.h, philox.h and half.h define, which are
// also what the CUDA launchers compute; tests/kernels/codec_test.cc holds a plain scalar loop over
// those functions and compares every target with it, byte for byte.
//
// What the element functions leave to the launcher, and how it is decided here:
//   - the bucket minimum and maximum order -0 below +0 (IEEE 754-2019 minimum/maximum), so that the
//     meta's bits do not depend on the order in which a bucket is reduced;
//   - a bucket is non-finite (meta NaN, counted in EncodeReport) when it holds NaN or Inf, and also
//     when its top code would not decode to a finite value: max - min or s * (2^N - 1) overflows
//     float32 (e.g. [-FLT_MAX, 0]), and decode would turn finite input into Inf or NaN (Inf * 0)
//     without counting it. Decoding is monotonic in the code, so the top code is the one to check;
//   - decode counts the values of non-finite buckets, all of which decode to NaN.

// No fused multiply-add (kernels/CMakeLists.txt compiles with -ffp-contract=off): GCC contracts
// a * b + c into one FMA by default in C++ wherever the target has FMA, as Highway's AVX2 and AVX-512
// targets do, and the fused rounding differs from quant.h's dequantize (m + s * c rounded twice).

#include "kernels/aq_codec.h"
#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "kernels/intsgd.h"
#include "kernels/marsit.h"
#include "kernels/sign.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/half.h"
#include "kernels/philox.h"
#include "kernels/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/codec.cc"
#include <hwy/foreach_target.h>  // must come before highway.h: re-includes this file per target
#include <hwy/highway.h>

#include "kernels/codec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- q1 .. q8 -----------------------------------------------------------------------------------------

// Calls f(std::integral_constant<int, bits>()): one instantiation per width, chosen once per call.
template <class F>
HWY_INLINE size_t WithBits(int bits, const F& f) {
  switch (bits) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 6:
      return f(std::integral_constant<int, 6>());
    case 7:
      return f(std::integral_constant<int, 7>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

// Returns the number of non-finite buckets. Layout (quant.h): every bucket's meta, then every
// bucket's codes; a bucket starts at a multiple of 8 values, so its codes start on a byte.
// `levels`: learned levels (levels.h), else null for the evenly spaced ones.
template <int kBits, Rounding kRound>
HWY_NOINLINE size_t EncodeQuant(size_t bucket, const float* in, size_t count, uint8_t* out, const PhiloxKey& key,
                                uint64_t first, const LevelPositions* levels) {
  uint8_t* codes = out + quant_meta_bytes(count, bucket);
  HWY_ALIGN uint8_t tile[kTilePad] = {};
  HWY_ALIGN float uniforms[kUniformScratch];
  size_t nonfinite = 0;
  for (size_t b0 = 0, k = 0; b0 < count; b0 += bucket, ++k) {
    const size_t len = std::min(bucket, count - b0);
    const BucketRange r = ScanBucket(in + b0, len);
    const BucketMeta m = bucket_meta(r.lo, r.hi, r.finite, kBits);
    const bool finite = !meta_is_nonfinite(m);
    memcpy(out + k * sizeof(BucketMeta), &m, sizeof m);  // out need not be aligned
    nonfinite += finite ? 0 : 1;
    uint8_t* dst = codes + b0 / 8 * kBits;
    if (!(m.step > 0.0f)) {  // all equal, or non-finite: quantize() gives code 0 everywhere
      memset(dst, 0, RoundUp8(len) / 8 * kBits);
      continue;
    }
    for (size_t t = 0; t < len; t += kTile) {
      const size_t n = std::min(kTile, len - t);
      const float* u = nullptr;
      if constexpr (kRound == Rounding::kStochastic) u = FillUniforms(key, first + b0 + t, n, uniforms);
      if constexpr (kRound == Rounding::kShift) {  // the bucket's one uniform, for every value
        const float shared = philox_uniform(key, shift_uniform_index(first + b0));
        for (size_t j = 0; j < n; ++j) uniforms[j] = shared;
        u = uniforms;
      }
      uint8_t* tile_codes = kBits == 8 ? dst + t : tile;  // one byte per code: no packing
      if (levels) QuantizeTileLevels(in + b0 + t, u, n, m, *levels, tile_codes);
      else QuantizeTile(in + b0 + t, u, n, m, quant_levels(kBits), tile_codes);
      if constexpr (kBits != 8) PackTile<kBits>(tile, n, dst + t / 8 * kBits);
    }
  }
  return nonfinite;
}

// Returns the number of values decoded to NaN (those of non-finite buckets).
template <int kBits, bool kAccumulate>
HWY_NOINLINE size_t DecodeQuant(size_t bucket, const uint8_t* in, size_t count, float* out,
                                const LevelPositions* levels) {
  const uint8_t* codes = in + quant_meta_bytes(count, bucket);
  HWY_ALIGN uint8_t tile[kTilePad];
  size_t nonfinite = 0;
  for (size_t b0 = 0, k = 0; b0 < count; b0 += bucket, ++k) {
    const size_t len = std::min(bucket, count - b0);
    BucketMeta m;
    memcpy(&m, in + k * sizeof(BucketMeta), sizeof m);
    float* y = out + b0;
    if (meta_is_nonfinite(m)) {
      for (size_t i = 0; i < len; ++i) y[i] = kAccumulate ? y[i] + NAN : NAN;
      nonfinite += len;
      continue;
    }
    const uint8_t* src = codes + b0 / 8 * kBits;
    for (size_t t = 0; t < len; t += kTile) {
      const size_t n = std::min(kTile, len - t);
      const uint8_t* c = src + t / 8 * kBits;  // 8 bits: the codes themselves
      if constexpr (kBits != 8) {
        UnpackTile<kBits>(c, n, tile);
        c = tile;
      }
      if (levels) DequantizeTileLevels<kAccumulate>(c, n, m, *levels, y + t);
      else DequantizeTile<kAccumulate>(c, n, m, y + t);
    }
  }
  return nonfinite;
}

// ---- none, fp16, bf16 ---------------------------------------------------------------------------------

// The casts count values that are not finite after the cast, tile by tile: a running maximum of |x|
// is cheap, and only a tile that reaches the threshold is counted one value at a time.
template <class Codec>
HWY_NOINLINE size_t EncodeCast(const float* in, size_t count, uint16_t* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  size_t nonfinite = 0;
  for (size_t t = 0; t < count; t += kTile) {
    const size_t n = std::min(kTile, count - t);
    auto max = hn::Zero(di);
    ForEachVector(in + t, out + t, n, hn::Lanes(df), [&](const float* x, uint16_t* y) {
      const auto v = hn::LoadU(df, x);
      hn::StoreU(Codec::Narrow(d16, v), d16, y);
      max = AbsBitsMax(df, max, v);
    });
    if (hn::GetLane(hn::MaxOfLanes(di, max)) >= Codec::kNonfiniteFrom)
      nonfinite += CountAtLeast(in + t, n, Codec::kNonfiniteFrom);
  }
  return nonfinite;
}

template <class Codec, bool kAccumulate>
HWY_NOINLINE size_t DecodeCast(const uint16_t* in, size_t count, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  size_t nonfinite = 0;
  for (size_t t = 0; t < count; t += kTile) {
    const size_t n = std::min(kTile, count - t);
    auto max = hn::Zero(di);
    ForEachVector(in + t, out + t, n, hn::Lanes(df), [&](const uint16_t* x, float* y) {
      auto v = Codec::Widen(df, hn::LoadU(d16, x));
      max = AbsBitsMax(df, max, v);
      if (kAccumulate) v = hn::Add(hn::LoadU(df, y), v);
      hn::StoreU(v, df, y);
    });
    if (hn::GetLane(hn::MaxOfLanes(di, max)) >= 0x7F800000) nonfinite += CountNonfinite16<Codec>(in + t, n);
  }
  return nonfinite;
}

// none: a copy (encode, decode) or a sum (decode_accumulate), counting NaN and Inf.
template <bool kAccumulate>
HWY_NOINLINE size_t CopyFloats(const float* in, size_t count, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  size_t nonfinite = 0;
  for (size_t t = 0; t < count; t += kTile) {
    const size_t n = std::min(kTile, count - t);
    auto max = hn::Zero(di);
    ForEachVector(in + t, out + t, n, hn::Lanes(df), [&](const float* x, float* y) {
      auto v = hn::LoadU(df, x);
      max = AbsBitsMax(df, max, v);
      if (kAccumulate) v = hn::Add(hn::LoadU(df, y), v);
      hn::StoreU(v, df, y);
    });
    if (hn::GetLane(hn::MaxOfLanes(di, max)) >= 0x7F800000) nonfinite += CountAtLeast(in + t, n, 0x7F800000);
  }
  return nonfinite;
}

// ---- Entry points, one per target ---------------------------------------------------------------------

size_t EncodeImpl(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                  uint64_t first) {
  switch (c.kind) {
    case CodecKind::kNone:
      return CopyFloats<false>(in, count, static_cast<float*>(out));
    case CodecKind::kFp16:
      return EncodeCast<Float16>(in, count, static_cast<uint16_t*>(out));
    case CodecKind::kBf16:
      return EncodeCast<Bfloat16>(in, count, static_cast<uint16_t*>(out));
    case CodecKind::kQuant:
      break;
    case CodecKind::kSign:  // encode() routes the sign codec to marsit.h before dispatching here
    case CodecKind::kInt:   // and IntSGD's to intsgd.h
    case CodecKind::kFft:   // and fft to fft_sparse.h
    case CodecKind::kAq:    // and aq to aq_codec.h
      return 0;
  }
  auto* bytes = static_cast<uint8_t*>(out);
  LevelPositions positions;
  const LevelPositions* levels = c.levels.empty() ? nullptr : &(positions = level_positions(c));
  return WithBits(c.bits, [&](auto bits) {
    switch (c.rounding) {
      case Rounding::kStochastic:
        return EncodeQuant<bits(), Rounding::kStochastic>(c.bucket, in, count, bytes, key, first, levels);
      case Rounding::kShift: return EncodeQuant<bits(), Rounding::kShift>(c.bucket, in, count, bytes, key, first, levels);
      case Rounding::kNearest:
      case Rounding::kTruncate: break;  // fft only
    }
    return EncodeQuant<bits(), Rounding::kNearest>(c.bucket, in, count, bytes, key, first, levels);
  });
}

template <bool kAccumulate>
size_t DecodeAny(const CodecConfig& c, const void* in, size_t count, float* out) {
  switch (c.kind) {
    case CodecKind::kNone:
      return CopyFloats<kAccumulate>(static_cast<const float*>(in), count, out);
    case CodecKind::kFp16:
      return DecodeCast<Float16, kAccumulate>(static_cast<const uint16_t*>(in), count, out);
    case CodecKind::kBf16:
      return DecodeCast<Bfloat16, kAccumulate>(static_cast<const uint16_t*>(in), count, out);
    case CodecKind::kQuant:
      break;
    case CodecKind::kSign:  // decode() routes the sign codec to marsit.h before dispatching here
    case CodecKind::kInt:   // and IntSGD's to intsgd.h
    case CodecKind::kFft:   // and fft to fft_sparse.h
    case CodecKind::kAq:    // and aq to aq_codec.h
      return 0;
  }
  const auto* bytes = static_cast<const uint8_t*>(in);
  LevelPositions positions;
  const LevelPositions* levels = c.levels.empty() ? nullptr : &(positions = level_positions(c));
  return WithBits(c.bits,
                  [&](auto bits) { return DecodeQuant<bits(), kAccumulate>(c.bucket, bytes, count, out, levels); });
}

size_t DecodeImpl(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate) {
  return accumulate ? DecodeAny<true>(c, in, count, out) : DecodeAny<false>(c, in, count, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

// ---- Host launchers -----------------------------------------------------------------------------------

HWY_EXPORT(EncodeImpl);
HWY_EXPORT(DecodeImpl);

// The sign codec (Marsit) and IntSGD's integers have their own launchers (marsit.h, intsgd.h); these
// entry points serve them too, so that every codec can be encoded, decoded and measured the same way
// (codec_perf, tests). Here an integer codec is one rank's: the fixed alpha (1 when adaptive), the
// whole wire range, decode = m / alpha; the collectives pass the shared alpha and rank count.
namespace {
float standalone_alpha(const CodecConfig& c) {
  return c.alpha_mode == IntAlpha::kFixed ? static_cast<float>(c.alpha) : 1.0f;
}
}  // namespace

EncodeReport encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                    uint64_t first) {
  EncodeReport report;
  if (count == 0) return report;
  report.bytes = c.encoded_bytes(count);
  if (c.kind == CodecKind::kFft) {
    const FftReport fft = fft_encode(c, in, count, out, *take_fft_workspace());
    report.nonfinite = fft.nonfinite, report.bytes = fft.bytes;
  } else if (c.kind == CodecKind::kAq) {
    report.nonfinite = aq_encode(c, in, count, out, key, first);
  } else if (c.kind == CodecKind::kSign) {
    report.nonfinite = pack_signs(in, nullptr, 0, count, static_cast<uint32_t*>(out), nullptr);
  } else if (c.kind == CodecKind::kInt) {
    report.nonfinite = int_encode(c.bits, in, count, standalone_alpha(c), c.rounding == Rounding::kStochastic,
                                  int_clip(c.bits, 1), key, first, out)
                           .nonfinite;
  } else {
    report.nonfinite = HWY_DYNAMIC_DISPATCH(EncodeImpl)(c, in, count, out, key, first);
  }
  return report;
}

size_t decode(const CodecConfig& c, const void* in, size_t count, float* out) {
  if (count == 0) return 0;
  if (c.kind == CodecKind::kFft) return fft_decode(c, in, c.encoded_bytes(count), count, out, false, *take_fft_workspace());
  if (c.kind == CodecKind::kAq) return aq_decode(c, in, count, out, false);
  if (c.kind == CodecKind::kSign) {
    decode_signs(static_cast<const uint32_t*>(in), count, c.eta, out, nullptr, 0);
    return 0;
  }
  if (c.kind == CodecKind::kInt) {
    int_decode(c.bits, in, count, 1.0 / standalone_alpha(c), out);
    return 0;
  }
  return HWY_DYNAMIC_DISPATCH(DecodeImpl)(c, in, count, out, false);
}

size_t decode_accumulate(const CodecConfig& c, const void* in, size_t count, float* acc) {
  if (count == 0) return 0;
  if (c.kind == CodecKind::kFft) return fft_decode(c, in, c.encoded_bytes(count), count, acc, true, *take_fft_workspace());
  if (c.kind == CodecKind::kAq) return aq_decode(c, in, count, acc, true);
  if (c.kind == CodecKind::kSign) {
    const auto* words = static_cast<const uint32_t*>(in);
    for (size_t j = 0; j < count; ++j) acc[j] += sign_value(words[j / 32], static_cast<unsigned>(j % 32), c.eta);
    return 0;
  }
  if (c.kind == CodecKind::kInt) {
    const double scale = 1.0 / standalone_alpha(c);
    const auto* bytes = static_cast<const char*>(in);
    float tile[256];
    for (size_t j = 0; j < count; j += 256) {
      const size_t n = std::min<size_t>(256, count - j);
      int_decode(c.bits, bytes + j * static_cast<size_t>(c.bits / 8), n, scale, tile);
      for (size_t i = 0; i < n; ++i) acc[j + i] += tile[i];
    }
    return 0;
  }
  return HWY_DYNAMIC_DISPATCH(DecodeImpl)(c, in, count, acc, true);
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
