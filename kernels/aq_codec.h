// The host launchers of AQ-SGD's quantizer (aq_quant.h); encode(), decode() and decode_accumulate()
// of codec.h route the aq2 .. aq8 codecs here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/codec.h"

namespace qccl::kernels {

// Encodes count values (in[0] is value `first` of the whole buffer: it keys stochastic rounding)
// into c.encoded_bytes(count) bytes. Returns the channels of blocks sent as NaN (they held NaN or
// Inf, or a magnitude beyond float16's range). Thread-safe; a thread's per-channel scratch is made
// at its first call and grown when a call has more channels, never freed.
size_t aq_encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                 uint64_t first);
// out[i] = (or +=) decoded value i. Returns how many decoded values are NaN (the values of NaN channels).
size_t aq_decode(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate);
// Makes this thread's scratch for encodes and decodes of up to count values now, so that those
// calls allocate nothing (throws std::bad_alloc here instead): for a caller that must not fail half
// way through, as a store's commit.
void aq_reserve(const CodecConfig& c, size_t count);

}  // namespace qccl::kernels
