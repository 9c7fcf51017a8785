// Binomial-tree broadcast for small messages (MPICH's MPIR_Bcast_binomial): ceil(log2 n) rounds
// instead of the chain's n-1 hops. With v = (rank - root) mod n, rank v receives from v - m where m
// is v's lowest set bit, then sends to v + m' for every m' < m (largest first) that is below n.
//
// Wire bytes per rank: S times the number of children.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class BroadcastBinomial final : public Plan {
 public:
  BroadcastBinomial(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)),
        tree_(Ring::whole(args.rank, args.nranks), args.root) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    char* out = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    const char* data = out;
    if (tree_.parent < 0) {
      data = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
      p.copy(out, data, bytes);
    } else {
      p.recv(0, tree_.parent, msg, out, bytes);
      p.wait(0);
    }
    // Children in flight two at a time (slots 1 and 2), the largest subtree first.
    const std::vector<int>& children = tree_.children;
    for (size_t i = 0; i < children.size(); ++i) {
      const int slot = 1 + static_cast<int>(i % 2);
      if (i >= 2) p.wait(slot);
      p.send(slot, children[children.size() - 1 - i], msg, data, bytes);
    }
    p.wait(1);
    p.wait(2);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (tree_.parent >= 0) recv_from->push_back(tree_.parent);
    send_to->insert(send_to->end(), tree_.children.rbegin(), tree_.children.rend());
  }

  uint64_t wire_bytes_sent() const override {
    return static_cast<uint64_t>(args_.count) * args_.element_size() * tree_.children.size();
  }

 private:
  size_t chunk_;
  BinomialTree tree_;
};

}  // namespace

const char* broadcast_binomial_cannot_run(const CollArgs& args) { return needs_two_ranks(args); }

std::unique_ptr<Plan> make_broadcast_binomial(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<BroadcastBinomial>(args, options);
}

}  // namespace qccl::coll
