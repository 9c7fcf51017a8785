// Pairwise-exchange all-to-all, pipelined by fragment: at step k (1 <= k < n) rank r sends block
// r+k of sendbuf to rank r+k and receives block r-k from rank r-k, so every rank talks to one peer
// at a time and no link is oversubscribed.
//
// Wire bytes per rank: (n-1) * count * element size.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AlltoAllPairwise final : public Plan {
 public:
  AlltoAllPairwise(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const auto fragments_total = static_cast<uint32_t>(fragments());
    auto in = [&](int r) { return static_cast<const char*>(args_.sendbuf) + (r * args_.count + pc.offset) * es; };
    auto out = [&](int r) { return static_cast<char*>(args_.recvbuf) + (r * args_.count + pc.offset) * es; };
    p.copy(out(ring_.position()), in(ring_.position()), bytes);
    for (int k = 1; k < ring_.size(); ++k) {
      const int to = ring_.position_at(k), from = ring_.position_at(-k);
      const uint32_t msg = static_cast<uint32_t>(k - 1) * fragments_total + static_cast<uint32_t>(f);
      p.recv(0, ring_.member(from), msg, out(from), bytes);
      p.send(1, ring_.member(to), msg, in(to), bytes);
      p.wait(0);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int k = 1; k < ring_.size(); ++k) {
      send_to->push_back(ring_.at(k));
      recv_from->push_back(ring_.at(-k));
    }
  }

  uint64_t wire_bytes_sent() const override {
    return static_cast<uint64_t>(ring_.size() - 1) * args_.count * args_.element_size();
  }

 private:
  Ring ring_;
  size_t chunk_;
};

}  // namespace

const char* alltoall_pairwise_cannot_run(const CollArgs& args) { return needs_two_ranks(args); }

std::unique_ptr<Plan> make_alltoall_pairwise(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AlltoAllPairwise>(args, options);
}

}  // namespace qccl::coll
