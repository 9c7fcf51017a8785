// What IntSGD's two all-reduce algorithms share (allreduce_intsgd.cc, the ring; and
// allreduce_intsgd_switch.cc, through aggregator processes): the exact first round, and the header
// of a chunk exchanged with an aggregator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/plan.h"
#include "collectives/ring.h"

namespace qccl::coll {

// The exact round (IntsgdRound::exact): allreduce_ring.cc's reduce-scatter and allgather in place on
// recvbuf, fragment f of ring_fragments (chunk values of every segment; later fragments are empty).
// `total` is the plan's fragment count (message ids are step * total + f); scratch holds chunk
// values of the datatype.
void build_intsgd_exact(const CollArgs& args, const Ring& ring, const Segments& segments, size_t chunk,
                        size_t total, size_t f, std::byte* scratch, Program& p);

// The values a rank sends in a ring all-reduce (exact round: times the element size; integer round
// on the ring: times the wire bytes).
uint64_t intsgd_ring_elements(const Ring& ring, const Segments& segments);

// The 8 bytes in front of every chunk a worker sends to an aggregator and every sum it gets back
// (little-endian): the wire width and the values that follow, so that the aggregator, which knows
// no codec, can add them and check that every rank's contribution agrees.
struct SwitchChunkHeader {
  static constexpr size_t kBytes = 8;
  static constexpr uint8_t kMagic = 0x51;  // 'Q'
  uint8_t bits = 0;     // 8, 16 or 32
  uint32_t count = 0;   // values in the chunk
  void encode(void* out) const {
    auto* b = static_cast<uint8_t*>(out);
    b[0] = kMagic, b[1] = bits, b[2] = 0, b[3] = 0;
    for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<uint8_t>(count >> (8 * i));
  }
  // False when the bytes are not a header (wrong magic or width).
  bool decode(const void* in) {
    const auto* b = static_cast<const uint8_t*>(in);
    bits = b[1];
    count = 0;
    for (int i = 0; i < 4; ++i) count |= static_cast<uint32_t>(b[4 + i]) << (8 * i);
    return b[0] == kMagic && (bits == 8 || bits == 16 || bits == 32);
  }
};

}  // namespace qccl::coll
