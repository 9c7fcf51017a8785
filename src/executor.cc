#include "src/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <variant>

#include "base/errors.h"
#include "collectives/device_kernels.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/feedback.h"
#include "kernels/reduce.h"
#include "src/message_key.h"

namespace qccl {

using message_key::kFingerprintBits;
using message_key::kIgnoredBits;
using message_key::kTaintBit;

namespace {

// Message ids (executor.h): 0 the plan's frame headers, then the payload, then the agreement rounds.
constexpr uint32_t kFirstAgreementMessage = 0xfff0;
constexpr uint32_t kPayloadMessages = kFirstAgreementMessage - 1;
constexpr size_t kMaxAgreementRounds = 0x10000 - kFirstAgreementMessage;
// How long a collective without agreement rounds makes no progress before it listens for a rooted
// collective's first round (PlanExecution::listen_for_rooted).
constexpr auto kStrayRoundDelay = std::chrono::milliseconds(100);

using coll::rooted;

// One call's plan, run by the host executor (numerics on this CPU, buffers in host memory) or by the
// device executor (`device` set: data steps enqueued on the device's stream, transfers staged through
// pinned host buffers). Scheduling, headers and ordering are the same code for both.
class PlanExecution final : public Execution {
 public:
  PlanExecution(transport::Transport& transport, const HostExecutorOptions& options, const coll::Algorithm& algorithm,
                std::unique_ptr<coll::Plan> plan, const OperationIdentity& identity, std::byte* scratch,
                const std::vector<std::string>* names, std::vector<std::unique_ptr<uint8_t[]>>* abandoned,
                std::shared_ptr<DeviceExecutor::Shared> device);
  ~PlanExecution() override;

  bool advance() override;
  bool started() const override { return started_; }
  bool finished() const override;
  void set_fragment_limit(size_t limit) override { fragment_limit_ = limit; }
  size_t fragments_in_flight() const override { return in_flight_; }
  // On wire A a fragment counts as started once it posted everything: the wire has no tags, so the
  // next collective (which the communicator starts once this one started its last fragment) must not
  // post before this one has posted all it will.
  bool started_every_fragment() const override {
    return started_ && (wire_ ? fragments_done_ : next_fragment_) >= plan_->fragments();
  }
  bool queued_all() const override { return device_ ? started_ && fragments_done_ >= plan_->fragments() : finished(); }
  void cancel() override;
  std::string waiting_for() const override;
  Clock::time_point last_progress() const override { return last_progress_; }
  const ExecutionStats& stats() const override { return stats_; }
  const coll::Algorithm& algorithm() const override { return algorithm_; }
  const coll::Plan& plan() const override { return *plan_; }
  const OperationIdentity& identity() const override { return identity_; }
  void set_codec_scale(double scale) override { identity_.header.codec_scale = identity_.expected.codec_scale = scale; }
  void set_scratch(std::byte* scratch) override {
    if (device_) return;  // its scratch is device memory, taken when it starts (start_on_device)
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].scratch = scratch + i * plan_->scratch_stride();
  }

 private:
  struct Transfer {
    transport::Handle handle;
    int peer = -1;
    size_t bytes = 0;            // the posted length (a receive's capacity)
    size_t* received = nullptr;  // a variable-length receive stores its length here
    // Device executions: the pinned buffer the bytes cross (Device::Memory::kPinned, `capacity`
    // bytes, kept across fragments) and the point on the stream after which the host may touch it: a
    // staged send's copy into it, a receive's copy out of it.
    void* staging = nullptr;
    size_t capacity = 0;
    Device::Ticket ready = 0;
    bool staged_send = false;  // a send whose bytes are on their way to `staging`: posted once ready
    transport::Key key = 0;    // ...with this key
    void* device_dst = nullptr;  // a receive's destination, filled from `staging` once it arrived
    bool wire_recv = false;      // wire A: a receive posted in the open group, not waited for yet
    // Device executions of plans with step kernels: a staged send's taint word, copied to pinned
    // memory beside its bytes and read when it is posted (the key's taint bit); on wire A, a
    // receive's taint word from the peer, added to the slot's once the receive is waited for.
    const unsigned long long* staged_taint = nullptr;
    bool fold_taint = false;
    // Device executions, messages of variable length: a send's length, copied from the device beside
    // its bytes (posted with that length), and a receive's, copied to the device after its bytes.
    const size_t* staged_length = nullptr;
    size_t capacity_sent = 0;
    void* received_word = nullptr;  // a receive's length on its way to `received`, in device memory
    bool abandoned = false;      // cancelled while the transport held it (cancel)
  };
  struct Slot {
    size_t fragment = kIdle;
    size_t pc = 0;
    bool tainted = false;  // met NaN/Inf here or at a peer (see message_key.h)
    // Device executions of plans with step kernels (Compute steps): the fragment's taint also lives
    // on the device, where this rank's kernels find NaN or Inf (taint_words: words_ words of device
    // memory, the slot's own taint then one per transfer slot for wire A's incoming words).
    bool device_taint = false;
    unsigned long long* taint_words = nullptr;
    std::byte* scratch = nullptr;
    coll::Program program;
    std::vector<Transfer> transfers;  // grown to the program's transfer_slots(), never shrunk
  };
  // A frame header on its way. Its bytes live on the heap: a transfer still pending when the execution
  // is cancelled is abandoned to the transport, which may read or write them until it is destroyed,
  // so cancel() hands them to the executor, which outlives the transport.
  struct HeaderLink {
    int peer = -1;
    transport::Handle handle;
    std::unique_ptr<uint8_t[]> bytes{new uint8_t[FrameHeader::kBytes]};
    bool done = false;
  };
  // Agreement round k (executor.h): the header sent to rank + 2^k and the one from rank - 2^k.
  struct AgreementRound {
    HeaderLink send;
    HeaderLink recv;
    bool sent = false;  // posted (only once rounds 0 .. k-1 are checked)
  };
  static constexpr size_t kIdle = ~size_t{0};

  // The key of one of the call's messages. `to_receiver`: the frame header that travels toward a
  // point-to-point call's receiving end, which a keyed delta call sends as a plain call would
  // (src/message_key.h).
  transport::Key key(uint32_t message, bool tainted = false, bool to_receiver = false) const {
    uint64_t sequence = identity_.sequence;
    if (identity_.p2p && identity_.keyed && !to_receiver) {
      const coll::CollArgs& args = plan_->args();
      const bool sends = args.kind == coll::CollKind::kSend;
      sequence = message_key::keyed_sequence(sequence, sends ? args.rank > args.peer : args.peer > args.rank);
    } else if (identity_.p2p) {
      sequence = message_key::p2p_sequence(sequence);
    }
    return message_key::make(identity_.p2p, sequence, tainted, message, identity_.header.fingerprint());
  }
  void start();
  bool poll_headers();
  bool poll_agreement();
  void listen_for_rooted();
  // Decodes a received header and fails (qcclMismatch, qcclRemoteError) unless it is what this rank
  // expects from link.peer.
  void check_header(const HeaderLink& link, size_t bytes) const;
  bool agreed() const { return agreed_rounds_ == agreement_.size(); }
  // Starts the next fragment in `slot` (idle, or holding a fragment that completed), unless none is
  // left, the fragment limit is reached, or it would be too far ahead of the oldest fragment in
  // flight for their keys to differ (it is then tried again later).
  void next_fragment(Slot& slot);
  bool run(Slot& slot);
  bool run_steps(Slot& slot);
  // One step of the slot's fragment; false when it must wait (the step is then retried).
  bool execute(const coll::step::Recv& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Send& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Wait& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Compute& s, Slot& slot, bool* moved);
  void run_on_host(const coll::Step& data_step);
  // Device executions: the transfer's staging buffer holds at least `bytes` once it is free, or false
  // while the stream may still copy out of it.
  bool stage(Transfer& t, size_t bytes);
  // Wire A: whether a transfer may be posted now (then within the open group), and the group's end:
  // before a data step, at the end of the fragment, and whenever the slot stops for now.
  bool post_on_wire();
  void end_group();
  // Device executions: posts a staged send whose bytes reached the staging buffer (true if it did).
  // Polled on every advance, since the fragment may be waiting for something else, such as the
  // peer's message that answers this one.
  bool post_staged_send(Transfer& t);
  // Device executions: takes the scratch and counters at the start, enqueues the read-back of the
  // non-finite count after the last fragment, and learns when the device reached it.
  void start_on_device();
  void start_device_fragment(Slot& slot);
  // Device executions: the pinned word of a slot's transfer for its taint (a staged send's) or its
  // message's length.
  unsigned long long* staged_word(const Slot& slot, bool length, uint32_t transfer);
  bool finish_on_device();
  // Ordered mode: whether a fragment older than the slot's still has a transfer of the same direction
  // with `peer` to post.
  bool earlier_fragment_posts(const Slot& slot, int peer, bool receive) const;
  Transfer& transfer(Slot& slot, uint32_t index);
  void count_sent(int peer, size_t bytes);  // the statistics of what was posted
  // Tests one transfer; true when it is done (handle empty). A received taint bit sets *tainted.
  bool complete(Transfer& transfer, bool* moved, bool* tainted);
  const std::string& name(int rank) const { return (*names_)[rank]; }

  transport::Transport& transport_;
  const HostExecutorOptions options_;
  const coll::Algorithm& algorithm_;
  std::unique_ptr<coll::Plan> plan_;
  OperationIdentity identity_;
  const std::vector<std::string>* names_;
  std::vector<std::unique_ptr<uint8_t[]>>* abandoned_;  // the executor's: see HeaderLink
  std::vector<Slot> slots_;
  std::vector<HeaderLink> header_sends_;
  std::vector<HeaderLink> header_recvs_;
  std::vector<AgreementRound> agreement_;  // rooted collectives, and any on wire A, on more than one rank
  size_t agreed_rounds_ = 0;               // rounds 0 .. agreed_rounds_ - 1 are checked
  HeaderLink stray_round_;                 // calls without rounds, once stalled (listen_for_rooted)
  bool started_ = false;
  bool headers_verified_ = false;
  size_t next_fragment_ = 0;
  size_t fragments_done_ = 0;
  size_t in_flight_ = 0;                    // slots holding a fragment
  size_t fragment_limit_ = ~size_t{0};      // set_fragment_limit (the slots bound it too)
  ExecutionStats stats_;
  Clock::time_point last_progress_;
  // Device executions only.
  std::shared_ptr<DeviceExecutor::Shared> shared_;
  Device* device_ = nullptr;
  PeerWire* wire_ = nullptr;  // wire A (else the transport, staged)
  bool group_open_ = false;   // wire A: transfers are being gathered into one group
  std::vector<std::pair<const std::byte*, size_t>> group_sends_;  // ...and what its sends read
  bool wire_posted_ = false;  // wire A: something was posted (a failure must abort the wire)
  DeviceExecutor::Block device_scratch_;
  DeviceExecutor::Block counters_;  // coll::DeviceCounters (device memory)...
  DeviceExecutor::Block readback_;  // ...and its copy on the host (pinned), while it comes back
  DeviceExecutor::Block taint_;     // Slot::taint_words of every slot (device memory)...
  // ...and per slot and transfer slot two pinned words: a staged send's taint word, and a message's
  // length (variable-length messages) on its way to or from the device (staged_word).
  DeviceExecutor::Block staged_words_;
  size_t words_ = 0;  // per slot in taint_ (twice that in staged_words_), fixed by the first fragment
  Device::Ticket tail_ = 0;         // the read-back's point on the stream, once enqueued
  Device::Mark input_ = 0;          // the caller's stream at the call, until the execution starts
  bool device_done_ = false;        // the device reached it
};

PlanExecution::PlanExecution(transport::Transport& transport, const HostExecutorOptions& options,
                             const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                             const OperationIdentity& identity, std::byte* scratch,
                             const std::vector<std::string>* names,
                             std::vector<std::unique_ptr<uint8_t[]>>* abandoned,
                             std::shared_ptr<DeviceExecutor::Shared> device)
    : transport_(transport),
      options_(options),
      algorithm_(algorithm),
      plan_(std::move(plan)),
      identity_(identity),
      names_(names),
      abandoned_(abandoned),
      last_progress_(Clock::now()),
      shared_(std::move(device)),
      device_(shared_ ? &shared_->device() : nullptr),
      wire_(shared_ && DeviceExecutor::on_wire(identity, *plan_) ? shared_->wire() : nullptr) {
  slots_.resize(pipeline_slots(*plan_, options.depth));
  for (Slot& slot : slots_) slot.program.set_default_codec(plan_->args().codec);
  if (scratch) set_scratch(scratch);
  // What the caller queued on its stream before this call runs first: the point is taken now, at the
  // call, and waited for when the execution starts (start_on_device).
  if (device_) input_ = device_->mark(plan_->args().stream);
}

PlanExecution::~PlanExecution() {
  if (!device_) return;
  if (input_) device_->forget(input_);  // never started
  // After a failure the stream may still copy into or out of the buffers given back here. A device
  // that cannot even synchronize keeps them: nothing may reuse memory its work may still touch.
  try {
    if (started_ && !device_done_) device_->synchronize();  // one that never started enqueued nothing
  } catch (const Error&) {
    return;
  }
  for (Slot& slot : slots_)
    for (Transfer& t : slot.transfers)
      if (t.staging) shared_->give({Device::Memory::kPinned, t.staging, t.capacity}, t.abandoned);
  shared_->give(device_scratch_);
  shared_->give(counters_);
  shared_->give(readback_);  // failed after its last step was enqueued
  shared_->give(taint_);
  shared_->give(staged_words_);
}

void PlanExecution::start_on_device() {
  device_->wait(input_);
  input_ = 0;
  const size_t scratch = plan_->scratch_stride();
  if (scratch) {
    device_scratch_ = shared_->take(Device::Memory::kDevice, scratch * slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].scratch = static_cast<std::byte*>(device_scratch_.p) + i * scratch;
  }
  counters_ = shared_->take(Device::Memory::kDevice, sizeof(coll::DeviceCounters));
  device_->zero(counters_.p, sizeof(coll::DeviceCounters));
}

unsigned long long* PlanExecution::staged_word(const Slot& slot, bool length, uint32_t transfer) {
  return static_cast<unsigned long long*>(staged_words_.p) + (&slot - slots_.data()) * 2 * words_ +
         (length ? words_ : 1) + transfer;
}

// A fragment just built, on the device: the words of its slot (sized from the plan's first fragment:
// the slot's taint and one per transfer slot), and, where its plan has step kernels, its taint kept
// on the device too, the words zeroed on the stream after the slot's previous fragment's work.
void PlanExecution::start_device_fragment(Slot& slot) {
  const size_t needed = slot.program.transfer_slots() + 1;
  if (words_ == 0) {
    words_ = std::max<size_t>(16, needed);
    taint_ = shared_->take(Device::Memory::kDevice, slots_.size() * words_ * sizeof(unsigned long long));
    staged_words_ = shared_->take(Device::Memory::kPinned, slots_.size() * 2 * words_ * sizeof(unsigned long long));
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].taint_words = static_cast<unsigned long long*>(taint_.p) + i * words_;
  }
  if (needed > words_)
    fail(qcclInternalError, "%s (%s): fragment %zu has %zu transfer slots, an earlier one %zu",
         identity_.header.describe().c_str(), algorithm_.name, slot.fragment, needed - 1, words_ - 1);
  const auto& steps = slot.program.steps();
  slot.device_taint = std::any_of(steps.begin(), steps.end(),
                                  [](const coll::Step& s) { return std::holds_alternative<coll::step::Compute>(s); });
  if (slot.device_taint) device_->zero(slot.taint_words, words_ * sizeof(unsigned long long));
}

// The collective's last data step is enqueued once every fragment completed on the host; the
// non-finite count follows it back, and the caller's stream waits for all of it.
bool PlanExecution::finish_on_device() {
  if (device_done_ || fragments_done_ < plan_->fragments()) return false;
  // Its posted transfers were withdrawn by an abort: what the device holds is not the result.
  if (wire_posted_ && wire_->aborted())
    fail(qcclRemoteError, "%s (%s): %s was aborted after another collective failed", identity_.header.describe().c_str(),
         algorithm_.name, wire_->describe().c_str());
  if (!tail_) {
    readback_ = shared_->take(Device::Memory::kPinned, sizeof(coll::DeviceCounters));
    device_->copy(readback_.p, counters_.p, sizeof(coll::DeviceCounters));
    tail_ = device_->record();
    device_->signal(plan_->args().stream);
  }
  if (!device_->reached(tail_)) return false;
  coll::DeviceCounters counters;
  std::memcpy(&counters, readback_.p, sizeof counters);
  stats_.nonfinite += counters.nonfinite;
  plan_->absorb(counters);
  shared_->give(readback_);
  readback_ = {};
  device_done_ = true;
  return true;
}

bool PlanExecution::stage(Transfer& t, size_t bytes) {
  if (!device_->reached(t.ready)) return false;
  if (t.capacity < bytes) {
    if (t.staging) shared_->give({Device::Memory::kPinned, t.staging, t.capacity});
    const DeviceExecutor::Block block = shared_->take(Device::Memory::kPinned, bytes);
    t.staging = block.p;
    t.capacity = block.bytes;
  }
  return true;
}

void PlanExecution::start() {
  started_ = true;
  last_progress_ = Clock::now();  // it may have waited for an earlier call on its codec state
  if (device_) start_on_device();
  std::vector<int> send_to, recv_from;
  plan_->links(&send_to, &recv_from);
  auto unique = [](std::vector<int>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  unique(send_to);
  unique(recv_from);
  // Receives first, so that a header from a fast peer finds its buffer posted.
  const bool receives = plan_->args().kind == coll::CollKind::kRecv;
  header_recvs_.resize(recv_from.size());
  for (size_t i = 0; i < recv_from.size(); ++i) {
    HeaderLink& link = header_recvs_[i];
    link.peer = recv_from[i];
    link.handle = transport_.irecv(link.peer, key(0, false, receives), kIgnoredBits, link.bytes.get(),
                                   FrameHeader::kBytes);
  }
  header_sends_.resize(send_to.size());
  for (size_t i = 0; i < send_to.size(); ++i) {
    HeaderLink& link = header_sends_[i];
    link.peer = send_to[i];
    identity_.header.encode(link.bytes.get());
    link.handle = transport_.isend(link.peer, key(0, false, !receives), link.bytes.get(), FrameHeader::kBytes);
  }
  headers_verified_ = header_recvs_.empty();

  const coll::CollArgs& args = plan_->args();
  if ((rooted(args.kind) || wire_) && args.nranks > 1) {
    size_t rounds = 0;
    while ((int64_t{1} << rounds) < args.nranks) ++rounds;
    if (rounds > kMaxAgreementRounds)
      fail(qcclInternalError, "%s: %d ranks need %zu agreement rounds, more than the %zu message ids kept for them",
           identity_.header.describe().c_str(), args.nranks, rounds, kMaxAgreementRounds);
    agreement_.resize(rounds);
    for (size_t k = 0; k < rounds; ++k) {
      const int distance = 1 << k;
      AgreementRound& round = agreement_[k];
      round.recv.peer = (args.rank - distance + args.nranks) % args.nranks;
      round.recv.handle = transport_.irecv(round.recv.peer, key(kFirstAgreementMessage + static_cast<uint32_t>(k)),
                                           kIgnoredBits, round.recv.bytes.get(), FrameHeader::kBytes);
      round.send.peer = (args.rank + distance) % args.nranks;
      identity_.header.encode(round.send.bytes.get());
    }
    AgreementRound& first = agreement_[0];
    first.send.handle =
        transport_.isend(first.send.peer, key(kFirstAgreementMessage), first.send.bytes.get(), FrameHeader::kBytes);
    first.sent = true;
  }
  for (Slot& slot : slots_) next_fragment(slot);
}

void PlanExecution::next_fragment(Slot& slot) {
  if (slot.fragment != kIdle) {
    slot.fragment = kIdle;
    --in_flight_;
  }
  if (next_fragment_ >= plan_->fragments() || in_flight_ >= fragment_limit_) return;
  for (const Slot& other : slots_)
    if (other.fragment != kIdle && next_fragment_ - other.fragment >= kPayloadMessages) return;
  slot.fragment = next_fragment_++;
  ++in_flight_;
  slot.pc = 0;
  slot.tainted = false;
  plan_->build(slot.fragment, slot.scratch, slot.program);
  if (slot.transfers.size() < slot.program.transfer_slots()) slot.transfers.resize(slot.program.transfer_slots());
  if (device_) start_device_fragment(slot);
}

bool PlanExecution::poll_headers() {
  bool moved = false;
  std::string error;
  transport::Completion done;
  for (HeaderLink& link : header_sends_) {
    if (link.done) continue;
    switch (transport_.test(link.handle, &done, &error)) {
      case transport::Poll::kPending:
        break;
      case transport::Poll::kDone:
        link.done = moved = true;
        break;
      case transport::Poll::kFailed:
        fail(qcclRemoteError, "%s: sending the frame header to %s failed: %s", identity_.header.describe().c_str(),
             name(link.peer).c_str(), error.c_str());
    }
  }
  if (headers_verified_) return moved;
  bool all = true;
  for (HeaderLink& link : header_recvs_) {
    if (link.done) continue;
    switch (transport_.test(link.handle, &done, &error)) {
      case transport::Poll::kPending:
        all = false;
        break;
      case transport::Poll::kFailed:
        fail(qcclRemoteError, "%s: receiving the frame header from %s failed: %s",
             identity_.expected.describe().c_str(), name(link.peer).c_str(), error.c_str());
      case transport::Poll::kDone:
        link.done = moved = true;
        check_header(link, done.bytes);
        break;
    }
  }
  headers_verified_ = all;
  return moved;
}

void PlanExecution::check_header(const HeaderLink& link, size_t bytes) const {
  FrameHeader theirs = FrameHeader::decode(link.bytes.get(), bytes, name(link.peer));
  std::string mismatch = frame_mismatch(identity_.expected, theirs);
  if (!mismatch.empty()) fail(qcclMismatch, "%s", mismatch.c_str());
  if (theirs.sender != link.peer)
    fail(qcclRemoteError, "%s sent a frame header signed by rank %d", name(link.peer).c_str(), theirs.sender);
}

// Checks whatever agreement rounds arrived (in any order: a mismatch fails at once), and sends round
// k once rounds 0 .. k-1 are checked, which is what lets round k vouch for the ranks behind its sender.
bool PlanExecution::poll_agreement() {
  bool moved = false;
  std::string error;
  transport::Completion done;
  for (size_t k = 0; k < agreement_.size(); ++k) {
    AgreementRound& round = agreement_[k];
    if (round.sent && !round.send.done) {
      switch (transport_.test(round.send.handle, &done, &error)) {
        case transport::Poll::kPending:
          break;
        case transport::Poll::kDone:
          round.send.done = moved = true;
          break;
        case transport::Poll::kFailed:
          fail(qcclRemoteError, "%s: sending the frame header (agreement round %zu) to %s failed: %s",
               identity_.header.describe().c_str(), k, name(round.send.peer).c_str(), error.c_str());
      }
    }
    if (round.recv.done) continue;
    switch (transport_.test(round.recv.handle, &done, &error)) {
      case transport::Poll::kPending:
        break;
      case transport::Poll::kFailed:
        fail(qcclRemoteError, "%s: receiving the frame header (agreement round %zu) from %s failed: %s",
             identity_.expected.describe().c_str(), k, name(round.recv.peer).c_str(), error.c_str());
      case transport::Poll::kDone:
        round.recv.done = moved = true;
        check_header(round.recv, done.bytes);
        break;
    }
  }
  while (agreed_rounds_ < agreement_.size() && agreement_[agreed_rounds_].recv.done) {
    ++agreed_rounds_;
    if (agreed_rounds_ == agreement_.size()) break;
    AgreementRound& next = agreement_[agreed_rounds_];
    next.send.handle =
        transport_.isend(next.send.peer, key(kFirstAgreementMessage + static_cast<uint32_t>(agreed_rounds_)),
                         next.send.bytes.get(), FrameHeader::kBytes);
    next.sent = moved = true;
  }
  return moved;
}

// The rooted collectives (Broadcast, Reduce, Gather and Scatter), and every collective on wire A,
// send their header to rank + 1 at once (agreement round 0); the other calls send no rounds and post
// no receive for them. So where one rank called a rooted collective and the others another one, their
// plans may share no link, no rank sees a header that differs, and every rank would wait out
// QCCL_TIMEOUT; and where ranks called the same collective, some on wire A and some not, those on
// wire A wait for rounds that never come. A call without rounds that has made no progress for
// kStrayRoundDelay therefore listens for round 0 from rank - 1 (at once, it would cost every call a
// receive to post and to cancel): going round the ring from a rank with rounds, some such rank's
// successor is one of these, and the round that reaches it is a mismatch. Meanwhile its call cannot
// complete: its output needs that rank's data, which a link would have carried with that rank's
// header (a rooted call's differs), and which wire A does not post before the rounds agree.
// Called on the passes that moved nothing (it fails the call or leaves it as it was).
void PlanExecution::listen_for_rooted() {
  const coll::CollArgs& args = plan_->args();
  if (stray_round_.done || identity_.p2p || args.nranks < 2) return;
  if (stray_round_.handle.empty()) {
    // (A finished call may still be advanced while it waits to complete after an older one.)
    if (Clock::now() - last_progress_ < kStrayRoundDelay || finished()) return;
    stray_round_.peer = (args.rank - 1 + args.nranks) % args.nranks;
    stray_round_.handle = transport_.irecv(stray_round_.peer, key(kFirstAgreementMessage), kIgnoredBits,
                                           stray_round_.bytes.get(), FrameHeader::kBytes);
  }
  transport::Completion done;
  std::string error;
  switch (transport_.test(stray_round_.handle, &done, &error)) {
    case transport::Poll::kPending:
      return;
    case transport::Poll::kFailed:
      fail(qcclRemoteError, "%s: listening for a rooted collective's frame header from %s failed: %s",
           identity_.expected.describe().c_str(), name(stray_round_.peer).c_str(), error.c_str());
    case transport::Poll::kDone:
      break;
  }
  stray_round_.done = true;
  check_header(stray_round_, done.bytes);  // fails where the header is a rooted collective's
  // The same call, then, which this rank runs without rounds: the sender runs it on wire A.
  fail(qcclMismatch,
       "%s: %s sent an agreement round, so it runs this call on the device's NCCL wire, and this rank does not",
       identity_.expected.describe().c_str(), name(stray_round_.peer).c_str());
}

// Wire A: true once the transfer may be posted (every rank agrees on the call), the group open.
bool PlanExecution::post_on_wire() {
  if (!headers_verified_ || !agreed()) return false;
  if (wire_->aborted())
    fail(qcclRemoteError, "%s (%s): %s was aborted after another collective failed", identity_.header.describe().c_str(),
         algorithm_.name, wire_->describe().c_str());
  if (!group_open_) {
    wire_->group_start();
    group_open_ = true;
  }
  wire_posted_ = true;
  return true;
}

void PlanExecution::end_group() {
  if (!group_open_) return;
  group_open_ = false;
  group_sends_.clear();
  wire_->group_end();
}

bool PlanExecution::post_staged_send(Transfer& t) {
  if (!t.staged_send || !device_->reached(t.ready)) return false;
  if (t.staged_taint && *t.staged_taint) t.key |= kTaintBit;  // this rank's kernels or a peer's met NaN/Inf
  if (t.staged_length) {  // a variable length, written on the device
    const size_t length = *t.staged_length;
    if (length > t.capacity_sent)
      fail(qcclInternalError, "%s (%s): a send of %zu bytes from a buffer of %zu", identity_.header.describe().c_str(),
           algorithm_.name, length, t.capacity_sent);
    t.bytes = length;
    t.staged_length = nullptr;
    count_sent(t.peer, length);
  }
  t.handle = transport_.isend(t.peer, t.key, t.staging, t.bytes);
  t.staged_send = false;
  return true;
}

bool PlanExecution::complete(Transfer& t, bool* moved, bool* tainted) {
  if (t.staged_send) {
    if (!post_staged_send(t)) return false;
    *moved = true;
  }
  if (t.handle.empty()) return true;
  const bool receive = t.handle.receive;
  // Payload from a peer is used only once its frame header has been checked (it was sent first).
  if (receive && !headers_verified_) return false;
  transport::Completion done;
  std::string error;
  switch (transport_.test(t.handle, &done, &error)) {
    case transport::Poll::kPending:
      return false;
    case transport::Poll::kFailed:
      if (done.truncated)  // a longer message than this rank's plan expects: the ranks disagree
        fail(qcclMismatch, "%s: %s sent a message longer than the %zu bytes this rank expects: %s",
             identity_.expected.describe().c_str(), name(t.peer).c_str(), t.bytes, error.c_str());
      fail(qcclRemoteError, "%s: %s %s failed: %s", identity_.header.describe().c_str(),
           receive ? "receiving from" : "sending to", name(t.peer).c_str(), error.c_str());
    case transport::Poll::kDone:
      break;
  }
  *moved = true;
  if (receive) {
    if ((done.key & kFingerprintBits) != identity_.header.fingerprint())
      fail(qcclMismatch, "%s: %s sent a message of another collective (fingerprint 0x%03llx, expected 0x%03x)",
           identity_.expected.describe().c_str(), name(t.peer).c_str(),
           static_cast<unsigned long long>(done.key & kFingerprintBits), identity_.header.fingerprint());
    if (t.received && device_) {  // the length, for the device's steps after the wait, follows the bytes
      auto* word = reinterpret_cast<size_t*>(t.received_word);
      *word = done.bytes;
    } else if (t.received) {
      *t.received = done.bytes;
    } else if (done.bytes != t.bytes) {
      fail(qcclMismatch, "%s: %s sent %zu bytes where %zu were expected", identity_.expected.describe().c_str(),
           name(t.peer).c_str(), done.bytes, t.bytes);
    }
    stats_.bytes_received += done.bytes;
    if (tainted && (done.key & kTaintBit)) *tainted = true;
    if (device_) {  // on to the device; the steps after the wait are enqueued after this copy
      device_->copy(t.device_dst, t.staging, done.bytes);
      if (t.received) device_->copy(t.received, t.received_word, sizeof(size_t));
      t.ready = device_->record();
    }
  }
  return true;
}

PlanExecution::Transfer& PlanExecution::transfer(Slot& slot, uint32_t index) {
  Transfer& t = slot.transfers[index];
  if (!t.handle.empty() || t.staged_send)
    fail(qcclInternalError, "%s (%s): fragment %zu posts on busy slot %u", identity_.header.describe().c_str(),
         algorithm_.name, slot.fragment, index);
  return t;
}

bool PlanExecution::earlier_fragment_posts(const Slot& slot, int peer, bool receive) const {
  for (const Slot& other : slots_) {
    if (other.fragment == kIdle || other.fragment >= slot.fragment) continue;
    const auto& steps = other.program.steps();
    for (size_t i = other.pc; i < steps.size(); ++i) {
      if (receive) {
        if (const auto* r = std::get_if<coll::step::Recv>(&steps[i]); r && r->peer == peer) return true;
      } else {
        if (const auto* s = std::get_if<coll::step::Send>(&steps[i]); s && s->peer == peer) return true;
      }
    }
  }
  return false;
}

bool PlanExecution::execute(const coll::step::Recv& s, Slot& slot, bool*) {
  if (options_.ordered && earlier_fragment_posts(slot, s.peer, true)) return false;
  if (wire_) {
    if (s.received)
      fail(qcclInvalidUsage, "%s (%s): a variable-length message on %s, which takes fixed lengths only",
           identity_.header.describe().c_str(), algorithm_.name, wire_->describe().c_str());
    // A receive into what a send of the open group reads would run beside it (NCCL progresses a
    // group's transfers together): it goes into the next group, after the send.
    for (const auto& [src, bytes] : group_sends_)
      if (static_cast<const std::byte*>(s.dst) < src + bytes && src < static_cast<const std::byte*>(s.dst) + s.capacity)
        end_group();
    if (!post_on_wire()) return false;
    wire_->recv(s.peer, s.dst, s.capacity);
    slot.transfers[s.slot].wire_recv = true;
    if (slot.device_taint) {  // the peer's taint word follows its message (NCCL has no keys to carry it)
      wire_->recv(s.peer, slot.taint_words + 1 + s.slot, sizeof(unsigned long long));
      slot.transfers[s.slot].fold_taint = true;
    }
    stats_.bytes_received += s.capacity;
    return true;
  }
  Transfer& t = transfer(slot, s.slot);
  if (device_ && !stage(t, s.capacity)) return false;
  t.peer = s.peer;
  t.bytes = s.capacity;
  t.received = s.received;
  if (device_ && s.received) t.received_word = staged_word(slot, true, s.slot);
  t.device_dst = s.dst;
  const auto message = static_cast<uint32_t>(1 + slot.fragment % kPayloadMessages);
  const auto begin = Clock::now();
  t.handle = transport_.irecv(s.peer, key(message), kIgnoredBits, device_ ? t.staging : s.dst, s.capacity);
  stats_.post_seconds += std::chrono::duration<double>(Clock::now() - begin).count();
  return true;
}

bool PlanExecution::execute(const coll::step::Send& s, Slot& slot, bool*) {
  if (options_.ordered && earlier_fragment_posts(slot, s.peer, false)) return false;
  // A device execution knows a variable length only on the device: the capacity is staged, and the
  // length, which follows it, is what the send posts (post_staged_send).
  const bool length_on_device = device_ && s.length;
  const size_t bytes = length_on_device ? s.bytes : s.length ? *s.length : s.bytes;
  if (bytes > s.bytes)
    fail(qcclInternalError, "%s (%s): fragment %zu sends %zu bytes from a buffer of %zu",
         identity_.header.describe().c_str(), algorithm_.name, slot.fragment, bytes, s.bytes);
  if (wire_) {
    if (s.length)
      fail(qcclInvalidUsage, "%s (%s): a variable-length message on %s, which takes fixed lengths only",
           identity_.header.describe().c_str(), algorithm_.name, wire_->describe().c_str());
    if (!post_on_wire()) return false;
    wire_->send(s.peer, s.src, bytes);
    group_sends_.emplace_back(static_cast<const std::byte*>(s.src), bytes);
    if (slot.device_taint) wire_->send(s.peer, slot.taint_words, sizeof(unsigned long long));
  } else {
    Transfer& t = transfer(slot, s.slot);
    if (device_ && !stage(t, bytes)) return false;
    t.peer = s.peer;
    t.bytes = bytes;
    t.received = nullptr;
  const auto message = static_cast<uint32_t>(1 + slot.fragment % kPayloadMessages);
    if (device_) {  // copied to the host on the stream, after the steps that wrote it; posted once there
      device_->copy(t.staging, s.src, bytes);
      t.staged_taint = nullptr;
      if (slot.device_taint) {
        unsigned long long* word = staged_word(slot, false, s.slot);
        device_->copy(word, slot.taint_words, sizeof(unsigned long long));
        t.staged_taint = word;
      }
      t.staged_length = nullptr;
      if (s.length) {  // known on the device only: it comes back beside the bytes (the capacity's)
        auto* word = reinterpret_cast<size_t*>(staged_word(slot, true, s.slot));
        device_->copy(word, s.length, sizeof(size_t));
        t.staged_length = word;
        t.capacity_sent = s.bytes;
      }
      t.ready = device_->record();
      t.staged_send = true;
      t.key = key(message, slot.tainted);
    } else {
      const auto begin = Clock::now();
      t.handle = transport_.isend(s.peer, key(message, slot.tainted), s.src, bytes);
      stats_.post_seconds += std::chrono::duration<double>(Clock::now() - begin).count();
    }
  }
  if (!length_on_device) count_sent(s.peer, bytes);
  return true;
}

void PlanExecution::count_sent(int peer, size_t bytes) {
  stats_.bytes_sent += bytes;
  const coll::NodeMap* nodes = plan_->args().nodes;
  if (nodes && peer < nodes->nranks() && !nodes->same_node(plan_->args().rank, peer))
    stats_.inter_node_bytes_sent += bytes;
}

bool PlanExecution::execute(const coll::step::Wait& s, Slot& slot, bool* moved) {
  if (s.slot >= slot.transfers.size()) return true;
  Transfer& t = slot.transfers[s.slot];
  if (t.wire_recv) {  // what follows may use the bytes, even a send: it goes after the group, on the stream
    end_group();
    t.wire_recv = false;
    if (t.fold_taint) device_->add_counter(slot.taint_words, slot.taint_words + 1 + s.slot);
    t.fold_taint = false;
    return true;
  }
  return complete(t, moved, &slot.tainted);
}

bool PlanExecution::execute(const coll::step::Compute& s, Slot& slot, bool*) {
  if (!s.kernel->ready(s)) return false;
  if (device_) {
    if (wire_) end_group();  // the group's transfers come before the step, in stream order
    coll::DeviceStepContext context{device_, static_cast<coll::DeviceCounters*>(counters_.p), slot.taint_words,
                                    slot.tainted};
    if (!s.kernel->launch(s, context))  // Comm refuses these calls on device buffers before anything is sent
      fail(qcclInvalidUsage, "%s (%s): the step kernel '%s' has no device implementation yet",
           identity_.header.describe().c_str(), algorithm_.name, s.kernel->name());
    return true;
  }
  const auto begin = Clock::now();
  coll::StepContext context{&slot.tainted, &stats_.nonfinite};
  s.kernel->run(s, context);
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  (s.kernel->phase() == coll::StepKernel::Phase::kEncode ? stats_.encode_seconds : stats_.decode_seconds) += seconds;
  if (options_.profile) {
    const std::string spec = plan_->args().codec ? plan_->args().codec->canonical() : "none";
    StepProfile::Entry& e = options_.profile->kernels[spec.substr(0, spec.find(':'))][s.kernel->name()];
    e.seconds += seconds;
    e.units += static_cast<double>(s.count);
  }
  return true;
}

// The host's data steps, timed: the codecs' into the encode and decode totals, the rest (Reduce, Copy
// and Average) into the reduce total.
void PlanExecution::run_on_host(const coll::Step& step) {
  namespace st = coll::step;
  const auto begin = Clock::now();
  stats_.nonfinite += run_data_step(step, plan_->args());
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  if (std::holds_alternative<st::Reduce>(step) || std::holds_alternative<st::Copy>(step) ||
      std::holds_alternative<st::Average>(step))
    stats_.reduce_seconds += seconds;
  else
    (std::holds_alternative<st::Encode>(step) ? stats_.encode_seconds : stats_.decode_seconds) += seconds;
}

bool PlanExecution::run(Slot& slot) {
  const bool moved = run_steps(slot);
  if (wire_) end_group();
  return moved;
}

bool PlanExecution::run_steps(Slot& slot) {
  bool moved = false;
  if (slot.fragment == kIdle) {  // held back by the key window, or nothing left
    next_fragment(slot);
    if (slot.fragment == kIdle) return false;
  }
  while (slot.fragment != kIdle) {
    const auto& steps = slot.program.steps();
    if (slot.pc == steps.size()) {
      if (wire_) end_group();  // a fragment's transfers never share a group with the next one's
      for (Transfer& t : slot.transfers) t.wire_recv = t.fold_taint = false;
      for (Transfer& t : slot.transfers)
        if (!complete(t, &moved, &slot.tainted)) return moved;
      ++fragments_done_;
      moved = true;
      next_fragment(slot);
      continue;
    }
    const coll::Step& step = steps[slot.pc];
    if (!coll::is_data_step(step)) {
      bool done = false;
      if (const auto* recv = std::get_if<coll::step::Recv>(&step)) done = execute(*recv, slot, &moved);
      else if (const auto* send = std::get_if<coll::step::Send>(&step)) done = execute(*send, slot, &moved);
      else if (const auto* wait = std::get_if<coll::step::Wait>(&step)) done = execute(*wait, slot, &moved);
      else done = execute(std::get<coll::step::Compute>(step), slot, &moved);
      if (!done) return moved;
    } else if (device_) {
      if (wire_) end_group();  // the group's transfers come before the step, in stream order
      device_->launch(step, plan_->args(), static_cast<unsigned long long*>(counters_.p));
    } else {
      run_on_host(step);
    }
    ++slot.pc;
    moved = true;
  }
  return moved;
}

bool PlanExecution::advance() {
  bool moved = false;
  if (!started_) {
    start();
    moved = true;
  }
  moved |= poll_headers();
  if (!agreement_.empty()) moved |= poll_agreement();
  if (device_)
    for (Slot& slot : slots_)
      for (Transfer& t : slot.transfers) moved |= post_staged_send(t);
  for (Slot& slot : slots_) moved |= run(slot);
  if (device_) moved |= finish_on_device();
  if (moved)
    last_progress_ = Clock::now();
  else if (agreement_.empty())
    listen_for_rooted();
  if (!stray_round_.handle.empty() && finished()) {  // nobody sent it
    transport_.cancel(stray_round_.handle);
    stray_round_.done = true;
  }
  return moved;
}

bool PlanExecution::finished() const {
  // A rooted collective also waits for its agreement rounds: until every rank is known to have called
  // the same collective, a rank that has all its data (a root that sent eagerly) may not succeed.
  if (!started_ || !headers_verified_ || !agreed() || fragments_done_ < plan_->fragments()) return false;
  if (device_ && !device_done_) return false;
  for (const HeaderLink& link : header_sends_)
    if (!link.done) return false;
  for (const AgreementRound& round : agreement_)
    if (!round.send.done) return false;
  return true;
}

void PlanExecution::cancel() {
  // Transfers posted on a tagless wire cannot be withdrawn: only aborting the wire frees the stream
  // (and every other collective with transfers on it fails: post_on_wire, finish_on_device).
  if (wire_ && wire_posted_ && !device_done_) {
    if (group_open_) {
      group_open_ = false;
      try {
        wire_->group_end();  // NCCL's group depth is the thread's: it must not stay open
      } catch (const Error&) {
      }
    }
    wire_->abort();
  }
  for (Slot& slot : slots_)
    for (Transfer& t : slot.transfers) {
      // A transfer the transport may still be reading (a send) or writing (a receive): its staging
      // buffer is not reused (the executor's pool keeps it until it goes, after the transport).
      if (t.staging && !t.handle.empty()) t.abandoned = true;
      transport_.cancel(t.handle);
    }
  auto abandon = [this](HeaderLink& link) {
    if (link.handle.empty()) return;
    transport_.cancel(link.handle);
    abandoned_->push_back(std::move(link.bytes));  // the transport may still read (or write) them
  };
  for (HeaderLink& link : header_sends_) abandon(link);
  for (HeaderLink& link : header_recvs_) abandon(link);
  for (AgreementRound& round : agreement_) {
    abandon(round.send);
    abandon(round.recv);
  }
  abandon(stray_round_);
}

std::string PlanExecution::waiting_for() const {
  if (!headers_verified_)
    for (const HeaderLink& link : header_recvs_)
      if (!link.done) return "the frame header from " + name(link.peer);
  for (const Slot& slot : slots_) {
    if (slot.fragment == kIdle) continue;
    for (const Transfer& t : slot.transfers) {
      if (t.staged_send)
        return format("the device's copy of a send to %s (%zu bytes, fragment %zu of %zu)", name(t.peer).c_str(),
                      t.bytes, slot.fragment, plan_->fragments());
      if (!t.handle.empty())
        return format("%s %s (%zu bytes, fragment %zu of %zu)", t.handle.receive ? "a message from" : "a send to",
                      name(t.peer).c_str(), t.bytes, slot.fragment, plan_->fragments());
    }
  }
  if (device_ && tail_ && !device_done_) return "the device to finish the collective's last steps";
  for (const HeaderLink& link : header_sends_)
    if (!link.done) return "the frame header send to " + name(link.peer);
  if (!agreed())
    return format("the frame header of agreement round %zu from %s (every rank must call the same collective)",
                  agreed_rounds_, name(agreement_[agreed_rounds_].recv.peer).c_str());
  for (const AgreementRound& round : agreement_)
    if (!round.send.done) return "the frame header send to " + name(round.send.peer);
  return "nothing";
}

}  // namespace

size_t run_data_step(const coll::Step& data_step, const coll::CollArgs& args) {
  namespace st = coll::step;
  size_t nonfinite = 0;
  auto run = [&](const auto& s) {
    using S = std::decay_t<decltype(s)>;
    if constexpr (std::is_same_v<S, st::Reduce>) {
      kernels::reduce(args.dtype, args.op, s.a, s.b, s.dst, s.count);
    } else if constexpr (std::is_same_v<S, st::Copy>) {
      kernels::copy_bytes(s.dst, s.src, s.bytes);
    } else if constexpr (std::is_same_v<S, st::Average>) {
      if (args.op == kernels::RedOp::kAvg) kernels::finish_average(args.dtype, s.buf, s.count, args.nranks);
    } else if constexpr (std::is_same_v<S, st::Load>) {
      if (s.add)
        kernels::load_add_float(args.dtype, s.src, s.dst, s.count);
      else
        kernels::load_float(args.dtype, s.src, s.dst, s.count);
    } else if constexpr (std::is_same_v<S, st::Store>) {
      kernels::store_float(args.dtype, s.src, s.dst, s.count);
      nonfinite = kernels::count_nonfinite(args.dtype, s.dst, s.count);
    } else if constexpr (std::is_same_v<S, st::AddFloat>) {
      kernels::add_float(s.src, s.dst, s.count);
    } else if constexpr (std::is_same_v<S, st::Divide>) {
      kernels::divide_float(s.dst, s.count, static_cast<float>(args.nranks));
    } else if constexpr (std::is_same_v<S, st::Encode>) {
      kernels::PhiloxKey key = args.rng;
      key.stream = s.stream;
      const size_t written = kernels::encode(*s.codec, s.src, s.count, s.dst, key, s.first).bytes;
      if (s.length) *s.length = written;  // a variable-length codec's writes vary below encoded_bytes()
    } else if constexpr (std::is_same_v<S, st::DecodeAdd>) {
      kernels::decode_accumulate(*s.codec, s.src, s.count, s.dst);
    } else if constexpr (std::is_same_v<S, st::DecodeOut>) {
      // Every rank decodes the same final bytes, so every rank counts the same non-finite values: in
      // the datatype written, where a finite float32 sum may round to +-Inf (fp16 from 65520).
      if (args.dtype == kernels::DataType::kFloat32) {
        nonfinite = kernels::decode(*s.codec, s.src, s.count, static_cast<float*>(s.dst));
      } else {
        kernels::decode(*s.codec, s.src, s.count, s.scratch);
        kernels::store_float(args.dtype, s.scratch, s.dst, s.count);
        nonfinite = kernels::count_nonfinite(args.dtype, s.dst, s.count);
      }
    } else if constexpr (std::is_same_v<S, st::ErrorFeedback>) {
      kernels::decode(*s.codec, s.encoded, s.count, s.residual);  // what the peers will decode...
      for (size_t i = 0; i < s.count; ++i)  // ...and the miss (0 where it is not finite)
        s.residual[i] = kernels::feedback_miss(s.acc[i], s.residual[i], s.factor);
    } else {
      fail(qcclInternalError, "run_data_step: step %zu is not a data step", data_step.index());
    }
  };
  std::visit(run, data_step);
  return nonfinite;
}

std::unique_ptr<Execution> HostExecutor::launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                                const OperationIdentity& identity, std::byte* scratch) {
  return std::make_unique<PlanExecution>(transport_, options_, algorithm, std::move(plan), identity, scratch, names_,
                                         &abandoned_, nullptr);
}

std::string HostExecutor::describe() const {
  return format("host executor, pipeline depth %d%s, over %s", options_.depth, options_.ordered ? ", ordered" : "",
                transport_.describe().c_str());
}

DeviceExecutor::Block DeviceExecutor::Shared::take(Device::Memory kind, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& pool = free_[kind == Device::Memory::kPinned];
  auto best = pool.end();
  for (auto it = pool.begin(); it != pool.end(); ++it)
    if (it->bytes >= bytes && (best == pool.end() || it->bytes < best->bytes)) best = it;
  if (best != pool.end()) {
    const Block block = *best;
    pool.erase(best);
    return block;
  }
  return Block{kind, device_->allocate(kind, bytes), bytes};
}

void DeviceExecutor::Shared::give(const Block& block, bool abandoned) {
  std::lock_guard<std::mutex> lock(mu_);
  if (block.p && abandoned) abandoned_.push_back(block);
  else if (block.p) free_[block.kind == Device::Memory::kPinned].push_back(block);
}

DeviceExecutor::Shared::~Shared() {
  // Never throws: a device that fails here (a sticky fault) keeps what it could not release.
  for (const auto* list : {&free_[0], &free_[1], &abandoned_})
    for (const Block& block : *list) {
      try {
        device_->release(block.kind, block.p);
      } catch (const Error&) {
      }
    }
}

DeviceExecutor::DeviceExecutor(transport::Transport& transport, std::shared_ptr<Device> device,
                               std::shared_ptr<PeerWire> wire, const HostExecutorOptions& options,
                               const std::vector<std::string>* names)
    : transport_(transport),
      shared_(std::make_shared<Shared>(std::move(device), std::move(wire))),
      options_(options),
      wire_options_(options),
      names_(names) {
  options_.ordered = false;  // staged sends are posted when their copies are done, in any order
  options_.profile = wire_options_.profile = nullptr;
  wire_options_.ordered = true;
  wire_options_.depth = 1;
}

std::unique_ptr<Execution> DeviceExecutor::launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                                  const OperationIdentity& identity, std::byte*) {
  const bool wire = shared_->wire() && on_wire(identity, *plan);
  return std::make_unique<PlanExecution>(transport_, wire ? wire_options_ : options_, algorithm, std::move(plan),
                                         identity, nullptr, names_, &abandoned_, shared_);
}

std::string DeviceExecutor::describe() const {
  if (PeerWire* wire = shared_->wire())
    return format("device executor on %s: collectives over %s, one fragment at a time; point-to-point staged through "
                  "pinned memory over %s", shared_->device().describe().c_str(), wire->describe().c_str(),
                  transport_.describe().c_str());
  return format("device executor on %s, pipeline depth %d, staged through pinned memory over %s",
                shared_->device().describe().c_str(), options_.depth, transport_.describe().c_str());
}

}  // namespace qccl
