// Configuration: every QCCL_* environment variable, its default and its meaning live in one table
// (env_vars()), which qccl_info prints and README.md mirrors. A communicator's settings come from
// qcclConfig_t fields the caller set, else the environment, else the default. Bad values are errors
// that name the variable and the value, never silent defaults.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "include/qccl.h"

namespace qccl {

struct EnvVar {
  const char* name;
  const char* default_value;  // as README shows it
  const char* description;
};
const std::vector<EnvVar>& env_vars();

struct Config {
  double timeout_seconds = 300.0;  // QCCL_TIMEOUT; 0 = wait forever
  size_t chunk_bytes = 256 * 1024; // QCCL_CHUNK_BYTES (docs/PERF.md, "Chunk size and depth")
  int pipeline_depth = 2;          // QCCL_PIPELINE_DEPTH
  std::string algorithms;          // QCCL_ALGO
  std::string algorithms_from = "QCCL_ALGO";  // where `algorithms` came from, for messages
  int spin_us = 20;                // QCCL_SPIN_US: spin this long before blocking on events
  std::string socket_ifname;       // QCCL_SOCKET_IFNAME
  std::string codec;               // QCCL_CODEC: compress plain AllReduce calls (CodecPolicy)
  std::string codec_from = "QCCL_CODEC";  // where `codec` came from, for messages
  size_t codec_min_bytes = 1 << 20;  // QCCL_CODEC_MIN_BYTES
  size_t codec_state_budget = size_t{4} << 30;  // QCCL_CODEC_STATE_BUDGET
  std::string aggregators;         // QCCL_AGGREGATORS: host:port,... of IntSGD's aggregator processes
  int aggregator_count() const {   // how many it names
    return aggregators.empty() ? 0 : 1 + static_cast<int>(std::count(aggregators.begin(), aggregators.end(), ','));
  }
  std::string node_map;            // QCCL_NODE_MAP: node label per rank (src/node_map.h); empty: by host
  int oversubscribed = -1;         // QCCL_OVERSUBSCRIBED: 0 or 1; -1 = detect (ranks of this host > its CPUs)
  // A split child: the ranks of its parent that share this host's CPUs (Comm::host_ranks), which
  // still run beside it whatever the child's own count; 0 for a communicator made otherwise.
  int parent_host_ranks = 0;
  uint64_t link_rate_bits = 0;     // QCCL_LINK_RATE, bit/s; 0 = unknown
  bool probe_link_rate = false;    // QCCL_LINK_RATE=probe: measured when the communicator is made
  bool chunk_explicit = false;     // QCCL_CHUNK_BYTES or chunkBytes set (a link rate then leaves it)
  std::string gpu_wire = "auto";   // QCCL_GPU_WIRE: auto, nccl or host (src/comm.h, "Device buffers")
  std::string gpu_fft = "host";    // QCCL_GPU_FFT: host or cufft (the fft codec on device buffers)

  // Environment first, then the fields of `overrides` that are set (overrides may be null).
  // Throws Error(qcclInvalidArgument) naming the variable or field and its value.
  static Config resolve(const qcclConfig_t* overrides);
  static Config from_environment();
  // This configuration with the fields of `overrides` that are set (a split communicator inherits
  // its parent's settings this way). Throws as resolve() does.
  Config with(const qcclConfig_t* overrides) const;
};

// Parsers shared by the environment, the perf binaries' options and the codec specs. `what` names
// the source in errors ("QCCL_CHUNK_BYTES", "-b").
size_t parse_size(const std::string& what, const std::string& value);      // 512, 64K, 4M, 1G
long long parse_int(const std::string& what, const std::string& value, long long lo, long long hi);
double parse_double(const std::string& what, const std::string& value, double lo, double hi);

// A tc(8) rate ("100mbit", "1gbit", "500kbit", "10mbps" = 10 MB/s, "1gibit", a bare number = bit/s;
// units case-insensitive) in bit/s. False when the text is not a rate or is outside [kMinLinkBits,
// kMaxLinkBits].
bool parse_bit_rate(const std::string& text, uint64_t* bits_per_s);
// The rates a link may have: below 1 kbit/s is not a network (tc's tbf refuses it), and beyond 1e15
// bit/s (1000 Tbit/s) no link reaches, so such a rate is a typo or a broken measurement.
constexpr uint64_t kMinLinkBits = 1'000ull;
constexpr uint64_t kMaxLinkBits = 1'000'000'000'000'000ull;
// Bits per second in one of tc's rate units ("" and "bit" 1, "mbit" 1e6, "mbps" 8e6, "gibit", ...;
// case-insensitive), or 0 when `unit` is none of them.
double tc_rate_unit(const std::string& unit);

// The chunk for a link of this rate when QCCL_CHUNK_BYTES is not set: 5 ms of the link, in 4 KiB
// multiples, from 16 KiB to 256 KiB. Over a slow link with a shallow queue (10 ms of traffic in
// qcclrun --netem's shaper, as in many switches) a 256 KiB chunk overflows it when two ranks send to
// one, and TCP then loses up to half the time to retransmissions (docs/PERF.md, "Simulator",
// validation at 100 Mbit/s); at 1 Gbit/s the chunk stays 256 KiB (608 KiB measured no faster). From
// 8 Gbit/s on, 1 MiB: on a 10 Gbit/s link the fixed cost of a chunk (a message, a wake-up, a codec
// launch) is a large part of its wire time, and 1 MiB is still under 1 ms of the link (docs/PERF.md,
// "Fast links"); 8, not 10, because a probe of a 10 Gbit/s link (QCCL_LINK_RATE=probe) measures what
// TCP carries, which a busy CPU can hold below the link's rate (9.5-10.4 Gbit/s measured here over an
// emulated 10 Gbit/s link, 8.6 in a run that timed one exchange per size).
constexpr uint64_t kFastLinkBits = 8'000'000'000ull;
size_t chunk_for_link_rate(uint64_t bits_per_s);

// getenv that treats an empty value as unset.
const char* env(const char* name);

}  // namespace qccl
