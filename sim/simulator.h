// The timed simulator: qccl's own plans, run on a modeled cluster in virtual time.
//
// Every rank's call is bound exactly as a communicator binds it (the codec's method and state, the
// registry's algorithm or the one named, the chunk size), and its Plan writes each fragment's
// Program as it would for the host executor (src/executor.cc). The simulator runs those Programs
// with the executor's rules (pipeline depth: fragments in flight, each running its steps in order
// until it waits for a transfer; a fragment is done when all its transfers are) but, instead of
// moving data, it charges time:
//   - a CPU step costs its Model cost times the values it touches (per codec and step kernel),
//     stretched by the host's oversubscription (ranks per core, when a host has fewer cores than
//     ranks); a rank of such a host that blocked waits for a core when it wakes (Model::wakeup);
//   - posting a transfer costs Model::post, and a message between hosts Model::wire per byte at
//     each end (the kernel's TCP path);
//   - a message starts once both ends have posted it, in the earliest gap its sender's outgoing and
//     its receiver's incoming ports share (the host's NIC across hosts, the rank's own port within
//     one), holds both for its serialization time (less what a token bucket passes at once: buckets
//     start the call empty and fill while their port idles) and arrives a latency later.
// Messages take the sizes the plan gives them; a variable-length codec's encodings (fft) take their
// capacity, or `density` of it. Buffers are never touched: they are addresses in a reservation that
// cannot be read or written, so a plan that looked at data while building would fault.
//
// The call simulated is a steady-state one: the codec state (one, shared by every rank, since no
// numbers are computed) is past its first round, where a method may behave differently (Marsit's
// round 0 is a full-precision one; an adaptive IntSGD scale starts exact). Its arrays (error
// feedback's residual, Marsit's compensation) are addresses in a reservation too, so a call of any
// size allocates no state that grows with it.
//
// Simulation is discrete-event and conservative: ranks act in virtual-time order, so that the ports
// serve messages in the order they were ready. Frame headers are not simulated; a rooted collective's
// agreement rounds (src/executor.h) add ceil(log2 n) latencies where they outlast the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collectives/plan.h"
#include "sim/model.h"
#include "src/executor.h"

namespace qccl::sim {

// Ranks on hosts: rank r on host r / (nranks / hosts) (blocks of equal size).
struct Topology {
  int nranks = 2;
  int hosts = 0;           // 0: one host per rank
  int cores_per_host = 0;  // 0: as many cores as ranks (no oversubscription)
  // > 0: every host shares one machine of this many cores (qcclrun --netem: emulated hosts on one box)
  int machine_cores = 0;

  int host_count() const { return hosts > 0 ? hosts : nranks; }
  int ranks_per_host() const { return nranks / host_count(); }
  int host_of(int rank) const { return rank / ranks_per_host(); }
  // Which ranks share a host, as the plans see it (CollArgs::nodes).
  coll::NodeMap node_map() const;
  // How much slower a CPU step runs than on a core of its own.
  double oversubscription() const;
  // Empty when valid, else what is wrong ("3 hosts do not divide 8 ranks").
  std::string check() const;
};

// One collective call, as every rank makes it.
struct CallSpec {
  coll::CollKind kind = coll::CollKind::kAllReduce;
  size_t count = 0;  // elements, with NCCL's meaning per collective (coll::CollArgs::count)
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::RedOp op = kernels::RedOp::kSum;
  int root = 0;
  std::string algorithm;  // "": the one qccl picks (src/policy.h)
  std::string codec;      // "": uncompressed
  size_t chunk_bytes = 256 * 1024;
  int depth = 2;
  double density = 1.0;  // variable-length codecs: the share of their capacity an encoding takes
  // rate > 0: the library is told its link (QCCL_LINK_RATE), and the plans that weigh it decide by it
  // (coll::LinkFacts: the fft codec's fall-back), as qcclrun --netem's ranks do.
  coll::LinkFacts link;
};

struct SimResult {
  double seconds = 0;  // from the call's start until the last rank finished
  std::string algorithm;
  std::string codec;         // canonical, "" when uncompressed
  uint64_t inter_bytes = 0;  // payload bytes between hosts, summed over ranks
  uint64_t intra_bytes = 0;  // payload bytes within hosts
  uint64_t plan_bytes = 0;   // the plans' wire_bytes_sent(), summed (equal to the two above
                             // for fixed-size codecs)
  uint64_t raw_bytes = 0;    // what the same call sends uncompressed
  double busiest_nic = 0;    // seconds the busiest inter-host port was busy
  double busiest_intra = 0;  // ... intra-host port
  double busiest_cpu = 0;    // CPU seconds of the busiest rank
  std::string bottleneck;    // "inter", "intra", "cpu" or "latency": what bounded the time
  uint64_t transfers = 0;
  uint64_t steps = 0;
  std::map<std::pair<int, int>, uint64_t> link_bytes;  // (src, dst) -> payload bytes, when asked
};

// What the simulator lets every rank's plan and fragment programs hold together. Plans are made for
// every rank before the call starts and each rank holds a program per fragment in flight, so both
// grow with the rank count, plans and rings' programs with its square: past this, a call is refused
// with the reason rather than run the machine out of memory.
inline constexpr double kMaxHeldBytes = 4.0 * (1 << 30);

// What one rank's plan of `algorithm` holds on `topology`, in bytes: estimated from what the plans
// of collectives/ keep (most a ring of every rank, an int each; the hierarchical ones their host's
// ranks and a rank per host; recursive doubling, the binomial trees and direct gather and scatter a
// few fields), since a plan reports no size of its own. simulate() and execute() refuse a call whose
// plans would pass kMaxHeldBytes before they make any.
double plan_bytes_per_rank(const coll::Algorithm& algorithm, const Topology& topology);

// "4.0 GiB", "256.0 KiB", "12 B": byte counts in tables and refusals.
std::string human_bytes(double bytes);

// Runs one call on the modeled cluster. Throws std::invalid_argument for a spec, algorithm or
// topology it cannot run (the message names it), or whose plans and programs would hold more than
// kMaxHeldBytes (the message gives the figure and what would fit), and std::runtime_error when the
// plans deadlock.
SimResult simulate(const Model& model, const Topology& topology, const CallSpec& call, bool link_bytes = false);

// Runs the same call with real data on an in-process network (the host executor and the real
// kernels, every rank on this thread; sizes small enough for memory): payload bytes per (src, dst)
// link, to compare with simulate(..., link_bytes = true). With a profile, the method's kernels are
// timed into it (calibration).
std::map<std::pair<int, int>, uint64_t> execute(const Topology& topology, const CallSpec& call,
                                                StepProfile* profile = nullptr);

// Elements of the send and receive buffers of a call on n ranks (NCCL's conventions).
size_t send_elements(const CallSpec& call, int nranks);
size_t recv_elements(const CallSpec& call, int nranks);

}  // namespace qccl::sim
