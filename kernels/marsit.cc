// Host launchers of Marsit's sign codec, vectorized with Highway and bit-identical to the element
// functions of sign.h (which the CUDA kernels and the tails here call):
//   pack    compare u + c > 0 a vector at a time and gather the lanes' mask bits into words;
//   merge   one word per 32-bit lane: the bit-sliced Bernoulli digits of kPhiloxGroups * lanes
//           words at once, from vector Philox blocks (philox-inl.h), until every lane is decided;
//   decode  broadcast a word, test each lane's bit, select +-eta, update c = c + (u - g).
#include "kernels/marsit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/sign.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/marsit.cc"
#include <hwy/foreach_target.h>  // must come before highway.h: re-includes this file per target
#include <hwy/highway.h>

#include "kernels/philox-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qccl::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Bit j of a word, for lane j: decode tests lanes i .. i + Lanes against kBit + i.
alignas(64) constexpr uint32_t kBit[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,  1u << 8,  1u << 9,  1u << 10,
    1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21,
    1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

// The scalar loop, for the values past the last whole word.
size_t PackTail(const float* u, const float* c, size_t n, uint32_t* word) {
  size_t nonfinite = 0;
  uint32_t bits = 0;
  for (size_t b = 0; b < n; ++b) {
    const float x = c ? u[b] + c[b] : u[b];
    bits |= sign_bit(x) << b;
    nonfinite += std::isfinite(x) ? 0 : 1;
  }
  *word = bits;
  return nonfinite;
}

size_t PackSignsImpl(const float* u, const float* c, size_t n, uint32_t* words) {
  const hn::ScalableTag<float> df;
  const size_t w = hn::Lanes(df);  // divides 32 on every target (1 .. 16 float lanes)
  const auto zero = hn::Zero(df);
  size_t nonfinite = 0, j = 0;
  for (; j + 32 <= n; j += 32) {
    uint32_t word = 0;
    auto bad = hn::FirstN(df, 0);  // any lane NaN or Inf
    for (size_t i = 0; i < 32; i += w) {
      auto x = hn::LoadU(df, u + j + i);
      if (c) x = hn::Add(x, hn::LoadU(df, c + j + i));
      bad = hn::Or(bad, hn::Not(hn::IsFinite(x)));
      uint8_t mask[8] = {};
      hn::StoreMaskBits(df, hn::Gt(x, zero), mask);  // lane l is bit l % 8 of byte l / 8
      word |= (static_cast<uint32_t>(mask[0]) | static_cast<uint32_t>(mask[1]) << 8) << i;
    }
    words[j / 32] = word;
    if (!hn::AllFalse(df, bad)) {  // rare: count exactly, with the scalar test
      uint32_t ignored;
      nonfinite += PackTail(u + j, c ? c + j : nullptr, 32, &ignored);
    }
  }
  if (j < n) nonfinite += PackTail(u + j, c ? c + j : nullptr, n - j, &words[j / 32]);
  return nonfinite;
}

void MergeSignsImpl(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                    const PhiloxKey& key, uint64_t first_word) {
  if (k <= 1) {  // the originator's own bits
    std::memmove(out, s, nwords * sizeof(uint32_t));
    return;
  }
#if HWY_TARGET == HWY_SCALAR  // no 64-bit lane products for vector Philox
  for (size_t i = 0; i < nwords; ++i) out[i] = marsit_merge(a[i], s[i], k, key, first_word + i);
#else
  const hn::ScalableTag<uint32_t> du;
  using V = hn::Vec<decltype(du)>;
  const size_t w = hn::Lanes(du), step = kPhiloxGroups * w;
  const uint32_t threshold = bernoulli_threshold(k);
  // The vectors decide digits 0 .. 7 (two Philox blocks per word): a lane is still undecided after
  // them with probability 2^-8, and the few words that have one finish in bernoulli_digits. Past
  // p's last 1 digit every undecided lane is decided (U >= p).
  constexpr int kVectorDigits = 8;
  int last_one = 31;
  while (last_one > 0 && ((threshold >> (31 - last_one)) & 1u) == 0) --last_one;
  const int vector_digits = std::min(kVectorDigits, last_one + 1);
  size_t i = 0;
  for (; i + step <= nwords; i += step) {
    V av[kPhiloxGroups], undecided[kPhiloxGroups], result[kPhiloxGroups];
    V any = hn::Zero(du);
    for (size_t g = 0; g < kPhiloxGroups; ++g) {
      av[g] = hn::LoadU(du, a + i + g * w);
      undecided[g] = hn::Xor(av[g], hn::LoadU(du, s + i + g * w));  // only differing bits draw
      result[g] = hn::Zero(du);
      any = hn::Or(any, undecided[g]);
    }
    V blocks[kPhiloxGroups][4];
    for (int digit = 0; digit < vector_digits && !hn::AllTrue(du, hn::Eq(any, hn::Zero(du))); ++digit) {
      if ((digit & 3) == 0) PhiloxBlocks(du, key, 8 * (first_word + i) + static_cast<uint64_t>(digit >> 2), blocks, 8);
      const bool one = (threshold >> (31 - digit)) & 1u;
      any = hn::Zero(du);
      for (size_t g = 0; g < kPhiloxGroups; ++g) {
        const V r = blocks[g][digit & 3];
        if (one) {
          result[g] = hn::Or(result[g], hn::AndNot(r, undecided[g]));  // U < p: the lane is 1
          undecided[g] = hn::And(undecided[g], r);
        } else {
          undecided[g] = hn::AndNot(r, undecided[g]);  // U > p: the lane is 0
        }
        any = hn::Or(any, undecided[g]);
      }
    }
    if (vector_digits < kVectorDigits || hn::AllTrue(du, hn::Eq(any, hn::Zero(du)))) {
      for (size_t g = 0; g < kPhiloxGroups; ++g) hn::StoreU(hn::Xor(av[g], result[g]), du, out + i + g * w);
      continue;
    }
    HWY_ALIGN uint32_t rest[kMaxBlocksPerStep], bits[kMaxBlocksPerStep];
    for (size_t g = 0; g < kPhiloxGroups; ++g) {
      hn::Store(result[g], du, bits + g * w);
      hn::Store(undecided[g], du, rest + g * w);
    }
    for (size_t l = 0; l < step; ++l) {
      if (rest[l]) bits[l] = bernoulli_digits(key, first_word + i + l, threshold, rest[l], bits[l], kVectorDigits);
      out[i + l] = a[i + l] ^ bits[l];
    }
  }
  for (; i < nwords; ++i) out[i] = marsit_merge(a[i], s[i], k, key, first_word + i);
#endif
}

void DecodeSignsImpl(const uint32_t* words, size_t n, float eta, float* g, float* c, const float* u) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t w = hn::Lanes(df);
  const auto plus = hn::Set(df, eta), minus = hn::Set(df, -eta);
  size_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const auto word = hn::Set(du, words[j / 32]);
    for (size_t i = 0; i < 32; i += w) {
      const auto set = hn::RebindMask(df, hn::Ne(hn::And(word, hn::Load(du, kBit + i)), hn::Zero(du)));
      const auto v = hn::IfThenElse(set, plus, minus);
      if (c) {  // u before g: they may be one buffer (an in-place all-reduce)
        const auto cu = hn::Add(hn::LoadU(df, c + j + i), hn::Sub(hn::LoadU(df, u + j + i), v));
        hn::StoreU(cu, df, c + j + i);
      }
      hn::StoreU(v, df, g + j + i);
    }
  }
  for (; j < n; ++j) {
    const float v = sign_value(words[j / 32], static_cast<unsigned>(j % 32), eta);
    if (c) c[j] += u[j] - v;
    g[j] = v;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

HWY_EXPORT(PackSignsImpl);
HWY_EXPORT(MergeSignsImpl);
HWY_EXPORT(DecodeSignsImpl);

size_t pack_signs(const float* u, const float* c, size_t n, uint32_t* words) {
  return HWY_DYNAMIC_DISPATCH(PackSignsImpl)(u, c, n, words);
}

void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                 const PhiloxKey& key, uint64_t first_word) {
  HWY_DYNAMIC_DISPATCH(MergeSignsImpl)(a, s, out, nwords, k, key, first_word);
}

void decode_signs(const uint32_t* words, size_t n, float eta, float* g, float* c, const float* u) {
  HWY_DYNAMIC_DISPATCH(DecodeSignsImpl)(words, n, eta, g, c, u);
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
