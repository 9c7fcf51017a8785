// Compressed ring allgather, fused per pipeline chunk: every rank encodes its own block once, the
// encoded bytes travel around the ring unchanged, and every rank, the owner of a block too, decodes
// the same bytes into recvbuf, so every rank ends with identical bits (for any rank count, one
// included: a single rank still decodes its own bytes and sees the codec's rounding).
//
// Encode: rank r encodes its sendcount values (this rank's input plus, with error feedback, its
// residual, compressed.h; the residual has sendcount values). Step k (0 <= k < n-1), for chunk f:
// send the encoded block r-k to the next rank (at k = 0 this rank's own bytes) and receive block
// r-k-1 from the previous one, then decode it into recvbuf + (r-k-1) * sendcount. Chunks are cut at
// multiples of the codec's bucket (compressed_chunk), so the bits do not depend on the chunk size or
// the pipeline depth. In place (sendbuff == recvbuff + rank * sendcount): a chunk is encoded before
// its decoded values overwrite it.
//
// Error: block q of every rank's output is decode(encode(x_q (+ r_q))): with nearest rounding
// |out - x_q| <= s/2 + e per bucket, stochastic < s + e (quant.h, s the bucket's step); the casts err
// by half an ulp of their type; a float16/bfloat16 output rounds once more. With error feedback
// out - x_q = r_old - r_new, so the residual telescopes over calls.
//
// Wire bytes per rank: (n-1) * sum over chunks f of E(|chunk f|), E the codec's encoded_bytes; the
// chunks hold whole buckets, so this equals (n-1) * E(sendcount). With segments (CollArgs::segments),
// chunks are cut at segment boundaries too and exact segments travel in their datatype (Pieces).
#include "collectives/algorithms.h"
#include "collectives/compressed.h"

namespace qccl::coll {

namespace {

class AllGatherCompressedRing final : public Plan {
 public:
  AllGatherCompressedRing(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)),
        // float buffers: encode staging, decode scratch; encoded: one per rank's block
        layout_{compressed_chunk(args, options.chunk_bytes, args.count), 2, static_cast<size_t>(args.nranks)},
        pieces_(args, layout_.chunk) {}

  size_t fragments() const override { return pieces_.size(); }
  size_t scratch_bytes() const override { return layout_.bytes(args_); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    p.use_codec(pieces_.codec(f));  // the call's codec, or exact for an exact segment
    const Piece pc = pieces_[f];
    const size_t bytes = pieces_.encoded_bytes(f);
    const auto total = static_cast<uint32_t>(fragments());
    float* staging = layout_.float_buffer(scratch, 0);
    float* decoded = layout_.float_buffer(scratch, 1);
    auto encoded = [&](int block) { return layout_.encoded_buffer(args_, scratch, static_cast<size_t>(block)); };
    auto out = [&](int block) {
      return static_cast<char*>(args_.recvbuf) + (static_cast<size_t>(block) * args_.count + pc.offset) * args_.element_size();
    };
    const int own = ring_.position();

    // This rank's block, encoded once (the residual indexed within the block).
    encode_input(args_, p, encoded(own), staging, pc.offset, pc.count);
    for (int k = 0; k < ring_.size() - 1; ++k) {
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      const uint32_t msg = static_cast<uint32_t>(k) * total + static_cast<uint32_t>(f);
      p.recv(0, ring_.prev(), msg, encoded(s_recv), bytes);
      p.send(1, ring_.next(), msg, encoded(s_send), bytes);
      if (k == 0) p.decode_out(out(own), encoded(own), pc.count, decoded);
      p.wait(0);
      p.decode_out(out(s_recv), encoded(s_recv), pc.count, decoded);
      p.wait(1);
    }
    if (ring_.size() == 1) p.decode_out(out(own), encoded(own), pc.count, decoded);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    return static_cast<uint64_t>(ring_.size() - 1) * pieces_.block_encoded_bytes();
  }
  uint64_t raw_wire_bytes() const override {
    return static_cast<uint64_t>(ring_.size() - 1) * args_.count * args_.element_size();
  }

 private:
  Ring ring_;
  CompressedScratch layout_;
  Pieces pieces_;
};

}  // namespace

// Runs on any rank count (one included, see above); `local` declines compressed all-gathers.
const char* allgather_compressed_ring_cannot_run(const CollArgs& args) {
  if (!args.codec) return "compressed only (no codec given)";
  if (args.codec->kind == kernels::CodecKind::kSign) return "Marsit is an all-reduce";
  if (args.codec->kind == kernels::CodecKind::kInt) return "IntSGD's integer sums are an all-reduce in this release";
  return nullptr;
}

std::unique_ptr<Plan> make_allgather_compressed_ring(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllGatherCompressedRing>(args, options);
}

}  // namespace qccl::coll
