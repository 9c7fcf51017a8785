// QCCL_LINK_RATE=probe: the rate of the links between nodes, measured when a communicator is made
// (and for QCCL_CODEC=auto on several nodes without a rate: its model needs one).
#pragma once

#include <cstdint>
#include <string>

namespace qccl {

class Comm;

struct LinkProbe {
  uint64_t bits_per_s = 0;  // the link's rate in tc's terms (Ethernet framing included), as QCCL_LINK_RATE
  std::string description;  // the sizes and times it came from, for the INFO log
};

// Collective over the communicator, which must have several nodes: the leader of every node sends
// the next node's leader, and receives from the previous one, one message at a time, so that every
// link between nodes carries one stream each way, as in a ring all-reduce. The messages start at
// 64 KiB and grow 4x until one takes 50 ms (or reaches 64 MiB); each size runs twice and the faster
// counts (a loss and its retransmission only ever slow one down). After each size every rank learns
// the slowest leader's time (an AllGather), so that all stop together and compute the same rate: the
// slope between the last two sizes, in which the per-message latency and a shaper's burst (both
// sizes pay them alike) drop out; with one size only, its bytes over its time. docs/PERF.md "Link
// probe" has what it measured and the designs that were dropped. Throws the communicator's errors (a
// dead peer fails it as any collective would). Its AllGathers are collectives like the caller's: the
// sequence numbers of later calls start after them.
LinkProbe probe_link_rate(Comm& comm);

// The rate probe_link_rate reports (bit/s, Ethernet framing included) once the slowest leader took
// `seconds` for `bytes` and, at the size before, `last_seconds` for `last_bytes` (0 and 0 when there
// was none): the slope between the two, at most 4 times bytes / seconds (two close timings made it
// up to 4e17 bit/s), or bytes / seconds without a usable earlier size; always within [kMinLinkBits,
// kMaxLinkBits] (base/config.h), the rates QCCL_LINK_RATE takes. A function of its arguments only:
// every rank that passes the agreed timings gets the same rate.
uint64_t probed_link_rate(double last_bytes, double last_seconds, double bytes, double seconds);

}  // namespace qccl
