// Ring reduce-scatter, pipelined by fragment: the first half of allreduce_ring. Block s of sendbuf
// is reduced along the ring starting at rank s+1 and ends on rank s, in the order x[s+1], ...,
// x[s]. Partials travel in scratch (recvbuf holds only this rank's block), double-buffered so that
// the partial being sent is never the one being written.
//
// Wire bytes per rank: (n-1) * recvcount * element size.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class ReduceScatterRing final : public Plan {
 public:
  ReduceScatterRing(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }
  // One received partial and two outgoing partials.
  size_t scratch_bytes() const override { return 3 * chunk_ * args_.element_size(); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const auto fragments_total = static_cast<uint32_t>(fragments());
    auto in = [&](int block) { return static_cast<const char*>(args_.sendbuf) + (block * args_.count + pc.offset) * es; };
    std::byte* received = scratch;
    std::byte* partial[2] = {scratch + chunk_ * es, scratch + 2 * chunk_ * es};
    char* out = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    const int n = ring_.size();
    for (int k = 0; k < n - 1; ++k) {
      const int s_send = ring_.position_at(-k - 1), s_recv = ring_.position_at(-k - 2);
      const uint32_t msg = static_cast<uint32_t>(k) * fragments_total + static_cast<uint32_t>(f);
      const void* outgoing = k == 0 ? static_cast<const void*>(in(s_send)) : partial[(k - 1) % 2];
      void* result = k == n - 2 ? static_cast<void*>(out) : partial[k % 2];
      p.recv(0, ring_.prev(), msg, received, bytes);
      p.send(1, ring_.next(), msg, outgoing, bytes);
      p.wait(0);
      p.reduce(result, received, in(s_recv), pc.count);
      p.wait(1);
    }
    if (args_.op == RedOp::kAvg) p.average(out, pc.count);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    ring_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    return static_cast<uint64_t>(ring_.size() - 1) * args_.count * args_.element_size();
  }

 private:
  Ring ring_;
  size_t chunk_;
};

}  // namespace

const char* reduce_scatter_ring_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_reduce_scatter_ring(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterRing>(args, options);
}

}  // namespace qccl::coll
