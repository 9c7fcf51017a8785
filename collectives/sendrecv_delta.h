// AQ-SGD's keyed delta calls as the executor runs them (qcclDeltaSend / qcclDeltaRecv and their
// non-blocking forms; the store's arithmetic and its message are collectives/aqsgd_store.h).
//
// One call is one exchange between the two ends of a store's link: the sender's message, in parts
// (the store's head, then each of its sections; each announced by its length, then in chunk-sized
// messages), then the receiver's answer (a fixed kAnswerBytes: accepted, or why not). The sender
// writes the head when the call starts to run (DeltaCall::prepare) and encodes each section in a
// Compute step while the part before it goes out, so the wire carries part p while section p is
// encoded; the receiver checks the head,
// applies each section as it arrives (after the head), and answers once all were applied; the sender
// commits its store only when the receiver accepted (DeltaCall::complete): both stores change, or
// neither, and both calls fail alike. A sender that refuses the call (its budget, before the head;
// a NaN delta or a new m beyond the store's type, at a section) sends refusals with the reason in place of the parts still to go, and
// the receiver fails with that reason. Either way the communicator stays sound: the call alone
// fails (MethodCall::failure). On a failed receive the store is unchanged; the rows of the buffer
// that sections already applied may hold them.
//
// Calls on one store run one after the other, in call order (the communicator runs them so, since
// each reads the store the one before it left), and so touch the store's shared buffers one at a
// time; calls on different stores, and other point-to-point calls, run beside them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/aqsgd_store.h"
#include "collectives/method.h"

namespace qccl::coll {

// A store and what its calls share. `mu` guards everything here: the API's calls on the store
// (settings, checkpoints) and the executor's steps of its calls take it.
struct DeltaLink {
  explicit DeltaLink(const DeltaStore::Config& config) : store(config) {}
  DeltaStore store;
  std::mutex mu;
  bool warmup = false;  // qcclDeltaStoreSetWarmup: what calls made from now on send
  int calls = 0;        // calls in flight: made and not yet over (DeltaCall::end)
  uint64_t owner = 0;   // the communicator (Comm::id) of the latest calls, 0: none yet
  int peer = -1;        // the rank at the link's other end, on `owner`
  // A call's rows in float32 and its message, kept from call to call: megabytes each, whose fresh
  // pages every call would cost more than the codec's arithmetic.
  std::vector<float> x;
  std::vector<uint8_t> message;
};

// Why a call on a store cannot be made now (qcclInvalidUsage): calls in flight on another
// communicator, or a second peer.
struct DeltaUsageError : std::logic_error {
  using std::logic_error::logic_error;
};

// One call, bound to its link when it is made, run when every earlier call on the link completed.
class DeltaCall final : public MethodCall {
 public:
  static constexpr size_t kAnswerBytes = 256;  // the answer: a result, then the reason
  // The message's parts (0: the head; 1 + s: section s), and the plan's fragments: the head's length,
  // a part each (with the next part's length), then the answer.
  static constexpr size_t kParts = 1 + DeltaStore::kSections;
  static constexpr size_t kFragments = 1 + kParts + 1;

  // sender: rows of `buffer` (nkeys x the store's row values, in `dtype`) to send; else the buffer
  // the rows are received into. The keys are copied; the buffer must stay valid until completion.
  // comm (Comm::id) and peer: where the call runs. Throws DeltaUsageError while calls on the link are
  // in flight on another communicator, or when `peer` is not the link's peer on this one; the check
  // and the count of the call are one step, so two threads' calls cannot both pass it.
  DeltaCall(std::shared_ptr<DeltaLink> link, bool sender, const void* buffer, kernels::DataType dtype,
            const uint64_t* keys, size_t nkeys, uint64_t comm, int peer);
  ~DeltaCall() override;
  DeltaCall(const DeltaCall&) = delete;
  DeltaCall& operator=(const DeltaCall&) = delete;

  void prepare(const CollArgs& args) override;
  void complete(const CollArgs& args, const Plan& plan, size_t* nonfinite) override;
  const CallFailure* failure() const override { return failure_ ? &*failure_ : nullptr; }
  void end() override;  // no longer in flight on its link

  // For the plan (collectives/sendrecv_delta.cc), valid after prepare(): part p's bytes, the room
  // for them, and their length (the sender's once written; the receiver's once announced), which
  // travels as these 8 bytes.
  bool sender() const { return sender_; }
  uint8_t* part(size_t p) const { return link_->message.data() + at_[p]; }
  size_t part_capacity(size_t p) const { return capacity_[p]; }
  uint64_t* part_length(size_t p) { return &length_[p]; }
  uint8_t* answer() { return answer_; }
  size_t wire_bytes() const;  // what this end sends
  // The Compute steps' work. Sender: writes section s (or a refusal). Receiver: checks the head;
  // applies section s (only once the head was checked); commits and writes the answer (only once
  // every section was applied).
  void send_section(size_t s);
  void receive_head();
  void receive_section(size_t s);
  void finish();
  bool head_received() const { return head_received_; }
  bool sections_received() const { return sections_received_ == DeltaStore::kSections; }

 private:
  void fail_with(DeltaStoreError::Kind kind, const std::string& message);
  // Receiver: the sender's refusal (its status and reason at status_bytes) becomes the call's failure.
  void hear_refusal(const uint8_t* status_bytes);
  // The sender's refusal, in place of part p (its length set).
  void write_refusal(size_t p);
  // Receiver: whether part p was longer than its room (received into scratch and dropped); the
  // call then fails as a mismatch.
  bool dropped(size_t p);

  std::shared_ptr<DeltaLink> link_;
  bool sender_;
  const void* buffer_;
  kernels::DataType dtype_;
  std::vector<uint64_t> keys_;
  bool warmup_;  // the link's setting when the call was made
  size_t at_[kParts] = {}, capacity_[kParts] = {};
  uint64_t length_[kParts] = {};
  uint8_t answer_[kAnswerBytes] = {};
  bool ended_ = false;  // end() ran (under the link's lock)
  std::optional<CallFailure> failure_;
  DeltaStoreError::Kind failure_store_kind_ = DeltaStoreError::Kind::kArgument;  // the failure's, as stores say it
  // Sender: refused (before the head, or at a section): every part still to go says so.
  std::optional<std::pair<DeltaStoreError::Kind, std::string>> refusal_;
  // Receiver: the executor's thread runs the steps; the flags let the later steps wait (ready()).
  std::atomic<bool> head_received_{false};
  std::atomic<size_t> sections_received_{0};
  bool sender_refused_ = false;  // the failure is the sender's refusal, heard
};

}  // namespace qccl::coll
