#include "kernels/marsit.h"

#include <algorithm>
#include <cmath>

#include "kernels/sign.h"

namespace qccl::kernels {

size_t pack_signs(const float* u, const float* c, size_t n, uint32_t* words) {
  size_t nonfinite = 0;
  for (size_t w0 = 0; w0 < n; w0 += 32) {
    const size_t len = std::min<size_t>(32, n - w0);
    uint32_t word = 0;
    for (size_t b = 0; b < len; ++b) {
      const float x = c ? u[w0 + b] + c[w0 + b] : u[w0 + b];
      word |= sign_bit(x) << b;
      nonfinite += std::isfinite(x) ? 0 : 1;
    }
    words[w0 / 32] = word;
  }
  return nonfinite;
}

void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                 const PhiloxKey& key, uint64_t first_word) {
  for (size_t w = 0; w < nwords; ++w) out[w] = marsit_merge(a[w], s[w], k, key, first_word + w);
}

void decode_signs(const uint32_t* words, size_t n, float eta, float* g, float* c, const float* u) {
  for (size_t j = 0; j < n; ++j) {
    const float v = sign_value(words[j / 32], static_cast<unsigned>(j % 32), eta);
    if (c) c[j] += u[j] - v;  // u before g: they may be one buffer (an in-place all-reduce)
    g[j] = v;
  }
}

}  // namespace qccl::kernels
