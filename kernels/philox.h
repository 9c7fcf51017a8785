// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel random
// numbers: as easy as 1, 2, 3" (SC'11), as used by cuRAND and JAX. A counter-based generator needs no
// state: the random bits of element i are a pure function of (seed, step, rank, i), so host and
// device, any chunking and any pipeline depth draw exactly the same numbers.
//
// One Philox call gives four 32-bit words; element i uses word i % 4 of block i / 4.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace qccl::kernels {

// Distinct keys draw independent numbers as long as rank < 2^20, stream < 2^12 and step < 2^32 (they
// share one counter word: rank in the low 20 bits, stream in the high 12, each XORed with the step's
// high word, so step 2^32 of rank 0 draws what step 0 of rank 1 draws: 4 billion calls of one state
// or communicator apart).
struct PhiloxKey {
  uint64_t seed = 0;   // from the codec spec (seed=...)
  uint64_t step = 0;   // the caller's step counter (or the collective's sequence number)
  uint32_t rank = 0;   // the rank that encodes (Marsit: the hop's contribution count)
  uint32_t stream = 0; // separates independent draws by one rank in one step (ring hops; Marsit's phases)
};

struct PhiloxBlock {
  uint32_t v[4];
};

QCCL_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// The four words of block `block` (elements 4*block .. 4*block+3).
QCCL_HD PhiloxBlock philox4x32_10(const PhiloxKey& key, uint64_t block) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = static_cast<uint32_t>(key.step), c3 = key.rank ^ (key.stream << 20) ^ static_cast<uint32_t>(key.step >> 32);
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, &hi0, &lo0);
    philox_mulhilo(kM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0, k1 += kW1;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from 32 random bits: the top 24 bits times 2^-24, so it is never 1.0
// (a float uniform that can reach 1.0 is how CGX's codes overflow at the bucket maximum).
QCCL_HD float uniform_from_bits(uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1p-24f; }

// The uniform of element i under key (one Philox call per element: device code and tests; host
// loops call philox4x32_10 once per four elements).
QCCL_HD float philox_uniform(const PhiloxKey& key, uint64_t element) {
  return uniform_from_bits(philox4x32_10(key, element >> 2).v[element & 3]);
}

}  // namespace qccl::kernels
