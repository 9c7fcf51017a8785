// qccl_info: what this build of qccl has — version, every QCCL_* variable of the library (not the NCCL
// drop-in's QCCL_NCCL_*) with its default and its value here, every algorithm of the registry with its
// wire-bytes formula and default size range, and the kernels and transport it would use (in the manner
// of ucx_info).
#include <cstdio>
#include <cstring>

#include "src/build_info.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: qccl_info [-a] [-m] [-e] [-v] [-h]\n"
               "Prints what this build of qccl provides (everything when no option is given).\n"
               "  -a   algorithms: name, collective, default size range, wire bytes per rank, description\n"
               "  -m   compression methods: name, the codecs each serves\n"
               "  -e   environment: every QCCL_* variable of the library and its benchmarks (not the NCCL\n"
               "       drop-in's QCCL_NCCL_*), its default, and its value in this environment\n"
               "  -v   versions: qccl, UCX, the vector target the reduction kernels dispatch to, and on GPUs\n"
               "       the CUDA runtime, driver and devices, NCCL (QCCL_GPU_WIRE=nccl) and cuFFT\n"
               "       (QCCL_GPU_FFT=cufft), each with why not where it cannot be used\n"
               "  -h   this help\n"
               "Exit status: 0; 1 when a QCCL_* variable holds a value a communicator would refuse (-e\n"
               "prints the refusal); 2 for an unknown option.\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool a = false, e = false, v = false, m = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-a")) a = true;
    else if (!std::strcmp(argv[i], "-e")) e = true;
    else if (!std::strcmp(argv[i], "-m")) m = true;
    else if (!std::strcmp(argv[i], "-v")) v = true;
    else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) return usage(stdout), 0;
    else {
      std::fprintf(stderr, "qccl_info: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!a && !e && !v && !m) a = e = v = m = true;
  if (v) qccl::print_versions(stdout);
  bool valid = true;
  if (e) valid = qccl::print_environment(stdout);
  if (a) qccl::print_algorithms(stdout);
  if (m) qccl::print_methods(stdout);
  return valid ? 0 : 1;
}
