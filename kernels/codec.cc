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

#include "kernels/codec.h"

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
template <int kBits, bool kStochastic>
HWY_NOINLINE size_t EncodeQuant(size_t bucket, const float* in, size_t count, uint8_t* out, const PhiloxKey& key,
                                uint64_t first) {
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
      const float* u = kStochastic ? FillUniforms(key, first + b0 + t, n, uniforms) : nullptr;
      if constexpr (kBits == 8) {  // one byte per code: no packing
        QuantizeTile(in + b0 + t, u, n, m, quant_levels(kBits), dst + t);
      } else {
        QuantizeTile(in + b0 + t, u, n, m, quant_levels(kBits), tile);
        PackTile<kBits>(tile, n, dst + t / 8 * kBits);
      }
    }
  }
  return nonfinite;
}

// Returns the number of values decoded to NaN (those of non-finite buckets).
template <int kBits, bool kAccumulate>
HWY_NOINLINE size_t DecodeQuant(size_t bucket, const uint8_t* in, size_t count, float* out) {
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
      DequantizeTile<kAccumulate>(c, n, m, y + t);
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
  }
  auto* bytes = static_cast<uint8_t*>(out);
  const bool stochastic = c.rounding == Rounding::kStochastic;
  return WithBits(c.bits, [&](auto bits) {
    return stochastic ? EncodeQuant<bits(), true>(c.bucket, in, count, bytes, key, first)
                      : EncodeQuant<bits(), false>(c.bucket, in, count, bytes, key, first);
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
  }
  const auto* bytes = static_cast<const uint8_t*>(in);
  return WithBits(c.bits, [&](auto bits) { return DecodeQuant<bits(), kAccumulate>(c.bucket, bytes, count, out); });
}

size_t DecodeImpl(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate) {
  return accumulate ? DecodeAny<true>(c, in, count, out) : DecodeAny<false>(c, in, count, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

// ---- Spec ------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw CodecSpecError("codec spec '" + spec + "': " + why);
}

uint64_t parse_number(const std::string& spec, const std::string& key, const std::string& value, uint64_t lo,
                      uint64_t hi) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
    bad(spec, key + "=" + value + ": '" + value + "' is not a non-negative integer");
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), nullptr, 10);
  if (errno || v < lo || v > hi)
    bad(spec, key + "=" + value + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

}  // namespace

CodecConfig parse_codec_spec(const std::string& spec) {
  CodecConfig c;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  if (name == "none") {
    c.kind = CodecKind::kNone, c.bits = 32;
  } else if (name == "fp16") {
    c.kind = CodecKind::kFp16, c.bits = 16;
  } else if (name == "bf16") {
    c.kind = CodecKind::kBf16, c.bits = 16;
  } else if (name.size() == 2 && name[0] == 'q' && name[1] >= '1' && name[1] <= '8') {
    c.kind = CodecKind::kQuant, c.bits = name[1] - '0';
  } else {
    bad(spec, "unknown codec '" + name + "' (none, fp16, bf16, q1 .. q8)");
  }
  if (colon == std::string::npos) return c;
  std::string rest = spec.substr(colon + 1);
  if (rest.empty()) bad(spec, "nothing after ':'");
  size_t at = 0;
  while (at <= rest.size()) {
    const size_t comma = rest.find(',', at);
    const std::string token = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    const size_t eq = token.find('=');
    if (token.empty() || eq == std::string::npos || eq == 0) bad(spec, "'" + token + "' is not key=value");
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    if (key == "bucket") {
      if (c.kind != CodecKind::kQuant) bad(spec, "'" + token + "': only q1 .. q8 have buckets");
      c.bucket = static_cast<uint32_t>(parse_number(spec, key, value, 8, 1u << 20));
      if (c.bucket % 8) bad(spec, "'" + token + "': the bucket must be a multiple of 8");
    } else if (key == "round") {
      if (c.kind != CodecKind::kQuant) bad(spec, "'" + token + "': only q1 .. q8 round");
      if (value == "nearest")
        c.rounding = Rounding::kNearest;
      else if (value == "stochastic")
        c.rounding = Rounding::kStochastic;
      else
        bad(spec, "'" + token + "': round is nearest or stochastic");
    } else if (key == "ef") {
      if (value == "on")
        c.error_feedback = true;
      else if (value == "off")
        c.error_feedback = false;
      else
        bad(spec, "'" + token + "': ef is on or off");
    } else if (key == "seed") {
      c.seed = parse_number(spec, key, value, 0, std::numeric_limits<uint64_t>::max());
    } else {
      bad(spec, "unknown key '" + key + "' (bucket, round, ef, seed)");
    }
  }
  return c;
}

std::string CodecConfig::canonical() const {
  switch (kind) {
    case CodecKind::kNone:
      return std::string("none") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kFp16:
      return std::string("fp16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kBf16:
      return std::string("bf16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kQuant:
      break;
  }
  return "q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket) +
         ",round=" + (rounding == Rounding::kStochastic ? "stochastic" : "nearest") +
         ",ef=" + (error_feedback ? "on" : "off") + ",seed=" + std::to_string(seed);
}

uint64_t CodecConfig::hash() const {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : canonical()) h = (h ^ ch) * 1099511628211ull;
  return h ? h : 1;
}

size_t CodecConfig::encoded_bytes(size_t count) const {
  switch (kind) {
    case CodecKind::kNone:
      return count * 4;
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return count * 2;
    case CodecKind::kQuant:
      return quant_encoded_bytes(count, bucket, bits);
  }
  return 0;
}

// ---- Host launchers -----------------------------------------------------------------------------------

HWY_EXPORT(EncodeImpl);
HWY_EXPORT(DecodeImpl);

EncodeReport encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                    uint64_t first) {
  EncodeReport report;
  if (count > 0) report.nonfinite = HWY_DYNAMIC_DISPATCH(EncodeImpl)(c, in, count, out, key, first);
  return report;
}

size_t decode(const CodecConfig& c, const void* in, size_t count, float* out) {
  return count > 0 ? HWY_DYNAMIC_DISPATCH(DecodeImpl)(c, in, count, out, false) : 0;
}

size_t decode_accumulate(const CodecConfig& c, const void* in, size_t count, float* acc) {
  return count > 0 ? HWY_DYNAMIC_DISPATCH(DecodeImpl)(c, in, count, acc, true) : 0;
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
