// Ring allgather, pipelined by fragment: at step k (0 <= k < n-1) rank r forwards block r-k to the
// next rank and receives block r-k-1 from the previous one, straight into recvbuf.
//
// Wire bytes per rank: (n-1) * sendcount * element size.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AllGatherRing final : public Plan {
 public:
  AllGatherRing(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const auto fragments_total = static_cast<uint32_t>(fragments());
    auto block = [&](int r) { return static_cast<char*>(args_.recvbuf) + (r * args_.count + pc.offset) * es; };
    const char* own = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
    for (int k = 0; k < ring_.size() - 1; ++k) {
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      const uint32_t msg = static_cast<uint32_t>(k) * fragments_total + static_cast<uint32_t>(f);
      p.recv(0, ring_.prev(), msg, block(s_recv), bytes);
      p.send(1, ring_.next(), msg, k == 0 ? own : block(s_send), bytes);
      if (k == 0) p.copy(block(ring_.position()), own, bytes);  // a no-op in place
      p.wait(0);
      p.wait(1);
    }
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

const char* allgather_ring_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_allgather_ring(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllGatherRing>(args, options);
}

}  // namespace qccl::coll
