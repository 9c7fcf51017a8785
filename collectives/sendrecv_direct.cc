// Point-to-point send or receive as one transport message (UCX pipelines large messages itself).
// The peer may be this rank: the transport's loopback carries it.
//
// Wire bytes: S for a send, 0 for a receive.
#include "collectives/algorithms.h"

namespace qccl::coll {

namespace {

class SendRecvDirect final : public Plan {
 public:
  using Plan::Plan;
  size_t fragments() const override { return 1; }

  void build(size_t, std::byte*, Program& p) const override {
    p.clear();
    const size_t bytes = args_.count * args_.element_size();
    if (args_.kind == CollKind::kSend) {
      p.send(1, args_.peer, 0, args_.sendbuf, bytes);
      p.wait(1);
    } else {
      p.recv(0, args_.peer, 0, args_.recvbuf, bytes);
      p.wait(0);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    (args_.kind == CollKind::kSend ? send_to : recv_from)->push_back(args_.peer);
  }

  uint64_t wire_bytes_sent() const override {
    return args_.kind == CollKind::kSend ? static_cast<uint64_t>(args_.count) * args_.element_size() : 0;
  }
};

}  // namespace

const char* sendrecv_direct_cannot_run(const CollArgs& args) {
  if (args.kind != CollKind::kSend && args.kind != CollKind::kRecv) return "point-to-point only";
  if (args.delta) return "keyed delta calls run as delta";
  return args.codec ? "uncompressed only (sendrecv compressed takes codecs)" : nullptr;
}

std::unique_ptr<Plan> make_sendrecv_direct(const CollArgs& args, const PlanOptions&) {
  return std::make_unique<SendRecvDirect>(args);
}

}  // namespace qccl::coll
