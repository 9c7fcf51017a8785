// Pipelined chain broadcast: the ranks form a chain starting at the root, in rank order; every
// fragment travels root -> root+1 -> ... -> root-1, each rank forwarding chunk f while chunk f+1 is
// still arriving. Every link carries S once, so time ~ S/B + (n-2) * chunk/B for large messages.
//
// Wire bytes per rank: S, except the chain's last rank, which sends nothing.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class BroadcastChain final : public Plan {
 public:
  BroadcastChain(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)),
        position_((ring_.position() - ring_.position_of(args.root) + ring_.size()) % ring_.size()) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    char* out = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    if (position_ == 0) {
      const char* in = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
      p.send(1, ring_.next(), msg, in, bytes);
      p.copy(out, in, bytes);
      p.wait(1);
      return;
    }
    p.recv(0, ring_.prev(), msg, out, bytes);
    p.wait(0);
    if (!last()) {
      p.send(1, ring_.next(), msg, out, bytes);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (!last()) send_to->push_back(ring_.next());
    if (position_ != 0) recv_from->push_back(ring_.prev());
  }

  uint64_t wire_bytes_sent() const override {
    return last() ? 0 : static_cast<uint64_t>(args_.count) * args_.element_size();
  }

 private:
  bool last() const { return position_ == ring_.size() - 1; }
  Ring ring_;
  size_t chunk_;
  int position_;  // along the chain: the root is 0
};

}  // namespace

const char* broadcast_chain_cannot_run(const CollArgs& args) { return needs_two_ranks(args); }

std::unique_ptr<Plan> make_broadcast_chain(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<BroadcastChain>(args, options);
}

}  // namespace qccl::coll
