// AQ-SGD's delta messages (Wang et al., NeurIPS 2022, Algorithm 1; shared/specs/aqsgd.md §2.3-2.4):
// for a sample seen before, the sender sends Q(x - m), m the last message of that sample that both
// ends keep, and both ends add the decoded delta to their m. The two copies of m stay bit-equal after
// every message because both ends compute the same thing from the same bytes: m' = round_t(float(m) +
// decode(payload)), one float32 addition (decode_accumulate's) and one rounding to the store's type t
// (float16, the reference's; bfloat16; float32); the sender never adds its true x. Stochastic
// rounding is the sender's alone (the receiver draws nothing).
//
// A call whose payload decodes to NaN somewhere (x - m held NaN or Inf, or a channel's delta beyond
// float16's 65504) changes neither m: both ends see the same NaN scales in the same bytes, so both
// leave the sample's m as it was and report the count; the caller decides what follows (a full
// send, an error). The CUDA twins (aq_delta_send_cuda, aq_delta_receive_cuda in codec_cuda.h) give
// the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/codec.h"
#include "kernels/types.h"

namespace qccl::kernels {

// The host functions are fused (kernels/aq_codec.cc): the sender reads x and m twice (the channels'
// scales, then the codes and the new m, tile by tile) and writes the codes and m once; the receiver
// reads the codes and m once and writes x_out and m. Per-channel scratch is a thread's, grown with
// the channels and never freed.
//
// c is an aq codec (aq2 .. aq8: the functions read its layout only).
//
// Sender: out = encode(c, x - float(m)) (c.encoded_bytes(n) bytes; c an aq codec), then, unless the
// payload decodes to NaN somewhere, m = round_t(float(m) + decode(out)). x[0] is value `first` of the
// message (it keys stochastic rounding). m holds n values of type t. Returns the channels sent as NaN
// (0: m was updated).
size_t aq_delta_send(const CodecConfig& c, const float* x, size_t n, DataType t, void* m, void* out,
                     const PhiloxKey& key, uint64_t first);
// Receiver: x_out = float(m) + decode(in), then, unless that holds NaN, m = round_t(x_out). Returns
// how many values of x_out are NaN (0: m was updated).
size_t aq_delta_receive(const CodecConfig& c, const void* in, size_t n, DataType t, void* m, float* x_out);

// The same over a run of rows that need not lie together (a store's rows, one per sample key): value
// v of the run is value v % row of row v / row. Row d's m is read from m[d] and its new m written to
// m_out[d] (which may be m[d]); the sender reads x[d], the receiver writes x_out[d]. The bits are
// those of aq_delta_send and aq_delta_receive on the rows laid end to end.
struct AqDeltaRows {
  size_t rows = 0;               // rows in the run
  size_t row = 0;                // values per row
  DataType t = DataType::kFloat16;  // m's type
  const void* const* m = nullptr;
  void* const* m_out = nullptr;
};
// Returns the channels sent as NaN; m_out is written only when there are none.
size_t aq_delta_send_rows(const CodecConfig& c, const float* const* x, const AqDeltaRows& rows, void* out,
                          const PhiloxKey& key, uint64_t first);
// Returns how many values decode to NaN; x_out and m_out are written only when none do.
size_t aq_delta_receive_rows(const CodecConfig& c, const void* in, const AqDeltaRows& rows, float* const* x_out);

}  // namespace qccl::kernels
