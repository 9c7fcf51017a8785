// Host launchers of Marsit's sign codec (sign.h): packing the signs of u + c, the stochastic merge of
// a ring or torus hop, and the decode that also updates the compensation. Thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/philox.h"

namespace qccl::kernels {

// words[j / 32] bit j % 32 = (u[j] + c[j] > 0), for j < n (c may be null: u alone); pad bits are 0.
// Returns how many u[j] + c[j] are NaN or Inf (their bit is 0).
size_t pack_signs(const float* u, const float* c, size_t n, uint32_t* words);

// out[w] = marsit_merge(a[w], s[w], k, key, first_word + w) for w < nwords (out may alias a or s).
void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                 const PhiloxKey& key, uint64_t first_word);

// g[j] = eta * (2 * bit j - 1); with c and u: c[j] += u[j] - g[j] (Marsit Alg. 1 line 10, with
// w = u + c). n values; g may be u (in place), not c.
void decode_signs(const uint32_t* words, size_t n, float eta, float* g, float* c, const float* u);

}  // namespace qccl::kernels
