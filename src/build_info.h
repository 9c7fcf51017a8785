// What this build of qccl provides, as qccl_info prints it (in the manner of ucx_info): versions, every
// QCCL_* variable with its default and its value in this environment, and the algorithm registry.
#pragma once

#include <cstdio>

namespace qccl {

void print_versions(FILE* out);     // qccl, UCX, the reduction kernels' vector target, CUDA, NCCL, cuFFT
// Every QCCL_* variable: default, value here, meaning; then whether the values here are valid
// (false, with the first refusal printed, when a communicator made here would refuse one).
bool print_environment(FILE* out);
void print_algorithms(FILE* out);   // every registered algorithm: collective, range, wire bytes, description
void print_methods(FILE* out);      // every compression method: name, the codecs it serves, description

}  // namespace qccl
