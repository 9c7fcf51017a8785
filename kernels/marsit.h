// Host launchers of Marsit's sign codec (sign.h): packing the signs of w = u + c, the stochastic
// merge of a ring or torus hop, the decode, and the compensation's full-precision-round helpers.
// Thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/philox.h"

namespace qccl::kernels {

// Marsit's compensation c of one tensor, kept lazily. A sign round sets c <- w - g, but g is known
// only after the network round, and by then w = u + c has left the cache: updating c in the decode
// would read u and c again and write c, 12 of the 24 bytes per value the round moved through memory.
// Instead the pack, which reads u and c anyway, writes w in place (stored = w), and the decode records
// the round's bits and eta_s; the next pack (or a checkpoint) finishes the update. So value j is
//   c[j] = compensation_value(stored[j], words[j / 32], j % 32, eta[j / 32])   (sign.h)
// and eta 0 means nothing is pending. stored has a float per value, words and eta one per 32 values.
struct Compensation {
  float* stored = nullptr;
  uint32_t* words = nullptr;
  float* eta = nullptr;
};

// The sign round's pack for values first .. first + n - 1 of the tensor (first a multiple of 32):
// words[i / 32] bit i % 32 = (w[first + i] > 0) with w = u[i] + c[first + i], pad bits 0; then
// stored = w there, after copying the old stored values to backup (n floats; may be null) so that a
// round that fails can put them back. With c null: the signs of u alone, nothing written but words.
// Returns how many w are NaN or Inf (their bit is 0).
size_t pack_signs(const float* u, const Compensation* c, size_t first, size_t n, uint32_t* words, float* backup);

// out[w] = marsit_merge(a[w], s[w], k, key, first_word + w) for w < nwords (out may alias a or s).
void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                 const PhiloxKey& key, uint64_t first_word);

// The sign round's decode: g[i] = eta (2 bit i - 1) for n values (g may be the u of pack_signs); with
// c, the round is recorded for values first .. first + n - 1 (first a multiple of 32, so whole words):
// c's words = words, its eta = eta, and so c = w - g.
void decode_signs(const uint32_t* words, size_t n, float eta, float* g, const Compensation* c, size_t first);

// out[i] = x[i] + c[first + i] (x null: c alone) for n values from any first; out may be x. The full-
// precision round's w = u + c, and a checkpoint's c.
void add_compensation(const float* x, const Compensation& c, size_t first, size_t n, float* out);

// After a full-precision round with the (identical on every rank) average g of n values: c = 0 at
// first + i where g[i] is finite (stored becomes the pending g, so the words, which neighbouring
// values outside the range may share, stay as they are); elsewhere c is kept. Returns how many g[i]
// are NaN or Inf.
size_t reset_compensation(const float* g, const Compensation& c, size_t first, size_t n);

}  // namespace qccl::kernels
