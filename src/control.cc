#include "src/control.h"

#include <algorithm>

#include "base/errors.h"
#include "base/log.h"
#include "base/wire.h"

namespace qccl {

namespace {
constexpr uint32_t kControlHello = 0x50434351;  // "QCCP"
constexpr size_t kMaxMessage = 64 * 1024;

// "rank 2 (host:pid), rank 5 (host:pid)" for the ranks where `missing` holds, the first few of them.
template <class Missing>
std::string list_ranks(const std::vector<std::string>& names, Missing missing) {
  constexpr int kNamed = 4;
  std::string out;
  int count = 0;
  for (int r = 0; r < static_cast<int>(names.size()); ++r) {
    if (!missing(r)) continue;
    if (count++ < kNamed) out += (out.empty() ? "" : ", ") + names[r];
  }
  if (count > kNamed) out += format(" and %d more", count - kNamed);
  return out;
}
}  // namespace

ControlPlane::ControlPlane(int rank, int nranks, uint64_t magic, std::vector<std::string> peer_names,
                           FailureHandler on_failure)
    : rank_(rank), nranks_(nranks), magic_(magic), names_(std::move(peer_names)),
      on_failure_(std::move(on_failure)), arrived_(nranks, 0) {}

void ControlPlane::accept_peers(net::Socket& listener, const net::Deadline& deadline) {
  std::vector<bool> joined(nranks_, false);
  for (int remaining = nranks_ - 1; remaining > 0;) {
    net::Socket s = listener.accept(deadline);
    if (!s.valid())
      fail(qcclTimeout, "control plane: %d of %d ranks did not connect to rank 0 in time: %s", remaining, nranks_ - 1,
           list_ranks(names_, [&](int r) { return r > 0 && !joined[r]; }).c_str());
    try {
      uint8_t hello[16];
      s.recv_all(hello, sizeof(hello), deadline.sooner(10.0));
      ByteReader r(hello, sizeof(hello), "control hello");
      uint32_t tag = r.get<uint32_t>();
      uint64_t magic = r.get<uint64_t>();
      int32_t rank = r.get<int32_t>();
      if (tag != kControlHello || magic != magic_)
        fail(qcclRemoteError, "not this communicator (tag 0x%08x, magic 0x%016llx)", tag,
             static_cast<unsigned long long>(magic));
      if (rank <= 0 || rank >= nranks_ || joined[rank])
        fail(qcclRemoteError, "rank %d is out of range or already connected", rank);
      joined[rank] = true;
      peers_.push_back(Peer{rank, std::move(s), {}});
      --remaining;
    } catch (const Error& e) {
      QCCL_WARN("control plane: refused connection from %s: %s", s.peer_address().to_string().c_str(),
                e.message().c_str());
    }
  }
}

void ControlPlane::connect_to_hub(const net::Address& hub, const net::Deadline& deadline) {
  net::Socket s = net::Socket::connect(hub, deadline);
  ByteWriter w;
  w.put<uint32_t>(kControlHello);
  w.put<uint64_t>(magic_);
  w.put<int32_t>(rank_);
  s.send_all(w.bytes().data(), w.bytes().size(), deadline);
  peers_.push_back(Peer{0, std::move(s), {}});
}

std::vector<int> ControlPlane::fds() const {
  std::vector<int> out;
  for (const auto& p : peers_)
    if (p.socket.valid()) out.push_back(p.socket.fd());
  return out;
}

void ControlPlane::send(Peer& peer, MessageType type, const std::vector<uint8_t>& payload) {
  if (!peer.socket.valid()) return;
  ByteWriter w;
  w.put<uint32_t>(type);
  w.put<uint32_t>(static_cast<uint32_t>(payload.size()));
  w.bytes().insert(w.bytes().end(), payload.begin(), payload.end());
  peer.socket.send_all(w.bytes().data(), w.bytes().size(), net::Deadline::after(10.0));
}

void ControlPlane::service(int fd) {
  auto it = std::find_if(peers_.begin(), peers_.end(), [fd](const Peer& p) { return p.socket.fd() == fd; });
  if (it == peers_.end()) return;
  Peer& peer = *it;
  uint8_t buf[4096];
  bool eof = false;
  try {
    for (;;) {
      long n = peer.socket.read_some(buf, sizeof(buf));
      if (n < 0) break;
      if (n == 0) {
        eof = true;
        break;
      }
      peer.inbox.insert(peer.inbox.end(), buf, buf + n);
    }
  } catch (const Error&) {
    eof = true;
  }
  // Handle every complete message, then the EOF (a failure report may precede a close).
  size_t at = 0;
  while (peer.inbox.size() - at >= 8) {
    ByteReader r(peer.inbox.data() + at, 8, "control message");
    auto type = static_cast<MessageType>(r.get<uint32_t>());
    uint32_t len = r.get<uint32_t>();
    if (len > kMaxMessage) {
      QCCL_WARN("control plane: %s sent a malformed message (%u bytes); treating it as failed",
                names_[peer.rank].c_str(), len);
      eof = true;
      break;
    }
    if (peer.inbox.size() - at - 8 < len) break;
    handle(peer, type, peer.inbox.data() + at + 8, len);
    at += 8 + len;
  }
  peer.inbox.erase(peer.inbox.begin(), peer.inbox.begin() + static_cast<long>(at));
  if (eof) lost(peer);
}

void ControlPlane::lost(Peer& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);  // other threads write to sockets under mu_
    peer.socket.close();
    if (closing_ || peer.announced) return;
  }
  const std::string text =
      "its control connection closed: the process died, or exited or aborted without qcclCommDestroy";
  fail_locally(Failure{qcclRemoteError, names_[peer.rank] + " failed: " + text, 0});
  if (rank_ == 0) broadcast_failure(peer.rank, Failure{qcclRemoteError, text, 0}, peer.rank, false);
}

void ControlPlane::handle(Peer& from, MessageType type, const uint8_t* payload, size_t len) {
  try {
    ByteReader r(payload, len, "control message");
    switch (type) {
      case kBarrier:
        if (rank_ == 0) {
          uint64_t epoch = r.get<uint64_t>();
          std::lock_guard<std::mutex> lock(mu_);
          arrived_[from.rank] = epoch;
          arrive(epoch);
        }
        return;
      case kRelease: {
        uint64_t epoch = r.get<uint64_t>();
        std::lock_guard<std::mutex> lock(mu_);
        released_epoch_ = std::max(released_epoch_, epoch);
        if (closing_epoch_ && released_epoch_ >= closing_epoch_) closing_ = true;
        cv_.notify_all();
        return;
      }
      case kFailure: {
        int32_t origin = r.get<int32_t>();
        Failure failure;
        failure.code = static_cast<qcclResult_t>(r.get<int32_t>());
        failure.first_sequence = r.get<uint64_t>();
        failure.message = r.get_string(kMaxMessage);
        if (r.get<uint8_t>() != 0 && origin == from.rank) from.announced = true;  // its own departure
        // A mismatch or a timeout fails the collective on every rank alike; a peer's abort or any
        // other failure is a remote error here, whatever it was there.
        if (failure.code != qcclMismatch && failure.code != qcclTimeout) failure.code = qcclRemoteError;
        if (rank_ == 0) broadcast_failure(origin, failure, origin, false);
        std::string who = (origin >= 0 && origin < nranks_) ? names_[origin] : "a rank";
        failure.message = who + " failed: " + failure.message;
        fail_locally(failure);
        return;
      }
    }
    QCCL_WARN("control plane: %s sent unknown message type %u", names_[from.rank].c_str(), type);
  } catch (const Error& e) {
    QCCL_WARN("control plane: %s: %s", names_[from.rank].c_str(), e.message().c_str());
  }
}

// Hub, with mu_ held: releases barrier `epoch` once every rank (the hub included) has reached it.
void ControlPlane::arrive(uint64_t epoch) {
  if (released_epoch_ >= epoch) return;
  for (int r = 0; r < nranks_; ++r)
    if (arrived_[r] < epoch) return;
  released_epoch_ = epoch;
  if (closing_epoch_ && released_epoch_ >= closing_epoch_) closing_ = true;
  ByteWriter w;
  w.put<uint64_t>(epoch);
  for (auto& p : peers_) {
    try { send(p, kRelease, w.bytes()); } catch (const Error&) {}
  }
  cv_.notify_all();
}

void ControlPlane::barrier(const net::Deadline& deadline, bool closing) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t epoch = ++my_epoch_;
  if (closing) closing_epoch_ = epoch;
  if (rank_ == 0) {
    arrived_[0] = epoch;
    arrive(epoch);
  } else {
    ByteWriter w;
    w.put<uint64_t>(epoch);
    send(peers_[0], kBarrier, w.bytes());
  }
  for (;;) {
    if (released_epoch_ >= epoch) return;  // before failed_: a release that arrived counts
    if (failed_) throw Error(failure_.code, failure_.message);
    if (deadline.expired()) {
      if (rank_ != 0)
        fail(qcclTimeout, "barrier %llu: rank 0 did not release it within the timeout (it names the ranks that did "
             "not arrive)", static_cast<unsigned long long>(epoch));
      fail(qcclTimeout, "barrier %llu: not every rank arrived within the timeout: %s did not",
           static_cast<unsigned long long>(epoch),
           list_ranks(names_, [&](int r) { return arrived_[r] < epoch; }).c_str());
    }
    int ms = deadline.poll_ms();
    cv_.wait_for(lock, std::chrono::milliseconds(ms < 0 ? 1000 : std::min(ms, 1000)));
  }
}

// Every failure, not only the first: an earlier collective's that arrives later still concerns calls
// the first did not (Failures).
void ControlPlane::fail_locally(const Failure& failure) {
  fail_waits(failure);
  on_failure_(failure);
}

void ControlPlane::report_failure(const Failure& failure, bool departing) {
  broadcast_failure(rank_, failure, -1, departing);
}

void ControlPlane::broadcast_failure(int origin, const Failure& failure, int except, bool departing) {
  ByteWriter w;
  w.put<int32_t>(origin);
  w.put<int32_t>(failure.code);
  w.put<uint64_t>(failure.first_sequence);
  w.put_string(failure.message.substr(0, kMaxMessage / 2));
  w.put<uint8_t>(departing ? 1 : 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : peers_) {
    if (p.rank == except) continue;
    try {
      send(p, kFailure, w.bytes());
    } catch (const Error&) {
      // That peer is failing too; it learns of it through its own connection.
    }
  }
}

bool ControlPlane::fail_waits(const Failure& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) return false;
  failed_ = true;
  failure_ = failure;
  cv_.notify_all();
  return true;
}

void ControlPlane::begin_close() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;
}

void ControlPlane::close() {
  std::lock_guard<std::mutex> lock(mu_);  // report_failure may be writing to them (an abort's thread)
  closing_ = true;
  for (auto& p : peers_) p.socket.close();
}

bool Failures::add(const Failure& failure) {
  if (!kept_.empty()) {
    const uint64_t lowest = kept_.back().first_sequence;  // the lowest yet (each kept lowers it)
    if (lowest == 0 || (failure.first_sequence != 0 && failure.first_sequence >= lowest)) return false;
  }
  kept_.push_back(failure);
  return true;
}

const Failure* Failures::concerning(bool p2p, uint64_t sequence) const {
  for (const Failure& failure : kept_)
    if (failure.concerns(p2p, sequence)) return &failure;
  return nullptr;
}

}  // namespace qccl
