// What the compressed all-reduce algorithms share: chunk alignment, per-fragment scratch layout, the
// error-feedback bookkeeping, and the allgather of the owners' encoded segments.
//
// Error feedback (per rank, per element): before encoding, the accumulator gets this rank's input
// plus its residual, acc = base + x + r, where base is what it received (0 on the first hop); after
// encoding E = encode(acc), the residual becomes r <- acc - decode(E). This rank's contribution to the
// sum, decode(E) - base, therefore equals x + r_old - r_new, so over steps the inputs minus the
// contributions telescope to the final residual. When the owner divides by n for an average before
// its final encode, the residual is scaled back by n (it re-enters the sum undivided).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/method.h"
#include "collectives/plan.h"
#include "collectives/ring.h"

namespace qccl::coll {

// A call of the value-codec method (none, fp16, bf16, q1-q8; collectives/quantized_method.cc): the
// error-feedback residual of its state, or null without error feedback.
struct QuantizedCall final : MethodCall {
  float* residual = nullptr;
  void use_device_arrays(const std::vector<void*>& arrays) override {
    if (residual && !arrays.empty()) residual = static_cast<float*>(arrays[0]);
  }
};

// The residual of a call of this method (null without error feedback).
inline float* residual_of(const CollArgs& args) {
  return args.method_call ? static_cast<const QuantizedCall*>(args.method_call)->residual : nullptr;
}

// Elements per chunk for a compressed plan: a multiple of the codec's alignment (its bucket), so that
// chunk boundaries never split a bucket and the bits do not depend on the chunk size; the whole run
// for a codec that must not be cut (alignment 0). A chunk is chunk_bytes of input, or more where that
// would encode to fewer than min_message_bytes (a codec's encoding under an eighth of its input: q1-q3
// on float32), but only where every message carries the call's codec: a plan that also sends values
// as they are (`raw_messages`: the members' inputs inside a node) or a call with an exact segment keeps
// chunk_bytes of input, so that the chunk still bounds those messages and the scratch they take.
inline size_t compressed_chunk(const CollArgs& args, size_t chunk_bytes, size_t run, bool raw_messages = false) {
  const size_t align = args.codec->alignment();
  if (align == 0) return std::max<size_t>(run, 1);
  size_t chunk = std::max<size_t>(align, chunk_bytes / args.element_size() / align * align);
  const bool exact = args.segments && std::any_of(args.segments->begin(), args.segments->end(),
                                                  [](const Segment& s) { return s.exact; });
  const size_t least = raw_messages || exact ? 0 : min_message_bytes(chunk_bytes);
  if (const size_t encoded = args.codec->encoded_bytes(chunk); encoded < least) {
    // Grow in proportion (encoded bytes are about linear in the count), then bucket by bucket to the
    // first count that reaches it.
    chunk = std::max(chunk, chunk * least / encoded / align * align);
    while (args.codec->encoded_bytes(chunk) < least) chunk += align;
  }
  const size_t run_aligned = (run + align - 1) / align * align;
  return std::max<size_t>(align, std::min(chunk, run_aligned));
}

// The encoded bytes of `count` values cut into chunks of `chunk` values, each encoded on its own.
inline uint64_t chunked_encoded_bytes(const kernels::CodecConfig& codec, size_t count, size_t chunk) {
  uint64_t bytes = 0;
  for (size_t f = 0; f * chunk < count; ++f) bytes += codec.encoded_bytes(piece(count, chunk, f).count);
  return bytes;
}

// The codec of a call's exact segments: its datatype as is (kernels' none, fp16, bf16 codecs, which
// decode a float32, float16 or bfloat16 input bit for bit).
inline const kernels::CodecConfig* exact_codec(DataType dtype) {
  static const kernels::CodecConfig none = kernels::parse_codec_spec("none"), fp16 = kernels::parse_codec_spec("fp16"),
                                    bf16 = kernels::parse_codec_spec("bf16");
  return dtype == DataType::kFloat16 ? &fp16 : dtype == DataType::kBfloat16 ? &bf16 : &none;
}

// The most bytes a chunk of `chunk` values encodes to, whichever codec its segment uses (an exact
// segment of sums takes float32's 4 bytes per value, whatever the datatype: see Pieces).
inline size_t max_encoded_bytes(const CollArgs& args, size_t chunk, bool sums = false) {
  const size_t coded = args.codec->encoded_bytes(chunk);
  if (!args.segments) return coded;
  return std::max(coded, (sums ? exact_codec(DataType::kFloat32) : exact_codec(args.dtype))->encoded_bytes(chunk));
}

// The fragments of a compressed plan over one block of args.count values: chunks of at most `chunk`
// values (a multiple of the codec's bucket), cut at every segment boundary (CollArgs::segments) and
// counted from the segment's start, so that a segment's bits depend on its own values only (QSDP's
// per-layer buckets; shared/specs/qsdp.md §4 P12) and never on the chunk size. Without segments, the
// block is one segment and the pieces are piece(count, chunk, f). Each piece has the codec of its
// segment: the call's, or for an exact segment exact_codec() of the datatype, or float32 where the
// plan encodes `sums` (a node's float32 sum is no longer representable in float16 or bfloat16).
class Pieces {
 public:
  Pieces(const CollArgs& args, size_t chunk, bool sums = false) {
    const std::vector<Segment> whole = {Segment{0, args.count, false}};
    const kernels::CodecConfig* exact = exact_codec(sums ? DataType::kFloat32 : args.dtype);
    for (const Segment& s : args.segments ? *args.segments : whole)
      for (size_t at = 0; at < s.count; at += chunk) {
        pieces_.push_back(Piece{s.offset + at, std::min(chunk, s.count - at)});
        codecs_.push_back(s.exact ? exact : args.codec);
      }
  }
  size_t size() const { return pieces_.size(); }
  const Piece& operator[](size_t f) const { return pieces_[f]; }
  const kernels::CodecConfig* codec(size_t f) const { return codecs_[f]; }
  size_t encoded_bytes(size_t f) const { return codecs_[f]->encoded_bytes(pieces_[f].count); }
  // What the whole block encodes to, piece by piece (what a plan's wire bytes count per block).
  uint64_t block_encoded_bytes() const {
    uint64_t bytes = 0;
    for (size_t f = 0; f < size(); ++f) bytes += encoded_bytes(f);
    return bytes;
  }

 private:
  std::vector<Piece> pieces_;
  std::vector<const kernels::CodecConfig*> codecs_;
};

// A fragment's scratch: `floats` float32 buffers of `chunk` values, then `encoded` buffers of
// max_encoded_bytes(chunk) bytes (each rounded up to 64 bytes), which a plan may follow with buffers
// of its own from bytes() on.
struct CompressedScratch {
  size_t chunk;
  size_t floats;
  size_t encoded;
  size_t encoded_stride(const CollArgs& args) const { return whole_lines(max_encoded_bytes(args, chunk)); }
  size_t floats_bytes() const { return whole_lines(floats * chunk * sizeof(float)); }
  size_t bytes(const CollArgs& args) const { return floats_bytes() + encoded * encoded_stride(args); }
  float* float_buffer(std::byte* scratch, size_t i) const { return reinterpret_cast<float*>(scratch) + i * chunk; }
  std::byte* encoded_buffer(const CollArgs& args, std::byte* scratch, size_t i) const {
    return scratch + floats_bytes() + i * encoded_stride(args);
  }
};

// acc = this rank's input for [begin, begin + count) plus, with error feedback, its residual there.
inline void load_contribution(const CollArgs& args, Program& p, float* acc, size_t begin, size_t count) {
  p.load(acc, static_cast<const char*>(args.sendbuf) + begin * args.element_size(), count);
  if (float* residual = residual_of(args)) p.add_float(acc, residual + begin, count);
}

// encoded = encode(acc) for [begin, begin + count), and the residual update of error feedback.
inline void encode_contribution(const CollArgs& args, Program& p, void* encoded, const float* acc, size_t begin,
                                size_t count, float residual_scale = 1.0f) {
  p.encode(encoded, acc, count, begin, 0);
  if (float* residual = residual_of(args)) p.error_feedback(residual + begin, acc, encoded, count, residual_scale);
}

// encoded = encode(this rank's input for [begin, begin + count)), staged through `staging` only when
// it must be: float32 input without error feedback is encoded straight from the user's buffer.
inline void encode_input(const CollArgs& args, Program& p, void* encoded, float* staging, size_t begin, size_t count) {
  if (args.dtype == DataType::kFloat32 && !residual_of(args)) {
    p.encode(encoded, static_cast<const float*>(args.sendbuf) + begin, count, begin, 0);
    return;
  }
  load_contribution(args, p, staging, begin, count);
  encode_contribution(args, p, encoded, staging, begin, count);
}

// The owner's final encode of its reduced segment (divided by n first for an average).
inline void encode_owned(const CollArgs& args, Program& p, void* encoded, float* acc, size_t begin, size_t count) {
  const bool avg = args.op == RedOp::kAvg;
  if (avg) p.divide(acc, count);
  encode_contribution(args, p, encoded, acc, begin, count, avg ? static_cast<float>(args.nranks) : 1.0f);
}

}  // namespace qccl::coll
