// Ring all-reduce: a ring reduce-scatter followed by a ring allgather (as in Gloo's
// allreduce_ring_chunked and UCC's allreduce_ring), pipelined by fragment.
//
// The buffer is cut into n segments (sizes differ by at most one, independent of the chunk size);
// fragment f is chunk f of every segment. Reduce-scatter step k (0 <= k < n-1): send the partial
// of segment r-k-1 to the next rank, receive the partial of segment r-k-2 from the previous one and
// add this rank's input to it. After n-1 steps rank r holds segment r reduced over every rank, in
// the order x[r+1], x[r+2], ..., x[r] (fixed by n alone: chunking never changes the bits). Allgather
// step k: forward segment r-k, receive segment r-k-1 straight into recvbuf. Every rank ends with the
// owner's bits, so results are identical on all ranks.
//
// Wire bytes per rank: sum over k of |seg(r-k-1)| + |seg(r-k)| elements, 2(n-1)/n * S when n
// divides the count.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AllReduceRing final : public Plan {
 public:
  AllReduceRing(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        chunk_(chunk_elements(options.chunk_bytes, args.element_size(), Segments{args.count, args.nranks}.max_size())) {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), chunk_); }
  size_t scratch_bytes() const override { return chunk_ * args_.element_size(); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Buffers buf{static_cast<const char*>(args_.sendbuf), static_cast<char*>(args_.recvbuf), es};
    const int n = ring_.size();
    const auto fragments_total = static_cast<uint32_t>(fragments());
    auto part = [&](int segment) { return piece(segments_.size(segment), chunk_, f); };
    auto at = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };

    for (int k = 0; k < n - 1; ++k) {  // reduce-scatter
      const int s_send = ring_.position_at(-k - 1), s_recv = ring_.position_at(-k - 2);
      const uint32_t msg = static_cast<uint32_t>(k) * fragments_total + static_cast<uint32_t>(f);
      const void* partial = k == 0 ? static_cast<const void*>(buf.src(at(s_send))) : buf.dst(at(s_send));
      p.recv(0, ring_.prev(), msg, scratch, part(s_recv).count * es);
      p.send(1, ring_.next(), msg, partial, part(s_send).count * es);
      p.wait(0);
      p.reduce(buf.dst(at(s_recv)), scratch, buf.src(at(s_recv)), part(s_recv).count);
      p.wait(1);
    }
    const int own = ring_.position();
    if (args_.op == RedOp::kAvg) p.average(buf.dst(at(own)), part(own).count);

    for (int k = 0; k < n - 1; ++k) {  // allgather
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      const uint32_t msg = static_cast<uint32_t>(n - 1 + k) * fragments_total + static_cast<uint32_t>(f);
      p.recv(0, ring_.prev(), msg, buf.dst(at(s_recv)), part(s_recv).count * es);
      p.send(1, ring_.next(), msg, buf.dst(at(s_send)), part(s_send).count * es);
      p.wait(0);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    uint64_t elements = 0;
    for (int k = 0; k < ring_.size() - 1; ++k)
      elements += segments_.size(ring_.position_at(-k - 1)) + segments_.size(ring_.position_at(-k));
    return elements * args_.element_size();
  }

 private:
  Ring ring_;
  Segments segments_;
  size_t chunk_;
};

}  // namespace

const char* allreduce_ring_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_allreduce_ring(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceRing>(args, options);
}

}  // namespace qccl::coll
