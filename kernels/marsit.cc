// Host launchers of Marsit's sign codec, vectorized with Highway and bit-identical to the element
// functions of sign.h (which the CUDA kernels and the tails here call):
//   pack    per word: c = stored - the pending +-eta (SignValues of the pending word), w = u + c,
//           stored = w, and the lanes' w > 0 mask bits gathered into the word;
//   merge   one word per 32-bit lane: the bit-sliced Bernoulli digits of kPhiloxGroups * lanes
//           words at once, from vector Philox blocks (philox-inl.h), until every lane is decided;
//   decode  g = SignValues of each word; record the word and eta.
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

// Shift counts that move bit j of a word to bit 31, for lane j: SignValues takes lanes i .. i + Lanes.
alignas(64) constexpr uint32_t kToBit31[32] = {31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                               15, 14, 13, 12, 11, 10, 9,  8,  7,  6,  5,  4,  3,  2,  1,  0};

// sign_value(word, i + l, eta) in lane l: eta with its sign bit flipped where the lane's bit is 0
// (-eta is exactly that), the bit moved to bit 31 by a shift of 31 - (i + l).
template <class DF>
hn::Vec<DF> SignValues(DF df, uint32_t word, float eta, size_t i) {
  const hn::RebindToUnsigned<DF> du;
  const auto flip = hn::And(hn::Shl(hn::Set(du, ~word), hn::Load(du, kToBit31 + i)), hn::Set(du, 0x80000000u));
  return hn::BitCast(df, hn::Xor(hn::BitCast(du, hn::Set(df, eta)), flip));
}

// The element loop for n <= 32 values of one word (sign.h's functions): the values past the last
// whole word, and the word of a run that is not word-aligned.
size_t PackTail(const float* u, const Compensation* c, size_t first, size_t n, uint32_t* word, float* backup) {
  size_t nonfinite = 0;
  uint32_t bits = 0;
  for (size_t b = 0; b < n; ++b) {
    float x = u[b];
    if (c) {
      const size_t j = first + b;
      float& stored = c->stored[j];
      if (backup) backup[b] = stored;
      x += compensation_value(stored, c->words[j / 32], static_cast<unsigned>(j % 32), c->eta[j / 32]);
      stored = x;
    }
    bits |= sign_bit(x) << b;
    nonfinite += std::isfinite(x) ? 0 : 1;
  }
  *word = bits;
  return nonfinite;
}

size_t PackSignsImpl(const float* u, const Compensation* c, size_t first, size_t n, uint32_t* words, float* backup) {
  const hn::ScalableTag<float> df;
  const size_t w = hn::Lanes(df);  // divides 32 on every target (1 .. 16 float lanes)
  const auto zero = hn::Zero(df);
  size_t nonfinite = 0, j = 0;
  for (; j + 32 <= n; j += 32) {
    uint32_t word = 0;
    const size_t at = first + j;  // this word's first value in the tensor
    auto finite = zero;  // x - x is 0 for finite x, NaN otherwise: summed, NaN if any lane is not finite
    for (size_t i = 0; i < 32; i += w) {
      auto x = hn::LoadU(df, u + j + i);
      if (c) {  // c = stored - the pending round's +-eta
        const auto stored = hn::LoadU(df, c->stored + at + i);
        if (backup) hn::StoreU(stored, df, backup + j + i);
        x = hn::Add(x, hn::Sub(stored, SignValues(df, c->words[at / 32], c->eta[at / 32], i)));
        hn::StoreU(x, df, c->stored + at + i);
      }
      finite = hn::Add(finite, hn::Sub(x, x));
      uint8_t mask[8] = {};
      hn::StoreMaskBits(df, hn::Gt(x, zero), mask);  // lane l is bit l % 8 of byte l / 8
      word |= (static_cast<uint32_t>(mask[0]) | static_cast<uint32_t>(mask[1]) << 8) << i;
    }
    words[j / 32] = word;
    if (HWY_UNLIKELY(!hn::AllTrue(df, hn::Eq(finite, zero)))) {  // rare: count exactly, from the w just written
      const float* x = c ? c->stored + at : u + j;
      for (size_t b = 0; b < 32; ++b) nonfinite += std::isfinite(x[b]) ? 0 : 1;
    }
  }
  if (j < n) nonfinite += PackTail(u + j, c, first + j, n - j, &words[j / 32], backup ? backup + j : nullptr);
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

void DecodeSignsImpl(const uint32_t* words, size_t n, float eta, float* g, const Compensation* c, size_t first) {
  const hn::ScalableTag<float> df;
  const size_t w = hn::Lanes(df);
  for (size_t j = 0; j < n; j += 32) {
    const uint32_t word = words[j / 32];
    if (c) c->words[(first + j) / 32] = word, c->eta[(first + j) / 32] = eta;
    if (j + 32 > n) {  // the last, partial word
      for (size_t b = 0; j + b < n; ++b) g[j + b] = sign_value(word, static_cast<unsigned>(b), eta);
      break;
    }
    for (size_t i = 0; i < 32; i += w) hn::StoreU(SignValues(df, word, eta, i), df, g + j + i);
  }
}

// Calls scalar(i) for the values i of first .. first + n - 1 outside whole words, and word(i) for
// the first value of every whole word (values i .. i + 31).
template <class Scalar, class Word>
void ForWords(size_t first, size_t n, const Scalar& scalar, const Word& word) {
  size_t i = 0;
  for (; i < n && (first + i) % 32; ++i) scalar(i);
  for (; i + 32 <= n; i += 32) word(i);
  for (; i < n; ++i) scalar(i);
}

void AddCompensationImpl(const float* x, const Compensation& c, size_t first, size_t n, float* out) {
  const hn::ScalableTag<float> df;
  const size_t w = hn::Lanes(df);
  auto scalar = [&](size_t i) {
    const size_t j = first + i;
    const float cj = compensation_value(c.stored[j], c.words[j / 32], static_cast<unsigned>(j % 32), c.eta[j / 32]);
    out[i] = x ? x[i] + cj : cj;
  };
  auto word = [&](size_t i) {
    const size_t at = (first + i) / 32;
    for (size_t l = 0; l < 32; l += w) {
      const auto pending = SignValues(df, c.words[at], c.eta[at], l);
      auto v = hn::Sub(hn::LoadU(df, c.stored + first + i + l), pending);
      if (x) v = hn::Add(hn::LoadU(df, x + i + l), v);
      hn::StoreU(v, df, out + i + l);
    }
  };
  ForWords(first, n, scalar, word);
}

size_t ResetCompensationImpl(const float* g, const Compensation& c, size_t first, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t w = hn::Lanes(df);
  size_t nonfinite = 0;
  auto scalar = [&](size_t i) {
    const size_t j = first + i;
    if (std::isfinite(g[i])) c.stored[j] = sign_value(c.words[j / 32], static_cast<unsigned>(j % 32), c.eta[j / 32]);
    else ++nonfinite;
  };
  auto word = [&](size_t i) {
    const size_t at = (first + i) / 32;
    for (size_t l = 0; l < 32; l += w) {
      const auto finite = hn::IsFinite(hn::LoadU(df, g + i + l));
      float* stored = c.stored + first + i + l;
      const auto pending = SignValues(df, c.words[at], c.eta[at], l);
      hn::StoreU(hn::IfThenElse(finite, pending, hn::LoadU(df, stored)), df, stored);
      nonfinite += w - hn::CountTrue(df, finite);
    }
  };
  ForWords(first, n, scalar, word);
  return nonfinite;
}

}  // namespace HWY_NAMESPACE
}  // namespace qccl::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qccl::kernels {

HWY_EXPORT(PackSignsImpl);
HWY_EXPORT(MergeSignsImpl);
HWY_EXPORT(DecodeSignsImpl);
HWY_EXPORT(AddCompensationImpl);
HWY_EXPORT(ResetCompensationImpl);

size_t pack_signs(const float* u, const Compensation* c, size_t first, size_t n, uint32_t* words, float* backup) {
  return HWY_DYNAMIC_DISPATCH(PackSignsImpl)(u, c, first, n, words, backup);
}

void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                 const PhiloxKey& key, uint64_t first_word) {
  HWY_DYNAMIC_DISPATCH(MergeSignsImpl)(a, s, out, nwords, k, key, first_word);
}

void decode_signs(const uint32_t* words, size_t n, float eta, float* g, const Compensation* c, size_t first) {
  HWY_DYNAMIC_DISPATCH(DecodeSignsImpl)(words, n, eta, g, c, first);
}

void add_compensation(const float* x, const Compensation& c, size_t first, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(AddCompensationImpl)(x, c, first, n, out);
}

size_t reset_compensation(const float* g, const Compensation& c, size_t first, size_t n) {
  return HWY_DYNAMIC_DISPATCH(ResetCompensationImpl)(g, c, first, n);
}

}  // namespace qccl::kernels
#endif  // HWY_ONCE
