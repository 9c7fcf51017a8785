// IntSGD's all-reduce (Mishchenko et al., ICLR 2022, Algorithm 1; ../shared/specs/intsgd.md): a
// pipelined ring reduce-scatter that adds wire integers without decoding, then a ring allgather of
// the owners' sums, which every rank decodes once: S / (n alpha) for an average, S / alpha for a sum.
//
// Per fragment (piece f of every segment), this rank first encodes its integers for every segment;
// reduce-scatter step k then sends its running sum of segment r-k-1 and receives the previous rank's
// running sum of segment r-k-2, which it adds to its own integers there. After n-1 steps it holds
// segment r's sum S over all ranks. Allgather step k forwards the sum of segment r-k and receives
// (and decodes) that of segment r-k-1.
//
// The sum is exact: every rank clips its integers so that any n of them add up inside the wire type,
// and the additions wrap (int_codec.h), so S, and the decoded values, are the same bits on every rank
// whatever the rank order, the chunk size or the pipeline depth (and equal the aggregator's).
// Each value is encoded exactly once, keyed by (seed, step, rank, element): the ranks' rounding
// errors are independent, as Lemma 1's variance bound d / (4 n alpha^2) for the average needs.
//
// The state's first round (no moving average yet) is exact instead: the float ring all-reduce of
// allreduce_ring.cc on recvbuf, whose result seeds the moving average (IntsgdRound::exact).
//
// Wire bytes per rank: b/8 * sum over k of |seg(r-k-1)| + |seg(r-k)|, 2(n-1)/n * b/8 * D when n
// divides D (b = 8, 16, 32); an exact round sends es instead of b/8 per value.
#include "collectives/algorithms.h"
#include "collectives/device_kernels.h"
#include "collectives/intsgd.h"

namespace qccl::coll {

namespace {

class AllReduceIntsgd final : public Plan {
 public:
  AllReduceIntsgd(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        // A chunk is chunk_bytes of float32 input, in both kinds of round (same fragments).
        chunk_(chunk_elements(options.chunk_bytes, sizeof(float), segments_.max_size())),
        wire_(static_cast<size_t>(args.codec->bits / 8)), steps_(args_) {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), chunk_); }
  // Integer round: a wire buffer per segment, one for the incoming running sum, and a float buffer
  // (staging for non-float32 data). The exact round uses the first chunk * es bytes.
  size_t scratch_bytes() const override {
    return static_cast<size_t>(ring_.size() + 1) * wire_stride() + chunk_ * sizeof(float);
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    if (intsgd_call(args_).round().exact) return build_intsgd_exact(args_, ring_, segments_, chunk_, fragments(), f, scratch, p);
    const int n = ring_.size();
    const float alpha = intsgd_call(args_).round().alpha;
    const auto total = static_cast<uint32_t>(fragments());
    const size_t es = args_.element_size();
    // wire(s): this rank's integers for segment s's piece, then the running sum it forwards, then
    // (allgather) the sum of segment s.
    auto wire = [&](int segment) { return scratch + static_cast<size_t>(segment) * wire_stride(); };
    std::byte* incoming = wire(n);
    auto* staging = reinterpret_cast<float*>(scratch + static_cast<size_t>(n + 1) * wire_stride());
    auto part = [&](int segment) { return piece(segments_.size(segment), chunk_, f); };
    auto at = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };
    auto bytes = [&](int segment) { return part(segment).count * wire_; };
    auto msg = [&](int step) { return static_cast<uint32_t>(step) * total + static_cast<uint32_t>(f); };

    // Every contribution is encoded before the first send, so that a NaN anywhere in the fragment
    // taints this rank's first message: the taint then reaches every rank within n - 1 hops, before
    // any of them decodes (the allgather comes after n - 1 reduce-scatter hops).
    for (int s = 0; s < n; ++s) {
      const size_t begin = at(s), count = part(s).count;
      const void* in = static_cast<const char*>(args_.sendbuf) + begin * es;
      const float* x = static_cast<const float*>(in);
      if (args_.dtype != DataType::kFloat32) p.load(staging, in, count), x = staging;
      steps_.encode(p, wire(s), x, count, begin, alpha);
    }
    for (int k = 0; k < n - 1; ++k) {  // reduce-scatter
      const int s_send = ring_.position_at(-k - 1), s_recv = ring_.position_at(-k - 2);
      p.recv(0, ring_.prev(), msg(k), incoming, bytes(s_recv));
      p.send(1, ring_.next(), msg(k), wire(s_send), bytes(s_send));
      p.wait(0);
      steps_.add(p, wire(s_recv), incoming, part(s_recv).count);
      p.wait(1);
    }
    auto decode = [&](int segment) {
      steps_.decode(p, static_cast<char*>(args_.recvbuf) + at(segment) * es, wire(segment), part(segment).count, alpha,
                   staging);
    };
    decode(ring_.position());
    for (int k = 0; k < n - 1; ++k) {  // allgather: forward the sum of segment r-k, receive r-k-1's
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      p.recv(0, ring_.prev(), msg(n - 1 + k), wire(s_recv), bytes(s_recv));
      p.send(1, ring_.next(), msg(n - 1 + k), wire(s_send), bytes(s_send));
      p.wait(0);
      decode(s_recv);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    return ring_elements() * (intsgd_call(args_).round().exact ? args_.element_size() : wire_);
  }
  uint64_t raw_wire_bytes() const override { return ring_elements() * args_.element_size(); }
  void absorb(const DeviceCounters& counters) override { steps_.absorb(counters); }

 private:
  size_t wire_stride() const { return whole_lines(chunk_ * wire_); }

  uint64_t ring_elements() const { return intsgd_ring_elements(ring_, segments_); }

  Ring ring_;
  Segments segments_;
  size_t chunk_;
  size_t wire_;  // bytes per wire integer
  IntsgdSteps steps_;
};

}  // namespace

void build_intsgd_exact(const CollArgs& args, const Ring& ring, const Segments& segments, size_t chunk,
                        size_t total, size_t f, std::byte* scratch, Program& p) {
  const int n = ring.size();
  const size_t es = args.element_size();
  const auto* in = static_cast<const char*>(args.sendbuf);
  auto* out = static_cast<char*>(args.recvbuf);
  auto part = [&](int segment) { return piece(segments.size(segment), chunk, f); };
  auto at = [&](int segment) { return (segments.begin(segment) + part(segment).offset) * es; };
  auto bytes = [&](int segment) { return part(segment).count * es; };
  auto msg = [&](int step) { return static_cast<uint32_t>(step * total + f); };
  for (int s = 0; s < n; ++s) p.copy(out + at(s), in + at(s), bytes(s));
  for (int k = 0; k < n - 1; ++k) {
    const int s_send = ring.position_at(-k - 1), s_recv = ring.position_at(-k - 2);
    p.recv(0, ring.prev(), msg(k), scratch, bytes(s_recv));
    p.send(1, ring.next(), msg(k), out + at(s_send), bytes(s_send));
    p.wait(0);
    p.reduce(out + at(s_recv), scratch, out + at(s_recv), part(s_recv).count);
    p.wait(1);
  }
  p.average(out + at(ring.position()), part(ring.position()).count);
  for (int k = 0; k < n - 1; ++k) {
    const int s_send = ring.position_at(-k), s_recv = ring.position_at(-k - 1);
    p.recv(0, ring.prev(), msg(n - 1 + k), out + at(s_recv), bytes(s_recv));
    p.send(1, ring.next(), msg(n - 1 + k), out + at(s_send), bytes(s_send));
    p.wait(0);
    p.wait(1);
  }
}

uint64_t intsgd_ring_elements(const Ring& ring, const Segments& segments) {
  uint64_t elements = 0;
  for (int k = 0; k < ring.size() - 1; ++k) elements += segments.size(ring.position_at(-k - 1)) + segments.size(ring.position_at(-k));
  return elements;
}

const char* allreduce_intsgd_cannot_run(const CollArgs& args) {
  if (!args.codec || args.codec->kind != kernels::CodecKind::kInt) return "IntSGD runs the int8, int16, int32 codecs only";
  if (args.codec->switch_aggregation) return "agg=switch runs intsgd_switch";
  if (!args.method_call) return "IntSGD needs its call (an internal error if a call gets here)";
  return nullptr;  // one rank too: its integers are encoded and decoded like everyone's
}

std::unique_ptr<Plan> make_allreduce_intsgd(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceIntsgd>(args, options);
}

}  // namespace qccl::coll
