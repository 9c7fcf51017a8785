// The host executor: runs one Plan on a Transport with up to `depth` fragments in flight.
//
// An Operation is a passive state machine: advance() does whatever can be done without blocking
// (post transfers, test them, run reductions and copies) and returns whether anything moved. The
// communicator's drive loop calls advance() on every active operation, and blocks on the
// transport's event descriptor when nothing moves. Hot-path budget per fragment: no allocation (the
// Program is rebuilt in place), no system call beyond the transport's own, no lock.
//
// Frame headers (src/frame.h) travel on the plan's links (Plan::links): message 0 to every rank the
// plan sends to, checked before any payload from that peer is used. That is enough when every rank's
// output depends on every other rank's data, which then reaches it only through checked links. It is
// not enough for Broadcast and Reduce: data flows one way, from or to the root, so ranks that
// disagree (on the root above all, which changes the plan's shape) may exchange nothing at all, and
// an agreeing rank may complete before anyone has seen the disagreement. Their headers therefore
// also go through ceil(log2 n) agreement rounds, as in a dissemination barrier: in round k a rank
// sends its header to rank + 2^k and receives from rank - 2^k (mod n; round 0 is the ring), and it
// sends round k only after it has checked rounds 0 .. k-1. A checked round k thus vouches for the 2^k
// ranks before the sender as well, so a rank that has checked every round knows that every rank
// announced the same header. The operation finishes only then: a disagreement anywhere fails the
// rank that sees it (qcclMismatch, which the control plane relays to every rank), while every other
// rank waits for a round that never comes and learns of it through the relay. The payload does not
// wait for the rounds; only completion does.
//
// Keys: [p2p:1 | sequence:14 | taint:1 | message:16 | fingerprint:12] (transports/ adds the sender's
// rank). The taint bit carries "this fragment met a non-finite value" from rank to rank at no cost in
// bytes (Marsit's sign bits have no room for NaN); receives ignore it and the fingerprint.
// Message 0 of every collective is the frame header on the plan's links; messages 0xfff0 + k are
// agreement round k; payload message m travels as 1 + m mod 0xffef.
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
  // Agreement round k (see above): the header sent to rank + 2^k and the one from rank - 2^k.
  struct AgreementRound {
    HeaderLink send;
    HeaderLink recv;
    bool sent = false;  // posted (only once rounds 0 .. k-1 are checked)
  };
  static constexpr size_t kIdle = ~size_t{0};

  transport::Key key(uint32_t message, bool tainted = false) const;
  void start(transport::Transport& transport);
  bool poll_headers(transport::Transport& transport);
  bool poll_agreement(transport::Transport& transport);
  // Decodes a received header and fails (qcclMismatch, qcclRemoteError) unless it is what this rank
  // expects from link.peer.
  void check_header(const HeaderLink& link, size_t bytes) const;
  bool agreed() const { return agreed_rounds_ == agreement_.size(); }
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
  std::vector<AgreementRound> agreement_;  // Broadcast and Reduce on more than one rank
  size_t agreed_rounds_ = 0;               // rounds 0 .. agreed_rounds_ - 1 are checked
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
