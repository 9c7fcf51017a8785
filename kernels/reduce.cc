// Host reduction kernels: one Highway source compiled once per x86 target (SSSE3, SSE4, AVX2,
// AVX-512 and a one-lane scalar fallback) and dispatched at run time, so a build runs on any
// x86-64.
//
// Every kernel is lane-wise: element i of dst depends only on element i of a and b, so the vector
// width never changes a result, and the tail (count not a multiple of the lane count) runs the very
// same vector step on zero-padded copies instead of a separate scalar loop with its own semantics.

#include "kernels/reduce.h"

#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/reduce.cc"
#include <hwy/foreach_target.h>  // must come before highway.h: re-includes this file per target
#include <hwy/highway.h>

#include "kernels/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- NaN and signed zero ------------------------------------------------------------------------

// Every NaN a floating kernel writes is the positive NaN with all payload bits set. x86 picks the
// payload of the first NaN operand (and makes -NaN out of Inf - Inf), so without this sum(NaN1,
// NaN2) and sum(NaN2, NaN1) would differ in bits and ranks combining in different orders would
// disagree. All-ones survives the float16/bfloat16 narrowing unchanged (0x7FFF), and 0x7FFFFFFF is
// PTX's canonical NaN, which a CUDA path can produce cheaply too.
template <class D>
HWY_INLINE hn::VFromD<D> CanonicalNaN(D d) {
  const hn::RebindToUnsigned<D> du;
  using TU = hn::TFromD<decltype(du)>;
  return hn::BitCast(d, hn::Set(du, static_cast<TU>(~TU{0} >> 1)));
}

template <class D, class V>
HWY_INLINE V CanonicalizeNaN(D d, V v) {
  return hn::IfThenElse(hn::IsNaN(v), CanonicalNaN(d), v);
}

// x86 maxps/minps return the second operand when either is NaN or both are zeros, so they are not
// symmetric. Here: any NaN gives the canonical NaN, and -0 < +0 (IEEE 754-2019 maximum/minimum), so
// max(+0, -0) = +0 and min(+0, -0) = -0 in either order. For equal inputs AND (max) and OR (min) of
// the bits pick +0 / -0 among zeros and return the common value otherwise.
template <bool kMax, class D, class V>
HWY_INLINE V SymmetricMaxMin(D d, V a, V b) {
  const auto equal = hn::Eq(a, b);
  const V r = kMax ? hn::IfThenElse(equal, hn::And(a, b), hn::Max(a, b))
                   : hn::IfThenElse(equal, hn::Or(a, b), hn::Min(a, b));
  return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::IsNaN(b)), CanonicalNaN(d), r);
}

// ---- The operators, on vectors of one lane type -------------------------------------------------

// Integer sum and product go through unsigned lanes: wraparound is the promise, and the one-lane
// scalar target would otherwise do signed arithmetic in C++, where overflow is undefined.
struct OpSum {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V b) const {
    if constexpr (hwy::IsFloat<hn::TFromD<D>>()) {
      return CanonicalizeNaN(d, hn::Add(a, b));
    } else {
      const hn::RebindToUnsigned<D> du;
      return hn::BitCast(d, hn::Add(hn::BitCast(du, a), hn::BitCast(du, b)));
    }
  }
};

struct OpProd {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V b) const {
    if constexpr (hwy::IsFloat<hn::TFromD<D>>()) {
      return CanonicalizeNaN(d, hn::Mul(a, b));
    } else {
      static_assert(sizeof(hn::TFromD<D>) > 1, "8-bit products use KernelProd8");
      const hn::RebindToUnsigned<D> du;
      return hn::BitCast(d, hn::Mul(hn::BitCast(du, a), hn::BitCast(du, b)));
    }
  }
};

template <bool kMax>
struct OpMaxMin {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V b) const {
    if constexpr (hwy::IsFloat<hn::TFromD<D>>()) {
      return SymmetricMaxMin<kMax>(d, a, b);
    } else {
      return kMax ? hn::Max(a, b) : hn::Min(a, b);
    }
  }
};

// finish_average's division; b is ignored (the driver passes a twice).
struct OpDivide {
  double divisor;
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V /*b*/) const {
    using T = hn::TFromD<D>;
    return CanonicalizeNaN(d, hn::Div(a, hn::Set(d, static_cast<T>(divisor))));
  }
};

// float16 / bfloat16 <-> float32: Float16 and Bfloat16 of kernels/half-inl.h.


// ---- Kernels: one vector step over Lanes() elements ---------------------------------------------

template <typename TLane, class Op>
struct KernelLanewise {
  using T = TLane;
  static size_t Lanes() { return hn::Lanes(hn::ScalableTag<T>()); }
  static HWY_INLINE void Step(const Op& op, const T* a, const T* b, T* dst) {
    const hn::ScalableTag<T> d;
    hn::StoreU(op(d, hn::LoadU(d, a), hn::LoadU(d, b)), d, dst);
  }
};

// float16/bfloat16: widen to a full float32 vector, combine there, narrow back.
template <class Codec, class Op>
struct KernelWidened {
  using T = uint16_t;
  static size_t Lanes() { return hn::Lanes(hn::ScalableTag<float>()); }
  static HWY_INLINE void Step(const Op& op, const T* a, const T* b, T* dst) {
    const hn::ScalableTag<float> df;
    const hn::Rebind<uint16_t, decltype(df)> d16;
    const auto r = op(df, Codec::Widen(df, hn::LoadU(d16, a)), Codec::Widen(df, hn::LoadU(d16, b)));
    hn::StoreU(Codec::Narrow(d16, r), d16, dst);
  }
};

// x86 has no 8-bit multiply: multiply in 16-bit lanes and keep the low byte, which is the product
// modulo 2^8 for int8 and uint8 alike.
struct KernelProd8 {
  using T = uint8_t;
  static size_t Lanes() { return hn::Lanes(hn::ScalableTag<uint16_t>()); }
  static HWY_INLINE void Step(const OpProd&, const T* a, const T* b, T* dst) {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Rebind<uint8_t, decltype(d16)> d8;
    const hn::RebindToSigned<decltype(d16)> di16;
    const auto p =
        hn::Mul(hn::PromoteTo(d16, hn::LoadU(d8, a)), hn::PromoteTo(d16, hn::LoadU(d8, b)));
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di16, hn::And(p, hn::Set(d16, 0xFF)))), d8, dst);
  }
};

// ---- The driver ---------------------------------------------------------------------------------

template <class Kernel, class Op>
HWY_NOINLINE void Run(const Op& op, const void* va, const void* vb, void* vdst, size_t count) {
  using T = typename Kernel::T;
  const T* a = static_cast<const T*>(va);
  const T* b = static_cast<const T*>(vb);
  T* dst = static_cast<T*>(vdst);
  const size_t n = Kernel::Lanes();
  size_t i = 0;
  // Both operands are loaded before dst[i..i+n) is stored, so dst == a or dst == b is safe.
  for (; i + n <= count; i += n) Kernel::Step(op, a + i, b + i, dst + i);
  if (i == count) return;
  // The tail: the same step on zero-padded copies, so that nothing is read or written past count.
  constexpr size_t kMax = HWY_MAX_BYTES / sizeof(T);  // >= n for every kernel
  T ta[kMax] = {}, tb[kMax] = {}, td[kMax];
  const size_t rest = count - i;
  memcpy(ta, a + i, rest * sizeof(T));
  memcpy(tb, b + i, rest * sizeof(T));
  Kernel::Step(op, ta, tb, td);
  memcpy(dst + i, td, rest * sizeof(T));
}

template <typename T>
void ReduceLanes(RedOp op, const void* a, const void* b, void* dst, size_t count) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return Run<KernelLanewise<T, OpSum>>(OpSum(), a, b, dst, count);
    case RedOp::kProd:
      if constexpr (sizeof(T) == 1) {
        return Run<KernelProd8>(OpProd(), a, b, dst, count);
      } else {
        return Run<KernelLanewise<T, OpProd>>(OpProd(), a, b, dst, count);
      }
    case RedOp::kMax:
      return Run<KernelLanewise<T, OpMaxMin<true>>>(OpMaxMin<true>(), a, b, dst, count);
    case RedOp::kMin:
      return Run<KernelLanewise<T, OpMaxMin<false>>>(OpMaxMin<false>(), a, b, dst, count);
  }
}

template <class Codec>
void ReduceWidened(RedOp op, const void* a, const void* b, void* dst, size_t count) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return Run<KernelWidened<Codec, OpSum>>(OpSum(), a, b, dst, count);
    case RedOp::kProd: return Run<KernelWidened<Codec, OpProd>>(OpProd(), a, b, dst, count);
    case RedOp::kMax:
      return Run<KernelWidened<Codec, OpMaxMin<true>>>(OpMaxMin<true>(), a, b, dst, count);
    case RedOp::kMin:
      return Run<KernelWidened<Codec, OpMaxMin<false>>>(OpMaxMin<false>(), a, b, dst, count);
  }
}

// Signed and unsigned integers share the wrapping sum and product (same bits) but not max/min.
void ReduceImpl(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count) {
  switch (type) {
    case DataType::kInt8: return ReduceLanes<int8_t>(op, a, b, dst, count);
    case DataType::kUint8: return ReduceLanes<uint8_t>(op, a, b, dst, count);
    case DataType::kInt32: return ReduceLanes<int32_t>(op, a, b, dst, count);
    case DataType::kUint32: return ReduceLanes<uint32_t>(op, a, b, dst, count);
    case DataType::kInt64: return ReduceLanes<int64_t>(op, a, b, dst, count);
    case DataType::kUint64: return ReduceLanes<uint64_t>(op, a, b, dst, count);
    case DataType::kFloat32: return ReduceLanes<float>(op, a, b, dst, count);
    case DataType::kFloat64: return ReduceLanes<double>(op, a, b, dst, count);
    case DataType::kFloat16: return ReduceWidened<Float16>(op, a, b, dst, count);
    case DataType::kBfloat16: return ReduceWidened<Bfloat16>(op, a, b, dst, count);
  }
}

// Floating types only; reduce.cc's portable part handles the integers.
void DivideFloatingImpl(DataType type, void* buf, size_t count, int nranks) {
  const OpDivide op{static_cast<double>(nranks)};
  switch (type) {
    case DataType::kFloat32: return Run<KernelLanewise<float, OpDivide>>(op, buf, buf, buf, count);
    case DataType::kFloat64: return Run<KernelLanewise<double, OpDivide>>(op, buf, buf, buf, count);
    case DataType::kFloat16: return Run<KernelWidened<Float16, OpDivide>>(op, buf, buf, buf, count);
    case DataType::kBfloat16:
      return Run<KernelWidened<Bfloat16, OpDivide>>(op, buf, buf, buf, count);
    default: return;
  }
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

HWY_EXPORT(ReduceImpl);
HWY_EXPORT(DivideFloatingImpl);
HWY_EXPORT(TargetNameImpl);

void reduce(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count) {
  if (count == 0) return;
  HWY_DYNAMIC_DISPATCH(ReduceImpl)(type, op, a, b, dst, count);
}

namespace {

// Integer averages are rare (NCCL's avg is meant for gradients) and SIMD has no integer division,
// so this stays a plain loop. C++ division truncates toward zero, which is the promise. It divides
// in 64 bits: nranks does not fit an 8-bit type from 128 (int8) or 256 (uint8) ranks on.
template <typename T>
void divide_integers(void* buf, size_t count, int nranks) {
  using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  T* p = static_cast<T*>(buf);
  const auto n = static_cast<Wide>(nranks);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<Wide>(p[i]) / n);
}

}  // namespace

void finish_average(DataType type, void* buf, size_t count, int nranks) {
  assert(nranks >= 1);
  if (count == 0) return;
  switch (type) {
    case DataType::kInt8: return divide_integers<int8_t>(buf, count, nranks);
    case DataType::kUint8: return divide_integers<uint8_t>(buf, count, nranks);
    case DataType::kInt32: return divide_integers<int32_t>(buf, count, nranks);
    case DataType::kUint32: return divide_integers<uint32_t>(buf, count, nranks);
    case DataType::kInt64: return divide_integers<int64_t>(buf, count, nranks);
    case DataType::kUint64: return divide_integers<uint64_t>(buf, count, nranks);
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
      return HWY_DYNAMIC_DISPATCH(DivideFloatingImpl)(type, buf, count, nranks);
  }
}

const char* reduce_target_name() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace qccl::kernels
#endif  // HWY_ONCE
