#include "src/topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "base/errors.h"

namespace qccl {

std::string LocalTopology::summary() const {
  return format("%s: %d package%s, %d NUMA node%s, %d cores, %d PUs, bound to PUs %s", hostname.c_str(), packages,
                packages == 1 ? "" : "s", numa_nodes, numa_nodes == 1 ? "" : "s", cores, pus, binding.c_str());
}

LocalTopology detect_local_topology() {
  LocalTopology t;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  t.hostname = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, t.boot_id);

  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0)
    fail(qcclSystemError, "hwloc could not load this machine's topology");
  t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  t.numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  t.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set && hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
    char* text = nullptr;
    hwloc_bitmap_list_asprintf(&text, set);
    if (text) t.binding = text;
    std::free(text);
    t.bound_pus = hwloc_bitmap_weight(set);
  }
  hwloc_bitmap_free(set);
  if (t.bound_pus <= 0) t.bound_pus = t.pus;
  hwloc_topology_destroy(topo);
  return t;
}

}  // namespace qccl
