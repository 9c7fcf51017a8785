// Philox4x32-10 (philox.h) on Highway vectors, one block per 32-bit lane, bit-identical to
// philox4x32_10: the codec launchers draw stochastic-rounding uniforms from it (codec-inl.h), and
// Marsit's merge its Bernoulli digits (marsit.cc). Included after foreach_target.h by files that
// compile once per target; the toggled guard is Highway's convention for such headers.

#if defined(QCCL_KERNELS_PHILOX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QCCL_KERNELS_PHILOX_INL_H_
#undef QCCL_KERNELS_PHILOX_INL_H_
#else
#define QCCL_KERNELS_PHILOX_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "kernels/philox.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// philox_mulhilo on every 32-bit lane: MulEven multiplies the even lanes into 64-bit products, the odd
// lanes are shifted down to take their turn, and both halves are picked out of the two products (a
// shift and a blend are cheaper than a second, 32-bit, multiply).
template <class DU, class V>
HWY_INLINE void MulHiLo(DU du, V multiplier, V c, V* hi, V* lo) {
  const hn::Repartition<uint64_t, DU> d64;
  const auto even = hn::MulEven(c, multiplier);
  const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, c))), multiplier);
  *hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
  *lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
}

// One Philox call is a chain of 10 dependent rounds, each waiting for a multiply; two independent
// groups of blocks in flight keep the core busy.
constexpr size_t kPhiloxGroups = 2;
constexpr size_t kMaxBlocksPerStep = kPhiloxGroups * HWY_MAX_BYTES / sizeof(uint32_t);

// philox4x32_10 for kPhiloxGroups * Lanes(du) blocks, one per lane, `stride` blocks apart from
// `block` on: v[g][w] holds word w of block block + (g * Lanes(du) + lane) * stride.
template <class DU, class V>
HWY_INLINE void PhiloxBlocks(DU du, const PhiloxKey& key, uint64_t block, V v[kPhiloxGroups][4],
                             uint64_t stride = 1) {
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  const V m0 = hn::Set(du, 0xD2511F53u), m1 = hn::Set(du, 0xCD9E8D57u);
  const size_t w = hn::Lanes(du);
  V c[kPhiloxGroups][4];
  for (size_t g = 0; g < kPhiloxGroups; ++g) {
    const uint64_t first = block + g * w * stride;
    c[g][0] = hn::Add(hn::Set(du, static_cast<uint32_t>(first)),
                      hn::Mul(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(stride))));
    c[g][1] = hn::Set(du, static_cast<uint32_t>(first >> 32));
    if (((first & 0xffffffffu) + (w - 1) * stride) >> 32) {  // the count carries into word 1
      HWY_ALIGN uint32_t lo[HWY_MAX_BYTES / sizeof(uint32_t)], hi[HWY_MAX_BYTES / sizeof(uint32_t)];
      for (size_t j = 0; j < w; ++j) {
        lo[j] = static_cast<uint32_t>(first + j * stride);
        hi[j] = static_cast<uint32_t>((first + j * stride) >> 32);
      }
      c[g][0] = hn::Load(du, lo);
      c[g][1] = hn::Load(du, hi);
    }
    c[g][2] = hn::Set(du, static_cast<uint32_t>(key.step));
    c[g][3] = hn::Set(du, key.rank ^ (key.stream << 20) ^ static_cast<uint32_t>(key.step >> 32));
  }
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (size_t g = 0; g < kPhiloxGroups; ++g) {
      V hi0, lo0, hi1, lo1;
      MulHiLo(du, m0, c[g][0], &hi0, &lo0);
      MulHiLo(du, m1, c[g][2], &hi1, &lo1);
      c[g][0] = hn::Xor(hn::Xor(hi1, c[g][1]), hn::Set(du, k0));
      c[g][1] = lo1;
      c[g][2] = hn::Xor(hn::Xor(hi0, c[g][3]), hn::Set(du, k1));
      c[g][3] = lo0;
    }
    k0 += kW0, k1 += kW1;
  }
  for (size_t g = 0; g < kPhiloxGroups; ++g)
    for (int word = 0; word < 4; ++word) v[g][word] = c[g][word];
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#endif  // include guard
