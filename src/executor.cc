#include "src/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "collectives/intsgd.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/marsit.h"
#include "kernels/reduce.h"
#include "src/errors.h"

namespace qccl {

namespace {
constexpr transport::Key kFingerprintBits = 0xfff;
constexpr transport::Key kTaintBit = transport::Key{1} << 28;
constexpr transport::Key kIgnoredBits = kFingerprintBits | kTaintBit;  // what receives do not match
// Message ids (executor.h): 0 the plan's frame headers, then the payload, then the agreement rounds.
constexpr uint32_t kFirstAgreementMessage = 0xfff0;
constexpr uint32_t kPayloadMessages = kFirstAgreementMessage - 1;
constexpr size_t kMaxAgreementRounds = 0x10000 - kFirstAgreementMessage;

bool rooted(coll::CollKind kind) { return kind == coll::CollKind::kBroadcast || kind == coll::CollKind::kReduce; }
}  // namespace

Operation::Operation(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                     const OperationIdentity& identity, int depth, std::byte* scratch,
                     const std::vector<std::string>* names)
    : algorithm_(algorithm), plan_(std::move(plan)), identity_(identity), names_(names),
      last_progress_(Clock::now()) {
  const size_t fragments = plan_->fragments();
  slots_.resize(std::min<size_t>(static_cast<size_t>(std::max(depth, 1)), std::max<size_t>(fragments, 1)));
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].scratch = scratch + i * plan_->scratch_bytes();
  const coll::CollArgs& args = plan_->args();
  if (args.codec && args.codec->kind == kernels::CodecKind::kInt) clip_ = kernels::int_clip(args.codec->bits, args.nranks);
}

Operation::~Operation() = default;

transport::Key Operation::key(uint32_t message, bool tainted) const {
  return (static_cast<transport::Key>(identity_.p2p) << 43) |
         (static_cast<transport::Key>(identity_.sequence & 0x3fff) << 29) | (tainted ? kTaintBit : 0) |
         (static_cast<transport::Key>(message & 0xffff) << 12) | identity_.header.fingerprint();
}

const std::string& Operation::name(int rank) const { return (*names_)[rank]; }

void Operation::start(transport::Transport& transport) {
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
    link.handle = transport.irecv(link.peer, key(0), kIgnoredBits, link.bytes, sizeof(link.bytes));
  }
  header_sends_.resize(send_to.size());
  for (size_t i = 0; i < send_to.size(); ++i) {
    HeaderLink& link = header_sends_[i];
    link.peer = send_to[i];
    identity_.header.encode(link.bytes);
    link.handle = transport.isend(link.peer, key(0), link.bytes, sizeof(link.bytes));
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
      round.recv.handle = transport.irecv(round.recv.peer, key(kFirstAgreementMessage + static_cast<uint32_t>(k)),
                                          kIgnoredBits, round.recv.bytes, sizeof(round.recv.bytes));
      round.send.peer = (args.rank + distance) % args.nranks;
      identity_.header.encode(round.send.bytes);
    }
    AgreementRound& first = agreement_[0];
    first.send.handle = transport.isend(first.send.peer, key(kFirstAgreementMessage), first.send.bytes,
                                        sizeof(first.send.bytes));
    first.sent = true;
  }
  for (Slot& slot : slots_) next_fragment(slot);
}

void Operation::next_fragment(Slot& slot) {
  if (next_fragment_ >= plan_->fragments()) {
    slot.fragment = kIdle;
    return;
  }
  slot.fragment = next_fragment_++;
  slot.pc = 0;
  slot.tainted = false;
  plan_->build(slot.fragment, slot.scratch, slot.program);
}

bool Operation::poll_headers(transport::Transport& transport) {
  bool moved = false;
  std::string error;
  transport::Completion done;
  for (HeaderLink& link : header_sends_) {
    if (link.done) continue;
    switch (transport.test(link.handle, &done, &error)) {
      case transport::Poll::kPending: break;
      case transport::Poll::kDone: link.done = moved = true; break;
      case transport::Poll::kFailed:
        fail(qcclRemoteError, "%s: sending the frame header to %s failed: %s", identity_.header.describe().c_str(),
             name(link.peer).c_str(), error.c_str());
    }
  }
  if (headers_verified_) return moved;
  bool all = true;
  for (HeaderLink& link : header_recvs_) {
    if (link.done) continue;
    switch (transport.test(link.handle, &done, &error)) {
      case transport::Poll::kPending: all = false; break;
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

void Operation::check_header(const HeaderLink& link, size_t bytes) const {
  FrameHeader theirs = FrameHeader::decode(link.bytes, bytes, name(link.peer));
  std::string mismatch = frame_mismatch(identity_.expected, theirs);
  if (!mismatch.empty()) fail(qcclMismatch, "%s", mismatch.c_str());
  if (theirs.sender != link.peer)
    fail(qcclRemoteError, "%s sent a frame header signed by rank %d", name(link.peer).c_str(), theirs.sender);
}

// Checks whatever agreement rounds arrived (in any order: a mismatch fails at once), and sends round
// k once rounds 0 .. k-1 are checked, which is what lets round k vouch for the ranks behind its sender.
bool Operation::poll_agreement(transport::Transport& transport) {
  bool moved = false;
  std::string error;
  transport::Completion done;
  for (size_t k = 0; k < agreement_.size(); ++k) {
    AgreementRound& round = agreement_[k];
    if (round.sent && !round.send.done) {
      switch (transport.test(round.send.handle, &done, &error)) {
        case transport::Poll::kPending: break;
        case transport::Poll::kDone: round.send.done = moved = true; break;
        case transport::Poll::kFailed:
          fail(qcclRemoteError, "%s: sending the frame header (agreement round %zu) to %s failed: %s",
               identity_.header.describe().c_str(), k, name(round.send.peer).c_str(), error.c_str());
      }
    }
    if (round.recv.done) continue;
    switch (transport.test(round.recv.handle, &done, &error)) {
      case transport::Poll::kPending: break;
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
    const uint32_t message = kFirstAgreementMessage + static_cast<uint32_t>(agreed_rounds_);
    next.send.handle = transport.isend(next.send.peer, key(message), next.send.bytes, sizeof(next.send.bytes));
    next.sent = moved = true;
  }
  return moved;
}

bool Operation::complete(Transfer& t, transport::Transport& transport, bool* moved, bool* tainted) {
  if (t.handle.empty()) return true;
  const bool receive = t.handle.receive;
  // Payload from a peer is used only once its frame header has been checked (it was sent first).
  if (receive && !headers_verified_) return false;
  transport::Completion done;
  std::string error;
  switch (transport.test(t.handle, &done, &error)) {
    case transport::Poll::kPending: return false;
    case transport::Poll::kFailed:
      fail(error.find("truncated") != std::string::npos ? qcclMismatch : qcclRemoteError,
           "%s: %s %s failed: %s", identity_.header.describe().c_str(), receive ? "receiving from" : "sending to",
           name(t.peer).c_str(), error.c_str());
    case transport::Poll::kDone: break;
  }
  *moved = true;
  if (receive) {
    if ((done.key & kFingerprintBits) != identity_.header.fingerprint())
      fail(qcclMismatch, "%s: %s sent a message of another collective (fingerprint 0x%03llx, expected 0x%03x)",
           identity_.expected.describe().c_str(), name(t.peer).c_str(),
           static_cast<unsigned long long>(done.key & kFingerprintBits), identity_.header.fingerprint());
    if (done.bytes != t.bytes)
      fail(qcclMismatch, "%s: %s sent %zu bytes where %zu were expected", identity_.expected.describe().c_str(),
           name(t.peer).c_str(), done.bytes, t.bytes);
    bytes_received_ += done.bytes;
    if (tainted && (done.key & kTaintBit)) *tainted = true;
  }
  return true;
}

bool Operation::run(Slot& slot, transport::Transport& transport) {
  bool moved = false;
  const coll::CollArgs& args = plan_->args();
  while (slot.fragment != kIdle) {
    const auto& steps = slot.program.steps();
    if (slot.pc == steps.size()) {
      for (Transfer& t : slot.transfers)
        if (!complete(t, transport, &moved, &slot.tainted)) return moved;
      ++fragments_done_;
      moved = true;
      next_fragment(slot);
      continue;
    }
    const coll::Step& s = steps[slot.pc];
    switch (s.kind) {
      case coll::StepKind::kRecv:
      case coll::StepKind::kSend: {
        Transfer& t = slot.transfers[s.slot];
        if (!t.handle.empty())
          fail(qcclInternalError, "%s (%s): fragment %zu posts on busy slot %u", identity_.header.describe().c_str(),
               algorithm_.name, slot.fragment, s.slot);
        const uint32_t message = 1 + s.msg % kPayloadMessages;
        t.peer = s.peer;
        t.bytes = s.n;
        if (s.kind == coll::StepKind::kRecv) {
          t.handle = transport.irecv(s.peer, key(message), kIgnoredBits, s.dst, s.n);
        } else {
          t.handle = transport.isend(s.peer, key(message, slot.tainted), s.src, s.n);
          bytes_sent_ += s.n;
        }
        break;
      }
      case coll::StepKind::kWait:
        if (!complete(slot.transfers[s.slot], transport, &moved, &slot.tainted)) return moved;
        break;
      case coll::StepKind::kReduce:
        kernels::reduce(args.dtype, args.op, s.src, s.src2, s.dst, s.n);
        break;
      case coll::StepKind::kCopy:
        std::memcpy(s.dst, s.src, s.n);
        break;
      case coll::StepKind::kAverage:
        if (args.op == kernels::RedOp::kAvg) kernels::finish_average(args.dtype, s.dst, s.n, args.nranks);
        break;
      default:
        run_codec_step(s, slot);
        break;
    }
    ++slot.pc;
    moved = true;
  }
  return moved;
}

// The float32 and codec steps of compressed collectives, timed into the encode and decode totals.
void Operation::run_codec_step(const coll::Step& s, Slot& slot) {
  const coll::CollArgs& args = plan_->args();
  const kernels::CodecConfig& codec = *args.codec;
  const auto start = Clock::now();
  double* bucket = &decode_seconds_;
  auto* out = static_cast<float*>(s.dst);
  switch (s.kind) {
    case coll::StepKind::kLoad: kernels::load_float(args.dtype, s.src, out, s.n); break;
    case coll::StepKind::kLoadAdd: kernels::load_add_float(args.dtype, s.src, out, s.n); break;
    case coll::StepKind::kAddFloat: kernels::add_float(static_cast<const float*>(s.src), out, s.n); break;
    case coll::StepKind::kDivide: kernels::divide_float(out, s.n, static_cast<float>(args.nranks)); break;
    case coll::StepKind::kEncode: {
      kernels::PhiloxKey key = args.rng;
      key.stream = s.msg;
      kernels::encode(codec, static_cast<const float*>(s.src), s.n, s.dst, key, s.index);
      bucket = &encode_seconds_;
      break;
    }
    case coll::StepKind::kDecodeAdd: kernels::decode_accumulate(codec, s.src, s.n, out); break;
    case coll::StepKind::kDecodeOut: {
      // Every rank decodes the same final bytes, so every rank counts the same non-finite values.
      if (args.dtype == kernels::DataType::kFloat32) {
        nonfinite_ += kernels::decode(codec, s.src, s.n, out);
      } else {
        auto* scratch = static_cast<float*>(const_cast<void*>(s.src2));
        nonfinite_ += kernels::decode(codec, s.src, s.n, scratch);
        kernels::store_float(args.dtype, scratch, s.dst, s.n);
      }
      break;
    }
    case coll::StepKind::kErrorFeedback: {
      kernels::decode(codec, s.src2, s.n, out);  // what the peers will decode...
      const auto* acc = static_cast<const float*>(s.src);
      for (size_t i = 0; i < s.n; ++i) out[i] = s.factor * (acc[i] - out[i]);  // ...and what it missed
      break;
    }
    case coll::StepKind::kPackSigns:
      if (kernels::pack_signs(static_cast<const float*>(s.src), &args.compensation, s.index, s.n,
                              static_cast<uint32_t*>(s.dst), static_cast<float*>(const_cast<void*>(s.src2))))
        slot.tainted = true;
      bucket = &encode_seconds_;
      break;
    case coll::StepKind::kMergeSigns: {
      kernels::PhiloxKey key = args.rng;
      key.rank = s.aux, key.stream = s.msg;  // one merge per (step, phase, group, hop, word): marsit.md §6.2
      kernels::merge_signs(static_cast<const uint32_t*>(s.src), static_cast<const uint32_t*>(s.src2),
                           static_cast<uint32_t*>(s.dst), s.n, s.aux, key, s.index);
      bucket = &encode_seconds_;
      break;
    }
    case coll::StepKind::kDecodeSigns:
      if (slot.tainted) {  // a NaN or Inf somewhere in this fragment: no finite garbage, state kept
        std::fill(out, out + s.n, std::numeric_limits<float>::quiet_NaN());
        std::memcpy(args.compensation.stored + s.index, s.src2, s.n * sizeof(float));
        nonfinite_ += s.n;
      } else {
        kernels::decode_signs(static_cast<const uint32_t*>(s.src), s.n, codec.eta, out, &args.compensation, s.index);
      }
      break;
    case coll::StepKind::kAddCompensation:
      kernels::add_compensation(static_cast<const float*>(s.src), args.compensation, s.index, s.n, out);
      break;
    case coll::StepKind::kResetCompensation:
      nonfinite_ += kernels::reset_compensation(static_cast<const float*>(s.src), args.compensation, s.index, s.n);
      break;
    case coll::StepKind::kIntEncode: {
      const kernels::IntEncodeReport report =
          kernels::int_encode(codec.bits, static_cast<const float*>(s.src), s.n, s.factor,
                              codec.rounding == kernels::Rounding::kStochastic, clip_, args.rng, s.index, s.dst);
      clipped_ += report.clipped;
      if (report.nonfinite) slot.tainted = true;  // never summed: the peers learn it from the key
      bucket = &encode_seconds_;
      break;
    }
    case coll::StepKind::kIntAdd: kernels::int_add(codec.bits, s.src, s.dst, s.n); break;
    case coll::StepKind::kIntDecode: {
      // Every rank decodes the same sums with the same taint, so every rank counts the same.
      auto* f32 = args.dtype == kernels::DataType::kFloat32 ? out : static_cast<float*>(const_cast<void*>(s.src2));
      if (slot.tainted) {
        std::fill(f32, f32 + s.n, std::numeric_limits<float>::quiet_NaN());
        nonfinite_ += s.n;
      } else {
        const double n = args.op == kernels::RedOp::kAvg ? args.nranks : 1;
        kernels::int_decode(codec.bits, s.src, s.n, 1.0 / (n * static_cast<double>(s.factor)), f32);
        kernels::int_accumulate_sums(codec.bits, s.src, s.n, &int_sums_);
      }
      if (f32 != out) kernels::store_float(args.dtype, f32, s.dst, s.n);
      break;
    }
    case coll::StepKind::kChunkHeader: {
      coll::SwitchChunkHeader header;
      header.bits = static_cast<uint8_t>(codec.bits);
      header.count = static_cast<uint32_t>(s.n);
      header.encode(s.dst);
      break;
    }
    default:
      fail(qcclInternalError, "%s: unknown step kind %d", identity_.header.describe().c_str(), static_cast<int>(s.kind));
  }
  *bucket += std::chrono::duration<double>(Clock::now() - start).count();
}

bool Operation::advance(transport::Transport& transport) {
  bool moved = false;
  if (!started_) {
    start(transport);
    moved = true;
  }
  moved |= poll_headers(transport);
  if (!agreement_.empty()) moved |= poll_agreement(transport);
  for (Slot& slot : slots_) moved |= run(slot, transport);
  if (moved) last_progress_ = Clock::now();
  return moved;
}

bool Operation::finished() const {
  // A rooted collective also waits for its agreement rounds: until every rank is known to have called
  // the same collective, a rank that has all its data (a root that sent eagerly) may not succeed.
  if (!started_ || !headers_verified_ || !agreed() || fragments_done_ < plan_->fragments()) return false;
  for (const HeaderLink& link : header_sends_)
    if (!link.done) return false;
  for (const AgreementRound& round : agreement_)
    if (!round.send.done) return false;
  return true;
}

void Operation::cancel(transport::Transport& transport) {
  for (Slot& slot : slots_)
    for (Transfer& t : slot.transfers) transport.cancel(t.handle);
  for (HeaderLink& link : header_sends_) transport.cancel(link.handle);
  for (HeaderLink& link : header_recvs_) transport.cancel(link.handle);
  for (AgreementRound& round : agreement_) {
    transport.cancel(round.send.handle);
    transport.cancel(round.recv.handle);
  }
}

std::string Operation::waiting_for() const {
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

}  // namespace qccl
