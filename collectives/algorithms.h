// Factories of every algorithm, one per file; registry.cc lists them (the only place that does).
#pragma once

#include "collectives/node_map.h"
#include "collectives/plan.h"

namespace qccl::coll {

#define QCCL_DECLARE_ALGORITHM(stem)                              \
  const char* stem##_cannot_run(const CollArgs& args);            \
  std::unique_ptr<Plan> make_##stem(const CollArgs& args, const PlanOptions& options);

QCCL_DECLARE_ALGORITHM(local)
QCCL_DECLARE_ALGORITHM(allreduce_recursive_doubling)
QCCL_DECLARE_ALGORITHM(allreduce_ring)
QCCL_DECLARE_ALGORITHM(allreduce_hierarchical_compressed)
QCCL_DECLARE_ALGORITHM(allreduce_sra_compressed)
QCCL_DECLARE_ALGORITHM(allreduce_ring_compressed)
QCCL_DECLARE_ALGORITHM(allreduce_marsit)
QCCL_DECLARE_ALGORITHM(allreduce_intsgd)
QCCL_DECLARE_ALGORITHM(allreduce_intsgd_switch)
QCCL_DECLARE_ALGORITHM(allreduce_fft_allgather)
QCCL_DECLARE_ALGORITHM(allreduce_fft_dense_ring)
QCCL_DECLARE_ALGORITHM(broadcast_binomial)
QCCL_DECLARE_ALGORITHM(broadcast_chain)
QCCL_DECLARE_ALGORITHM(reduce_binomial)
QCCL_DECLARE_ALGORITHM(reduce_chain)
QCCL_DECLARE_ALGORITHM(allgather_ring)
QCCL_DECLARE_ALGORITHM(allgather_compressed_ring)
QCCL_DECLARE_ALGORITHM(allgather_hierarchical)
QCCL_DECLARE_ALGORITHM(allgather_compressed_hierarchical)
QCCL_DECLARE_ALGORITHM(reduce_scatter_ring)
QCCL_DECLARE_ALGORITHM(reduce_scatter_hierarchical)
QCCL_DECLARE_ALGORITHM(reduce_scatter_compressed_pairwise)
QCCL_DECLARE_ALGORITHM(reduce_scatter_compressed_hierarchical)
QCCL_DECLARE_ALGORITHM(reduce_scatter_compressed_two_level)
QCCL_DECLARE_ALGORITHM(reduce_scatter_compressed_hierarchical_intra)
QCCL_DECLARE_ALGORITHM(alltoall_pairwise)
QCCL_DECLARE_ALGORITHM(gather_direct)
QCCL_DECLARE_ALGORITHM(scatter_direct)
QCCL_DECLARE_ALGORITHM(sendrecv_direct)
QCCL_DECLARE_ALGORITHM(sendrecv_compressed)
QCCL_DECLARE_ALGORITHM(sendrecv_delta)

#undef QCCL_DECLARE_ALGORITHM

// For the multi-rank algorithms: they decline a single rank, which `local` serves.
inline const char* needs_two_ranks(const CollArgs& args) {
  return args.nranks < 2 ? "needs at least two ranks" : nullptr;
}

// For the uncompressed algorithms: they decline a call that carries a codec.
inline const char* uncompressed_with_two_ranks(const CollArgs& args) {
  return args.codec ? "uncompressed only (a codec was given)" : needs_two_ranks(args);
}

// For the hierarchical algorithms: a node map of several nodes, one of them with two ranks or more
// (with one node, or one rank per node, the flat algorithms move the same bytes).
inline const char* needs_node_hierarchy(const CollArgs& args) {
  if (!args.nodes) return "no node map";
  if (args.nodes->nodes() < 2) return "one node (the flat algorithms are as good)";
  if (args.nodes->nodes() == args.nranks) return "one rank per node (the flat algorithms are the same)";
  return nullptr;
}

// For the compressed all-reduce algorithms that encode values (not Marsit's sign bits).
inline const char* value_codec_with_two_ranks(const CollArgs& args) {
  if (!args.codec) return "compressed all-reduce only (no codec given)";
  if (args.codec->kind == kernels::CodecKind::kSign) return "the sign codec runs Marsit (marsit)";
  if (args.codec->kind == kernels::CodecKind::kInt) return "the int codecs run IntSGD (intsgd)";
  if (args.codec->kind == kernels::CodecKind::kFft) return "the fft codec runs FFT sparsification (fft_allgather)";
  return needs_two_ranks(args);
}

}  // namespace qccl::coll
