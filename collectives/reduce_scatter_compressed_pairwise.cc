// Compressed pairwise reduce-scatter, fused per pipeline chunk: the scatter-reduce half of
// allreduce_sra_compressed.cc. Every contribution is encoded exactly once and sent straight to the
// owner of its block, so the error does not compound along a ring.
//
// In n-1 pairwise steps (k = 1 .. n-1) rank r encodes its input for block r+k (plus, with error
// feedback, its residual there: the residual covers the whole input, recvcount * n values, and the
// part of this rank's own block is never used) and sends it to rank r+k, and receives the encoded
// contribution of rank r-k to block r. The owner then adds the decoded contributions to its own,
// unencoded input in a fixed order, its own input first and then the others in rank order (never in
// arrival order, so the bits do not depend on timing, the chunk size or the pipeline depth), divides
// by n for an average, and writes its block. Chunks are cut at multiples of the codec's bucket.
//
// Error with nearest rounding, for each element of block r:
//   |out - exact| <= sum over the n-1 contributions q != r of (s_q / 2 + e_q) + float32 rounding
//                    + the output's rounding,
// s_q the step of the bucket of q's contribution that holds the element and e_q quant.h's float32
// term (stochastic rounding: s_q instead of s_q / 2, and unbiased); the float32 rounding is that of
// the n-1 additions (and of the division by n for an average, which also divides the bound). The
// casts fp16/bf16 err by half an ulp of each contribution instead. Error feedback: each
// contribution is x + r_old - r_new, so the residuals telescope over calls.
//
// Datatype: float32, float16 or bfloat16. Inputs are read into float32, the owner sums in float32,
// and a Store step writes the block in the call's datatype, rounded to nearest even once: half an ulp
// of the result (none for float32). NaN or Inf in a contribution or in the owner's own input reaches
// the output as NaN or Inf (never finite values), and the Store counts the non-finite values it
// writes (float16's overflow to Inf too), so that rank's call reports qcclNonFinite.
//
// Wire bytes per rank: (n-1) * sum over chunks f of E(|chunk f|) = (n-1) * E(recvcount), E the
// codec's encoded_bytes (every chunk holds whole buckets). With segments (CollArgs::segments), chunks
// are cut at segment boundaries too and exact segments travel in their datatype (Pieces).
#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "kernels/convert.h"

namespace qccl::coll {

namespace {

class ReduceScatterCompressedPairwise final : public Plan {
 public:
  ReduceScatterCompressedPairwise(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)),
        // float buffers: accumulator, encode staging; encoded: 2 outgoing, one received per rank
        layout_{compressed_chunk(args, options.chunk_bytes, args.count), 2, 2 + static_cast<size_t>(args.nranks)},
        pieces_(args, layout_.chunk) {}

  size_t fragments() const override { return pieces_.size(); }
  size_t scratch_bytes() const override { return layout_.bytes(args_); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int n = ring_.size(), own = ring_.position();
    p.use_codec(pieces_.codec(f));  // the call's codec, or exact for an exact segment
    const Piece pc = pieces_[f];
    const size_t bytes = pieces_.encoded_bytes(f);
    const auto total = static_cast<uint32_t>(fragments());
    float* acc = layout_.float_buffer(scratch, 0);
    float* staging = layout_.float_buffer(scratch, 1);
    std::byte* outgoing[2] = {layout_.encoded_buffer(args_, scratch, 0), layout_.encoded_buffer(args_, scratch, 1)};
    auto received = [&](int q) { return layout_.encoded_buffer(args_, scratch, 2 + static_cast<size_t>(q)); };
    // Element index of chunk f of block b in the whole input (it keys the rounding and the residual).
    auto begin = [&](int block) { return static_cast<size_t>(block) * args_.count + pc.offset; };

    // Each contribution encoded once and sent straight to its block's owner.
    for (int k = 1; k < n; ++k) {
      const int to = ring_.position_at(k), from = ring_.position_at(-k);
      std::byte* buffer = outgoing[k % 2];
      if (k >= 3) p.wait(1 + k % 2);  // the send that last used this buffer
      encode_input(args_, p, buffer, staging, begin(to), pc.count);
      p.recv(0, ring_.member(from), static_cast<uint32_t>(k - 1) * total + static_cast<uint32_t>(f), received(from), bytes);
      p.send(1 + k % 2, ring_.member(to), static_cast<uint32_t>(k - 1) * total + static_cast<uint32_t>(f), buffer, bytes);
      p.wait(0);
    }
    p.wait(1);
    p.wait(2);
    // The owner's sum: its own input (never encoded), then the others' contributions in rank order.
    p.load(acc, static_cast<const char*>(args_.sendbuf) + begin(own) * args_.element_size(), pc.count);
    for (int q = 0; q < n; ++q)
      if (q != own) p.decode_add(acc, received(q), pc.count);
    if (args_.op == RedOp::kAvg) p.divide(acc, pc.count);
    // Written in the call's datatype; the executor counts the non-finite values of the block.
    p.store(static_cast<char*>(args_.recvbuf) + pc.offset * args_.element_size(), acc, pc.count);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int k = 1; k < ring_.size(); ++k) {
      send_to->push_back(ring_.at(k));
      recv_from->push_back(ring_.at(-k));
    }
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

const char* reduce_scatter_compressed_pairwise_cannot_run(const CollArgs& args) {
  if (!args.codec) return "compressed only (no codec given)";
  if (args.codec->kind == kernels::CodecKind::kSign) return "Marsit is an all-reduce";
  if (args.codec->kind == kernels::CodecKind::kInt) return "IntSGD's integer sums are an all-reduce in this release";
  if (!kernels::codec_input_type(args.dtype)) return "float32, float16 or bfloat16 only";
  return needs_two_ranks(args);
}

std::unique_ptr<Plan> make_reduce_scatter_compressed_pairwise(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterCompressedPairwise>(args, options);
}

}  // namespace qccl::coll
