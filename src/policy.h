// Policy: which algorithm runs a call. Forced by name through QCCL_ALGO (or qcclConfig_t.algorithms)
// when the algorithm can run the call; otherwise the registry's first algorithm for the collective
// that can run it and whose default size range holds the message (collectives/registry.cc).
#pragma once

#include <map>
#include <string>

#include "collectives/plan.h"

namespace qccl {

class AlgorithmPolicy {
 public:
  // spec: "" | "name" | "collective=name[,collective=name...]" (collective names as in the C API,
  // case-insensitive: allreduce, broadcast, reduce, allgather, reducescatter, alltoall, send, recv).
  // Throws Error(qcclInvalidArgument) naming the bad token.
  explicit AlgorithmPolicy(const std::string& spec);

  const coll::Algorithm& choose(const coll::CollArgs& args) const;
  // One line per collective for the INFO log: "AllReduce: recursive_doubling up to 32 KiB, then ring".
  std::string describe() const;

 private:
  std::map<coll::CollKind, std::string> forced_;
};

}  // namespace qccl
