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
// the next node's leader, and receives from the previous one, a train of 16 messages, so that every
// link between nodes carries one stream each way, as in a ring all-reduce. The rate is that of the
// received stream once it runs: the bytes of messages 5-16 over the time between the completions of
// messages 4 and 16, so that neither a shaper's burst nor TCP's start nor the latency counts. The
// messages start at 16 KiB and grow 4x per train until a train takes 50 ms (or the messages reach
// 4 MiB). After each train every rank learns every leader's rate and time (an AllGather), so that
// all stop together and keep the same rate: the slowest link's. Throws the communicator's errors (a
// dead peer fails it as any collective would).
LinkProbe probe_link_rate(Comm& comm);

}  // namespace qccl
