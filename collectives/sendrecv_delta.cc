// AQ-SGD's keyed delta exchange (collectives/sendrecv_delta.h): one fragment. The sender sends its
// message (or refusal) as one variable-length message and waits for the answer; the receiver takes
// the message into a buffer of twice the largest message its own store could be sent (a sender whose
// store has drifted apart may hold more keys to evict; a longer message fails the communicator as a
// mismatch), applies it in a Compute step and answers.
//
// The answer, and a refusal after the store's refusal header: u32 status (0: accepted; else 1 + the
// DeltaStoreError::Kind), then the reason, NUL-terminated, in kAnswerBytes.
//
// Wire bytes: the sender's message (known once prepared), the receiver's answer.
#include "collectives/sendrecv_delta.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "collectives/algorithms.h"
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

template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The receiver's Compute step.
class ApplyDelta final : public StepKernel {
 public:
  explicit ApplyDelta(DeltaCall* call) : call_(call) {}
  Phase phase() const override { return Phase::kDecode; }
  const char* name() const override { return "apply_delta"; }
  // Allocates where the store takes new keys (its rows): a store grows with its keys.
  void run(const step::Compute&, StepContext&) const override { call_->apply(); }

 private:
  DeltaCall* call_;
};

class SendRecvDelta final : public Plan {
 public:
  explicit SendRecvDelta(const CollArgs& args) : Plan(args), call_(args.delta), apply_(args.delta) {}

  size_t fragments() const override { return 1; }

  void build(size_t, std::byte*, Program& p) const override {
    p.clear();
    const int peer = args_.peer;
    if (call_->sender()) {
      p.send_length(0, peer, 0, call_->message(), call_->message_capacity(), call_->message_length());
      p.recv(1, peer, 1, call_->answer(), DeltaCall::kAnswerBytes);
      p.wait(0);
      p.wait(1);
    } else {
      p.recv_upto(0, peer, 0, call_->message(), call_->message_capacity(), call_->message_length());
      p.wait(0);
      step::Compute apply{};
      apply.kernel = &apply_;
      apply.count = 1;
      p.compute(apply);
      p.send(1, peer, 1, call_->answer(), DeltaCall::kAnswerBytes);
      p.wait(1);
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    send_to->push_back(args_.peer);
    recv_from->push_back(args_.peer);
  }

  uint64_t wire_bytes_sent() const override {
    return call_->sender() ? *call_->message_length() : DeltaCall::kAnswerBytes;
  }

 private:
  DeltaCall* call_;
  ApplyDelta apply_;
};

}  // namespace

DeltaCall::DeltaCall(std::shared_ptr<DeltaLink> link, bool sender, const void* buffer, kernels::DataType dtype,
                     const uint64_t* keys, size_t nkeys)
    : link_(std::move(link)), sender_(sender), buffer_(buffer), dtype_(dtype), keys_(keys, keys + nkeys) {
  std::lock_guard<std::mutex> lock(link_->mu);
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

void DeltaCall::fail_with(Kind kind, const std::string& message) { failure_ = CallFailure{failure_kind(kind), message}; }

void DeltaCall::prepare(const CollArgs&) {
  std::lock_guard<std::mutex> lock(link_->mu);
  DeltaStore& store = link_->store;
  const size_t header = DeltaStore::header_bytes();
  const size_t values = keys_.size() * store.config().row_values;
  if (!sender_) {
    if (dtype_ != kernels::DataType::kFloat32) grow(link_->x, values);
    capacity_ = std::max(2 * store.max_message_bytes(keys_.size()), header + kAnswerBytes);
    grow(link_->message, capacity_);
    return;
  }
  capacity_ = std::max(store.max_message_bytes(keys_.size()), header + kAnswerBytes);
  uint8_t* out = grow(link_->message, capacity_);
  // float32 rows are read where the caller keeps them; the others through the link's float32 rows
  const float* x = static_cast<const float*>(buffer_);
  if (dtype_ != kernels::DataType::kFloat32) {
    float* converted = grow(link_->x, values);
    kernels::load_float(dtype_, buffer_, converted, values);
    x = converted;
  }
  store.set_warmup(warmup_);
  const auto refused = refusal_of(
      [&] {
        length_ = store.prepare(x, keys_.data(), keys_.size(),
                                kernels::PhiloxKey{store.config().codec.seed, store.sequence(), 0, 0}, out);
      },
      "out of memory preparing the message: nothing sent, the store unchanged");
  if (!refused) return;
  // The receiver is waiting for a message: it gets the refusal and the reason, and fails alike.
  fail_with(refused->first, refused->second);
  DeltaStore::write_refusal(out);
  write_status(out + header, 1 + static_cast<uint32_t>(refused->first), refused->second);
  length_ = header + kAnswerBytes;
}

void DeltaCall::apply() {
  std::lock_guard<std::mutex> lock(link_->mu);
  DeltaStore& store = link_->store;
  const uint8_t* message = link_->message.data();
  const size_t header = DeltaStore::header_bytes();
  if (length_ >= header + kAnswerBytes && DeltaStore::is_refusal(message)) {
    uint32_t status;
    std::string reason;
    const Kind kind = read_status(message + header, &status, &reason);
    fail_with(status == kAccepted ? Kind::kMismatch : kind, "the sender refused the call: " + reason);
    write_status(answer_, kAccepted, "");  // heard; the sender has its reason
    return;
  }
  const auto refused = refusal_of(
      [&] {
        // float32 rows straight into the caller's buffer (which a failed call leaves alone), the
        // others through the link's float32 rows
        const bool direct = dtype_ == kernels::DataType::kFloat32;
        float* x = direct ? static_cast<float*>(const_cast<void*>(buffer_)) : link_->x.data();
        store.receive(message, length_, keys_.data(), keys_.size(), x);
        if (!direct)
          kernels::store_float(dtype_, x, const_cast<void*>(buffer_), keys_.size() * store.config().row_values);
      },
      "out of memory applying the message: the store unchanged");
  if (!refused) {
    write_status(answer_, kAccepted, "");
    return;
  }
  fail_with(refused->first, refused->second);
  write_status(answer_, 1 + static_cast<uint32_t>(refused->first), refused->second);  // the sender fails alike
}

void DeltaCall::complete(const CollArgs&, const Plan&, size_t*) {
  if (!sender_ || failure_) return;  // the receiver is done; a refusing sender prepared nothing
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
    // prepare() made room for the rows and the keys, so commit() allocates nothing: a safety net.
    link_->store.abandon();
    fail_with(Kind::kSystem, std::string("the receiver applied the message, but this store could not (") + e.what() +
                                 "): the two stores now differ; restore both from a checkpoint");
  }
}

const char* sendrecv_delta_cannot_run(const CollArgs& args) {
  if (args.kind != CollKind::kSend && args.kind != CollKind::kRecv) return "point-to-point only";
  return args.delta ? nullptr : "keyed delta calls only (qcclDeltaSend, qcclDeltaRecv)";
}

std::unique_ptr<Plan> make_sendrecv_delta(const CollArgs& args, const PlanOptions&) {
  return std::make_unique<SendRecvDelta>(args);
}

}  // namespace qccl::coll
