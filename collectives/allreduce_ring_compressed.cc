// Compressed ring all-reduce with per-hop re-encoding, fused per pipeline chunk (the ring of CGX and
// of qsdp.md §2.2 option B): the ring of allreduce_ring.cc, where every hop carries encoded bytes.
//
// Reduce-scatter step k (0 <= k < n-1), for chunk f of segments s_send = r-k-1 and s_recv = r-k-2:
// send the encoded partial of s_send (at k = 0, this rank's own input, encoded); receive the encoded
// partial of s_recv, decode it into a float32 accumulator holding this rank's input, and re-encode the
// sum for the next hop. After n-1 steps rank r holds segment r reduced over every rank; it encodes it
// once more (the owner's encoding), and the allgather forwards those bytes unchanged around the ring.
// Every rank, the owner included, decodes the owner's bytes, so every rank ends with identical bits.
//
// Error: each hop adds the rounding of one encode of a partial sum whose range grows along the ring;
// with nearest rounding |result - exact| <= sum over the n encodes of s_h / 2 (+ float32 rounding),
// s_h the bucket step of hop h's encode (quant.h). Stochastic rounding keeps every hop unbiased.
//
// Wire bytes per rank: sum over k of E(|seg(r-k-1)|) + E(|seg(r-k)|), E the codec's encoded size.
#include "collectives/algorithms.h"
#include "collectives/compressed.h"

namespace qccl::coll {

namespace {

class AllReduceRingCompressed final : public Plan {
 public:
  AllReduceRingCompressed(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        // float buffers: accumulator, decode scratch; encoded: 2 outgoing partials, 1 incoming, n owners
        layout_{compressed_chunk(args, options.chunk_bytes, segments_.max_size()), 2,
                static_cast<size_t>(args.nranks) + 3} {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), layout_.chunk); }
  size_t scratch_bytes() const override { return layout_.bytes(args_); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const kernels::CodecConfig& codec = *args_.codec;
    const int n = ring_.size();
    const auto total = static_cast<uint32_t>(fragments());
    float* acc = layout_.float_buffer(scratch, 0);
    float* decoded = layout_.float_buffer(scratch, 1);
    std::byte* outgoing[2] = {layout_.encoded_buffer(args_, scratch, 0), layout_.encoded_buffer(args_, scratch, 1)};
    std::byte* incoming = layout_.encoded_buffer(args_, scratch, 2);
    auto owned = [&](int segment) { return layout_.encoded_buffer(args_, scratch, 3 + static_cast<size_t>(segment)); };
    auto part = [&](int segment) { return piece(segments_.size(segment), layout_.chunk, f); };
    auto begin = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };
    auto bytes = [&](int segment) { return codec.encoded_bytes(part(segment).count); };
    auto msg = [&](int step) { return static_cast<uint32_t>(step) * total + static_cast<uint32_t>(f); };
    char* out = static_cast<char*>(args_.recvbuf);

    // Reduce-scatter with re-encoding at every hop.
    const int own = ring_.position();
    const int first = ring_.position_at(-1);
    encode_input(args_, p, outgoing[0], acc, begin(first), part(first).count);
    for (int k = 0; k < n - 1; ++k) {
      const int s_send = ring_.position_at(-k - 1), s_recv = ring_.position_at(-k - 2);
      p.recv(0, ring_.prev(), msg(k), incoming, bytes(s_recv));
      p.send(1, ring_.next(), msg(k), outgoing[k % 2], bytes(s_send));
      p.wait(0);
      load_contribution(args_, p, acc, begin(s_recv), part(s_recv).count);
      p.decode_add(acc, incoming, part(s_recv).count);
      if (s_recv == own) encode_owned(args_, p, owned(own), acc, begin(own), part(own).count);
      else encode_contribution(args_, p, outgoing[(k + 1) % 2], acc, begin(s_recv), part(s_recv).count);
      p.wait(1);
    }
    // Allgather of the owners' bytes; every rank decodes them, its own included.
    p.decode_out(out + begin(own) * args_.element_size(), owned(own), part(own).count, decoded);
    for (int k = 0; k < n - 1; ++k) {
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      p.recv(0, ring_.prev(), msg(n - 1 + k), owned(s_recv), bytes(s_recv));
      p.send(1, ring_.next(), msg(n - 1 + k), owned(s_send), bytes(s_send));
      p.wait(0);
      p.decode_out(out + begin(s_recv) * args_.element_size(), owned(s_recv), part(s_recv).count, decoded);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override { return ring_bytes([this](size_t n) { return args_.codec->encoded_bytes(n); }); }
  uint64_t raw_wire_bytes() const override { return ring_bytes([this](size_t n) { return n * args_.element_size(); }); }

 private:
  // Chunks are bucket multiples, so a segment's encoded pieces add up to the encoding of the whole.
  template <class Bytes>
  uint64_t ring_bytes(Bytes size) const {
    uint64_t total = 0;
    for (int k = 0; k < ring_.size() - 1; ++k)
      total += size(segments_.size(ring_.position_at(-k - 1))) + size(segments_.size(ring_.position_at(-k)));
    return total;
  }

  Ring ring_;
  Segments segments_;
  CompressedScratch layout_;
};

}  // namespace

const char* allreduce_ring_compressed_cannot_run(const CollArgs& args) { return value_codec_with_two_ranks(args); }

std::unique_ptr<Plan> make_allreduce_ring_compressed(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceRingCompressed>(args, options);
}

}  // namespace qccl::coll
