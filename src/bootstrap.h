// Bootstrap: how ranks that know only a root address and a magic find each other.
//
// The root (a thread started by qcclGetUniqueId, or by rank 0 under qcclCommInitEnv or with an id from
// an address) accepts one TCP connection per rank. Each rank sends a hello {magic, rank, nranks,
// blob}; when all nranks have arrived the root closes its listener (the next communicator on the
// same address may listen there), sends every rank the table of all blobs and exits. A connection that presents
// another magic, an inconsistent rank count, a duplicate rank or bytes that do not parse is refused
// (with a one-line reason sent back when possible), logged at WARN, and does not disturb the
// communicator being built. The blob carries what the ranks need from each other (PeerInfo).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/socket.h"
#include "include/qccl.h"

namespace qccl {

struct BootstrapId {
  uint64_t magic = 0;
  net::Address root;
  // Rank 0's init starts the root, listening on root's port (an id from an address,
  // qcclGetUniqueIdFromAddress); otherwise the process that made the id runs it.
  bool root_at_init = false;
};

// A random non-zero magic for a new communicator's id.
uint64_t random_magic();

void encode_unique_id(const BootstrapId& id, qcclUniqueId* out);
// Throws Error(qcclInvalidArgument) when the bytes are not a qccl unique id.
BootstrapId decode_unique_id(const qcclUniqueId& id);

// A root service's thread. Dropping the handle leaves the service running until it ends by itself.
class RootServiceHandle {
 public:
  RootServiceHandle() = default;
  RootServiceHandle(std::shared_ptr<std::atomic<bool>> stop_requested, std::thread thread)
      : stop_requested_(std::move(stop_requested)), thread_(std::move(thread)) {}
  RootServiceHandle(RootServiceHandle&&) = default;
  RootServiceHandle& operator=(RootServiceHandle&& other) noexcept;  // the service it held runs on
  ~RootServiceHandle();
  // Ends the service (within 0.1 s), closing its port and every connection, and waits for its thread.
  void stop();

 private:
  std::shared_ptr<std::atomic<bool>> stop_requested_;
  std::thread thread_;
};

// Starts the root service on `listener` in its own thread. expected_nranks = 0 learns it from the
// first valid hello. The thread waits for the first rank until `first_rank` (a unique id may be used
// long after it was made), then gives up `timeout_seconds` after it came (0: never), or just before
// the first of the ranks that came gives up (each says in its hello when); it then tells them which
// ranks never came, and logs it (WARN). Accept errors (out of descriptors, ...) are logged and
// retried: the root serves on.
RootServiceHandle start_root_service(net::Socket listener, uint64_t magic, int expected_nranks, double timeout_seconds,
                                     const net::Deadline& first_rank = net::Deadline::never());

// Rank side: sends our blob to the root and returns every rank's blob, indexed by rank.
std::vector<std::vector<uint8_t>> exchange_through_root(const BootstrapId& id, int rank, int nranks,
                                                        const std::vector<uint8_t>& blob,
                                                        const net::Deadline& deadline);

// PeerInfo::link_rate_bits of a rank told QCCL_LINK_RATE=probe.
constexpr uint64_t kProbedLinkRate = ~uint64_t{0};

// What each rank tells the others at bootstrap.
struct PeerInfo {
  std::string hostname;
  std::string boot_id;          // /proc/sys/kernel/random/boot_id: same host <=> same boot id + name
  int32_t pid = 0;
  std::string control_address;  // rank 0's control-plane listener ("ip:port"); empty elsewhere
  std::string topology;         // one-line hwloc summary, for logs
  std::vector<uint8_t> transport_address;
  // With QCCL_LINK_RATE (or a link probe): the fft codec's encode + decode of a value on this rank's
  // CPU (LinkFacts).
  double fft_seconds_per_value = 0;
  // Settings every rank must share (the chunk decides the messages, the link rate the algorithms):
  // bit/s, 0 unset, kProbedLinkRate for QCCL_LINK_RATE=probe.
  uint64_t chunk_bytes = 0;
  uint64_t link_rate_bits = 0;
  int32_t chunk_explicit = 0;  // 1: QCCL_CHUNK_BYTES or chunkBytes (a probed rate then leaves the chunk)
  std::string node_map;        // QCCL_NODE_MAP as given ("": by host)
  // QCCL_CODEC=auto's inputs (src/auto_codec.h): the spec every rank must share, this rank's measured
  // CPU costs (CpuCosts::flatten; empty unless auto), its CPUs and its QCCL_OVERSUBSCRIBED (-1 unset).
  std::string codec_policy;
  std::vector<double> codec_costs;
  int32_t cpus = 0;
  int32_t oversubscribed = -1;
  int32_t parent_host_ranks = 0;  // Config::parent_host_ranks (a split child's parent's ranks on this host)
  int32_t pipeline_depth = 0;  // QCCL_PIPELINE_DEPTH (auto's model takes rank 0's)
  std::string algorithms;      // what QCCL_ALGO (or config->algorithms) forces (AlgorithmPolicy::forced)
  std::string aggregators;     // QCCL_AGGREGATORS as given ("": none)
  // The transport library's version (UCX's, "1.13.1"): a worker address is unpacked only by the same
  // version (Comm::join compares them before any is).
  std::string transport_version;

  std::vector<uint8_t> serialize() const;
  static PeerInfo parse(const std::vector<uint8_t>& bytes, int rank);
  bool same_host(const PeerInfo& other) const { return hostname == other.hostname && boot_id == other.boot_id; }
};

// How many ranks' CPU work competes for the CPUs of peers[r]'s host, for QCCL_CODEC=auto's model
// (Comm::host_ranks, as every rank sees it): those of its host, all of them when rank r set
// QCCL_OVERSUBSCRIBED=1 (emulated hosts sharing one machine), or its parent's when more (a split
// child's: the parent's other ranks still run there). Rank r itself included.
int ranks_sharing_cpus(const std::vector<PeerInfo>& peers, size_t r);

}  // namespace qccl
