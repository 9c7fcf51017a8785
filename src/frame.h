// The frame header: what a rank announces to its peers at the start of every collective, so that
// ranks that called different collectives (or passed different counts, datatypes, ops, roots or
// codecs) fail with a message that says so, instead of exchanging garbage.
//
// How it travels. Every payload message carries a compact header in its transport key: the
// collective's sequence number (its low 14 bits, src/message_key.h) and a 12-bit fingerprint of the
// fields below; a receive accepts any fingerprint and checks it on arrival. The full 64-byte header
// is sent once per link of the plan (Plan::links) per collective, ahead of the payload on the same
// connection, and checked before any payload from that peer is used. The payload itself therefore
// lands zero-copy in the user's buffer (UCX's rendezvous reads it straight from the sender), which
// a header glued in front of each chunk would prevent. The rooted collectives (Broadcast, Reduce,
// Gather, Scatter) also send it through ceil(log2 n) agreement rounds (src/executor.h), since ranks
// that disagree on the root may share no link; a rooted collective completes on no rank until every
// rank is known to have announced the same header. So does every collective on the device's NCCL
// wire, which posts nothing until then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/plan.h"

namespace qccl {

struct FrameHeader {
  static constexpr uint32_t kMagic = 0x46434351;  // "QCCF"
  static constexpr uint16_t kVersion = 4;
  static constexpr size_t kBytes = 64;

  coll::CollKind kind = coll::CollKind::kAllReduce;  // Send for both ends of a point-to-point pair
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::RedOp op = kernels::RedOp::kSum;          // kSum for collectives that do not reduce
  int32_t root = -1;                                 // -1 for collectives without a root
  uint64_t count = 0;
  uint64_t sequence = 0;
  uint64_t codec_hash = 0;  // 0: uncompressed
  uint64_t codec_step = 0;  // the codec state's step (Marsit's t): ranks whose steps differ fail
  // The scale every rank must share (IntSGD's alpha; 0 for other codecs): it depends on replicated
  // state only, so a difference means the states diverged (and the integer sums would be garbage).
  double codec_scale = 0;
  bool delta = false;     // a keyed delta call (qcclDeltaSend / qcclDeltaRecv): count 1 and uint8 then
  bool receiver = false;  // made by the receiving end of a point-to-point pair (described, not compared)
  int32_t sender = -1;

  // What rank `args.rank` sends for these arguments (a Recv expects the matching Send's header).
  static FrameHeader for_call(const coll::CollArgs& args, uint64_t sequence, uint64_t codec_hash,
                              uint64_t codec_step = 0);

  void encode(uint8_t out[kBytes]) const;
  // Throws Error(qcclRemoteError) naming `from` when the bytes are not a header of this version.
  static FrameHeader decode(const uint8_t* data, size_t size, const std::string& from);

  // 12-bit hash of everything that must agree (kind, dtype, op, root, count, codec and its step, delta).
  uint32_t fingerprint() const;
  // The call that made it: "AllReduce(count=1000, float, sum) #5", "Recv(count=16, float) #0",
  // "DeltaSend #3".
  std::string describe() const;
};

// Empty when `theirs` (received from a peer) matches what this rank expects (`expected`, whose
// `receiver` is this rank's own role); else a sentence that says how they differ.
std::string frame_mismatch(const FrameHeader& expected, const FrameHeader& theirs);

}  // namespace qccl
