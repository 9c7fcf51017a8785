// The transport key of every message a collective sends, shared by the executor and by the IntSGD
// aggregator daemon, which must take a chunk's key apart the same way:
//   [p2p:1 | sequence:14 | taint:1 | message:16 | fingerprint:12]   (transports/ adds the sender)
// (point-to-point: sequence = [keyed:1 | sequence:13], p2p_sequence and keyed_sequence below)
// The taint bit carries "this fragment met a non-finite value" from rank to rank at no cost in bytes
// (Marsit's sign bits have no room for NaN); receives ignore it and the fingerprint, and check the
// fingerprint on arrival (src/frame.h).
#pragma once

#include <cstdint>

#include "transports/transport.h"

namespace qccl::message_key {

constexpr transport::Key kFingerprintBits = 0xfff;
constexpr transport::Key kTaintBit = transport::Key{1} << 28;
constexpr transport::Key kIgnoredBits = kFingerprintBits | kTaintBit;  // what receives do not match

constexpr transport::Key make(bool p2p, uint64_t sequence, bool tainted, uint32_t message, uint32_t fingerprint) {
  return (static_cast<transport::Key>(p2p) << 43) | (static_cast<transport::Key>(sequence & 0x3fff) << 29) |
         (tainted ? kTaintBit : 0) | (static_cast<transport::Key>(message & 0xffff) << 12) |
         (fingerprint & kFingerprintBits);
}

// Point-to-point calls are numbered per peer and direction in call order, whatever their kind
// (src/comm.cc): the n-th call from rank s to rank r at s meets the n-th from s at r. A plain call's
// messages travel as number n. A keyed delta call's frame header to its receiver does too, where a
// plain call's would, so that a plain call and a delta call that meet fail on it (qcclMismatch) instead
// of waiting for each other; its other messages go both ways and travel apart (the sequence field's
// top bit set) as 2n + 1 when s > r and 2n when s < r, so that the calls of the two directions, which
// are numbered alike, never share one. 13 bits remain: calls 4096 apart in one direction may not be
// in flight together, and a call waits to start while one kP2pWindow calls older of its peer and
// direction runs (src/comm.cc, waits_for_its_key).
constexpr uint64_t kKeyedBit = uint64_t{1} << 13;
constexpr uint64_t kP2pWindow = kKeyedBit / 2;
constexpr uint64_t p2p_sequence(uint64_t n) { return n & (kKeyedBit - 1); }
constexpr uint64_t keyed_sequence(uint64_t n, bool high_sender) {
  return ((2 * n + (high_sender ? 1 : 0)) & (kKeyedBit - 1)) | kKeyedBit;
}

// The message field: 0 a frame header, 1 .. 0xffef a fragment's payload, 0xfff0 + k agreement round k
// (src/executor.h).
constexpr uint32_t message(transport::Key key) { return static_cast<uint32_t>((key >> 12) & 0xffff); }
constexpr bool is_payload(transport::Key key) { return message(key) != 0 && message(key) < 0xfff0; }

// What identifies one chunk of one collective, whoever sent it and whether it was tainted.
constexpr transport::Key chunk_id(transport::Key key) { return key & ~kIgnoredBits; }

}  // namespace qccl::message_key
