// Sign bits and Marsit's stochastic merge (Wu et al., "Sign Bit is Enough", DAC 2022, §4.1.1 eq. 2),
// as element functions that host loops and CUDA kernels share.
//
// Bits: one per value, packed in 32-bit words least significant bit first (value j of a run is bit
// j % 32 of word j / 32); bit 1 means positive (x > 0), so 0 and -0 send bit 0 and decode to -eta_s
// (marsit.md §2.2; a zero is rare in an update, and the bias is documented). Pad bits are zero.
//
// The merge at a hop that holds k contributions (the incoming aggregate a of k-1, and this rank's
// bits s) is out = a ^ ((a ^ s) & r) with r ~ Bernoulli(1/k) per bit: where a and s agree the bit
// passes; where they disagree, s wins with probability 1/k. By induction P(out = 1) is the fraction
// of the k contributions whose bit is 1 (marsit.md §1.4: k counts contributions, not ranks). This is
// the paper's (a AND s) OR ((a XOR s) AND v) with v = NOT(s XOR r), bit for bit.
//
// Bernoulli(1/k) for 32 bits at once, exact to 2^-32: each bit compares a uniform 32-bit fraction U
// with p = floor(2^32 / k) / 2^32, one binary digit at a time, all 32 lanes in parallel ("bit
// slicing"): lanes whose digit of U differs from p's are decided, the others read the next random
// word. Half the undecided lanes decide at every digit, so a word needs about log2(32) + 2 random
// words instead of 32 (one per value), and the result is a pure function of (key, word index, k):
// host and device agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"
#include "kernels/philox.h"

namespace qccl::kernels {

QCCL_HD uint32_t sign_bit(float x) { return x > 0.0f ? 1u : 0u; }

// p * 2^32 for p = 1/k, k >= 2 (k = 1 is certainty: handled by the caller of bernoulli_word).
QCCL_HD uint32_t bernoulli_threshold(uint32_t k) { return static_cast<uint32_t>((uint64_t{1} << 32) / k); }

// The bit-sliced comparison from digit `first` (a multiple of 4) on, for the lanes still `undecided`
// (the others keep their bit in `result`): random digit d is word d % 4 of Philox block
// 8 * word + d / 4. Vector code decides the first digits of many words at once and finishes the few
// undecided lanes here.
QCCL_HD uint32_t bernoulli_digits(const PhiloxKey& key, uint64_t word, uint32_t threshold, uint32_t undecided,
                                  uint32_t result, int first) {
  PhiloxBlock block{{0, 0, 0, 0}};
  for (int digit = first; digit < 32 && undecided; ++digit) {
    if ((digit & 3) == 0) block = philox4x32_10(key, word * 8 + static_cast<uint64_t>(digit >> 2));
    const uint32_t r = block.v[digit & 3];  // digit `digit` of U, one lane per bit
    if ((threshold >> (31 - digit)) & 1u) {
      result |= undecided & ~r;  // U's digit 0 < p's digit 1: U < p, the lane is 1
      undecided &= r;
    } else {
      undecided &= ~r;  // U's digit 1 > p's digit 0: U > p, the lane is 0
    }
    if (digit < 31 && (threshold << (digit + 1)) == 0) break;  // p's remaining digits are 0: U >= p
  }
  return result;
}

// 32 Bernoulli(threshold / 2^32) bits for word `word` under `key`: random words come from Philox
// blocks 8 * word .. 8 * word + 7 (four digits per block). Only the lanes set in `lanes` are decided
// (the others come out 0, and a lane's bit never depends on the others): the merge needs the bits
// only where its two words differ, and agreeing lanes then cost no random words.
QCCL_HD uint32_t bernoulli_word(const PhiloxKey& key, uint64_t word, uint32_t threshold, uint32_t lanes = ~0u) {
  return bernoulli_digits(key, word, threshold, lanes, 0, 0);
}

// The merge of 32 incoming bits a with 32 local bits s at a hop holding k contributions.
QCCL_HD uint32_t marsit_merge(uint32_t a, uint32_t s, uint32_t k, const PhiloxKey& key, uint64_t word) {
  if (k <= 1) return s;  // the originator: its own bits
  const uint32_t differ = a ^ s;
  return differ ? a ^ bernoulli_word(key, word, bernoulli_threshold(k), differ) : a;
}

// eta_s * (2 * bit - 1): the decoded global update.
QCCL_HD float sign_value(uint32_t word, unsigned bit, float eta) { return ((word >> bit) & 1u) ? eta : -eta; }

// Marsit's compensation, kept lazily (marsit.h, Compensation): c = stored - the pending round's
// eta_s (2 b - 1), from the bit that round decoded (eta 0: nothing pending, c = stored).
QCCL_HD float compensation_value(float stored, uint32_t word, unsigned bit, float eta) {
  return stored - sign_value(word, bit, eta);
}

QCCL_HD size_t sign_words(size_t n) { return (n + 31) / 32; }

}  // namespace qccl::kernels
