// Compressed point-to-point, pipelined: the sender encodes its buffer chunk by chunk and sends each
// chunk's bytes as soon as they are encoded; the receiver decodes each chunk into its buffer as it
// arrives, so that the encode, the wire and the decode of consecutive chunks overlap. Chunks are cut
// at multiples of the codec's alignment (compressed_chunk), so the bits do not depend on the chunk
// size or the pipeline depth; a codec whose scales span the whole message (aq with rows=0) sends it
// as one chunk.
//
// The receiver's buffer holds decode(encode(x)): for q codecs with nearest rounding within half a
// bucket step of x, for aq within s / 2^b of it and within s / 2^(b-1) + 2^-11 m of the values the
// grid's top level clips (kernels/aq_quant.h: s the channel's fp16 scale, m its largest magnitude),
// for fp16/bf16 the cast's rounding; float16 and bfloat16 buffers round once more. The codec is
// stateless here (no error feedback): point-to-point messages are not summed, so a residual would
// have nothing to telescope into.
//
// Wire bytes: the sender's sum over chunks of E(chunk) = E(count) (chunks hold whole buckets or
// blocks); the receiver's 0.
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
        pieces_(args, layout_.chunk) {}

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
    if (args_.kind == CollKind::kSend) {
      encode_input(args_, p, encoded, floats, pc.offset, pc.count);
      p.send(1, args_.peer, msg, encoded, bytes);
      p.wait(1);
    } else {
      p.recv(0, args_.peer, msg, encoded, bytes);
      p.wait(0);
      p.decode_out(static_cast<char*>(args_.recvbuf) + pc.offset * args_.element_size(), encoded, pc.count, floats);
    }
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
  CompressedScratch layout_;
  Pieces pieces_;
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
