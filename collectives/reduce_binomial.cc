// Binomial-tree reduce for small messages (MPICH's MPIR_Reduce_binomial): ceil(log2 n) rounds. With
// v = (rank - root) mod n, for mask = 1, 2, 4, ...: a rank whose bit `mask` is clear receives the
// partial of v | mask (if it exists) and adds it to its own; a rank whose bit is set sends its
// partial to v - mask and is done. The root ends with the reduction in a fixed order.
//
// Wire bytes per rank: S, except the root, which sends nothing.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class ReduceBinomial final : public Plan {
 public:
  ReduceBinomial(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)),
        tree_(Ring::whole(args.rank, args.nranks), args.root) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }
  size_t scratch_bytes() const override { return 2 * chunk_ * args_.element_size(); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const char* in = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    const bool root = tree_.parent < 0;
    std::byte* received = scratch;
    void* partial = root ? static_cast<void*>(static_cast<char*>(args_.recvbuf) + pc.offset * es)
                         : static_cast<void*>(scratch + chunk_ * es);
    const void* mine = in;
    for (int child : tree_.children) {  // smallest subtree first: a fixed order
      p.recv(0, child, msg, received, bytes);
      p.wait(0);
      p.reduce(partial, mine, received, pc.count);
      mine = partial;
    }
    if (root) {
      p.copy(partial, mine, bytes);  // no children: a copy (skipped when mine is already partial)
      if (args_.op == RedOp::kAvg) p.average(partial, pc.count);
      return;
    }
    p.send(1, tree_.parent, msg, mine, bytes);
    p.wait(1);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (tree_.parent >= 0) send_to->push_back(tree_.parent);
    recv_from->insert(recv_from->end(), tree_.children.begin(), tree_.children.end());
  }

  uint64_t wire_bytes_sent() const override {
    return tree_.parent < 0 ? 0 : static_cast<uint64_t>(args_.count) * args_.element_size();
  }

 private:
  size_t chunk_;
  BinomialTree tree_;
};

}  // namespace

const char* reduce_binomial_cannot_run(const CollArgs& args) { return needs_two_ranks(args); }

std::unique_ptr<Plan> make_reduce_binomial(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceBinomial>(args, options);
}

}  // namespace qccl::coll
