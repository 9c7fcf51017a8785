// What the simulator knows about a cluster (qccl_sim, sim/simulator.h): its links and its CPUs' cost
// of each kind of step, in a text file that `qccl_sim calibrate` writes and anyone may edit.
//
// Links. Two classes: `inter` joins hosts (one NIC per host, full duplex, shared by the host's ranks)
// and `intra` joins the ranks of one host (shared memory or loopback: a port per rank). A message of
// B bytes occupies its sender's outgoing port and its receiver's incoming port for
// B / (rate x efficiency) seconds and arrives `latency` seconds after it left; a port with a token
// bucket (qcclrun --netem's tbf: `burst` bytes deep, refilled at the rate, empty when a call starts)
// passes what its tokens cover at once and the rest at the rate. Efficiency is the
// payload's share of what the link carries: 1448 bytes of TCP payload per 1538 bytes on an Ethernet
// wire with MTU 1500 (0.941: 20 bytes of preamble and gap, 14 of Ethernet header, 4 of CRC, 20 of
// IP, 32 of TCP with timestamps); 1448 per 1514 (0.956) under qcclrun --netem, whose token buckets
// count the frame without preamble, gap and CRC.
//
// CPU. Costs in seconds per value (per byte for copies) on one core, which a host's ranks share
// when they outnumber its cores (Topology, sim/simulator.h). Codec costs are per codec and step: a
// spec's canonical text first ("q4:bucket=256,..."), then its name ("q4"); the steps are encode,
// decode and decode_add (per value) and the method's kernels by name (per unit of their count:
// StepKernel::name in collectives/plan.h; Marsit's merge counts 32-bit words, for instance).
//
// The file: one `key = value` per line, `#` to the end of a line is a comment:
//   inter.rate = 10gbit          (or 300GB/s, ...: parse_rate; a bare number is bytes/s: 1.25e9);
//                                a file that gives it tells the library the link (Model::inter_rate_told)
//   inter.latency = 5e-05        seconds
//   inter.efficiency = 0.941
//   inter.burst = 250000         bytes of token bucket (0: none)
//   intra.rate, intra.latency, intra.efficiency, intra.burst
//   cpu.post = 1e-06             seconds to post one transfer
//   cpu.wakeup = 5e-05           seconds a rank that blocked takes to run again, per rank per core
//                                beyond one (an oversubscribed host's ranks block instead of spinning)
//   cpu.wire = 1e-09             seconds per payload byte a rank sends or receives between hosts
//                                (the kernel's TCP path: copies and per-packet work, at each end)
//   cpu.message = 8e-06          seconds per message a rank sends or receives between hosts, beside
//                                its bytes (the kernel's TCP path: a system call, a segment to
//                                push or acknowledge, the peer's wake-up; at each end)
//   cpu.copy = 1e-10             seconds per byte copied
//   cpu.reduce = 4e-10           seconds per value of a float32 reduction (other types: by size)
//   cpu.load, cpu.store, cpu.add, cpu.divide   seconds per value (float32 accumulator steps)
//   codec.NAME.STEP              seconds per unit: STEP is encode, decode, decode_add or a kernel
//   source = text                where the numbers came from (any number of lines)
#pragma once

#include <map>
#include <string>
#include <vector>

namespace qccl::sim {

struct LinkClass {
  double rate = 0;          // bytes per second on the wire; 0: unlimited
  double latency = 0;       // seconds
  double efficiency = 1.0;  // payload bytes per wire byte
  double burst = 0;         // token bucket depth in wire bytes; 0: none
  double payload_rate() const { return rate * efficiency; }
};

// Seconds per unit of each step of one codec: "encode", "decode" (into an output buffer),
// "decode_add" (into a float32 accumulator), per value; and its method's kernels by name.
using CodecCosts = std::map<std::string, double>;

struct Model {
  LinkClass inter;
  LinkClass intra;
  double post = 0;     // seconds per transfer posted
  double wakeup = 0;   // seconds to run again after blocking, per unit of oversubscription above 1
  double wire = 0;     // CPU seconds per payload byte sent or received between hosts, at each end
  double message = 0;  // CPU seconds per message sent or received between hosts, at each end
  double copy = 0;     // seconds per byte
  double reduce = 0;   // seconds per float32 value (a + b); other types scale by their size
  double load = 0;     // seconds per value: float32 accumulator from the call's type...
  double store = 0;    // ...and back
  double add = 0;      // seconds per value: acc += x (float32)
  double divide = 0;   // seconds per value: acc /= n
  std::map<std::string, CodecCosts> codecs;
  std::vector<std::string> sources;  // provenance, one line each
  // The library is told the link between hosts, as QCCL_LINK_RATE tells it (its chunk and the fft
  // codec's fall-back follow the rate): a model file gave inter.rate, or qccl_sim --link did. A rate
  // that is only the defaults' is not told.
  bool inter_rate_told = false;

  // The kernel's TCP path at one end for a message of `bytes` between hosts.
  double tcp_seconds(double bytes) const { return message + wire * bytes; }

  // The cost of a codec's step, by the codec's canonical spec, then by its name; null when neither
  // has the step.
  const double* step_cost(const std::string& canonical, const std::string& step) const;
};

// The model shipped with qccl: links from their presets (link_preset), CPU costs measured on the
// development machine (its sources say which and when).
Model default_model();

// A link preset: "100mbit", "1gbit", "10gbit", "25gbit", "100gbit" (Ethernet, TCP payload efficiency,
// 25 us: a typical one-switch latency), "netem:RATE" (qcclrun --netem RATE: the token bucket's
// efficiency, 30 us through the emulation's veth pairs), "nvlink" (an NVLink-class intra-node link:
// 300 GB/s, 2 us). Names are case-blind, RATE's unit is not (parse_rate). False when unknown.
bool link_preset(const std::string& name, LinkClass* out, std::string* source);
// A link given by preset or by rate ("12.5GB/s", "40gbit", "10Gbit/s": Ethernet efficiency, no
// latency, whatever preset's rate it equals; --latency gives one).
// Throws std::invalid_argument naming the text.
LinkClass parse_link(const std::string& text, std::string* source);
// A rate in bytes per second, with its unit: tc(8)'s ("10gbit", "1gibit", "125mbps" = 125 MB/s, as
// qcclrun --netem takes them), or "/s" forms, a capital B counting bytes ("300GB/s", "1.5MiB/s") and
// "bit" or a small b bits ("40Gbit/s", "100Mb/s"); 1 kbit/s to 1000 Tbit/s. Throws
// std::invalid_argument naming the text.
double parse_rate(const std::string& text);
// "10 Gbit/s", "300 GB/s" for tables.
std::string describe_rate(double bytes_per_second);

// Reads a model file over `base` (keys not in the file keep base's values; inter.rate sets
// inter_rate_told). Throws std::invalid_argument naming the file, the line and the key or value (a
// codec's name must parse as a codec spec).
Model load_model(const std::string& path, const Model& base);
// Writes every field of the model in the file format above, each number in the fewest digits that
// read back as the same double, so that load_model over default_model() gives the model back; an
// inter.rate not told is written as a comment (read back, it would be told). False with errno when
// it cannot.
bool save_model(const Model& model, const std::string& path);
std::string format_model(const Model& model);

}  // namespace qccl::sim
