// Point-to-point send or receive in messages of a pipeline chunk each, several in flight (the
// pipeline depth). One message of the whole buffer would be simpler, but a rank counts progress
// (QCCL_TIMEOUT) when a message completes, and gigabytes over a slow link take longer than the
// timeout: the call would fail while its bytes still moved. Messages of a few MiB are not enough:
// above UCX's rendezvous threshold, which qccl raises over the chunk (docs/PERF.md, "Eager
// chunks"), each message waits for a handshake from its receiver, and where both ranks send, that
// reply queues behind the receiver's own data on a slow link (over 1 s at 100 Mbit/s with two 4 MiB
// messages in flight each way). Chunks travel eagerly. The peer may be this rank: the transport's
// loopback carries it.
//
// Wire bytes: S for a send, 0 for a receive.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class SendRecvDirect final : public Plan {
 public:
  SendRecvDirect(const CollArgs& args, const PlanOptions& options)
      : Plan(args), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  void build(size_t f, std::byte*, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es, at = pc.offset * es;
    const auto msg = static_cast<uint32_t>(f);
    if (args_.kind == CollKind::kSend) {
      p.send(1, args_.peer, msg, static_cast<const char*>(args_.sendbuf) + at, bytes);
      p.wait(1);
    } else {
      p.recv(0, args_.peer, msg, static_cast<char*>(args_.recvbuf) + at, bytes);
      p.wait(0);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    (args_.kind == CollKind::kSend ? send_to : recv_from)->push_back(args_.peer);
  }

  uint64_t wire_bytes_sent() const override {
    return args_.kind == CollKind::kSend ? static_cast<uint64_t>(args_.count) * args_.element_size() : 0;
  }

 private:
  size_t chunk_;  // values per message
};

}  // namespace

const char* sendrecv_direct_cannot_run(const CollArgs& args) {
  if (args.kind != CollKind::kSend && args.kind != CollKind::kRecv) return "point-to-point only";
  if (args.delta) return "keyed delta calls run as delta";
  return args.codec ? "uncompressed only (sendrecv compressed takes codecs)" : nullptr;
}

std::unique_ptr<Plan> make_sendrecv_direct(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<SendRecvDirect>(args, options);
}

}  // namespace qccl::coll
