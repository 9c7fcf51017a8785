// AQ-SGD's keyed delta calls as the executor runs them (qcclDeltaSend / qcclDeltaRecv and their
// non-blocking forms; the store's arithmetic and its message are collectives/aqsgd_store.h).
//
// One call is one exchange between the two ends of a store's link: the sender's message (the store's
// header, then its payload: one variable-length transport message), then the receiver's answer (a
// fixed kAnswerBytes: accepted, or why not). The sender prepares its message when the call starts
// to run (DeltaCall::prepare), the receiver applies the message in a Compute step as soon as it has
// arrived and answers, and the sender commits its store only when the receiver accepted
// (DeltaCall::complete): both stores change, or neither, and both calls fail alike. A sender that
// refuses the call itself (its budget, a NaN delta) sends a refusal with the reason in place of the
// message, and the receiver fails with that reason. Either way the communicator stays sound: the
// call alone fails (MethodCall::failure).
//
// Calls on one store run one after the other, in call order (the communicator runs them so, since
// each reads the store the one before it left), and so touch the store's shared buffers one at a
// time; calls on different stores, and other point-to-point calls, run beside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
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
  const void* owner = nullptr;  // the communicator of the calls in flight (the API's check)
  // A call's rows in float32 and its message, kept from call to call: megabytes each, whose fresh
  // pages every call would cost more than the codec's arithmetic.
  std::vector<float> x;
  std::vector<uint8_t> message;
};

// One call, bound to its link when it is made, run when every earlier call on the link completed.
class DeltaCall final : public MethodCall {
 public:
  static constexpr size_t kAnswerBytes = 256;  // the answer: a result, then the reason

  // sender: rows of `buffer` (nkeys x the store's row values, in `dtype`) to send; else the buffer
  // the rows are received into. The keys are copied; the buffer must stay valid until completion.
  DeltaCall(std::shared_ptr<DeltaLink> link, bool sender, const void* buffer, kernels::DataType dtype,
            const uint64_t* keys, size_t nkeys);
  ~DeltaCall() override;
  DeltaCall(const DeltaCall&) = delete;
  DeltaCall& operator=(const DeltaCall&) = delete;

  void prepare(const CollArgs& args) override;
  void complete(const CollArgs& args, const Plan& plan, size_t* nonfinite) override;
  const CallFailure* failure() const override { return failure_ ? &*failure_ : nullptr; }
  void end() override;  // no longer in flight on its link

  // For the plan (collectives/sendrecv_delta.cc), valid after prepare().
  bool sender() const { return sender_; }
  uint8_t* message() const { return link_->message.data(); }
  size_t message_capacity() const { return capacity_; }
  size_t* message_length() { return &length_; }
  uint8_t* answer() { return answer_; }
  // Receiver: applies the message that arrived and writes the answer (a Compute step's work).
  void apply();

 private:
  void fail_with(DeltaStoreError::Kind kind, const std::string& message);

  std::shared_ptr<DeltaLink> link_;
  bool sender_;
  const void* buffer_;
  kernels::DataType dtype_;
  std::vector<uint64_t> keys_;
  bool warmup_;          // the link's setting when the call was made
  size_t capacity_ = 0;  // the message buffer's, for this call
  size_t length_ = 0;    // the message's: written by the sender's prepare, or by the receive
  uint8_t answer_[kAnswerBytes] = {};
  bool ended_ = false;  // end() ran (under the link's lock)
  std::optional<CallFailure> failure_;
};

}  // namespace qccl::coll
