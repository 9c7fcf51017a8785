#include "src/executor.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <variant>

#include "base/errors.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
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

using coll::rooted;

class HostExecution final : public Execution {
 public:
  HostExecution(transport::Transport& transport, const HostExecutorOptions& options, const coll::Algorithm& algorithm,
                std::unique_ptr<coll::Plan> plan, const OperationIdentity& identity, std::byte* scratch,
                const std::vector<std::string>* names, std::vector<std::unique_ptr<uint8_t[]>>* abandoned);

  bool advance() override;
  bool started() const override { return started_; }
  bool finished() const override;
  void set_fragment_limit(size_t limit) override { fragment_limit_ = limit; }
  size_t fragments_in_flight() const override { return in_flight_; }
  bool started_every_fragment() const override { return started_ && next_fragment_ >= plan_->fragments(); }
  void cancel() override;
  std::string waiting_for() const override;
  Clock::time_point last_progress() const override { return last_progress_; }
  const ExecutionStats& stats() const override { return stats_; }
  const coll::Algorithm& algorithm() const override { return algorithm_; }
  const coll::Plan& plan() const override { return *plan_; }
  const OperationIdentity& identity() const override { return identity_; }
  void set_codec_scale(double scale) override { identity_.header.codec_scale = identity_.expected.codec_scale = scale; }
  void set_scratch(std::byte* scratch) override {
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].scratch = scratch + i * plan_->scratch_bytes();
  }

 private:
  struct Transfer {
    transport::Handle handle;
    int peer = -1;
    size_t bytes = 0;            // the posted length (a receive's capacity)
    size_t* received = nullptr;  // a variable-length receive stores its length here
  };
  struct Slot {
    size_t fragment = kIdle;
    size_t pc = 0;
    bool tainted = false;  // met NaN/Inf here or at a peer (see message_key.h)
    std::byte* scratch = nullptr;
    coll::Program program;
    std::vector<Transfer> transfers;  // grown to the program's transfer_slots(), never shrunk
  };
  // A frame header on its way. Its bytes live on the heap: a send still pending when the execution is
  // cancelled is abandoned to the transport, which may read them until it is destroyed, so cancel()
  // hands them to the executor, which outlives the transport.
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

  transport::Key key(uint32_t message, bool tainted = false) const {
    return message_key::make(identity_.p2p, identity_.sequence, tainted, message, identity_.header.fingerprint());
  }
  void start();
  bool poll_headers();
  bool poll_agreement();
  // Decodes a received header and fails (qcclMismatch, qcclRemoteError) unless it is what this rank
  // expects from link.peer.
  void check_header(const HeaderLink& link, size_t bytes) const;
  bool agreed() const { return agreed_rounds_ == agreement_.size(); }
  // Starts the next fragment in `slot` (idle, or holding a fragment that completed), unless none is
  // left, the fragment limit is reached, or it would be too far ahead of the oldest fragment in
  // flight for their keys to differ (it is then tried again later).
  void next_fragment(Slot& slot);
  bool run(Slot& slot);
  // One step of the slot's fragment; false when it must wait (the step is then retried).
  bool execute(const coll::step::Recv& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Send& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Wait& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Reduce& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Copy& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Average& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Compute& s, Slot& slot, bool* moved);
  bool execute(const coll::step::Store& s, Slot& slot, bool* moved);
  template <class CodecStep>
  bool execute(const CodecStep& s, Slot& slot, bool* moved);
  // Ordered mode: whether a fragment older than the slot's still has a transfer of the same direction
  // with `peer` to post.
  bool earlier_fragment_posts(const Slot& slot, int peer, bool receive) const;
  Transfer& transfer(Slot& slot, uint16_t index);
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
  std::vector<AgreementRound> agreement_;  // Broadcast and Reduce on more than one rank
  size_t agreed_rounds_ = 0;               // rounds 0 .. agreed_rounds_ - 1 are checked
  bool started_ = false;
  bool headers_verified_ = false;
  size_t next_fragment_ = 0;
  size_t fragments_done_ = 0;
  size_t in_flight_ = 0;                    // slots holding a fragment
  size_t fragment_limit_ = ~size_t{0};      // set_fragment_limit (the slots bound it too)
  ExecutionStats stats_;
  Clock::time_point last_progress_;
};

HostExecution::HostExecution(transport::Transport& transport, const HostExecutorOptions& options,
                             const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                             const OperationIdentity& identity, std::byte* scratch,
                             const std::vector<std::string>* names,
                             std::vector<std::unique_ptr<uint8_t[]>>* abandoned)
    : transport_(transport),
      options_(options),
      algorithm_(algorithm),
      plan_(std::move(plan)),
      identity_(identity),
      names_(names),
      abandoned_(abandoned),
      last_progress_(Clock::now()) {
  const size_t fragments = plan_->fragments();
  slots_.resize(std::min<size_t>(static_cast<size_t>(std::max(options.depth, 1)), std::max<size_t>(fragments, 1)));
  for (Slot& slot : slots_) slot.program.set_default_codec(plan_->args().codec);
  if (scratch) set_scratch(scratch);
}

void HostExecution::start() {
  started_ = true;
  last_progress_ = Clock::now();  // it may have waited for an earlier call on its codec state
  std::vector<int> send_to, recv_from;
  plan_->links(&send_to, &recv_from);
  auto unique = [](std::vector<int>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  unique(send_to);
  unique(recv_from);
  // Receives first, so that a header from a fast peer finds its buffer posted.
  header_recvs_.resize(recv_from.size());
  for (size_t i = 0; i < recv_from.size(); ++i) {
    HeaderLink& link = header_recvs_[i];
    link.peer = recv_from[i];
    link.handle = transport_.irecv(link.peer, key(0), kIgnoredBits, link.bytes.get(), FrameHeader::kBytes);
  }
  header_sends_.resize(send_to.size());
  for (size_t i = 0; i < send_to.size(); ++i) {
    HeaderLink& link = header_sends_[i];
    link.peer = send_to[i];
    identity_.header.encode(link.bytes.get());
    link.handle = transport_.isend(link.peer, key(0), link.bytes.get(), FrameHeader::kBytes);
  }
  headers_verified_ = header_recvs_.empty();

  const coll::CollArgs& args = plan_->args();
  if (rooted(args.kind) && args.nranks > 1) {
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

void HostExecution::next_fragment(Slot& slot) {
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
}

bool HostExecution::poll_headers() {
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

void HostExecution::check_header(const HeaderLink& link, size_t bytes) const {
  FrameHeader theirs = FrameHeader::decode(link.bytes.get(), bytes, name(link.peer));
  std::string mismatch = frame_mismatch(identity_.expected, theirs);
  if (!mismatch.empty()) fail(qcclMismatch, "%s", mismatch.c_str());
  if (theirs.sender != link.peer)
    fail(qcclRemoteError, "%s sent a frame header signed by rank %d", name(link.peer).c_str(), theirs.sender);
}

// Checks whatever agreement rounds arrived (in any order: a mismatch fails at once), and sends round
// k once rounds 0 .. k-1 are checked, which is what lets round k vouch for the ranks behind its sender.
bool HostExecution::poll_agreement() {
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

bool HostExecution::complete(Transfer& t, bool* moved, bool* tainted) {
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
    if (t.received) {
      *t.received = done.bytes;
    } else if (done.bytes != t.bytes) {
      fail(qcclMismatch, "%s: %s sent %zu bytes where %zu were expected", identity_.expected.describe().c_str(),
           name(t.peer).c_str(), done.bytes, t.bytes);
    }
    stats_.bytes_received += done.bytes;
    if (tainted && (done.key & kTaintBit)) *tainted = true;
  }
  return true;
}

HostExecution::Transfer& HostExecution::transfer(Slot& slot, uint16_t index) {
  Transfer& t = slot.transfers[index];
  if (!t.handle.empty())
    fail(qcclInternalError, "%s (%s): fragment %zu posts on busy slot %u", identity_.header.describe().c_str(),
         algorithm_.name, slot.fragment, index);
  return t;
}

bool HostExecution::earlier_fragment_posts(const Slot& slot, int peer, bool receive) const {
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

bool HostExecution::execute(const coll::step::Recv& s, Slot& slot, bool*) {
  if (options_.ordered && earlier_fragment_posts(slot, s.peer, true)) return false;
  Transfer& t = transfer(slot, s.slot);
  t.peer = s.peer;
  t.bytes = s.capacity;
  t.received = s.received;
  const auto message = static_cast<uint32_t>(1 + slot.fragment % kPayloadMessages);
  t.handle = transport_.irecv(s.peer, key(message), kIgnoredBits, s.dst, s.capacity);
  return true;
}

bool HostExecution::execute(const coll::step::Send& s, Slot& slot, bool*) {
  if (options_.ordered && earlier_fragment_posts(slot, s.peer, false)) return false;
  const size_t bytes = s.length ? *s.length : s.bytes;
  if (bytes > s.bytes)
    fail(qcclInternalError, "%s (%s): fragment %zu sends %zu bytes from a buffer of %zu",
         identity_.header.describe().c_str(), algorithm_.name, slot.fragment, bytes, s.bytes);
  Transfer& t = transfer(slot, s.slot);
  t.peer = s.peer;
  t.bytes = bytes;
  t.received = nullptr;
  const auto message = static_cast<uint32_t>(1 + slot.fragment % kPayloadMessages);
  t.handle = transport_.isend(s.peer, key(message, slot.tainted), s.src, bytes);
  stats_.bytes_sent += bytes;
  const coll::NodeMap* nodes = plan_->args().nodes;
  if (nodes && s.peer < nodes->nranks() && !nodes->same_node(plan_->args().rank, s.peer))
    stats_.inter_node_bytes_sent += bytes;
  return true;
}

bool HostExecution::execute(const coll::step::Wait& s, Slot& slot, bool* moved) {
  return s.slot >= slot.transfers.size() || complete(slot.transfers[s.slot], moved, &slot.tainted);
}

bool HostExecution::execute(const coll::step::Reduce& s, Slot&, bool*) {
  const coll::CollArgs& args = plan_->args();
  kernels::reduce(args.dtype, args.op, s.a, s.b, s.dst, s.count);
  return true;
}

bool HostExecution::execute(const coll::step::Copy& s, Slot&, bool*) {
  std::memcpy(s.dst, s.src, s.bytes);
  return true;
}

bool HostExecution::execute(const coll::step::Average& s, Slot&, bool*) {
  const coll::CollArgs& args = plan_->args();
  if (args.op == kernels::RedOp::kAvg) kernels::finish_average(args.dtype, s.buf, s.count, args.nranks);
  return true;
}

bool HostExecution::execute(const coll::step::Compute& s, Slot& slot, bool*) {
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

// A float32 result written out in the call's datatype, its non-finite values counted (timed as decode).
bool HostExecution::execute(const coll::step::Store& s, Slot&, bool*) {
  const auto begin = Clock::now();
  const kernels::DataType dtype = plan_->args().dtype;
  kernels::store_float(dtype, s.src, s.dst, s.count);
  stats_.nonfinite += kernels::count_nonfinite(dtype, s.dst, s.count);
  stats_.decode_seconds += std::chrono::duration<double>(Clock::now() - begin).count();
  return true;
}

// The float32 and codec steps of compressed collectives, timed into the encode and decode totals.
template <class CodecStep>
bool HostExecution::execute(const CodecStep& s, Slot&, bool*) {
  namespace step = coll::step;
  const coll::CollArgs& args = plan_->args();
  const auto begin = Clock::now();
  double* phase = &stats_.decode_seconds;
  if constexpr (std::is_same_v<CodecStep, step::Load>) {
    if (s.add)
      kernels::load_add_float(args.dtype, s.src, s.dst, s.count);
    else
      kernels::load_float(args.dtype, s.src, s.dst, s.count);
  } else if constexpr (std::is_same_v<CodecStep, step::AddFloat>) {
    kernels::add_float(s.src, s.dst, s.count);
  } else if constexpr (std::is_same_v<CodecStep, step::Divide>) {
    kernels::divide_float(s.dst, s.count, static_cast<float>(args.nranks));
  } else if constexpr (std::is_same_v<CodecStep, step::Encode>) {
    kernels::PhiloxKey key = args.rng;
    key.stream = s.stream;
    const size_t written = kernels::encode(*s.codec, s.src, s.count, s.dst, key, s.first).bytes;
    if (s.length) *s.length = written;  // a variable-length codec's writes vary below encoded_bytes()
    phase = &stats_.encode_seconds;
  } else if constexpr (std::is_same_v<CodecStep, step::DecodeAdd>) {
    kernels::decode_accumulate(*s.codec, s.src, s.count, s.dst);
  } else if constexpr (std::is_same_v<CodecStep, step::DecodeOut>) {
    // Every rank decodes the same final bytes, so every rank counts the same non-finite values.
    if (args.dtype == kernels::DataType::kFloat32) {
      stats_.nonfinite += kernels::decode(*s.codec, s.src, s.count, static_cast<float*>(s.dst));
    } else {
      stats_.nonfinite += kernels::decode(*s.codec, s.src, s.count, s.scratch);
      kernels::store_float(args.dtype, s.scratch, s.dst, s.count);
    }
  } else {
    static_assert(std::is_same_v<CodecStep, step::ErrorFeedback>, "a step kind without an executor");
    kernels::decode(*s.codec, s.encoded, s.count, s.residual);  // what the peers will decode...
    for (size_t i = 0; i < s.count; ++i) s.residual[i] = s.factor * (s.acc[i] - s.residual[i]);  // ...and the miss
  }
  *phase += std::chrono::duration<double>(Clock::now() - begin).count();
  return true;
}

bool HostExecution::run(Slot& slot) {
  bool moved = false;
  if (slot.fragment == kIdle) {  // held back by the key window, or nothing left
    next_fragment(slot);
    if (slot.fragment == kIdle) return false;
  }
  while (slot.fragment != kIdle) {
    const auto& steps = slot.program.steps();
    if (slot.pc == steps.size()) {
      for (Transfer& t : slot.transfers)
        if (!complete(t, &moved, &slot.tainted)) return moved;
      ++fragments_done_;
      moved = true;
      next_fragment(slot);
      continue;
    }
    const bool done = std::visit([&](const auto& s) { return execute(s, slot, &moved); }, steps[slot.pc]);
    if (!done) return moved;
    ++slot.pc;
    moved = true;
  }
  return moved;
}

bool HostExecution::advance() {
  bool moved = false;
  if (!started_) {
    start();
    moved = true;
  }
  moved |= poll_headers();
  if (!agreement_.empty()) moved |= poll_agreement();
  for (Slot& slot : slots_) moved |= run(slot);
  if (moved) last_progress_ = Clock::now();
  return moved;
}

bool HostExecution::finished() const {
  // A rooted collective also waits for its agreement rounds: until every rank is known to have called
  // the same collective, a rank that has all its data (a root that sent eagerly) may not succeed.
  if (!started_ || !headers_verified_ || !agreed() || fragments_done_ < plan_->fragments()) return false;
  for (const HeaderLink& link : header_sends_)
    if (!link.done) return false;
  for (const AgreementRound& round : agreement_)
    if (!round.send.done) return false;
  return true;
}

void HostExecution::cancel() {
  for (Slot& slot : slots_)
    for (Transfer& t : slot.transfers) transport_.cancel(t.handle);
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
}

std::string HostExecution::waiting_for() const {
  if (!headers_verified_)
    for (const HeaderLink& link : header_recvs_)
      if (!link.done) return "the frame header from " + name(link.peer);
  for (const Slot& slot : slots_) {
    if (slot.fragment == kIdle) continue;
    for (const Transfer& t : slot.transfers)
      if (!t.handle.empty())
        return format("%s %s (%zu bytes, fragment %zu of %zu)", t.handle.receive ? "a message from" : "a send to",
                      name(t.peer).c_str(), t.bytes, slot.fragment, plan_->fragments());
  }
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

std::unique_ptr<Execution> HostExecutor::launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                                const OperationIdentity& identity, std::byte* scratch) {
  return std::make_unique<HostExecution>(transport_, options_, algorithm, std::move(plan), identity, scratch, names_,
                                         &abandoned_);
}

std::string HostExecutor::describe() const {
  return format("host executor, pipeline depth %d%s, over %s", options_.depth, options_.ordered ? ", ordered" : "",
                transport_.describe().c_str());
}

}  // namespace qccl
