// Policy: which algorithm runs a call. Forced by name through QCCL_ALGO (or qcclConfig_t.algorithms)
// when the algorithm can run the call; otherwise the registry's first algorithm for the collective
// that can run it and whose default size range holds the message (collectives/registry.cc).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "collectives/plan.h"
#include "kernels/codec.h"

namespace qccl {

class AlgorithmPolicy {
 public:
  // spec: "" | "name" | "collective=name[,collective=name...]" (collective names as in the C API,
  // case-insensitive: allreduce, broadcast, reduce, allgather, reducescatter, alltoall, send, recv),
  // mixed as in "ring,allreduce=recursive_doubling": a bare name forces every collective that has an
  // algorithm of that name and no collective=name of its own, wherever the two stand.
  // Throws Error(qcclInvalidArgument) naming `source` (where spec came from) and the bad token, a
  // collective given twice, or two bare names forcing one collective.
  explicit AlgorithmPolicy(const std::string& spec, const std::string& source = "QCCL_ALGO");

  // The forced algorithm when it can run the call; otherwise the first by size, with one WARN per
  // collective and reason for the life of this policy (a communicator's). Thread-safe.
  const coll::Algorithm& choose(const coll::CollArgs& args) const;
  // Whether the spec names an algorithm for this collective.
  bool forces(coll::CollKind kind) const { return forced_.count(kind) != 0; }
  // One line per collective for the INFO log: "AllReduce: recursive_doubling up to 32 KiB, then ring".
  std::string describe() const;
  // What the spec forces, in one form for any spelling of it ("AllReduce=ring,Broadcast=chain"; ""
  // when nothing is forced): ranks that force differently would run different plans.
  std::string forced() const;

 private:
  std::map<coll::CollKind, std::string> forced_;
  std::string source_;  // where the spec came from, for the fallback's warning
  mutable std::mutex warned_mutex_;  // (calls of several threads choose at once)
  mutable std::set<std::pair<coll::CollKind, std::string>> warned_;  // fallbacks already warned of
};

// Which plain qcclAllReduce calls a communicator compresses (QCCL_CODEC / qcclConfig_t.codec):
// sum or average of float32, float16 or bfloat16 messages of at least min_bytes.
class CodecPolicy {
 public:
  // spec: "" (off) | "SPEC" (float, half and bfloat16) | "TYPE=SPEC[;TYPE=SPEC...]" with TYPE one of
  // float, half, bfloat16, and at most one SPEC for the types no TYPE=SPEC names. Throws
  // Error(qcclInvalidArgument) naming the bad token, a TYPE given twice, or a codec whose method
  // refuses a plain call: ef=on and sign (no codec state to keep a residual or compensation in),
  // agg=switch without `aggregators`. Messages name `source`, where spec came from.
  CodecPolicy(const std::string& spec, size_t min_bytes, const std::string& source = "QCCL_CODEC",
              int aggregators = 0);
  // The codec for these arguments, or null (a type the spec gives `none` stays exact).
  const kernels::CodecConfig* choose(const coll::CollArgs& args) const;
  std::string describe() const;

 private:
  std::map<kernels::DataType, std::shared_ptr<kernels::CodecConfig>> by_type_;
  size_t min_bytes_;
};

}  // namespace qccl
