// An in-process network of N ranks behind the Transport interface, for running every rank's plan in
// one thread with the real host executor (the simulator's --execute, and the plan tests): fast,
// deterministic, and strict. Sends complete only once a receive has matched them
// (rendezvous semantics), so a plan that would deadlock on a real network deadlocks here too; a
// receive smaller than its message fails as UCX does ("message truncated").
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/message_key.h"
#include "transports/transport.h"

namespace qccl::sim {

class SimNetwork {
 public:
  struct Request {
    bool receive = false;
    bool done = false;
    bool failed = false;
    bool out_of_order = false;  // ordered mode: the oldest payload message had another key
    size_t bytes = 0;
    transport::Key key = 0;
    // pending send
    int src = -1, dst = -1;
    const void* data = nullptr;
    // pending receive
    transport::Key ignore = 0;
    void* buf = nullptr;
    size_t capacity = 0;
  };

  // ordered: payload messages (message_key::is_payload) match strictly in the order each sender sent
  // them to each receiver, whatever their keys, as on a transport without tags; a receive that meets
  // a payload message with another key than its own fails ("out of order"). Headers still match by key.
  // Payload bytes posted per (source, destination) link (frame headers not counted).
  std::map<std::pair<int, int>, uint64_t> payload_bytes;

  explicit SimNetwork(int nranks, bool ordered = false)
      : pending_sends_(nranks), pending_recvs_(nranks), ordered_(ordered) {}

  Request* send(int src, int dst, transport::Key key, const void* data, size_t bytes) {
    auto* r = track(new Request());
    r->src = src, r->dst = dst, r->key = key, r->data = data, r->bytes = bytes;
    if (message_key::is_payload(key)) payload_bytes[{src, dst}] += bytes;
    pending_sends_[dst].push_back(r);
    return r;
  }

  Request* recv(int dst, int src, transport::Key key, transport::Key ignore, void* buf, size_t capacity) {
    auto* r = track(new Request());
    r->receive = true, r->src = src, r->dst = dst, r->key = key, r->ignore = ignore, r->buf = buf;
    r->capacity = capacity;
    pending_recvs_[dst].push_back(r);
    return r;
  }

  // Matches receives with sends: per (src, dst), messages in send order; receives in post order.
  bool progress() {
    bool moved = false;
    for (size_t dst = 0; dst < pending_recvs_.size(); ++dst) {
      auto& recvs = pending_recvs_[dst];
      for (auto it = recvs.begin(); it != recvs.end();) {
        Request* rv = *it;
        auto& sends = pending_sends_[dst];
        // The oldest message from this source whose key matches (messages with equal keys are
        // therefore matched in the order they were sent).
        auto keys_match = [rv](const Request* sv) {
          return ((sv->key ^ rv->key) & ~rv->ignore & transport::kKeyMask) == 0;
        };
        auto match = std::find_if(sends.begin(), sends.end(), [&](const Request* sv) {
          if (sv->src != rv->src) return false;
          if (ordered_ && message_key::is_payload(rv->key)) return message_key::is_payload(sv->key);
          return keys_match(sv);
        });
        if (match == sends.end()) {
          ++it;
          continue;
        }
        Request* sv = *match;
        sends.erase(match);
        if (ordered_ && !keys_match(sv)) {
          rv->failed = rv->out_of_order = true;
        } else if (sv->bytes > rv->capacity) {
          rv->failed = true;
        } else {
          if (sv->bytes) std::memcpy(rv->buf, sv->data, sv->bytes);
          rv->bytes = sv->bytes;
          rv->key = sv->key;
        }
        rv->done = sv->done = true;
        it = recvs.erase(it);
        moved = true;
      }
    }
    return moved;
  }

  // A completed request whose handle was emptied: nothing refers to it any more.
  void release(Request* r) { owned_.erase(r); }

  void cancel(Request* r) {
    for (auto& q : pending_sends_) q.erase(std::remove(q.begin(), q.end(), r), q.end());
    for (auto& q : pending_recvs_) q.erase(std::remove(q.begin(), q.end(), r), q.end());
  }

  bool idle() const {
    for (const auto& q : pending_sends_)
      if (!q.empty()) return false;
    for (const auto& q : pending_recvs_)
      if (!q.empty()) return false;
    return true;
  }

 private:
  Request* track(Request* r) {
    owned_.emplace(r, std::unique_ptr<Request>(r));
    return r;
  }
  std::vector<std::deque<Request*>> pending_sends_;
  std::vector<std::deque<Request*>> pending_recvs_;
  std::unordered_map<Request*, std::unique_ptr<Request>> owned_;  // until its handle completed
  bool ordered_ = false;
};

// One rank's view of a SimNetwork.
class SimTransport final : public transport::Transport {
 public:
  SimTransport(SimNetwork& net, int rank) : net_(net), rank_(rank) {}

  transport::Handle isend(int peer, transport::Key key, const void* buf, size_t bytes) override {
    transport::Handle h;
    h.request = net_.send(rank_, peer, key, buf, bytes);
    return h;
  }
  transport::Handle irecv(int peer, transport::Key key, transport::Key ignore, void* buf, size_t bytes) override {
    transport::Handle h;
    h.receive = true;
    h.request = net_.recv(rank_, peer, key, ignore, buf, bytes);
    return h;
  }
  transport::Poll test(transport::Handle& h, transport::Completion* done, std::string* error) override {
    auto* r = static_cast<SimNetwork::Request*>(h.request);
    if (!r->done) return transport::Poll::kPending;
    h = transport::Handle{};
    const SimNetwork::Request finished = *r;
    net_.release(r);  // matched, so the network holds it no more
    if (finished.out_of_order) {
      *error = "the oldest payload message from this peer belongs to another fragment (ordered mode)";
      return transport::Poll::kFailed;
    }
    if (finished.failed) {
      *error = "Message truncated";
      done->truncated = true;
      return transport::Poll::kFailed;
    }
    done->bytes = finished.bytes;
    done->key = finished.key;
    return transport::Poll::kDone;
  }
  void cancel(transport::Handle& h) override {
    if (h.request) net_.cancel(static_cast<SimNetwork::Request*>(h.request));
    h = transport::Handle{};
  }
  bool progress() override { return net_.progress(); }
  int event_fd() const override { return -1; }
  bool arm() override { return false; }
  std::string describe() const override { return "simulated"; }
  std::string peer_transports(int) const override { return "simulated"; }

 private:
  SimNetwork& net_;
  int rank_;
};

}  // namespace qccl::sim
