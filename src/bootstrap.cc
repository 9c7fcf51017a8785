#include "src/bootstrap.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "base/errors.h"
#include "base/log.h"
#include "base/wire.h"

namespace qccl {

uint64_t random_magic() {
  std::random_device device;
  uint64_t magic = 0;
  while (magic == 0) magic = (static_cast<uint64_t>(device()) << 32) ^ device();
  return magic;
}

namespace {

constexpr uint32_t kIdTag = 0x44494351;     // "QCID"
constexpr uint32_t kHelloTag = 0x4c484351;  // "QCHL"
constexpr uint32_t kTableTag = 0x42544351;  // "QCTB"
constexpr uint32_t kRefuseTag = 0x4f4e4351; // "QCNO"
constexpr uint32_t kMissingTag = 0x534d4351; // "QCMS": the root gave up, naming the ranks that never came
// 3: the hello carries the rank's time left, PeerInfo the transport's library version, and the root
// may answer kMissingTag;
// 2: PeerInfo carries QCCL_CODEC=auto's inputs.
constexpr uint32_t kVersion = 3;
// 3: a flags byte after the address, written only when a flag is set (an id of version 2 is what an
// older qccl reads); 2: no flags; 1 carried the root's address as text.
constexpr uint32_t kIdVersion = 3;
constexpr uint8_t kRootAtInit = 1;  // the id's flags
constexpr size_t kHelloHeaderBytes = 4 + 4 + 8 + 4 + 4 + 4 + 4;
constexpr size_t kMaxBlobBytes = 64 * 1024;
constexpr double kHelloSeconds = 10.0;  // a connection must say hello this fast or be dropped
// At most this many accepted connections wait for their hello at once. A burst of idle connections (a
// scanner, a misdirected client) would otherwise hold a descriptor each until its hello deadline, and
// the root's process needs descriptors for its own rank (UCX, the control plane). At the bound the
// root stops accepting (newcomers wait in the kernel's backlog, costing it nothing) and drops the
// oldest connection that has said nothing for kSilentDropSeconds: a rank sends its hello as soon as
// it has connected, so a connection silent that long is not likely a rank, and one part-way through
// its hello is never dropped. (Dropping the oldest outright could drop a rank that was slow to send
// during a burst of real ranks; refusing newcomers outright would let idle ones hold the root for
// their whole kHelloSeconds.)
constexpr size_t kMaxPendingHellos = 64;
constexpr double kSilentDropSeconds = 1.0;
// An accept that failed (out of descriptors, buffers or memory: EMFILE, ENFILE, ENOBUFS, ENOMEM) is
// retried after this long, the connections already accepted served meanwhile: descriptors come back
// as they close, and ending the root would fail every rank at its timeout with "connection refused".
constexpr double kAcceptBackoffSeconds = 0.1;
// The root gives up on ranks that never came a little before the deadline of the first rank to give up
// (each says in its hello how long it has left: its timeout is its own, the root's QCCL_TIMEOUT may be
// another), and a rank waits this long past its deadline for the root's word: the ranks then hear
// which ranks never joined, not only that they timed out. (Once one of them has given up, the
// communicator cannot form.)
double root_give_up_margin(double timeout_seconds) { return std::min(1.0, 0.1 * timeout_seconds); }
constexpr double kRootWordGraceSeconds = 1.0;

// "2", "2, 5-9, 12": ranks in increasing order, as ranges, at most kShown of them then a count.
std::string describe_ranks(const std::vector<int>& ranks) {
  constexpr int kShown = 16;
  std::string text;
  int ranges = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (ranges == kShown) {
      text += format(", ... (%zu in all)", ranks.size());
      break;
    }
    text += (ranges ? ", " : "") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    ++ranges;
    i = j + 1;
  }
  return text;
}

}  // namespace

// The id is binary: tag, version, magic, then the root's address as family, port and raw address
// bytes (IPv6 with its scope), then a flags byte (BootstrapId::root_at_init). At most 40 of the 128
// bytes, so that it fits NCCL's ncclUniqueId (the same 128 bytes) with room to spare; the rest is zero.
void encode_unique_id(const BootstrapId& id, qcclUniqueId* out) {
  std::memset(out, 0, sizeof(*out));
  ByteWriter w;
  w.put<uint32_t>(kIdTag);
  w.put<uint32_t>(id.root_at_init ? kIdVersion : 2);
  w.put<uint64_t>(id.magic);
  w.put<uint8_t>(static_cast<uint8_t>(id.root.family() == AF_INET6 ? 6 : 4));
  w.put<uint16_t>(id.root.port());
  if (id.root.family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(id.root.sa());
    for (uint8_t b : a->sin6_addr.s6_addr) w.put<uint8_t>(b);
    w.put<uint32_t>(a->sin6_scope_id);
  } else if (id.root.family() == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(id.root.sa());
    const auto* bytes = reinterpret_cast<const uint8_t*>(&a->sin_addr.s_addr);  // network order as is
    for (int i = 0; i < 4; ++i) w.put<uint8_t>(bytes[i]);
  } else {
    fail(qcclInternalError, "unique id: the root's address family %d is neither IPv4 nor IPv6", id.root.family());
  }
  if (id.root_at_init) w.put<uint8_t>(kRootAtInit);
  static_assert(4 + 4 + 8 + 1 + 2 + 16 + 4 + 1 <= QCCL_UNIQUE_ID_BYTES, "the id fits");
  std::memcpy(out->internal, w.bytes().data(), w.bytes().size());
}

BootstrapId decode_unique_id(const qcclUniqueId& id) {
  ByteReader r(reinterpret_cast<const uint8_t*>(id.internal), sizeof(id.internal), "unique id",
               qcclInvalidArgument);
  uint32_t tag = r.get<uint32_t>();
  uint32_t version = r.get<uint32_t>();
  if (tag != kIdTag || (version != kIdVersion && version != 2))
    fail(qcclInvalidArgument, "uniqueId was not made by qcclGetUniqueId or qcclGetUniqueIdFromAddress of this qccl "
         "(tag 0x%08x, version %u)", tag, version);
  BootstrapId out;
  out.magic = r.get<uint64_t>();
  const uint8_t family = r.get<uint8_t>();
  const uint16_t port = r.get<uint16_t>();
  if (family == 4) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    auto* bytes = reinterpret_cast<uint8_t*>(&a.sin_addr.s_addr);
    for (int i = 0; i < 4; ++i) bytes[i] = r.get<uint8_t>();
    out.root = net::Address::from_sockaddr(reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  } else if (family == 6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    for (uint8_t& b : a.sin6_addr.s6_addr) b = r.get<uint8_t>();
    a.sin6_scope_id = r.get<uint32_t>();
    out.root = net::Address::from_sockaddr(reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  } else {
    fail(qcclInvalidArgument, "uniqueId: address family %u is neither 4 nor 6 (not made by qcclGetUniqueId)", family);
  }
  out.root.set_port(port);
  if (version >= 3) {
    const uint8_t flags = r.get<uint8_t>();
    if (flags & ~kRootAtInit) fail(qcclInvalidArgument, "uniqueId: unknown flags 0x%02x (not made by this qccl)", flags);
    out.root_at_init = flags & kRootAtInit;
  }
  return out;
}

// ---- Root service --------------------------------------------------------------------------------

namespace {

class RootService {
 public:
  // Waits for the first rank until `first_rank`, then `timeout` seconds for the rest.
  RootService(net::Socket listener, uint64_t magic, int nranks, double timeout, const net::Deadline& first_rank,
              std::shared_ptr<std::atomic<bool>> stop_requested)
      : listener_(std::move(listener)), magic_(magic), nranks_(nranks), timeout_(timeout), deadline_(first_rank),
        stop_requested_(std::move(stop_requested)) {}

  void run() {
    const std::string where = listener_.local_address().to_string();
    try {
      serve(where);
    } catch (const Error& e) {
      QCCL_WARN("bootstrap root %s: %s", where.c_str(), e.message().c_str());
    }
    // Now, not when the last owner lets go of the service: a stopped root's port and connections
    // are gone once RootServiceHandle::stop returns.
    listener_.close();
    pending_.clear();
    ranks_.clear();
  }

 private:
  struct Pending {
    net::Socket socket;
    std::vector<uint8_t> bytes;
    net::Deadline deadline;
    net::Deadline silent_drop;  // when, still silent, it may make room for another (kMaxPendingHellos)
  };
  struct Joined {
    net::Socket socket;
    std::vector<uint8_t> blob;
  };

  void serve(const std::string& where) {
    while (static_cast<int>(ranks_.size()) < nranks_ || nranks_ == 0) {
      if (stop_requested_->load()) return;
      if (deadline_.expired()) {
        give_up(where);
        return;
      }
      poll_once(where);
    }
    // Closed first: a communicator made next on the same address (an id from an address, a
    // launcher's root) may then listen there while the tables go out.
    listener_.close();
    send_tables(where);
  }

  // Tells every rank that joined which ranks never did (they wait kRootWordGraceSeconds past their
  // deadline for it), and logs it.
  void give_up(const std::string& where) {
    if (ranks_.empty()) {
      QCCL_WARN("bootstrap root %s: gave up after the timeout with no rank joined", where.c_str());
      return;
    }
    std::vector<int> missing;
    for (int r = 0; r < nranks_; ++r)
      if (!ranks_.count(r)) missing.push_back(r);
    const std::string text = format("%s %s (of %d) never joined the bootstrap at %s",
                                    missing.size() == 1 ? "rank" : "ranks", describe_ranks(missing).c_str(), nranks_,
                                    where.c_str());
    QCCL_WARN("bootstrap root %s: gave up after the timeout: %s", where.c_str(), text.c_str());
    ByteWriter w;
    w.put<uint32_t>(kMissingTag);
    w.put_string(text);
    for (auto& [rank, joined] : ranks_) {
      try {
        joined.socket.send_all(w.bytes().data(), w.bytes().size(), net::Deadline::after(1.0));
      } catch (const Error&) {
        // That rank is gone already (it gave up); the others still hear.
      }
    }
  }

  void poll_once(const std::string& where) {
    drop_a_silent_one_if_full(where);
    const bool accepting =
        pending_.size() < kMaxPendingHellos && (!accept_failing_ || accept_paused_.expired());
    std::vector<pollfd> fds;
    fds.push_back({listener_.fd(), static_cast<short>(accepting ? POLLIN : 0), 0});
    for (auto& p : pending_) fds.push_back({p->socket.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    if (accepting && (fds[0].revents & POLLIN)) accept_one(where);
    for (size_t i = 0; i < pending_.size();) {
      bool keep = true;
      try {
        keep = service(*pending_[i], where);
      } catch (const Error& e) {
        refuse(*pending_[i], where, e.message());
        keep = false;
      }
      if (keep) ++i;
      else pending_.erase(pending_.begin() + static_cast<long>(i));
    }
  }

  void accept_one(const std::string& where) {
    try {
      net::Socket s = listener_.accept(net::Deadline::after(0.001));
      accept_failing_ = false;
      if (s.valid())
        pending_.push_back(std::make_unique<Pending>(Pending{std::move(s), {}, net::Deadline::after(kHelloSeconds),
                                                             net::Deadline::after(kSilentDropSeconds)}));
    } catch (const Error& e) {  // the listener itself stays good: see kAcceptBackoffSeconds
      if (!accept_failing_)
        QCCL_WARN("bootstrap root %s: %s; retrying every %g s while serving the %zu connections it has", where.c_str(),
                  e.message().c_str(), kAcceptBackoffSeconds, pending_.size());
      accept_failing_ = true;
      accept_paused_ = net::Deadline::after(kAcceptBackoffSeconds);
    }
  }

  void drop_a_silent_one_if_full(const std::string& where) {
    if (pending_.size() < kMaxPendingHellos) return;
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!pending_[i]->bytes.empty() || !pending_[i]->silent_drop.expired()) continue;
      refuse(*pending_[i], where,
             format("dropped: %zu connections were waiting for their hello, and this one had said nothing for %g s",
                    pending_.size(), kSilentDropSeconds));
      pending_.erase(pending_.begin() + static_cast<long>(i));
      return;
    }
  }

  // Reads what arrived; returns false when the connection is finished with (joined or refused).
  bool service(Pending& p, const std::string& where) {
    uint8_t buf[4096];
    for (;;) {
      long n = p.socket.read_some(buf, sizeof(buf));
      if (n == 0) fail(qcclRemoteError, "closed before a complete hello (%zu bytes)", p.bytes.size());
      if (n < 0) break;
      p.bytes.insert(p.bytes.end(), buf, buf + n);
      if (p.bytes.size() > kHelloHeaderBytes + kMaxBlobBytes) break;
    }
    if (p.bytes.size() >= 4) {
      uint32_t tag = ByteReader(p.bytes.data(), 4, "hello").get<uint32_t>();
      if (tag != kHelloTag) fail(qcclRemoteError, "not a qccl hello (first bytes 0x%08x)", tag);
    }
    if (p.bytes.size() < kHelloHeaderBytes) {
      if (p.deadline.expired()) fail(qcclTimeout, "no complete hello within %.0f s", kHelloSeconds);
      return true;
    }
    ByteReader r(p.bytes.data(), p.bytes.size(), "hello");
    r.get<uint32_t>();
    uint32_t version = r.get<uint32_t>();
    uint64_t magic = r.get<uint64_t>();
    int32_t rank = r.get<int32_t>();
    int32_t nranks = r.get<int32_t>();
    const int32_t time_left_ms = r.get<int32_t>();  // -1: no deadline
    uint32_t blob_len = r.get<uint32_t>();
    if (version != kVersion) fail(qcclRemoteError, "protocol version %u, expected %u", version, kVersion);
    if (magic != magic_)
      fail(qcclRemoteError, "wrong magic 0x%016llx (this communicator's is different)",
           static_cast<unsigned long long>(magic));
    if (blob_len > kMaxBlobBytes) fail(qcclRemoteError, "blob of %u bytes exceeds %zu", blob_len, kMaxBlobBytes);
    if (r.remaining() < blob_len) {
      if (p.deadline.expired()) fail(qcclTimeout, "no complete hello within %.0f s", kHelloSeconds);
      return true;
    }
    if (nranks < 1) fail(qcclRemoteError, "nranks = %d", nranks);
    if (nranks_ != 0 && nranks != nranks_)
      fail(qcclRemoteError, "rank %d says nranks = %d but the communicator being built has %d", rank, nranks, nranks_);
    if (rank < 0 || rank >= nranks) fail(qcclRemoteError, "rank %d is not in [0, %d)", rank, nranks);
    if (ranks_.count(rank)) fail(qcclRemoteError, "rank %d has already joined", rank);
    nranks_ = nranks;  // the first valid hello's count (a refused one fixes nothing)
    if (ranks_.empty()) deadline_ = net::Deadline::after(timeout_ > 0 ? timeout_ - root_give_up_margin(timeout_) : 0);
    if (time_left_ms >= 0) {
      const double left = time_left_ms / 1000.0;
      deadline_ = deadline_.sooner(std::max(0.001, left - root_give_up_margin(left)));
    }
    Joined j{std::move(p.socket), std::vector<uint8_t>(p.bytes.begin() + kHelloHeaderBytes,
                                                       p.bytes.begin() + static_cast<long>(kHelloHeaderBytes + blob_len))};
    ranks_.emplace(rank, std::move(j));
    QCCL_TRACE("bootstrap root %s: rank %d joined (%zu of %d)", where.c_str(), rank, ranks_.size(), nranks_);
    return false;
  }

  void refuse(Pending& p, const std::string& where, const std::string& reason) {
    QCCL_WARN("bootstrap root %s: refused connection from %s: %s", where.c_str(),
              p.socket.peer_address().to_string().c_str(), reason.c_str());
    try {
      ByteWriter w;
      w.put<uint32_t>(kRefuseTag);
      w.put_string(reason);
      p.socket.send_all(w.bytes().data(), w.bytes().size(), net::Deadline::after(1.0));
    } catch (const Error&) {
      // The peer may be gone already; the refusal is logged either way.
    }
  }

  void send_tables(const std::string& where) {
    ByteWriter w;
    w.put<uint32_t>(kTableTag);
    w.put<uint32_t>(static_cast<uint32_t>(nranks_));
    for (auto& [rank, joined] : ranks_) w.put_bytes(joined.blob.data(), joined.blob.size());
    for (auto& [rank, joined] : ranks_) {
      try {
        joined.socket.send_all(w.bytes().data(), w.bytes().size(), net::Deadline::after(30.0));
      } catch (const Error& e) {
        QCCL_WARN("bootstrap root %s: could not send the table to rank %d: %s", where.c_str(), rank, e.message().c_str());
      }
    }
    QCCL_TRACE("bootstrap root %s: %d ranks joined; exiting", where.c_str(), nranks_);
  }

  net::Socket listener_;
  uint64_t magic_;
  int nranks_;
  double timeout_;
  net::Deadline deadline_;  // the first rank's, then from its arrival
  std::shared_ptr<std::atomic<bool>> stop_requested_;  // by RootServiceHandle::stop
  std::vector<std::unique_ptr<Pending>> pending_;
  std::map<int, Joined> ranks_;
  bool accept_failing_ = false;
  net::Deadline accept_paused_;  // while accept_failing_: when to try again
};

}  // namespace

RootServiceHandle::~RootServiceHandle() {
  if (thread_.joinable()) thread_.detach();  // the service runs on, and ends by itself
}

RootServiceHandle& RootServiceHandle::operator=(RootServiceHandle&& other) noexcept {
  if (this != &other) {
    if (thread_.joinable()) thread_.detach();
    stop_requested_ = std::move(other.stop_requested_);
    thread_ = std::move(other.thread_);
  }
  return *this;
}

void RootServiceHandle::stop() {
  if (!thread_.joinable()) return;
  stop_requested_->store(true);
  thread_.join();
}

RootServiceHandle start_root_service(net::Socket listener, uint64_t magic, int expected_nranks, double timeout_seconds,
                                     const net::Deadline& first_rank) {
  auto stop_requested = std::make_shared<std::atomic<bool>>(false);
  auto service = std::make_shared<RootService>(std::move(listener), magic, expected_nranks, timeout_seconds,
                                               first_rank, stop_requested);
  return RootServiceHandle(std::move(stop_requested), std::thread([service] { service->run(); }));
}

std::vector<std::vector<uint8_t>> exchange_through_root(const BootstrapId& id, int rank, int nranks,
                                                        const std::vector<uint8_t>& blob,
                                                        const net::Deadline& deadline) {
  net::Socket s = net::Socket::connect(id.root, deadline);
  ByteWriter w;
  w.put<uint32_t>(kHelloTag);
  w.put<uint32_t>(kVersion);
  w.put<uint64_t>(id.magic);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  // The time we have left, for the root's give_up; -1, none, also beyond what poll_ms counts (2^30 ms,
  // 12 days), which would make the root give up on the others long before our deadline.
  const int left_ms = deadline.poll_ms();
  w.put<int32_t>(left_ms >= (1 << 30) ? -1 : left_ms);
  w.put<uint32_t>(static_cast<uint32_t>(blob.size()));
  w.bytes().insert(w.bytes().end(), blob.begin(), blob.end());
  s.send_all(w.bytes().data(), w.bytes().size(), deadline);

  const std::string root = id.root.to_string();
  // The root's answer is awaited a little past our deadline: the root gives up on missing ranks just
  // before it, and says which.
  const net::Deadline answer = deadline.later(kRootWordGraceSeconds);
  uint32_t tag = 0;
  try {
    s.recv_all(&tag, sizeof(tag), answer);
  } catch (const Error& e) {
    fail(e.code(), "bootstrap: waiting for the other ranks at root %s: %s", root.c_str(), e.message().c_str());
  }
  auto read_sized = [&](size_t max_len) {
    uint32_t len = 0;
    s.recv_all(&len, sizeof(len), answer);
    if (len > max_len) fail(qcclRemoteError, "bootstrap: root %s sent a field of %u bytes", root.c_str(), len);
    std::vector<uint8_t> bytes(len);
    s.recv_all(bytes.data(), len, answer);
    return bytes;
  };
  if (tag == kRefuseTag) {
    auto reason = read_sized(4096);
    fail(qcclInvalidArgument, "bootstrap root %s refused rank %d: %s", root.c_str(), rank,
         std::string(reason.begin(), reason.end()).c_str());
  }
  if (tag == kMissingTag) {
    auto missing = read_sized(4096);
    fail(qcclTimeout, "bootstrap: %s", std::string(missing.begin(), missing.end()).c_str());
  }
  if (tag != kTableTag) fail(qcclRemoteError, "bootstrap: root %s answered with tag 0x%08x", root.c_str(), tag);
  uint32_t count = 0;
  s.recv_all(&count, sizeof(count), answer);
  if (static_cast<int>(count) != nranks)
    fail(qcclRemoteError, "bootstrap: root %s sent %u entries for %d ranks", root.c_str(), count, nranks);
  std::vector<std::vector<uint8_t>> blobs(count);
  for (auto& b : blobs) b = read_sized(kMaxBlobBytes);
  return blobs;
}

// ---- PeerInfo ------------------------------------------------------------------------------------

namespace {
// The hwloc summary is for logs, and its list of bound CPUs has no bound (every other PU of a large
// host): it is cut to this, so that no binding can make a peer's record unreadable.
constexpr size_t kTopologyBytes = 1024;
}  // namespace

std::vector<uint8_t> PeerInfo::serialize() const {
  ByteWriter w;
  w.put_string(hostname);
  w.put_string(boot_id);
  w.put<int32_t>(pid);
  w.put_string(control_address);
  w.put_string(topology.size() <= kTopologyBytes ? topology : topology.substr(0, kTopologyBytes - 3) + "...");
  w.put_bytes(transport_address.data(), transport_address.size());
  uint64_t cost_bits = 0;
  std::memcpy(&cost_bits, &fft_seconds_per_value, sizeof cost_bits);
  w.put<uint64_t>(cost_bits);
  w.put<uint64_t>(chunk_bytes);
  w.put<uint64_t>(link_rate_bits);
  w.put_string(codec_policy);
  w.put<uint32_t>(static_cast<uint32_t>(codec_costs.size()));
  for (double cost : codec_costs) {
    std::memcpy(&cost_bits, &cost, sizeof cost_bits);
    w.put<uint64_t>(cost_bits);
  }
  w.put<int32_t>(cpus);
  w.put<int32_t>(oversubscribed);
  w.put<int32_t>(parent_host_ranks);
  w.put<int32_t>(pipeline_depth);
  w.put<int32_t>(chunk_explicit);
  w.put_string(node_map);
  w.put_string(algorithms);
  w.put_string(aggregators);
  w.put_string(transport_version);
  return std::move(w.bytes());
}

PeerInfo PeerInfo::parse(const std::vector<uint8_t>& bytes, int rank) {
  (void)rank;
  ByteReader r(bytes.data(), bytes.size(), "peer information");
  PeerInfo p;
  p.hostname = r.get_string(256);
  p.boot_id = r.get_string(64);
  p.pid = r.get<int32_t>();
  p.control_address = r.get_string(128);
  p.topology = r.get_string(kTopologyBytes);
  p.transport_address = r.get_bytes(16384);
  const uint64_t cost_bits = r.get<uint64_t>();
  std::memcpy(&p.fft_seconds_per_value, &cost_bits, sizeof cost_bits);
  p.chunk_bytes = r.get<uint64_t>();
  p.link_rate_bits = r.get<uint64_t>();
  p.codec_policy = r.get_string(4096);
  const uint32_t costs = r.get<uint32_t>();
  if (costs > 1024) fail(qcclRemoteError, "peer information: %u codec costs", costs);
  for (uint32_t i = 0; i < costs; ++i) {
    uint64_t bits = r.get<uint64_t>();
    double cost = 0;
    std::memcpy(&cost, &bits, sizeof cost);
    if (!(cost >= 0) || !std::isfinite(cost)) fail(qcclRemoteError, "peer information: codec cost %g", cost);
    p.codec_costs.push_back(cost);
  }
  p.cpus = r.get<int32_t>();
  p.oversubscribed = r.get<int32_t>();
  p.parent_host_ranks = r.get<int32_t>();
  if (p.parent_host_ranks < 0) fail(qcclRemoteError, "peer information: parent_host_ranks = %d", p.parent_host_ranks);
  p.pipeline_depth = r.get<int32_t>();
  p.chunk_explicit = r.get<int32_t>();
  p.node_map = r.get_string(1 << 20);
  p.algorithms = r.get_string(4096);
  p.aggregators = r.get_string(1 << 20);
  p.transport_version = r.get_string(64);
  return p;
}

int ranks_sharing_cpus(const std::vector<PeerInfo>& peers, size_t r) {
  int sharing = 0;
  for (const PeerInfo& q : peers) sharing += q.same_host(peers[r]) || peers[r].oversubscribed == 1 ? 1 : 0;
  return std::max(sharing, static_cast<int>(peers[r].parent_host_ranks));
}

}  // namespace qccl
