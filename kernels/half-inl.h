// float16 / bfloat16 <-> float32 on Highway vectors, bit-identical to kernels/half.h, for every
// per-target translation unit that needs them (kernels/reduce.cc and kernels/codec.cc). Include it
// after foreach_target.h: like every Highway "-inl" header it is re-included once per target, which
// the toggled guard below allows.

#if defined(QCCL_KERNELS_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QCCL_KERNELS_HALF_INL_H_
#undef QCCL_KERNELS_HALF_INL_H_
#else
#define QCCL_KERNELS_HALF_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// AVX2 and AVX-512 imply F16C, whose vcvtph2ps/vcvtps2ph (imm 0: round to nearest even) agree with
// half.h bit for bit, NaNs included (checked over every float32 and every half). Highway 1.0.3's
// own fallback for older targets truncates instead of rounding and turns Inf/NaN into finite
// values, so those targets use the integer versions below (checked the same way).
#undef QCCL_F16C
#if (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && \
    !defined(HWY_DISABLE_F16C)
#define QCCL_F16C 1
#else
#define QCCL_F16C 0
#endif

struct Float16 {
  // Casts of float32 values at or above this |x| (as float32 bits) are not finite: >= 65520 rounds
  // to Inf. And whether a half is Inf or NaN.
  static constexpr int32_t kNonfiniteFrom = 0x477FF000;
  static bool IsNonfinite(uint16_t h) { return (h & 0x7C00u) == 0x7C00u; }

  template <class DF, class V16>
  static HWY_INLINE hn::VFromD<DF> Widen(DF df, V16 h) {
#if QCCL_F16C
    return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(), h));
#else
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto bits = hn::PromoteTo(du, h);
    const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000u)));
    const auto em = hn::And(bits, hn::Set(du, 0x7FFFu));  // exponent and mantissa
    const auto normal = hn::Add(hn::ShiftLeft<13>(em), hn::Set(du, (127u - 15u) << 23));
    const auto emi = hn::BitCast(di, em);  // signed compares: cheaper than unsigned before AVX-512
    const auto is_nan = hn::RebindMask(du, hn::Gt(emi, hn::Set(di, 0x7C00)));
    const auto quiet = hn::IfThenElseZero(is_nan, hn::Set(du, 0x00400000u));  // as F16C does
    const auto inf_nan = hn::Or(hn::Or(hn::ShiftLeft<13>(em), hn::Set(du, 0x7F800000u)), quiet);
    // Subnormals (and zero): m * 2^-24, exact in float32 and never a float32 subnormal.
    const auto sub = hn::BitCast(
        du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, em)), hn::Set(df, 1.0f / 16777216.0f)));
    auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(emi, hn::Set(di, 0x400))), sub, normal);
    r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(emi, hn::Set(di, 0x7BFF))), inf_nan, r);
    return hn::BitCast(df, hn::Or(r, sign));
#endif
  }

  template <class D16, class VF>
  static HWY_INLINE hn::VFromD<D16> Narrow(D16 d16, VF v) {
#if QCCL_F16C
    return hn::BitCast(d16, hn::DemoteTo(hn::Rebind<hwy::float16_t, D16>(), v));
#else
    // half.h's float_bits_to_half_bits with every branch computed, then selected.
    const hn::DFromV<VF> df;
    const hn::RebindToUnsigned<decltype(df)> du;
    const hn::RebindToSigned<decltype(df)> di;
    const auto x = hn::BitCast(du, v);
    const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
    const auto ax = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
    const auto axi = hn::BitCast(di, ax);
    const auto odd = hn::And(hn::ShiftRight<13>(ax), hn::Set(du, 1u));
    const auto normal = hn::ShiftRight<13>(
        hn::Sub(hn::Add(ax, hn::Add(odd, hn::Set(du, 0xFFFu))), hn::Set(du, (127u - 15u) << 23)));
    // Subnormal results: adding 0.5f (whose ulp is 2^-24, the float16 subnormal step) makes the FPU
    // round |x| to nearest even in units of 2^-24; the low bits are then the float16 encoding.
    const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, ax), hn::Set(df, 0.5f))),
                             hn::Set(du, 0x3F000000u));
    const auto nan =
        hn::Or(hn::And(hn::ShiftRight<13>(ax), hn::Set(du, 0x3FFu)), hn::Set(du, 0x7E00u));
    auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(axi, hn::Set(di, 0x38800000))), sub, normal);
    r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(axi, hn::Set(di, 0x477FEFFF))),
                       hn::Set(du, 0x7C00u), r);
    r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(axi, hn::Set(di, 0x7F800000))), nan, r);
    return hn::DemoteTo(d16, hn::BitCast(di, hn::Or(r, sign)));  // < 0x10000: no saturation
#endif
  }
};

// Highway's bfloat16 demotion truncates, so rounding is done here with integer ops on every target.
struct Bfloat16 {
  // 0x7F7F8000 is the first float32 that rounds (to even) to bfloat16 Inf.
  static constexpr int32_t kNonfiniteFrom = 0x7F7F8000;
  static bool IsNonfinite(uint16_t h) { return (h & 0x7F80u) == 0x7F80u; }

  template <class DF, class V16>
  static HWY_INLINE hn::VFromD<DF> Widen(DF df, V16 h) {
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));
  }

  template <class D16, class VF>
  static HWY_INLINE hn::VFromD<D16> Narrow(D16 d16, VF v) {
    const hn::DFromV<VF> df;
    const hn::RebindToUnsigned<decltype(df)> du;
    const hn::RebindToSigned<decltype(df)> di;
    const auto x = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(x, hn::Add(odd, hn::Set(du, 0x7FFFu))));
    const auto quiet_nan = hn::Or(hn::ShiftRight<16>(x), hn::Set(du, 0x40u));
    const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    return hn::DemoteTo(d16, hn::BitCast(di, r));
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#endif  // QCCL_KERNELS_HALF_INL_H_
