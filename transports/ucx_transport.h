// Transport over UCX's tag-matching API (ucp_tag_send_nbx / ucp_tag_recv_nbx) on host memory. One
// UCP worker per communicator, so communicators never see each other's tags; one endpoint per peer
// (self included), created eagerly from the worker addresses the bootstrap exchanged. UCX picks the
// wire: shared memory (sysv + cma) between processes of one host, tcp between hosts or when
// UCX_TLS=tcp (qcclrun --netem).
//
// The 64-bit UCX tag is [sender rank : 20 bits | key : 44 bits]; receives match the sender exactly.
// Endpoints use UCP_ERR_HANDLING_MODE_NONE: peer-failure mode would move shared-memory traffic onto
// tcp loopback (transports.md §1.3), and qccl detects dead peers through its bootstrap sockets.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <set>
#include <vector>

#include "transports/transport.h"

namespace qccl::transport {

class UcxTransport final : public Transport {
 public:
  static constexpr int kMaxRanks = 1 << 20;

  // Creates the worker. Throws Error(qcclSystemError) with UCX's message on failure.
  UcxTransport(int rank, int nranks);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, to be exchanged through the bootstrap.
  const std::vector<uint8_t>& address() const { return address_; }
  // The UCX library's version, "major.minor.release" (ucp_get_version): a worker address is packed
  // for the same version to unpack, and another version's trips UCX's assertions in ucp_ep_create.
  static std::string library_version();
  // Creates an endpoint to every rank from their addresses (addresses[rank] is ours). Throws
  // Error(qcclRemoteError) for an empty address.
  void connect(const std::vector<std::vector<uint8_t>>& addresses);
  // Connects one more peer, numbered `peer` (>= the ranks: IntSGD's aggregators), whose worker
  // announces itself with that number as its sender rank.
  void connect_peer(int peer, const std::vector<uint8_t>& address);

  Handle isend(int peer, Key key, const void* buf, size_t bytes) override;
  Handle irecv(int peer, Key key, Key ignore, void* buf, size_t bytes) override;
  Poll test(Handle& handle, Completion* done, std::string* error) override;
  void cancel(Handle& handle) override;
  bool settle(double seconds) override;
  bool progress() override;
  int event_fd() const override { return event_fd_; }
  bool arm() override;
  std::string describe() const override;
  std::string peer_transports(int peer) const override;

 private:
  class Context;
  std::shared_ptr<Context> context_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  int rank_;
  int nranks_;
  std::vector<uint8_t> address_;
  std::vector<ucp_ep_h> endpoints_;
  std::vector<void*> unsettled_receives_;  // cancelled after they matched: settle() waits for them
  std::vector<void*> abandoned_receives_;  // ... and still not completed by UCX after that

  std::set<std::string> lanes_of(int peer) const;  // the "name/device" of each lane to peer
};

}  // namespace qccl::transport
