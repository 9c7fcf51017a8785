// The transport interface: moving bytes between ranks. A transport knows peers, keys and buffers,
// never codecs or collectives (DESIGN.md "Interfaces").
//
// Contract for every implementation:
//   - isend/irecv never block. The buffer belongs to the transport from the post until test() has
//     returned kDone or kFailed for the handle, or cancel() has returned (for a receive that had
//     matched a message, until the next settle() has returned true; for a send, until the transport
//     is destroyed: UCX cannot withdraw a send, which finishes or fails inside it, so qccl.h asks
//     the caller to keep a failed call's buffers until the communicator's teardown).
//   - Messages from one peer with equal keys are matched in the order they were sent.
//   - A receive matches a message from `peer` whose key equals `key` on every bit that is not set
//     in `ignore`; test() then reports the message's own key, so the layer above can check the
//     ignored bits (qccl puts a collective fingerprint there).
//   - Keys are kKeyBits wide.
//   - Not thread-safe: one thread at a time drives a transport (the communicator's drive lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qccl::transport {

using Key = uint64_t;
constexpr int kKeyBits = 44;
constexpr Key kKeyMask = (Key{1} << kKeyBits) - 1;

// An outstanding send or receive. Empty after it completed, failed or was cancelled. An operation
// that finished inside the post keeps its result here (`finished`), so no request object is needed.
struct Handle {
  void* request = nullptr;
  bool receive = false;
  bool finished = false;
  bool empty() const { return request == nullptr && !finished; }
};

enum class Poll { kPending, kDone, kFailed };

struct Completion {
  size_t bytes = 0;  // bytes received (receives only)
  Key key = 0;       // the sender's key (receives only)
  bool truncated = false;  // kFailed only: the message was longer than the receive's buffer
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual Handle isend(int peer, Key key, const void* buf, size_t bytes) = 0;
  virtual Handle irecv(int peer, Key key, Key ignore, void* buf, size_t bytes) = 0;

  // kDone fills *done and empties the handle; kFailed fills *error (and done->truncated) and empties
  // the handle.
  virtual Poll test(Handle& handle, Completion* done, std::string* error) = 0;
  // Withdraws a pending operation and empties the handle (a receive is cancelled; a send is
  // abandoned and finishes or fails inside the transport). A receive that has matched a message
  // cannot always be withdrawn: it may go on writing the rest of the message into its buffer.
  virtual void cancel(Handle& handle) = 0;
  // After cancel()s: moves the wire until the receives they could not withdraw are done with their
  // buffers, for at most `seconds` (a peer that died mid-message never sends the rest). Returns
  // whether they all are.
  virtual bool settle(double /*seconds*/) { return true; }

  // Moves whatever can move. Returns true when something happened.
  virtual bool progress() = 0;
  // A descriptor that becomes readable when progress() has work, or -1 if the transport can only be
  // polled. Block on it only after arm() returned true.
  virtual int event_fd() const = 0;
  virtual bool arm() = 0;

  // One line for the INFO log: the transports used to reach peers.
  virtual std::string describe() const = 0;
  // The transports that reach `peer` ("sysv/memory, cma/memory", "tcp/eth0"), for the INFO log.
  virtual std::string peer_transports(int peer) const = 0;
};

}  // namespace qccl::transport
