// Pipelined chain reduce: the mirror of broadcast_chain. Partials flow root-1 -> root-2 -> ... ->
// root; each rank adds its input to the partial it receives and passes it on, chunk by chunk. The
// reduction order of every element is x[root-1], x[root-2], ..., x[root] (fixed by n and root).
//
// Wire bytes per rank: S, except the root, which sends nothing.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class ReduceChain final : public Plan {
 public:
  ReduceChain(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)),
        position_((ring_.position() - ring_.position_of(args.root) + ring_.size()) % ring_.size()) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }
  // A received partial and this rank's outgoing partial (non-roots have no recvbuf to work in).
  size_t scratch_bytes() const override { return 2 * chunk_ * args_.element_size(); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const char* in = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    if (first()) {
      p.send(1, ring_.prev(), msg, in, bytes);
      p.wait(1);
      return;
    }
    std::byte* received = scratch;
    void* partial = position_ == 0 ? static_cast<void*>(static_cast<char*>(args_.recvbuf) + pc.offset * es)
                                   : static_cast<void*>(scratch + chunk_ * es);
    p.recv(0, ring_.next(), msg, received, bytes);
    p.wait(0);
    p.reduce(partial, received, in, pc.count);
    if (position_ == 0) {
      if (args_.op == RedOp::kAvg) p.average(partial, pc.count);
      return;
    }
    p.send(1, ring_.prev(), msg, partial, bytes);
    p.wait(1);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (position_ != 0) send_to->push_back(ring_.prev());
    if (!first()) recv_from->push_back(ring_.next());
  }

  uint64_t wire_bytes_sent() const override {
    return position_ == 0 ? 0 : static_cast<uint64_t>(args_.count) * args_.element_size();
  }

 private:
  // The rank that starts the chain (the one just after the root along the ring backwards).
  bool first() const { return position_ == ring_.size() - 1; }
  Ring ring_;
  size_t chunk_;
  int position_;  // along the ring from the root: the root is 0
};

}  // namespace

const char* reduce_chain_cannot_run(const CollArgs& args) { return needs_two_ranks(args); }

std::unique_ptr<Plan> make_reduce_chain(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceChain>(args, options);
}

}  // namespace qccl::coll
