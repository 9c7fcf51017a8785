// The launcher's environment that qcclCommInitEnv reads: this rank, the rank count, the root's
// address and the job's magic, from qcclrun (QCCL_RANK/QCCL_NRANKS/QCCL_ROOT), torchrun, Open MPI or
// Slurm. Shared with qccl_info -e, which judges the same variables.
#pragma once

#include <cstdint>
#include <string>

#include "base/socket.h"

namespace qccl {

struct EnvLaunch {
  int rank = 0;
  int nranks = 1;
  std::string root;           // host:port
  std::string root_from;      // the variables that gave it
  net::Address root_address;  // root, resolved (more than one rank)
  std::string source;         // which launcher's variables were used
};

// Throws Error(qcclInvalidArgument) naming a variable that is missing or malformed.
EnvLaunch read_launch_environment();
// QCCL_MAGIC, or a hash of what identifies the job, so that two jobs that happen to share a root
// address refuse each other.
uint64_t launch_magic(const EnvLaunch& launch);

}  // namespace qccl
