// The transport key of every message a collective sends, shared by the executor and by the IntSGD
// aggregator daemon, which must take a chunk's key apart the same way:
//   [p2p:1 | sequence:14 | taint:1 | message:16 | fingerprint:12]   (transports/ adds the sender)
// (point-to-point: sequence = [keyed:1 | sequence:13], p2p_sequence below)
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

// Point-to-point calls are numbered per peer and direction; keyed delta calls, whose messages go both
// ways, are numbered apart (src/comm.cc): the sequence field's top bit tells the two apart, and 13
// bits number the calls of each.
constexpr uint64_t kKeyedBit = uint64_t{1} << 13;
constexpr uint64_t p2p_sequence(uint64_t sequence, bool keyed) {
  return (sequence & (kKeyedBit - 1)) | (keyed ? kKeyedBit : 0);
}

// The message field: 0 a frame header, 1 .. 0xffef a fragment's payload, 0xfff0 + k agreement round k
// (src/executor.h).
constexpr uint32_t message(transport::Key key) { return static_cast<uint32_t>((key >> 12) & 0xffff); }
constexpr bool is_payload(transport::Key key) { return message(key) != 0 && message(key) < 0xfff0; }

// What identifies one chunk of one collective, whoever sent it and whether it was tainted.
constexpr transport::Key chunk_id(transport::Key key) { return key & ~kIgnoredBits; }

}  // namespace qccl::message_key
