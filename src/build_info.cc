#include "src/build_info.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "base/config.h"
#include "base/errors.h"
#include "collectives/method.h"
#include "collectives/plan.h"
#include "include/qccl.h"
#include "kernels/reduce.h"
#include "src/aggregator.h"
#include "src/auto_codec.h"
#include "src/device.h"
#include "src/launch_env.h"
#include "src/node_map.h"
#include "src/policy.h"

namespace qccl {

void print_versions(FILE* out) {
  int v = 0;
  qcclGetVersion(&v);
  std::fprintf(out, "# qccl %d.%d.%d (library code %d)\n", QCCL_MAJOR, QCCL_MINOR, QCCL_PATCH, v);
  std::fprintf(out, "# UCX %s\n", ucp_get_version_string());
  std::fprintf(out, "# reduction kernels: %s\n", kernels::reduce_target_name());
  for (const std::string& line : describe_gpu_support()) std::fprintf(out, "# %s\n", line.c_str());
}

bool print_environment(FILE* out) {
  std::fprintf(out, "#\n# %-22s %-34s %s\n", "variable", "default", "value here");
  for (const EnvVar& v : env_vars()) {
    const char* now = std::getenv(v.name);
    std::fprintf(out, "  %-22s %-34s %s\n", v.name, v.default_value,
                 !now ? "(unset)" : *now ? now : "(empty: the default)");
    std::fprintf(out, "  %-22s %s\n", "", v.description);
  }
  // What a communicator made here would refuse (as qcclCommInitRank would, naming the variable).
  try {
    const Config config = Config::from_environment();
    const EnvLaunch launch = read_launch_environment();  // qcclCommInitEnv's: QCCL_RANK, QCCL_ROOT, ...
    launch_magic(launch);
    if (!config.node_map.empty()) {  // against the launcher's rank count, else its own length
      const auto entries = std::count(config.node_map.begin(), config.node_map.end(), ',') + 1;
      parse_node_map(config.node_map, launch.nranks > 1 ? launch.nranks : static_cast<int>(entries));
    }
    if (!config.aggregators.empty()) parse_aggregator_list(config.aggregators);
    if (!config.socket_ifname.empty()) net::local_address(config.socket_ifname);
    const AlgorithmPolicy algorithms(config.algorithms);
    if (AutoCodec::is_auto(config.codec))
      const AutoCodec codec(config.codec, 2);
    else
      const CodecPolicy codec(config.codec, config.codec_min_bytes, config.codec_from, config.aggregator_count());
    // Not a communicator's: the perf binaries' bandwidth floor, read as they read it (perf/common.cc,
    // min_bus_bandwidth: a finite decimal >= 0; unset or empty, NCCL_TESTS_MIN_BW in its place).
    const char* min_bw = env("QCCL_TESTS_MIN_BW") ? "QCCL_TESTS_MIN_BW" : "NCCL_TESTS_MIN_BW";
    if (const char* v = env(min_bw)) parse_double(min_bw, v, 0, std::numeric_limits<double>::max());
  } catch (const Error& e) {
    std::fprintf(out, "# invalid here: %s\n", e.what());
    return false;
  }
  std::fprintf(out, "# every value here is valid\n");
  return true;
}

void print_algorithms(FILE* out) {
  std::fprintf(out, "#\n# %-14s %-20s %-12s %-28s %s\n", "collective", "algorithm", "default up to",
               "wire bytes per rank", "description");
  for (const coll::Algorithm& a : coll::algorithms()) {
    std::string range = a.default_max_bytes ? std::to_string(a.default_max_bytes) + " B" : "any size";
    std::fprintf(out, "  %-14s %-20s %-12s %-28s %s\n", coll::coll_name(a.collective), a.name, range.c_str(),
                 a.wire_bytes, a.description);
  }
}

void print_methods(FILE* out) {
  std::fprintf(out, "#\n# %-10s %s\n", "method", "codecs and description");
  for (const coll::Method* m : coll::methods()) std::fprintf(out, "  %-10s %s\n", m->name(), m->description());
}

}  // namespace qccl
