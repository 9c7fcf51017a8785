// AQ-SGD's keyed delta exchange (collectives/sendrecv_delta.h) in DeltaCall::kFragments fragments,
// run one at a time: fragment 0 announces the head's length; fragment 1 + p carries part p (the
// store's head, then section p - 1) in messages of a pipeline chunk each, and the next part's
// length; the last, the answer. A part is never one message: a rank counts progress when a message
// completes (QCCL_TIMEOUT), and a part of tens of MiB over a slow link takes longer than the
// timeout; and a message above UCX's rendezvous threshold waits for a handshake that queues behind
// the receiver's own data where both ends send (sendrecv_direct.cc). The receiver builds a part's
// receives from the length announced in the fragment before, hence one fragment at a time.
//
// The sender encodes section s in a Compute step once the first messages of the part before it are
// posted, so the wire carries part p while part p + 1 is encoded, then announces its length. The
// receiver takes each part into room for twice the largest its own store could be sent (a sender
// whose store has drifted apart may hold more keys to evict); a longer part is received into
// scratch and dropped, and the call fails as a mismatch. It checks the head, applies each section,
// and answers once all sections were applied.
//
// The answer, and a refusal after the store's refusal header (or section header): u32 status (0:
// accepted; else 1 + the DeltaStoreError::Kind), then the reason, NUL-terminated, in kAnswerBytes.
//
// Wire bytes: the sender's parts (known once written) and their 8-byte lengths; the receiver's answer.
#include "collectives/sendrecv_delta.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "collectives/algorithms.h"
#include "collectives/ring.h"
#include "kernels/convert.h"

namespace qccl::coll {

namespace {

using Kind = DeltaStoreError::Kind;

CallFailure::Kind failure_kind(Kind kind) {
  switch (kind) {
    case Kind::kArgument: return CallFailure::Kind::kArgument;
    case Kind::kBudget: return CallFailure::Kind::kUsage;
    case Kind::kNonFinite: return CallFailure::Kind::kNonFinite;
    case Kind::kMismatch:
    case Kind::kSequence:
    case Kind::kCorrupt: return CallFailure::Kind::kMismatch;
    case Kind::kSystem: return CallFailure::Kind::kSystem;
  }
  return CallFailure::Kind::kSystem;
}

constexpr uint32_t kAccepted = 0;
constexpr uint32_t kLastKind = static_cast<uint32_t>(Kind::kSystem);

void write_status(uint8_t* out, uint32_t status, const std::string& reason) {
  std::memcpy(out, &status, sizeof status);
  std::snprintf(reinterpret_cast<char*>(out) + sizeof status, DeltaCall::kAnswerBytes - sizeof status, "%s",
                reason.c_str());
}

// The status and reason of an answer or refusal, and the kind of failure it says (none when accepted);
// a status no sender writes reads as a mismatch.
Kind read_status(const uint8_t* in, uint32_t* status, std::string* reason) {
  std::memcpy(status, in, sizeof *status);
  const char* text = reinterpret_cast<const char*>(in) + sizeof *status;
  *reason = std::string(text, strnlen(text, DeltaCall::kAnswerBytes - sizeof *status));
  if (*status > kLastKind + 1) {
    *reason = "an answer with an unknown status " + std::to_string(*status);
    return Kind::kMismatch;
  }
  return *status == kAccepted ? Kind::kArgument : static_cast<Kind>(*status - 1);
}

// Runs f; a store's refusal, or an allocation that failed, comes back as its kind and reason.
template <class F>
std::optional<std::pair<Kind, std::string>> refusal_of(F&& f, const char* out_of_memory) {
  try {
    f();
    return std::nullopt;
  } catch (const DeltaStoreError& e) {
    return std::make_pair(e.kind(), std::string(e.what()));
  } catch (const std::bad_alloc&) {
    return std::make_pair(Kind::kSystem, std::string(out_of_memory));
  }
}

// A Compute step of a delta call: the sender's section encode, the receiver's head check, section
// apply and final commit.
class DeltaStep final : public StepKernel {
 public:
  enum class Work { kSendSection, kReceiveHead, kReceiveSection, kFinish };
  DeltaStep(DeltaCall* call, Work work) : call_(call), work_(work) {}
  Phase phase() const override { return work_ == Work::kSendSection ? Phase::kEncode : Phase::kDecode; }
  const char* name() const override {
    switch (work_) {
      case Work::kSendSection: return "encode_delta";
      case Work::kReceiveHead: return "check_delta";
      case Work::kReceiveSection: return "apply_delta";
      case Work::kFinish: return "commit_delta";
    }
    return "";
  }
  bool ready(const step::Compute&) const override {
    if (work_ == Work::kReceiveSection) return call_->head_received();
    if (work_ == Work::kFinish) return call_->sections_received();
    return true;
  }
  // The receiver allocates where the store takes new keys (its rows): a store grows with its keys.
  void run(const step::Compute& s, StepContext&) const override {
    switch (work_) {
      case Work::kSendSection: call_->send_section(s.index); break;
      case Work::kReceiveHead: call_->receive_head(); break;
      case Work::kReceiveSection: call_->receive_section(s.index); break;
      case Work::kFinish: call_->finish(); break;
    }
  }

 private:
  DeltaCall* call_;
  Work work_;
};

class SendRecvDelta final : public Plan {
 public:
  SendRecvDelta(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        call_(args.delta),
        chunk_(std::max<size_t>(options.chunk_bytes, 1)),
        send_section_(args.delta, DeltaStep::Work::kSendSection),
        receive_head_(args.delta, DeltaStep::Work::kReceiveHead),
        receive_section_(args.delta, DeltaStep::Work::kReceiveSection),
        finish_(args.delta, DeltaStep::Work::kFinish) {}

  size_t fragments() const override { return DeltaCall::kFragments; }
  bool fragments_in_sequence() const override { return true; }
  // A receiver's room to drop a part longer than it could be sent: a chunk (one in flight).
  size_t scratch_bytes() const override { return call_->sender() ? 0 : chunk_; }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int peer = args_.peer;
    const auto compute = [&](const DeltaStep& kernel, size_t section) {
      step::Compute c{};
      c.kernel = &kernel;
      c.count = 1;
      c.index = section;
      p.compute(c);
    };
    if (f == DeltaCall::kFragments - 1) {  // the answer
      if (call_->sender()) {
        p.recv(0, peer, 0, call_->answer(), DeltaCall::kAnswerBytes);
      } else {
        compute(finish_, 0);
        p.send(0, peer, 0, call_->answer(), DeltaCall::kAnswerBytes);
      }
      p.wait(0);
      return;
    }
    constexpr size_t kLengthBytes = sizeof(uint64_t);
    constexpr int kLengthSlot = static_cast<int>(kWindow);
    if (f == 0) {  // the head's length
      if (call_->sender()) p.send(kLengthSlot, peer, 0, call_->part_length(0), kLengthBytes);
      else p.recv(kLengthSlot, peer, 0, call_->part_length(0), kLengthBytes);
      p.wait(kLengthSlot);
      return;
    }
    const size_t part = f - 1;
    const bool next = part + 1 < DeltaCall::kParts;
    const uint64_t bytes = *call_->part_length(part);
    // A receiver drops a part longer than its room (the peer's store or call differs), a chunk at a
    // time into scratch, and the call fails as a mismatch (DeltaCall::dropped). A length no sender
    // could have written (a broken peer) is not received beyond its first chunk: what else comes
    // fails the transport, not this rank's memory.
    const bool drop = !call_->sender() && bytes > call_->part_capacity(part);
    const size_t window = drop ? 1 : kWindow;  // chunks in flight
    const size_t n = drop && bytes > kMaxDroppedBytes ? 1 : ceil_div(static_cast<size_t>(bytes), chunk_);
    for (size_t i = 0; i < n; ++i) {
      const int slot = static_cast<int>(i % window);
      if (i >= window) p.wait(slot);
      const size_t at = i * chunk_, length = std::min<size_t>(chunk_, bytes - at);
      if (call_->sender()) {
        p.send(slot, peer, 0, call_->part(part) + at, length);
        // The next section encoded while the first window of this part is on the wire.
        if (next && i + 1 == std::min(n, window)) compute(send_section_, part);
      } else {
        p.recv(slot, peer, 0, drop ? static_cast<void*>(scratch) : call_->part(part) + at, length);
      }
    }
    if (next && n == 0 && call_->sender()) compute(send_section_, part);  // (a part is never empty)
    if (next) {
      if (call_->sender()) p.send(kLengthSlot, peer, 0, call_->part_length(part + 1), kLengthBytes);
      else p.recv(kLengthSlot, peer, 0, call_->part_length(part + 1), kLengthBytes);
    }
    for (size_t slot = 0; slot < std::min(n, window); ++slot) p.wait(static_cast<int>(slot));
    if (!call_->sender()) {
      if (part == 0) compute(receive_head_, 0);
      else compute(receive_section_, part - 1);
    }
    if (next) p.wait(kLengthSlot);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    send_to->push_back(args_.peer);
    recv_from->push_back(args_.peer);
  }

  uint64_t wire_bytes_sent() const override { return call_->wire_bytes(); }

 private:
  static constexpr size_t kWindow = 8;  // a part's messages in flight
  static constexpr uint64_t kMaxDroppedBytes = uint64_t{1} << 40;  // more than any store's message
  DeltaCall* call_;
  size_t chunk_;  // bytes per message
  DeltaStep send_section_, receive_head_, receive_section_, finish_;
};

}  // namespace

DeltaCall::DeltaCall(std::shared_ptr<DeltaLink> link, bool sender, const void* buffer, kernels::DataType dtype,
                     const uint64_t* keys, size_t nkeys, uint64_t comm, int peer)
    : link_(std::move(link)), sender_(sender), buffer_(buffer), dtype_(dtype), keys_(keys, keys + nkeys) {
  std::lock_guard<std::mutex> lock(link_->mu);
  // Calls on a store are ordered by the communicator that runs them: two at once would not be.
  if (link_->calls > 0 && link_->owner != comm)
    throw DeltaUsageError("store: " + std::to_string(link_->calls) +
                          " calls on it are in flight on another communicator (qcclWait for them first)");
  // One end of one link: a second peer would meet a store in another state (a later communicator,
  // whose ranks may be numbered anew, starts over).
  if (link_->owner == comm && link_->peer >= 0 && link_->peer != peer)
    throw DeltaUsageError("peer = " + std::to_string(peer) + ", but the store's calls on this communicator go to rank " +
                          std::to_string(link_->peer) + ": a store is one end of one link (make one per peer)");
  link_->owner = comm;
  link_->peer = peer;
  warmup_ = link_->warmup;
  ++link_->calls;
  link_->store.prefetch(keys, nkeys);  // a file tier's rows on their way while earlier calls run
}

DeltaCall::~DeltaCall() { end(); }  // a call that never started (its group failed) ends here

void DeltaCall::end() {
  std::lock_guard<std::mutex> lock(link_->mu);
  if (!ended_) --link_->calls;
  ended_ = true;
}

void DeltaCall::fail_with(Kind kind, const std::string& message) {
  failure_ = CallFailure{failure_kind(kind), message};
  failure_store_kind_ = kind;
}

size_t DeltaCall::wire_bytes() const {
  if (!sender_) return kAnswerBytes;
  size_t bytes = 0;
  for (size_t p = 0; p < kParts; ++p) bytes += length_[p] + sizeof length_[p];  // the part and its length
  return bytes;
}

void DeltaCall::prepare(const CollArgs&) {
  std::lock_guard<std::mutex> lock(link_->mu);
  DeltaStore& store = link_->store;
  const size_t values = keys_.size() * store.config().row_values;
  // Room for each part: a receiver's twice the largest its store could be sent; a refusal fits too.
  const size_t twice = sender_ ? 1 : 2;
  size_t at = 0;
  for (size_t p = 0; p < kParts; ++p) {
    const size_t largest = p == 0 ? store.max_head_bytes(keys_.size()) : store.max_section_bytes(keys_.size());
    const size_t refusal = (p == 0 ? DeltaStore::header_bytes() : DeltaStore::section_header_bytes()) + kAnswerBytes;
    at_[p] = at;
    capacity_[p] = std::max(twice * largest, refusal);
    at += capacity_[p];
  }
  grow(link_->message, at);
  if (!sender_) {
    if (dtype_ != kernels::DataType::kFloat32) grow(link_->x, values);
    return;
  }
  // float32 rows are read where the caller keeps them; the others through the link's float32 rows
  const float* x = static_cast<const float*>(buffer_);
  if (dtype_ != kernels::DataType::kFloat32) {
    float* converted = grow(link_->x, values);
    kernels::load_float(dtype_, buffer_, converted, values);
    x = converted;
  }
  store.set_warmup(warmup_);
  refusal_ = refusal_of(
      [&] {
        length_[0] = store.begin_send(x, keys_.data(), keys_.size(),
                                      kernels::PhiloxKey{store.config().codec.seed, store.sequence(), 0, 0}, part(0));
      },
      "out of memory preparing the message: nothing sent, the store unchanged");
  if (!refusal_) return;
  // The receiver is waiting for the message: it gets the refusal and the reason, and fails alike.
  fail_with(refusal_->first, refusal_->second);
  write_refusal(0);
}

void DeltaCall::write_refusal(size_t p) {
  uint8_t* out = part(p);
  size_t header;
  if (p == 0) {
    DeltaStore::write_refusal(out);
    header = DeltaStore::header_bytes();
  } else {
    DeltaStore::write_section_refusal(p - 1, out);
    header = DeltaStore::section_header_bytes();
  }
  write_status(out + header, 1 + static_cast<uint32_t>(refusal_->first), refusal_->second);
  length_[p] = header + kAnswerBytes;
}

void DeltaCall::send_section(size_t s) {
  std::lock_guard<std::mutex> lock(link_->mu);
  if (!refusal_) {
    refusal_ = refusal_of([&] { link_->store.send_section(s, part(1 + s)); },
                          "out of memory encoding the message: the store unchanged");
    if (!refusal_) {
      length_[1 + s] = link_->store.section_bytes(s);
      return;
    }
    link_->store.abandon();
    fail_with(refusal_->first, refusal_->second);
  }
  write_refusal(1 + s);
}

void DeltaCall::hear_refusal(const uint8_t* status_bytes) {
  uint32_t status;
  std::string reason;
  const Kind kind = read_status(status_bytes, &status, &reason);
  fail_with(status == kAccepted ? Kind::kMismatch : kind, "the sender refused the call: " + reason);
  sender_refused_ = true;
}

bool DeltaCall::dropped(size_t p) {
  if (length_[p] <= capacity_[p]) return false;
  fail_with(Kind::kMismatch, "the sender's message part " + std::to_string(p) + " has " + std::to_string(length_[p]) +
                                 " bytes, more than this end's room of " + std::to_string(capacity_[p]) +
                                 " (twice the most its store could be sent for " + std::to_string(keys_.size()) +
                                 " keys): the two ends' stores or calls differ");
  return true;
}

void DeltaCall::receive_head() {
  std::lock_guard<std::mutex> lock(link_->mu);
  const uint8_t* head = part(0);
  const size_t header = DeltaStore::header_bytes();
  if (dropped(0)) {
  } else if (length_[0] >= header + kAnswerBytes && DeltaStore::is_refusal(head)) {
    hear_refusal(head + header);
  } else if (const auto refused = refusal_of([&] { link_->store.receive_head(head, length_[0], keys_.data(), keys_.size()); },
                                             "out of memory receiving the message: the store unchanged")) {
    fail_with(refused->first, refused->second);
  }
  head_received_ = true;
}

void DeltaCall::receive_section(size_t s) {
  std::lock_guard<std::mutex> lock(link_->mu);
  const uint8_t* section = part(1 + s);
  const size_t header = DeltaStore::section_header_bytes();
  if (failure_ || dropped(1 + s)) {  // the head's, or an earlier section's: the store is abandoned at the end
  } else if (length_[1 + s] >= header + kAnswerBytes && DeltaStore::is_section_refusal(section, length_[1 + s])) {
    hear_refusal(section + header);
  } else {
    // float32 rows straight into the caller's buffer, the others through the link's float32 rows
    float* x = dtype_ == kernels::DataType::kFloat32 ? static_cast<float*>(const_cast<void*>(buffer_)) : link_->x.data();
    if (const auto refused = refusal_of([&] { link_->store.receive_section(s, section, length_[1 + s], x); },
                                        "out of memory applying the message: the store unchanged"))
      fail_with(refused->first, refused->second);
  }
  ++sections_received_;
}

void DeltaCall::finish() {
  std::lock_guard<std::mutex> lock(link_->mu);
  DeltaStore& store = link_->store;
  if (!failure_) {
    // receive_head() made room for the rows and the keys: commit() allocates nothing (a safety net)
    if (const auto refused = refusal_of([&] { store.commit(); }, "out of memory committing the message")) {
      fail_with(refused->first, refused->second);
    } else {
      if (dtype_ != kernels::DataType::kFloat32)
        kernels::store_float(dtype_, link_->x.data(), const_cast<void*>(buffer_), keys_.size() * store.config().row_values);
      write_status(answer_, kAccepted, "");
      return;
    }
  }
  store.abandon();
  if (sender_refused_) write_status(answer_, kAccepted, "");  // heard; the sender has its reason
  else write_status(answer_, 1 + static_cast<uint32_t>(failure_store_kind_), failure_->message);  // it fails alike
}

void DeltaCall::complete(const CollArgs&, const Plan&, size_t*) {
  if (!sender_ || failure_) return;  // the receiver is done; a refusing sender abandoned its message
  std::lock_guard<std::mutex> lock(link_->mu);
  uint32_t status;
  std::string reason;
  const Kind kind = read_status(answer_, &status, &reason);
  if (status != kAccepted) {
    link_->store.abandon();
    fail_with(kind, "the receiver refused the message: " + reason);
    return;
  }
  try {
    link_->store.commit();
  } catch (const std::exception& e) {
    // begin_send() made room for the rows and the keys, so commit() allocates nothing: a safety net.
    link_->store.abandon();
    fail_with(Kind::kSystem, std::string("the receiver applied the message, but this store could not (") + e.what() +
                                 "): the two stores now differ; restore both from a checkpoint");
  }
}

const char* sendrecv_delta_cannot_run(const CollArgs& args) {
  if (args.kind != CollKind::kSend && args.kind != CollKind::kRecv) return "point-to-point only";
  return args.delta ? nullptr : "keyed delta calls only (qcclDeltaSend, qcclDeltaRecv)";
}

std::unique_ptr<Plan> make_sendrecv_delta(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<SendRecvDelta>(args, options);
}

}  // namespace qccl::coll
