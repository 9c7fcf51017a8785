// IntSGD's in-network-style all-reduce (agg=switch), after SwitchML (Sapio et al., NSDI 2021;
// ../shared/specs/intsgd.md §3): aggregator processes play the programmable switch. Every rank
// streams its integer chunks to them, an aggregator adds the n contributions to a chunk in one of its
// slots and sends the sum back to every rank, and each rank decodes what comes back.
//
// Fragment f is chunk f of the whole buffer (chunk values of float32 input, as for the ring), sent to
// aggregator f mod K (transport peer nranks + f mod K) behind an 8-byte SwitchChunkHeader; the sum
// returns with the same message id. A rank has at most the pipeline depth of chunks outstanding per
// call, and starts chunk f + depth only when a sum came back: the self-clocking of SwitchML, which
// bounds the slots an aggregator needs by the ranks' windows. Because an aggregator's sum is the
// exact integer sum (int_codec.h), the result is the same bits as the ring's (allreduce_intsgd.cc)
// for the same integers.
//
// The exact first round cannot be summed by a switch that adds integers only: it runs the ring's
// exact round among the ranks (fragments past the ring's are then empty).
//
// Wire bytes per rank: (b/8) * D + 8 per chunk up, the same down: each rank moves S instead of the
// ring's 2(n-1)/n * S, which is the point on a link-bound job (1.5x fewer bytes at n = 4).
#include "collectives/algorithms.h"
#include "collectives/device_kernels.h"
#include "collectives/intsgd.h"

namespace qccl::coll {

namespace {

class AllReduceIntsgdSwitch final : public Plan {
 public:
  AllReduceIntsgdSwitch(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        chunk_(chunk_elements(options.chunk_bytes, sizeof(float), args.count)),
        ring_chunk_(chunk_elements(options.chunk_bytes, sizeof(float), segments_.max_size())),
        wire_(static_cast<size_t>(args.codec->bits / 8)), steps_(args_) {}

  // Enough fragments for either kind of round: the whole buffer's chunks, or the ring's.
  size_t fragments() const override {
    return std::max(ceil_div(args_.count, chunk_), ceil_div(segments_.max_size(), ring_chunk_));
  }
  // Outgoing and incoming chunk (header included), and a float buffer for non-float32 data.
  size_t scratch_bytes() const override { return 2 * message_stride() + chunk_ * sizeof(float); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    if (intsgd_call(args_).round().exact) {
      if (f < ceil_div(segments_.max_size(), ring_chunk_))
        build_intsgd_exact(args_, ring_, segments_, ring_chunk_, fragments(), f, scratch, p);
      return;
    }
    const Piece part = piece(args_.count, chunk_, f);
    if (part.count == 0) return;
    const float alpha = intsgd_call(args_).round().alpha;
    const size_t es = args_.element_size();
    const int aggregator = args_.nranks + static_cast<int>(f % static_cast<size_t>(args_.aggregators));
    std::byte* outgoing = scratch;
    std::byte* incoming = scratch + message_stride();
    auto* staging = reinterpret_cast<float*>(scratch + 2 * message_stride());
    const void* in = static_cast<const char*>(args_.sendbuf) + part.offset * es;
    const float* x = static_cast<const float*>(in);
    if (args_.dtype != DataType::kFloat32) p.load(staging, in, part.count), x = staging;
    steps_.chunk_header(p, outgoing, part.count);
    steps_.encode(p, outgoing + SwitchChunkHeader::kBytes, x, part.count, part.offset, alpha);
    const size_t bytes = SwitchChunkHeader::kBytes + part.count * wire_;
    p.recv(0, aggregator, static_cast<uint32_t>(f), incoming, bytes);
    p.send(1, aggregator, static_cast<uint32_t>(f), outgoing, bytes);
    p.wait(0);
    steps_.decode(p, static_cast<char*>(args_.recvbuf) + part.offset * es, incoming + SwitchChunkHeader::kBytes,
                 part.count, alpha, staging);
    p.wait(1);
  }

  // The ring's links: the exact round uses them, and every call announces its frame header on them,
  // so that ranks that disagree (count, codec, step, alpha) fail before the aggregators add garbage.
  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    if (intsgd_call(args_).round().exact) return intsgd_ring_elements(ring_, segments_) * args_.element_size();
    return args_.count * wire_ + ceil_div(args_.count, chunk_) * SwitchChunkHeader::kBytes;
  }
  uint64_t raw_wire_bytes() const override { return intsgd_ring_elements(ring_, segments_) * args_.element_size(); }
  bool uses_aggregators() const override { return true; }
  void absorb(const DeviceCounters& counters) override { steps_.absorb(counters); }

 private:
  size_t message_stride() const {
    const size_t ring_bytes = ring_chunk_ * args_.element_size();  // the exact round's scratch
    return whole_lines(std::max(SwitchChunkHeader::kBytes + chunk_ * wire_, ring_bytes));
  }

  Ring ring_;
  Segments segments_;
  size_t chunk_;       // values per chunk sent to an aggregator
  size_t ring_chunk_;  // values per segment piece in the exact round
  size_t wire_;
  IntsgdSteps steps_;
};

}  // namespace

const char* allreduce_intsgd_switch_cannot_run(const CollArgs& args) {
  if (!args.codec || args.codec->kind != kernels::CodecKind::kInt || !args.codec->switch_aggregation)
    return "the int codecs with agg=switch only";
  if (!args.method_call) return "IntSGD needs its call (an internal error if a call gets here)";
  if (args.aggregators < 1) return "no aggregator processes (QCCL_AGGREGATORS; qcclrun --aggregators K)";
  return nullptr;
}

std::unique_ptr<Plan> make_allreduce_intsgd_switch(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceIntsgdSwitch>(args, options);
}

}  // namespace qccl::coll
