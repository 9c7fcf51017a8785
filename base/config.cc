#include "base/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/errors.h"
#include "base/socket.h"

namespace qccl {

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> vars = {
      {"QCCL_DEBUG", "unset (silent)", "log level: NONE, WARN, INFO (topology, transport, algorithms once per communicator) or TRACE, in any case; another value logs at WARN, after a line saying so"},
      {"QCCL_DEBUG_FILE", "unset (stderr)", "write the log to this file; %h is the host name, %p the pid"},
      {"QCCL_TIMEOUT", "300", "seconds a collective may go without progress before it fails on every rank; 0 waits forever"},
      {"QCCL_CHUNK_BYTES", "262144 (or from QCCL_LINK_RATE)", "pipeline chunk size in bytes, 64 to 1 GiB (K/M/G, k/m/g or KiB/MiB/GiB suffixes, powers of 1024)"},
      {"QCCL_PIPELINE_DEPTH", "2", "chunks in flight per collective, 1 to 64"},
      {"QCCL_LINK_RATE", "unset (unknown; probed for QCCL_CODEC=auto on several nodes)", "the rate of each rank's link, in tc's units, 1kbit to 1000tbit (100mbit, 1gbit; set by qcclrun --netem), or probe: measured between the nodes when the communicator is made (node leaders send one another growing messages around a ring of nodes, each size twice, 64 KiB up to 64 MiB or 50 ms; the slope between the last two sizes, so that a shaper's burst and the latency drop out, at most 4 times the last size's average rate; the slowest link's rate, the same on every rank; 0.25-0.45 s measured, nothing on one node). Without QCCL_CHUNK_BYTES the chunk becomes 5 ms of the link (4 KiB multiples, 16 KiB to 256 KiB), so that a chunk fits a shallow switch queue, and 1 MiB from 8gbit on (a 10 Gbit/s link, as set or as a probe measures it)"},
      {"QCCL_ALGO", "unset (by size)", "force algorithms by name: 'ring' or 'allreduce=ring,broadcast=chain', each collective once, its own NAME over a bare one (qccl_info lists them); one that cannot run a call gives way to the choice by size, with a WARN once per reason"},
      {"QCCL_SPIN_US", "20", "microseconds to poll (0 to 1000000) before blocking on the network's event descriptor"},
      {"QCCL_SOCKET_IFNAME", "unset (first non-loopback IPv4)", "interface whose address the bootstrap listens on and advertises"},
      {"QCCL_CODEC", "unset (no compression)", "compress plain qcclAllReduce calls (sum/avg of float, half, bfloat16): a codec spec such as q8 for all three, TYPE=SPEC;TYPE=SPEC per datatype (none: that type exact), or auto[:maxrelerr=E] (per call, the codec a cost model predicts fastest among those whose proven error bound is within E of the largest sum, default 0.01; uncompressed where none pays)"},
      {"QCCL_CODEC_MIN_BYTES", "1048576", "a fixed QCCL_CODEC compresses only all-reduces of at least this many bytes (auto weighs every size)"},
      {"QCCL_CODEC_STATE_BUDGET", "4294967296", "bytes of codec state (error-feedback residuals, Marsit compensations, IntSGD states) one communicator may hold"},
      {"QCCL_AGGREGATORS", "unset (none)", "host:port,... (each once) of IntSGD's aggregator processes (qccl_aggregator; set by qcclrun --aggregators K): every communicator registers with them (every rank must set the same list), and the int codecs' agg=switch sums through them"},
      {"QCCL_NODE_MAP", "unset (by host)", "which ranks share a node, to emulate several nodes on one host: one node label per rank, comma-separated non-negative integers such as 0,0,1,1 (ranks with equal labels share a node); it must list every rank of the communicator"},
      {"QCCL_GPU_WIRE", "auto", "how device-buffer collectives move bytes between ranks: nccl (NCCL point-to-point between the GPUs, libnccl.so.2 loaded at run time), host (staged through pinned host memory over qccl's transport) or auto (nccl when every rank has a GPU of its own and all share one host, else host); chosen at the first collective on device buffers made outside a group, which every rank must make at the same point (earlier calls take host)"},
      {"QCCL_GPU_FFT", "host", "what runs the fft codec on device buffers: host (the host's codec, KissFFT or FFTW, on pinned copies of the buffers: the same bits as host buffers, so ranks with and without GPUs mix) or cufft (cuFFT and the CUDA kernels of kernels/fft_cuda.h on the device, libcufft.so.12 or CUDA 12's libcufft.so.11 loaded at run time; cuFFT rounds otherwise than the host's library, so every rank of a call must use it, of one version, or all fail with qcclMismatch)"},
      {"QCCL_OVERSUBSCRIBED", "unset (detected)", "1: more ranks than CPUs share this machine, so a spinning rank yields the CPU; 0: they do not; unset: ranks of this host (by host name and boot id) against the CPUs this process may use (qcclrun --nodes and --netem set 1 when their emulated hosts share too few CPUs)"},
      {"QCCL_RANK", "unset", "this process's rank, for qcclCommInitEnv (set by qcclrun)"},
      {"QCCL_NRANKS", "unset", "number of ranks, for qcclCommInitEnv (set by qcclrun)"},
      {"QCCL_ROOT", "unset", "host:port where rank 0 runs the bootstrap root, for qcclCommInitEnv (set by qcclrun)"},
      {"QCCL_MAGIC", "derived from the job id", "64-bit hex bootstrap magic shared by the job's ranks (set by qcclrun); unset, a hash of the root's host:port, the rank count and whichever of TORCHELASTIC_RUN_ID, SLURM_JOB_ID, SLURM_STEP_ID, OMPI_MCA_ess_base_jobid and PMIX_NAMESPACE are set"},
      {"QCCL_LOCAL_RANK", "unset", "rank among the ranks on this host, or emulated host (set by qcclrun; informational)"},
      {"QCCL_LOCAL_NRANKS", "unset", "ranks on this host, or emulated host (set by qcclrun; informational)"},
      {"QCCL_TESTS_MIN_BW", "unset", "all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf, alltoall_perf and sendrecv_perf only: exit 1 when the average bus bandwidth is below 0.9 x this (GB/s); unset or empty, nccl-tests' NCCL_TESTS_MIN_BW is read"},
  };
  return vars;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

double tc_rate_unit(const std::string& unit) {
  // Units of tc(8) (tc_util.c): bit-based and byte-based ("bps" is bytes per second), SI and IEC.
  static const struct {
    const char* unit;
    double bits;
  } kUnits[] = {
      {"", 1},           {"bit", 1},           {"kbit", 1e3},        {"mbit", 1e6},
      {"gbit", 1e9},     {"tbit", 1e12},       {"kibit", 1024.0},    {"mibit", 1048576.0},
      {"gibit", 1073741824.0}, {"tibit", 1099511627776.0},           {"bps", 8},
      {"kbps", 8e3},     {"mbps", 8e6},        {"gbps", 8e9},        {"tbps", 8e12},
      {"kibps", 8 * 1024.0}, {"mibps", 8 * 1048576.0}, {"gibps", 8 * 1073741824.0},
      {"tibps", 8 * 1099511627776.0},
  };
  std::string lower = unit;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return tolower(c); });
  for (const auto& u : kUnits)
    if (lower == u.unit) return u.bits;
  return 0;
}

bool parse_bit_rate(const std::string& text, uint64_t* bits_per_s) {
  // A plain decimal number (no sign, exponent, hex, inf or whitespace, which strtod would take).
  size_t i = 0, dots = 0;
  while (i < text.size() && (isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    dots += text[i] == '.';
    i++;
  }
  if (i == 0 || dots > 1 || (i == 1 && dots == 1)) return false;
  const double scale = tc_rate_unit(text.substr(i));
  if (scale == 0) return false;
  const double bits = strtod(text.substr(0, i).c_str(), nullptr) * scale;
  if (!(bits >= static_cast<double>(kMinLinkBits)) || bits > static_cast<double>(kMaxLinkBits)) return false;
  *bits_per_s = static_cast<uint64_t>(bits);
  return true;
}

size_t chunk_for_link_rate(uint64_t bits_per_s) {
  if (bits_per_s >= kFastLinkBits) return 1024 * 1024;
  const uint64_t bytes = bits_per_s / 8 * 5 / 1000 / 4096 * 4096;  // 5 ms of the link, in 4 KiB pages
  return static_cast<size_t>(std::clamp<uint64_t>(bytes, 16 * 1024, 256 * 1024));
}

size_t parse_size(const std::string& what, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(value.c_str(), &end, 10);
  // strtoull skips blanks, takes a '+' and negates after a '-' (" -1" would be 2^64 - 1): a size
  // starts with its first digit, as an integer does (parse_int).
  if (value.empty() || !std::isdigit(static_cast<unsigned char>(value[0])))
    fail(qcclInvalidArgument, "%s = '%s' is not a size (e.g. 524288, 512K, 4M, 1G)", what.c_str(),
         value.c_str());
  if (errno == ERANGE) fail(qcclInvalidArgument, "%s = '%s' is too large", what.c_str(), value.c_str());
  unsigned long long mult = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = 1ull << 30;
  else if (!suffix.empty())
    fail(qcclInvalidArgument, "%s = '%s' has an unknown suffix '%s' (use K, M or G)", what.c_str(),
         value.c_str(), suffix.c_str());
  if (n > (~0ull) / mult) fail(qcclInvalidArgument, "%s = '%s' is too large", what.c_str(), value.c_str());
  return static_cast<size_t>(n * mult);
}

long long parse_int(const std::string& what, const std::string& value, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(value.c_str(), &end, 10);
  // strtoll also takes leading blanks and a '+', which parse_size and parse_double refuse as well.
  const bool digits = !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) ||
                                         (value[0] == '-' && std::isdigit(static_cast<unsigned char>(value[1]))));
  if (!digits || *end != '\0' || errno == ERANGE)
    fail(qcclInvalidArgument, "%s = '%s' is not an integer", what.c_str(), value.c_str());
  if (n < lo || n > hi)
    fail(qcclInvalidArgument, "%s = %lld is out of range [%lld, %lld]", what.c_str(), n, lo, hi);
  return n;
}

double parse_double(const std::string& what, const std::string& value, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  double d = std::strtod(value.c_str(), &end);
  // strtod also takes leading blanks, a '+', hex ("0x10", "0x1p-3"), "inf" and "nan": a number here
  // is decimal and starts with a digit, a '.' or a '-' (which the range may then refuse).
  const char first = value.empty() ? '\0' : value[0];
  const char lead = first == '-' && value.size() > 1 ? value[1] : first;
  const bool decimal = (std::isdigit(static_cast<unsigned char>(lead)) || lead == '.') &&
                       value.find_first_of("xX") == std::string::npos;
  if (!decimal || *end != '\0')
    fail(qcclInvalidArgument, "%s = '%s' is not a number", what.c_str(), value.c_str());
  // Overflow, and underflow to 0 or a subnormal ("1e-400" was read as 0).
  if (errno == ERANGE || !std::isfinite(d))
    fail(qcclInvalidArgument, "%s = '%s' is too large or too small for a double (the range is [%g, %g])",
         what.c_str(), value.c_str(), lo, hi);
  if (d < lo || d > hi)
    fail(qcclInvalidArgument, "%s = %g is out of range [%g, %g]", what.c_str(), d, lo, hi);
  return d;
}

namespace {
constexpr size_t kMaxChunkBytes = 1ull << 30;
constexpr int kMaxPipelineDepth = 64;
}  // namespace

Config Config::resolve(const qcclConfig_t* overrides) { return from_environment().with(overrides); }

Config Config::from_environment() {
  Config c;
  if (const char* v = env("QCCL_TIMEOUT"))
    c.timeout_seconds = parse_double("QCCL_TIMEOUT", v, 0, net::Deadline::kForeverSeconds);
  if (const char* v = env("QCCL_CHUNK_BYTES")) {
    c.chunk_bytes = parse_size("QCCL_CHUNK_BYTES", v);
    c.chunk_explicit = true;
    if (c.chunk_bytes < 64 || c.chunk_bytes > kMaxChunkBytes)
      fail(qcclInvalidArgument, "QCCL_CHUNK_BYTES = %zu is out of range [64, %zu]", c.chunk_bytes,
           kMaxChunkBytes);
  }
  if (const char* v = env("QCCL_LINK_RATE")) {
    if (std::string(v) == "probe") {
      c.probe_link_rate = true;
    } else {
      if (!parse_bit_rate(v, &c.link_rate_bits))
        fail(qcclInvalidArgument, "QCCL_LINK_RATE = '%s' is neither probe nor a rate from 1kbit to 1000tbit "
             "(1e15 bit/s; tc's units: 100mbit, 1gbit, 10gbit, 125mbps = bytes/s)", v);
      if (!c.chunk_explicit) c.chunk_bytes = chunk_for_link_rate(c.link_rate_bits);
    }
  }
  if (const char* v = env("QCCL_PIPELINE_DEPTH"))
    c.pipeline_depth = static_cast<int>(parse_int("QCCL_PIPELINE_DEPTH", v, 1, kMaxPipelineDepth));
  if (const char* v = env("QCCL_ALGO")) c.algorithms = v;
  if (const char* v = env("QCCL_SPIN_US")) c.spin_us = static_cast<int>(parse_int("QCCL_SPIN_US", v, 0, 1000000));
  if (const char* v = env("QCCL_SOCKET_IFNAME")) c.socket_ifname = v;
  if (const char* v = env("QCCL_CODEC")) c.codec = v;
  if (const char* v = env("QCCL_CODEC_MIN_BYTES")) c.codec_min_bytes = parse_size("QCCL_CODEC_MIN_BYTES", v);
  if (const char* v = env("QCCL_CODEC_STATE_BUDGET")) c.codec_state_budget = parse_size("QCCL_CODEC_STATE_BUDGET", v);
  if (const char* v = env("QCCL_AGGREGATORS")) c.aggregators = v;
  if (const char* v = env("QCCL_NODE_MAP")) c.node_map = v;
  if (const char* v = env("QCCL_GPU_WIRE")) {
    c.gpu_wire = v;
    if (c.gpu_wire != "auto" && c.gpu_wire != "nccl" && c.gpu_wire != "host")
      fail(qcclInvalidArgument, "QCCL_GPU_WIRE = '%s' is not auto, nccl or host", v);
  }
  if (const char* v = env("QCCL_GPU_FFT")) {
    c.gpu_fft = v;
    if (c.gpu_fft != "host" && c.gpu_fft != "cufft")
      fail(qcclInvalidArgument, "QCCL_GPU_FFT = '%s' is not host or cufft", v);
  }
  if (const char* v = env("QCCL_OVERSUBSCRIBED"))
    c.oversubscribed = static_cast<int>(parse_int("QCCL_OVERSUBSCRIBED", v, 0, 1));
  return c;
}

Config Config::with(const qcclConfig_t* given) const {
  Config c = *this;
  if (!given) return c;
  if (given->magic != QCCL_CONFIG_MAGIC)
    fail(qcclInvalidArgument, "config->magic = 0x%x: initialise qcclConfig_t with QCCL_CONFIG_INITIALIZER",
         given->magic);
  if (given->size < sizeof(size_t) + 2 * sizeof(unsigned) || given->size > sizeof(qcclConfig_t))
    fail(qcclInvalidArgument, "config->size = %zu is not the size of a qcclConfig_t (%zu)", given->size,
         sizeof(qcclConfig_t));
  // Only the caller's `size` bytes are its struct (a smaller one of an older header): the fields
  // beyond them are not set, and not read.
  qcclConfig_t fields = QCCL_CONFIG_INITIALIZER;
  std::memcpy(&fields, given, given->size);
  const qcclConfig_t* overrides = &fields;
  if (overrides->timeoutSeconds != QCCL_CONFIG_UNDEF_DOUBLE) {
    if (!(overrides->timeoutSeconds >= 0 && overrides->timeoutSeconds <= net::Deadline::kForeverSeconds))
      fail(qcclInvalidArgument, "config->timeoutSeconds = %g is out of range [0, %g]", overrides->timeoutSeconds,
           net::Deadline::kForeverSeconds);
    c.timeout_seconds = overrides->timeoutSeconds;
  }
  if (overrides->chunkBytes != QCCL_CONFIG_UNDEF_INT) {
    if (overrides->chunkBytes < 64 || static_cast<size_t>(overrides->chunkBytes) > kMaxChunkBytes)
      fail(qcclInvalidArgument, "config->chunkBytes = %d is out of range [64, %zu]", overrides->chunkBytes,
           kMaxChunkBytes);
    c.chunk_bytes = static_cast<size_t>(overrides->chunkBytes);
    c.chunk_explicit = true;
  }
  if (overrides->pipelineDepth != QCCL_CONFIG_UNDEF_INT) {
    if (overrides->pipelineDepth < 1 || overrides->pipelineDepth > kMaxPipelineDepth)
      fail(qcclInvalidArgument, "config->pipelineDepth = %d is out of range [1, %d]", overrides->pipelineDepth,
           kMaxPipelineDepth);
    c.pipeline_depth = overrides->pipelineDepth;
  }
  if (overrides->algorithms) {
    c.algorithms = overrides->algorithms;
    c.algorithms_from = "config->algorithms";
  }
  if (overrides->codec) {
    c.codec = overrides->codec;
    c.codec_from = "config->codec";
  }
  if (overrides->codecMinBytes != QCCL_CONFIG_UNDEF_DOUBLE) {
    // (a double of 2^64 or more has no size_t: the cast would be undefined, and came out 0 here)
    if (!(overrides->codecMinBytes >= 0) || !(overrides->codecMinBytes < 18446744073709551616.0))
      fail(qcclInvalidArgument, "config->codecMinBytes = %g must be in [0, 2^64)", overrides->codecMinBytes);
    c.codec_min_bytes = static_cast<size_t>(overrides->codecMinBytes);
  }
  return c;
}

}  // namespace qccl
