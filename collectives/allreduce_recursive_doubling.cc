// Recursive-doubling all-reduce for small messages (Thakur, Rabenseifner and Gropp, "Optimization of
// Collective Communication Operations in MPICH", 2005, §4.1): log2(p) exchange rounds instead of the
// ring's 2(n-1) steps, at the price of sending the whole buffer every round.
//
// With p the largest power of two <= n and rem = n - p, ranks below 2*rem first fold in pairs (the
// even rank sends its buffer to the odd one and sits out), the p active ranks exchange with partner
// vr ^ mask for mask = 1, 2, ..., p/2 (coll::RecursiveDoubling), and finally the folded ranks get the
// result back. Partners compute mine op theirs and theirs op mine; the reduction kernels are
// commutative bit for bit (NaN and signed zeros included), so every rank ends with identical bits.
//
// Wire bytes per rank (S = count * element size): log2(p) * S for an active rank, plus S for an odd
// rank below 2*rem; S for a folded rank.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AllReduceRecursiveDoubling final : public Plan {
 public:
  AllReduceRecursiveDoubling(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)), pairs_(args.nranks) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }
  size_t scratch_bytes() const override { return chunk_ * args_.element_size(); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int r = args_.rank;
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    char* work = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    p.copy(work, static_cast<const char*>(args_.sendbuf) + pc.offset * es, bytes);
    const uint32_t base = static_cast<uint32_t>(f) * static_cast<uint32_t>(pairs_.rounds + 2);

    if (pairs_.folds(r)) {  // fold
      if (r % 2 == 0) {
        p.send(1, r + 1, base, work, bytes);
        p.wait(1);
      } else {
        p.recv(0, r - 1, base, scratch, bytes);
        p.wait(0);
        p.reduce(work, scratch, work, pc.count);
      }
    }
    if (pairs_.active(r)) {
      for (int i = 0; i < pairs_.rounds; ++i) {
        const int partner = pairs_.partner(r, i);
        const uint32_t msg = base + 1 + static_cast<uint32_t>(i);
        p.recv(0, partner, msg, scratch, bytes);
        p.send(1, partner, msg, work, bytes);
        p.wait(0);
        p.wait(1);
        p.reduce(work, work, scratch, pc.count);
      }
      if (args_.op == RedOp::kAvg) p.average(work, pc.count);
    }
    if (pairs_.folds(r)) {  // unfold
      const uint32_t msg = base + 1 + static_cast<uint32_t>(pairs_.rounds);
      if (r % 2 == 1) {
        p.send(1, r - 1, msg, work, bytes);
        p.wait(1);
      } else {
        p.recv(0, r + 1, msg, work, bytes);
        p.wait(0);
      }
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    const int r = args_.rank;
    if (pairs_.folds(r)) {
      send_to->push_back(pairs_.fold_partner(r));
      recv_from->push_back(pairs_.fold_partner(r));
    }
    if (!pairs_.active(r)) return;
    for (int i = 0; i < pairs_.rounds; ++i) {
      send_to->push_back(pairs_.partner(r, i));
      recv_from->push_back(pairs_.partner(r, i));
    }
  }

  uint64_t wire_bytes_sent() const override {
    const uint64_t s = static_cast<uint64_t>(args_.count) * args_.element_size();
    const int r = args_.rank;
    if (!pairs_.active(r)) return s;
    return s * static_cast<uint64_t>(pairs_.rounds + (pairs_.folds(r) ? 1 : 0));
  }

 private:
  size_t chunk_;
  RecursiveDoubling pairs_;
};

}  // namespace

const char* allreduce_recursive_doubling_cannot_run(const CollArgs& args) { return uncompressed_with_two_ranks(args); }

std::unique_ptr<Plan> make_allreduce_recursive_doubling(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceRecursiveDoubling>(args, options);
}

}  // namespace qccl::coll
