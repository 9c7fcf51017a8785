// The host executor: runs one Plan on a Transport with up to `depth` fragments in flight.
//
// An Operation is a passive state machine: advance() does whatever can be done without blocking
// (post transfers, test them, run reductions and copies) and returns whether anything moved. The
// communicator's drive loop calls advance() on every active operation, and blocks on the
// transport's event descriptor when nothing moves. Hot-path budget per fragment: no allocation (the
// Program is rebuilt in place), no system call beyond the transport's own, no lock.
//
// Keys: src/message_key.h. Message 0 of every collective is the frame header; payload message m
// travels as 1 + m mod 65535.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "kernels/intsgd.h"
#include "src/frame.h"
#include "transports/transport.h"

namespace qccl {

struct OperationIdentity {
  uint64_t sequence = 0;  // the collective's number on the communicator (per peer for point-to-point)
  bool p2p = false;
  FrameHeader header;     // what this rank sends on each of its links
  FrameHeader expected;   // what it expects from each peer (differs only for Recv)
};

class Operation {
 public:
  using Clock = std::chrono::steady_clock;

  // `scratch` must hold depth * plan->scratch_bytes() bytes and outlive the operation; `names`
  // gives "rank 3 (host:pid)" for error messages.
  Operation(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan, const OperationIdentity& identity,
            int depth, std::byte* scratch, const std::vector<std::string>* names);
  ~Operation();

  // Throws Error (qcclMismatch, qcclSystemError, ...) when the collective cannot complete.
  bool advance(transport::Transport& transport);
  bool started() const { return started_; }
  bool finished() const;
  // Withdraws every outstanding transfer (after a failure).
  void cancel(transport::Transport& transport);

  // For timeout messages: what the first blocked fragment waits for.
  std::string waiting_for() const;
  Clock::time_point last_progress() const { return last_progress_; }

  const coll::Algorithm& algorithm() const { return algorithm_; }
  const coll::Plan& plan() const { return *plan_; }
  const OperationIdentity& identity() const { return identity_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }
  // Compressed collectives: seconds spent encoding and decoding (float32 loads and sums count as
  // decoding), and how many output values decoded to NaN or Inf (the same on every rank).
  double encode_seconds() const { return encode_seconds_; }
  double decode_seconds() const { return decode_seconds_; }
  size_t nonfinite() const { return nonfinite_; }
  // IntSGD: values this rank clipped, and the exact sums of squares and largest |S| of the sums it
  // decoded (the same on every rank).
  size_t clipped() const { return clipped_; }
  const kernels::IntSums& int_sums() const { return int_sums_; }
  // Before the operation starts: the codec scale its frame headers announce (FrameHeader::codec_scale).
  void set_codec_scale(double scale) { identity_.header.codec_scale = identity_.expected.codec_scale = scale; }

 private:
  struct Transfer {
    transport::Handle handle;
    int peer = -1;
    size_t bytes = 0;
  };
  struct Slot {
    size_t fragment = kIdle;
    size_t pc = 0;
    bool tainted = false;  // met NaN/Inf here or at a peer (see the key layout)
    std::byte* scratch = nullptr;
    coll::Program program;
    Transfer transfers[coll::Program::kSlots];
  };
  struct HeaderLink {
    int peer;
    transport::Handle handle;
    uint8_t bytes[FrameHeader::kBytes];
    bool done = false;
  };
  static constexpr size_t kIdle = ~size_t{0};

  transport::Key key(uint32_t message, bool tainted = false) const;
  void start(transport::Transport& transport);
  bool poll_headers(transport::Transport& transport);
  bool run(Slot& slot, transport::Transport& transport);
  void run_codec_step(const coll::Step& step, Slot& slot);
  // Tests one transfer; true when it is done (handle empty). A received taint bit sets *tainted.
  bool complete(Transfer& transfer, transport::Transport& transport, bool* moved, bool* tainted);
  void next_fragment(Slot& slot);
  const std::string& name(int rank) const;

  const coll::Algorithm& algorithm_;
  std::unique_ptr<coll::Plan> plan_;
  OperationIdentity identity_;
  const std::vector<std::string>* names_;
  std::vector<Slot> slots_;
  std::vector<HeaderLink> header_sends_;
  std::vector<HeaderLink> header_recvs_;
  bool started_ = false;
  bool headers_verified_ = false;
  size_t next_fragment_ = 0;
  size_t fragments_done_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
  double encode_seconds_ = 0;
  double decode_seconds_ = 0;
  size_t nonfinite_ = 0;
  size_t clipped_ = 0;
  kernels::IntSums int_sums_;
  kernels::IntClip clip_;  // int codecs: this rank count's clip range
  Clock::time_point last_progress_;
};

}  // namespace qccl
