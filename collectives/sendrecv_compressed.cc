// Compressed point-to-point, pipelined: the sender encodes its buffer chunk by chunk and sends each
// chunk's bytes as soon as they are encoded; the receiver decodes each chunk into its buffer as it
// arrives, so that the encode, the wire and the decode of consecutive chunks overlap. Chunks are cut
// at multiples of the codec's alignment (compressed_chunk), so the bits do not depend on the chunk
// size or the pipeline depth. A codec whose scales span the whole message (aq with rows=0) encodes it
// as one chunk, whose bytes then travel in messages of a chunk's bytes each (kWindow in flight, all
// of one key, matched in the order sent): one message of the whole would show no progress until it
// ended (a call slower than QCCL_TIMEOUT failed while its bytes moved) and, past the rendezvous
// threshold, hold up the peer's own traffic behind it.
//
// The receiver's buffer holds decode(encode(x)): for q codecs with nearest rounding within half a
// bucket step of x, for aq within s / 2^b of it and within s / 2^(b-1) of the values the grid's top
// level clips (kernels/aq_quant.h: s the channel's largest magnitude rounded up to fp16), for
// fp16/bf16 the cast's rounding; float16 and bfloat16 buffers round once more. The codec is
// stateless here (no error feedback): point-to-point messages are not summed, so a residual would
// have nothing to telescope into.
//
// Wire bytes: the sender's sum over chunks of E(chunk) = E(count) (chunks hold whole buckets or
// blocks); the receiver's 0.
#include <algorithm>
#include <cstdint>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"

namespace qccl::coll {

namespace {

class SendRecvCompressed final : public Plan {
 public:
  SendRecvCompressed(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        // one encoded buffer per fragment, and for float16 and bfloat16 one float buffer (the
        // sender's staging of its input; the receiver's decode before the cast): float32 is encoded
        // from and decoded into the caller's buffers
        layout_{compressed_chunk(args, options.chunk_bytes, args.count), args.dtype == DataType::kFloat32 ? 0u : 1u, 1},
        pieces_(args, layout_.chunk),
        message_bytes_(args.codec->alignment() == 0 ? std::max<size_t>(options.chunk_bytes, 1) : SIZE_MAX) {}

  size_t fragments() const override { return pieces_.size(); }
  size_t scratch_bytes() const override { return layout_.bytes(args_); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    p.use_codec(pieces_.codec(f));
    const Piece pc = pieces_[f];
    const size_t bytes = pieces_.encoded_bytes(f);
    float* floats = layout_.floats ? layout_.float_buffer(scratch, 0) : nullptr;
    std::byte* encoded = layout_.encoded_buffer(args_, scratch, 0);
    const auto msg = static_cast<uint32_t>(f);
    const bool sender = args_.kind == CollKind::kSend;
    if (sender) encode_input(args_, p, encoded, floats, pc.offset, pc.count);
    // The fragment's bytes in messages of at most message_bytes_ (one, but for a whole-run codec).
    const size_t per = std::min(bytes, message_bytes_), messages = per ? ceil_div(bytes, per) : 0;
    for (size_t i = 0; i < messages; ++i) {
      const int slot = static_cast<int>(i % kWindow);
      if (i >= kWindow) p.wait(slot);
      const size_t at = i * per, length = std::min(per, bytes - at);
      if (sender) p.send(slot, args_.peer, msg, encoded + at, length);
      else p.recv(slot, args_.peer, msg, encoded + at, length);
    }
    for (size_t slot = 0; slot < std::min(messages, kWindow); ++slot) p.wait(static_cast<int>(slot));
    if (!sender)
      p.decode_out(static_cast<char*>(args_.recvbuf) + pc.offset * args_.element_size(), encoded, pc.count, floats);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    (args_.kind == CollKind::kSend ? send_to : recv_from)->push_back(args_.peer);
  }

  uint64_t wire_bytes_sent() const override {
    return args_.kind == CollKind::kSend ? pieces_.block_encoded_bytes() : 0;
  }
  uint64_t raw_wire_bytes() const override {
    return args_.kind == CollKind::kSend ? static_cast<uint64_t>(args_.count) * args_.element_size() : 0;
  }

 private:
  static constexpr size_t kWindow = 8;  // a whole-run codec's messages in flight
  CompressedScratch layout_;
  Pieces pieces_;
  size_t message_bytes_;  // a message's most bytes: a chunk's for a whole-run codec, else no limit
};

}  // namespace

const char* sendrecv_compressed_cannot_run(const CollArgs& args) {
  if (args.kind != CollKind::kSend && args.kind != CollKind::kRecv) return "point-to-point only";
  if (!args.codec) return "compressed only (no codec given)";
  if (args.codec->variable_length()) return "fixed-length codecs only";
  return nullptr;
}

std::unique_ptr<Plan> make_sendrecv_compressed(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<SendRecvCompressed>(args, options);
}

}  // namespace qccl::coll
