// Host launchers of IntSGD's integer codec, vectorized with Highway and bit-identical to the element
// functions of int_codec.h (which the CUDA kernels call):
//   encode  per tile of kTile values, the Philox uniforms (codec-inl.h), then t = alpha * x, Floor,
//           the comparison with u (or Round, half to even), the clamp, and a narrowing store;
//   add     wrapping integer addition in the wire type (unsigned lanes: signed overflow is undefined
//           in C++, and the wrap is what makes the sum exact, int_codec.h);
//   decode  widen to double, multiply by the scale, round once to float32.
#include "kernels/intsgd.h"

#include <algorithm>
#include <cstring>

#include "kernels/int_codec.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/intsgd.cc"
#include <hwy/foreach_target.h>  // must come before highway.h: re-includes this file per target
#include <hwy/highway.h>

#include "kernels/codec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename TWire>
IntEncodeReport EncodeTyped(const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                            const PhiloxKey& key, uint64_t first, TWire* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<TWire, decltype(df)> dw;
  const size_t w = hn::Lanes(df);
  const auto a = hn::Set(df, alpha), one = hn::Set(df, 1.0f);
  const auto lo = hn::Set(df, clip.lo_f), hi = hn::Set(df, clip.hi_f);
  IntEncodeReport report;
  auto encode = [&](hn::Vec<decltype(df)> xv, hn::Vec<decltype(df)> uv, size_t lanes, TWire* dst) {
    const auto finite = hn::IsFinite(xv);
    const auto t = hn::Mul(a, xv);
    const auto f = hn::Floor(t);
    auto v = stochastic ? hn::Add(f, hn::IfThenElseZero(hn::Lt(uv, hn::Sub(t, f)), one)) : hn::Round(t);
    const auto inside = hn::And(hn::Le(v, hi), hn::Ge(v, lo));
    const auto live = hn::FirstN(df, lanes);
    report.clipped += hn::CountTrue(df, hn::AndNot(inside, hn::And(finite, live)));
    report.nonfinite += hn::CountTrue(df, hn::AndNot(finite, live));
    v = hn::IfThenElseZero(finite, hn::Min(hn::Max(v, lo), hi));
    const auto wire = hn::ConvertTo(di, v);  // a whole number inside the wire type's range: exact
    if constexpr (sizeof(TWire) == 4) {
      hn::StoreU(wire, di, reinterpret_cast<int32_t*>(dst));
    } else {
      hn::StoreU(hn::DemoteTo(dw, wire), dw, dst);
    }
  };
  HWY_ALIGN float scratch[kUniformScratch];
  for (size_t t0 = 0; t0 < n; t0 += kTile) {
    const size_t m = std::min(kTile, n - t0);
    const float* u = stochastic ? FillUniforms(key, first + t0, m, scratch) : nullptr;
    size_t i = 0;
    for (; i + w <= m; i += w)
      encode(hn::LoadU(df, x + t0 + i), u ? hn::LoadU(df, u + i) : hn::Zero(df), w, out + t0 + i);
    if (i < m) {  // zero-padded tail: 0 encodes to 0, and the padding lanes are not counted
      HWY_ALIGN float xt[HWY_MAX_BYTES / sizeof(float)] = {}, ut[HWY_MAX_BYTES / sizeof(float)] = {};
      HWY_ALIGN TWire ot[HWY_MAX_BYTES / sizeof(float)];
      memcpy(xt, x + t0 + i, (m - i) * sizeof(float));
      if (u) memcpy(ut, u + i, (m - i) * sizeof(float));
      encode(hn::Load(df, xt), hn::Load(df, ut), m - i, ot);
      memcpy(out + t0 + i, ot, (m - i) * sizeof(TWire));
    }
  }
  return report;
}

IntEncodeReport IntEncodeImpl(int bits, const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                              const PhiloxKey& key, uint64_t first, void* out) {
  switch (bits) {
    case 8: return EncodeTyped(x, n, alpha, stochastic, clip, key, first, static_cast<int8_t*>(out));
    case 16: return EncodeTyped(x, n, alpha, stochastic, clip, key, first, static_cast<int16_t*>(out));
    default: return EncodeTyped(x, n, alpha, stochastic, clip, key, first, static_cast<int32_t*>(out));
  }
}

template <typename TUnsigned>
void AddTyped(const TUnsigned* in, TUnsigned* acc, size_t n) {
  const hn::ScalableTag<TUnsigned> d;
  ForEachVector(in, acc, n, hn::Lanes(d), [&](const TUnsigned* a, TUnsigned* b) {
    hn::StoreU(hn::Add(hn::LoadU(d, a), hn::LoadU(d, b)), d, b);
  });
}

void IntAddImpl(int bits, const void* in, void* acc, size_t n) {
  switch (bits) {
    case 8: return AddTyped(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(acc), n);
    case 16: return AddTyped(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(acc), n);
    default: return AddTyped(static_cast<const uint32_t*>(in), static_cast<uint32_t*>(acc), n);
  }
}

// out[i] = int_decode_value(in[i], scale): int32 lanes widened to double (half as many lanes),
// multiplied, demoted to float32.
template <typename TWire>
void DecodeTyped(const TWire* in, size_t n, double scale, float* out) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<int32_t, decltype(dd)> di;
  const hn::Rebind<TWire, decltype(dd)> dw;
  const hn::Rebind<float, decltype(dd)> df;
  const auto s = hn::Set(dd, scale);
  ForEachVector(in, out, n, hn::Lanes(dd), [&](const TWire* src, float* dst) {
    hn::Vec<decltype(di)> wide;
    if constexpr (sizeof(TWire) == 4) {
      wide = hn::LoadU(di, reinterpret_cast<const int32_t*>(src));
    } else {
      wide = hn::PromoteTo(di, hn::LoadU(dw, src));
    }
    hn::StoreU(hn::DemoteTo(df, hn::Mul(hn::PromoteTo(dd, wide), s)), df, dst);
  });
}

void IntDecodeImpl(int bits, const void* in, size_t n, double scale, float* out) {
  switch (bits) {
    case 8: return DecodeTyped(static_cast<const int8_t*>(in), n, scale, out);
    case 16: return DecodeTyped(static_cast<const int16_t*>(in), n, scale, out);
    default: return DecodeTyped(static_cast<const int32_t*>(in), n, scale, out);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

HWY_EXPORT(IntEncodeImpl);
HWY_EXPORT(IntAddImpl);
HWY_EXPORT(IntDecodeImpl);

IntEncodeReport int_encode(int bits, const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                           const PhiloxKey& key, uint64_t first, void* out) {
  return HWY_DYNAMIC_DISPATCH(IntEncodeImpl)(bits, x, n, alpha, stochastic, clip, key, first, out);
}

void int_add(int bits, const void* in, void* acc, size_t n) { HWY_DYNAMIC_DISPATCH(IntAddImpl)(bits, in, acc, n); }

void int_decode(int bits, const void* in, size_t n, double scale, float* out) {
  HWY_DYNAMIC_DISPATCH(IntDecodeImpl)(bits, in, n, scale, out);
}

namespace {
template <typename TWire>
void accumulate_typed(const TWire* s, size_t n, IntSums* sums) {
  uint64_t part = 0;  // int8 and int16 squares: at most 2^30 each, so 2^34 of them fit
  uint32_t max_abs = sums->max_abs;
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = s[i];
    const uint64_t sq = static_cast<uint64_t>(v * v);
    if constexpr (sizeof(TWire) == 4) {
      sums->add(sq);  // up to 2^62 each: straight into 128 bits
    } else {
      part += sq;
    }
    max_abs = std::max(max_abs, static_cast<uint32_t>(v < 0 ? -v : v));
  }
  if constexpr (sizeof(TWire) != 4) sums->add(part);
  sums->max_abs = max_abs;
}
}  // namespace

void int_accumulate_sums(int bits, const void* in, size_t n, IntSums* sums) {
  switch (bits) {
    case 8: return accumulate_typed(static_cast<const int8_t*>(in), n, sums);
    case 16: return accumulate_typed(static_cast<const int16_t*>(in), n, sums);
    default: return accumulate_typed(static_cast<const int32_t*>(in), n, sums);
  }
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
