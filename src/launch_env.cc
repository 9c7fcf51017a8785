#include "src/launch_env.h"

#include <cstring>

#include "base/config.h"
#include "base/errors.h"

namespace qccl {

namespace {

int env_int(const char* name, int lo, int hi) {
  return static_cast<int>(parse_int(name, env(name), lo, hi));
}

void env_root(EnvLaunch& l, const char* source) {
  if (const char* root = env("QCCL_ROOT")) {
    l.root = root;
    l.root_from = "QCCL_ROOT";
    return;
  }
  if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    l.root = std::string(env("MASTER_ADDR")) + ":" + env("MASTER_PORT");
    l.root_from = "MASTER_ADDR:MASTER_PORT";
    return;
  }
  fail(qcclInvalidArgument, "%s gives rank and size but no root address: set QCCL_ROOT=host:port (rank 0's host) "
       "or MASTER_ADDR and MASTER_PORT", source);
}

}  // namespace

EnvLaunch read_launch_environment() {
  EnvLaunch l;
  auto both = [](const char* a, const char* b) {
    if ((env(a) != nullptr) != (env(b) != nullptr))
      fail(qcclInvalidArgument, "%s is set but %s is not", env(a) ? a : b, env(a) ? b : a);
    return env(a) != nullptr;
  };
  if (both("QCCL_RANK", "QCCL_NRANKS")) {
    l.source = "QCCL_RANK/QCCL_NRANKS";
    l.nranks = env_int("QCCL_NRANKS", 1, 1 << 20);
    l.rank = env_int("QCCL_RANK", 0, l.nranks - 1);
    if (l.nranks > 1 && !env("QCCL_ROOT")) fail(qcclInvalidArgument, "QCCL_NRANKS = %d but QCCL_ROOT is not set", l.nranks);
  } else if (both("RANK", "WORLD_SIZE")) {
    l.source = "torchrun (RANK/WORLD_SIZE)";
    l.nranks = env_int("WORLD_SIZE", 1, 1 << 20);
    l.rank = env_int("RANK", 0, l.nranks - 1);
  } else if (both("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")) {
    l.source = "Open MPI (OMPI_COMM_WORLD_RANK/SIZE)";
    l.nranks = env_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 20);
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0, l.nranks - 1);
  } else if (both("SLURM_PROCID", "SLURM_NTASKS")) {
    l.source = "Slurm (SLURM_PROCID/SLURM_NTASKS)";
    l.nranks = env_int("SLURM_NTASKS", 1, 1 << 20);
    l.rank = env_int("SLURM_PROCID", 0, l.nranks - 1);
  } else {
    l.source = "no launcher (single rank)";
  }
  if (l.nranks > 1) {
    env_root(l, l.source.c_str());
    l.root_address = net::Address::parse(l.root, l.root_from);
    if (l.root_address.port() == 0)  // rank 0 would listen on a port of its choosing that no rank knows
      fail(qcclInvalidArgument, "%s = '%s': port 0 cannot be the root's port (every rank connects to it): give a "
           "free port", l.root_from.c_str(), l.root.c_str());
  }
  return l;
}

uint64_t launch_magic(const EnvLaunch& l) {
  if (const char* v = env("QCCL_MAGIC")) {
    // Hex digits only (strtoull would also take a sign, spaces or 0x, and wrap "-1" to all ones).
    if (std::strspn(v, "0123456789abcdefABCDEF") != std::strlen(v) || std::strlen(v) > 16)
      fail(qcclInvalidArgument, "QCCL_MAGIC = '%s' is not a 64-bit hexadecimal number (1 to 16 hex digits)", v);
    return std::strtoull(v, nullptr, 16);
  }
  std::string identity = l.root + "|" + std::to_string(l.nranks);
  for (const char* var : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})
    if (const char* v = env(var)) identity += std::string("|") + v;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : identity) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace qccl
