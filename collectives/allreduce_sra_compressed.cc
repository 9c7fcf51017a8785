// Compressed scatter-reduce-allgather (CGX's SRA, qsdp.md §2.2 option A), fused per pipeline chunk:
// every contribution is encoded exactly once, so the error does not compound along a ring.
//
// Scatter-reduce: in n-1 pairwise steps (k = 1 .. n-1) rank r encodes its input for segment r+k and
// sends it to that segment's owner, and receives the encoded contribution of rank r-k to segment r.
// The owner then adds the decoded contributions to its own input in rank order (not arrival order, so
// the bits do not depend on timing), encodes the sum once, and sends those bytes to every rank in n-1
// more pairwise steps. Every rank, the owner included, decodes the owner's bytes: identical bits.
//
// Error with nearest rounding: |result - exact| <= sum over the n-1 contributions of s_q / 2, plus
// s_owner / 2 for the owner's encode (+ float32 rounding), s the bucket steps (quant.h).
//
// Wire bytes per rank: (n-1) * E(|seg(r+k)|) summed over k, plus (n-1) * E(|seg(r)|).
#include "collectives/algorithms.h"
#include "collectives/compressed.h"

namespace qccl::coll {

namespace {

class AllReduceSraCompressed final : public Plan {
 public:
  AllReduceSraCompressed(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        // float buffers: accumulator, encode staging, decode scratch; encoded: 2 outgoing, one per rank
        layout_{compressed_chunk(args, options.chunk_bytes, segments_.max_size()), 3,
                2 + static_cast<size_t>(args.nranks)} {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), layout_.chunk); }
  size_t scratch_bytes() const override { return layout_.bytes(args_); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const kernels::CodecConfig& codec = *args_.codec;
    const int n = ring_.size(), own = ring_.position();
    const auto total = static_cast<uint32_t>(fragments());
    float* acc = layout_.float_buffer(scratch, 0);
    float* staging = layout_.float_buffer(scratch, 1);
    float* decoded = layout_.float_buffer(scratch, 2);
    std::byte* outgoing[2] = {layout_.encoded_buffer(args_, scratch, 0), layout_.encoded_buffer(args_, scratch, 1)};
    // received[q]: rank q's contribution to this rank's segment, then (allgather) rank q's segment.
    auto received = [&](int q) { return layout_.encoded_buffer(args_, scratch, 2 + static_cast<size_t>(q)); };
    auto part = [&](int segment) { return piece(segments_.size(segment), layout_.chunk, f); };
    auto begin = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };
    auto bytes = [&](int segment) { return codec.encoded_bytes(part(segment).count); };
    auto msg = [&](int step) { return static_cast<uint32_t>(step) * total + static_cast<uint32_t>(f); };
    char* out = static_cast<char*>(args_.recvbuf);

    // Scatter-reduce: each contribution encoded once, sent straight to its owner.
    for (int k = 1; k < n; ++k) {
      const int to = ring_.position_at(k), from = ring_.position_at(-k);
      std::byte* buffer = outgoing[k % 2];
      if (k >= 3) p.wait(1 + k % 2);  // the send that last used this buffer
      encode_input(args_, p, buffer, staging, begin(to), part(to).count);
      p.recv(0, ring_.member(from), msg(k - 1), received(from), bytes(own));
      p.send(1 + k % 2, ring_.member(to), msg(k - 1), buffer, bytes(to));
      p.wait(0);
    }
    p.wait(1);
    p.wait(2);
    load_contribution(args_, p, acc, begin(own), part(own).count);
    for (int q = 0; q < n; ++q)
      if (q != own) p.decode_add(acc, received(q), part(own).count);
    encode_owned(args_, p, received(own), acc, begin(own), part(own).count);

    // Allgather of the owners' bytes.
    p.decode_out(out + begin(own) * args_.element_size(), received(own), part(own).count, decoded);
    for (int k = 1; k < n; ++k) {
      const int to = ring_.position_at(k), from = ring_.position_at(-k);
      p.recv(0, ring_.member(from), msg(n - 2 + k), received(from), bytes(from));
      p.send(1, ring_.member(to), msg(n - 2 + k), received(own), bytes(own));
      p.wait(0);
      p.decode_out(out + begin(from) * args_.element_size(), received(from), part(from).count, decoded);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int k = 1; k < ring_.size(); ++k) {
      send_to->push_back(ring_.at(k));
      recv_from->push_back(ring_.at(-k));
    }
  }

  uint64_t wire_bytes_sent() const override { return sra_bytes([this](size_t n) { return args_.codec->encoded_bytes(n); }); }
  uint64_t raw_wire_bytes() const override { return sra_bytes([this](size_t n) { return n * args_.element_size(); }); }

 private:
  template <class Bytes>
  uint64_t sra_bytes(Bytes size) const {
    uint64_t total = 0;
    for (int k = 1; k < ring_.size(); ++k)
      total += size(segments_.size(ring_.position_at(k))) + size(segments_.size(ring_.position()));
    return total;
  }

  Ring ring_;
  Segments segments_;
  CompressedScratch layout_;
};

}  // namespace

const char* allreduce_sra_compressed_cannot_run(const CollArgs& args) { return value_codec_with_two_ranks(args); }

std::unique_ptr<Plan> make_allreduce_sra_compressed(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceSraCompressed>(args, options);
}

}  // namespace qccl::coll
