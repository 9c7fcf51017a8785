// A communicator of one rank: every collective is a copy from sendbuf to recvbuf (nothing to
// reduce with, and an average over one rank is the value itself). A compressed all-reduce is a copy
// too: with nothing to send, there is nothing to compress, and the exact input is the best answer.
// So is a compressed reduce-scatter, whose owner never encodes its own contribution: on one rank
// that is all there is. A compressed all-gather is not served here: every rank decodes the owner's
// bytes, the owner too, so allgather_compressed_ring runs it on one rank as well, and a block reads
// decode(encode(x)) whatever the rank count.
#include "collectives/algorithms.h"

namespace qccl::coll {

namespace {

class Local final : public Plan {
 public:
  using Plan::Plan;
  size_t fragments() const override { return 1; }
  void build(size_t, std::byte*, Program& p) const override {
    p.clear();
    if (args_.recvbuf) p.copy(args_.recvbuf, args_.sendbuf, args_.count * args_.element_size());
  }
  void links(std::vector<int>*, std::vector<int>*) const override {}
  uint64_t wire_bytes_sent() const override { return 0; }
};

}  // namespace

const char* local_cannot_run(const CollArgs& args) {
  if (args.nranks != 1) return "serves single-rank communicators only";
  if (args.kind == CollKind::kSend || args.kind == CollKind::kRecv) return "point-to-point goes through the transport";
  if (args.codec && args.codec->kind == kernels::CodecKind::kSign) return "Marsit updates its state even on one rank";
  if (args.codec && args.codec->kind == kernels::CodecKind::kInt) return "IntSGD rounds to integers even on one rank";
  if (args.codec && args.kind == CollKind::kAllGather)
    return "a compressed all-gather decodes its own bytes even on one rank (compressed_ring)";
  return nullptr;
}

std::unique_ptr<Plan> make_local(const CollArgs& args, const PlanOptions&) { return std::make_unique<Local>(args); }

}  // namespace qccl::coll
