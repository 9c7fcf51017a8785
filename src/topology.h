// What a rank knows about the machine it runs on (hwloc) and which peers share it.
#pragma once

#include <string>
#include <vector>

namespace qccl {

struct LocalTopology {
  std::string hostname;
  std::string boot_id;   // distinguishes two hosts that share a name (containers, clones)
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int pus = 0;
  std::string binding;   // the CPUs this process may run on, as hwloc prints a cpuset list
  int bound_pus = 0;     // how many they are
  std::string summary() const;  // "host: 1 package, 1 NUMA node, 2 cores, 2 PUs, bound to 0-1"
};

// Reads hwloc's view of this machine (throws Error(qcclSystemError) when hwloc fails).
LocalTopology detect_local_topology();

}  // namespace qccl
