// qccl_info: what this build of qccl has — version, every QCCL_* variable with its default and its
// value here, every algorithm of the registry with its wire-bytes formula and default size range,
// and the kernels and transport it would use (in the manner of ucx_info).
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "collectives/plan.h"
#include "include/qccl.h"
#include "kernels/reduce.h"
#include "src/config.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: qccl_info [-a] [-e] [-v] [-h]\n"
               "Prints what this build of qccl provides (everything when no option is given).\n"
               "  -a   algorithms: name, collective, default size range, wire bytes per rank, description\n"
               "  -e   environment: every QCCL_* variable, its default, and its value in this environment\n"
               "  -v   versions: qccl, UCX, and the vector target the reduction kernels dispatch to\n"
               "  -h   this help\n"
               "Exit status: 0, or 2 for an unknown option.\n");
}

void versions() {
  int v = 0;
  qcclGetVersion(&v);
  std::printf("# qccl %d.%d.%d (library code %d)\n", QCCL_MAJOR, QCCL_MINOR, QCCL_PATCH, v);
  std::printf("# UCX %s\n", ucp_get_version_string());
  std::printf("# reduction kernels: %s\n", qccl::kernels::reduce_target_name());
}

void environment() {
  std::printf("#\n# %-22s %-34s %s\n", "variable", "default", "value here");
  for (const qccl::EnvVar& v : qccl::env_vars()) {
    const char* now = std::getenv(v.name);
    std::printf("  %-22s %-34s %s\n", v.name, v.default_value, now ? now : "(unset)");
    std::printf("  %-22s %s\n", "", v.description);
  }
}

void algorithms() {
  std::printf("#\n# %-14s %-20s %-12s %-28s %s\n", "collective", "algorithm", "default up to", "wire bytes per rank",
              "description");
  for (const qccl::coll::Algorithm& a : qccl::coll::algorithms()) {
    std::string range = a.default_max_bytes ? std::to_string(a.default_max_bytes) + " B" : "any size";
    std::printf("  %-14s %-20s %-12s %-28s %s\n", qccl::coll::coll_name(a.collective), a.name, range.c_str(),
                a.wire_bytes, a.description);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool a = false, e = false, v = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-a")) a = true;
    else if (!std::strcmp(argv[i], "-e")) e = true;
    else if (!std::strcmp(argv[i], "-v")) v = true;
    else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) return usage(stdout), 0;
    else {
      std::fprintf(stderr, "qccl_info: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!a && !e && !v) a = e = v = true;
  if (v) versions();
  if (e) environment();
  if (a) algorithms();
  return 0;
}
