// Direct scatter, pipelined by fragment: the root sends chunk f of block q of sendbuf straight to
// rank q, for every q, and copies its own block into recvbuf (a no-op in place, recvbuf == sendbuf +
// root * count); every other rank receives its block into recvbuf. The root's link carries the n-1
// blocks once each, which is what a scatter must move.
//
// Wire bytes per rank: the root (n-1) * count * element size, the others 0.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class ScatterDirect final : public Plan {
 public:
  ScatterDirect(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    char* out = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    if (args_.rank != args_.root) {
      p.recv(0, args_.root, msg, out, bytes);
      p.wait(0);
      return;
    }
    auto in = [&](int q) {
      return static_cast<const char*>(args_.sendbuf) + (static_cast<size_t>(q) * args_.count + pc.offset) * es;
    };
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) p.send(q, q, msg, in(q), bytes);
    p.copy(out, in(args_.root), bytes);
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) p.wait(q);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (args_.rank != args_.root) {
      recv_from->push_back(args_.root);
      return;
    }
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.root) send_to->push_back(q);
  }

  uint64_t wire_bytes_sent() const override {
    return args_.rank == args_.root ? static_cast<uint64_t>(args_.nranks - 1) * args_.count * args_.element_size() : 0;
  }

 private:
  size_t chunk_;
};

}  // namespace

const char* scatter_direct_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_scatter_direct(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ScatterDirect>(args, options);
}

}  // namespace qccl::coll
