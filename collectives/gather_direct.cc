// Direct gather, pipelined by fragment: every rank but the root sends chunk f of its block straight
// to the root, which receives each into recvbuf + q * count and copies its own block into place (a
// no-op in place, sendbuf == recvbuf + root * count). The root's link carries the n-1 blocks once
// each, which is what a gather must move; a tree would only add hops.
//
// Wire bytes per rank: count * element size (the root: 0).
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class GatherDirect final : public Plan {
 public:
  GatherDirect(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const char* in = static_cast<const char*>(args_.sendbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    if (args_.rank != args_.root) {
      p.send(0, args_.root, msg, in, bytes);
      p.wait(0);
      return;
    }
    auto out = [&](int q) { return static_cast<char*>(args_.recvbuf) + (static_cast<size_t>(q) * args_.count + pc.offset) * es; };
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) p.recv(q, q, msg, out(q), bytes);
    p.copy(out(args_.root), in, bytes);
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) p.wait(q);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (args_.rank != args_.root) {
      send_to->push_back(args_.root);
      return;
    }
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) recv_from->push_back(q);
  }

  uint64_t wire_bytes_sent() const override {
    return args_.rank == args_.root ? 0 : static_cast<uint64_t>(args_.count) * args_.element_size();
  }

 private:
  size_t chunk_;
};

}  // namespace

const char* gather_direct_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_gather_direct(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<GatherDirect>(args, options);
}

}  // namespace qccl::coll
