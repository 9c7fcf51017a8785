// The registry: every algorithm qccl has, in preference order per collective (STYLE rule 2).
// Default size limits were chosen by measurement (docs/PERF.md, "Algorithm thresholds").
#include "collectives/algorithms.h"

namespace qccl::coll {

const char* coll_name(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce: return "AllReduce";
    case CollKind::kBroadcast: return "Broadcast";
    case CollKind::kReduce: return "Reduce";
    case CollKind::kAllGather: return "AllGather";
    case CollKind::kReduceScatter: return "ReduceScatter";
    case CollKind::kAlltoAll: return "AlltoAll";
    case CollKind::kSend: return "Send";
    case CollKind::kRecv: return "Recv";
    case CollKind::kGather: return "Gather";
    case CollKind::kScatter: return "Scatter";
  }
  return "?";
}

size_t CollArgs::message_bytes() const {
  const size_t bytes = count * element_size();
  switch (kind) {
    case CollKind::kAllGather:
    case CollKind::kReduceScatter:
    case CollKind::kAlltoAll:
    case CollKind::kGather:
    case CollKind::kScatter: return bytes * static_cast<size_t>(nranks);
    default: return bytes;
  }
}

const std::vector<Algorithm>& algorithms() {
  constexpr size_t kAny = 0;
  static const std::vector<Algorithm> list = {
      {"local", CollKind::kAllReduce, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kBroadcast, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kReduce, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kAllGather, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kReduceScatter, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kAlltoAll, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kGather, "single rank: copy", "0", kAny, local_cannot_run, make_local},
      {"local", CollKind::kScatter, "single rank: copy", "0", kAny, local_cannot_run, make_local},

      {"recursive_doubling", CollKind::kAllReduce,
       "log2(p) pairwise exchanges of the whole buffer (non-powers of two fold first); latency-bound sizes",
       "log2(p)*S (+S when folding)", 32 * 1024, allreduce_recursive_doubling_cannot_run,
       make_allreduce_recursive_doubling},
      {"ring", CollKind::kAllReduce, "pipelined ring reduce-scatter then ring allgather; bandwidth-optimal",
       "2(n-1)/n*S", kAny, allreduce_ring_cannot_run, make_allreduce_ring},
      {"hierarchical_compressed", CollKind::kAllReduce,
       "compressed, on several nodes with several ranks: node leaders sum their nodes uncompressed, run "
       "sra_compressed among themselves (each node sum encoded once) and send their members the result",
       "member S; leader (L-1)*E(S) + 2(N-1)/N*E(S)", kAny, allreduce_hierarchical_compressed_cannot_run,
       make_allreduce_hierarchical_compressed},
      {"sra_compressed", CollKind::kAllReduce,
       "compressed: each contribution encoded once and sent to its segment's owner, owners' sums encoded once and "
       "sent to all (pairwise steps)",
       "2(n-1)/n*E(S)", kAny, allreduce_sra_compressed_cannot_run, make_allreduce_sra_compressed},
      {"ring_compressed", CollKind::kAllReduce,
       "compressed: ring reduce-scatter re-encoding the partial sum at every hop, ring allgather of the owners' bytes",
       "2(n-1)/n*E(S)", kAny, allreduce_ring_compressed_cannot_run, make_allreduce_ring_compressed},
      {"marsit", CollKind::kAllReduce,
       "sign codec (Marsit): sign bits merged stochastically at every reduce hop of a ring or RxC torus; every "
       "K-th round a full-precision ring average",
       "2(n-1)/n*4*ceil(D/32) (full precision: 2(n-1)/n*4D)", kAny, allreduce_marsit_cannot_run,
       make_allreduce_marsit},
      {"intsgd", CollKind::kAllReduce,
       "int codecs (IntSGD): integers under a shared scale, added without decoding along a ring reduce-scatter, "
       "ring allgather of the sums (exact, order-independent); the first round exact in float",
       "2(n-1)/n*(b/8)*D (exact round: 2(n-1)/n*S)", kAny, allreduce_intsgd_cannot_run, make_allreduce_intsgd},
      {"intsgd_switch", CollKind::kAllReduce,
       "int codecs with agg=switch (IntSGD after SwitchML): integer chunks streamed to aggregator processes, which "
       "add them in slots and send the sums back; the first round exact along a ring",
       "(b/8)*D + 8 per chunk (exact round: 2(n-1)/n*S)", kAny, allreduce_intsgd_switch_cannot_run,
       make_allreduce_intsgd_switch},
      {"fft_allgather", CollKind::kAllReduce,
       "fft codec (FFT sparsification): each rank's encoded segments, of variable length, sent to every other rank; "
       "every rank decodes all n in rank order and sums them (the same bits everywhere)",
       "(n-1)*E, E <= encoded_bytes(count) (variable)", kAny, allreduce_fft_allgather_cannot_run,
       make_allreduce_fft_allgather},
      {"fft_dense_ring", CollKind::kAllReduce,
       "fft codec at theta=0 (lossless), or where it cannot pay (n * capacity >= 2 * S, or the codec's time above the "
       "wire time it saves at QCCL_LINK_RATE; fallback=auto, no error feedback): the uncompressed pipelined ring, exact",
       "2(n-1)/n*S", kAny, allreduce_fft_dense_ring_cannot_run, make_allreduce_fft_dense_ring},

      {"binomial", CollKind::kBroadcast, "binomial tree from the root; ceil(log2 n) rounds", "children*S", 64 * 1024,
       broadcast_binomial_cannot_run, make_broadcast_binomial},
      {"chain", CollKind::kBroadcast, "pipelined chain from the root in rank order", "S (last rank: 0)", kAny,
       broadcast_chain_cannot_run, make_broadcast_chain},

      {"binomial", CollKind::kReduce, "binomial tree into the root; ceil(log2 n) rounds", "S (root: 0)", 64 * 1024,
       reduce_binomial_cannot_run, make_reduce_binomial},
      {"chain", CollKind::kReduce, "pipelined chain into the root", "S (root: 0)", kAny, reduce_chain_cannot_run,
       make_reduce_chain},

      {"hierarchical", CollKind::kAllGather,
       "node leaders gather their node's blocks, pass node bundles around a ring of leaders, and fan every block "
       "out inside the node: each block crosses each node boundary once (several nodes, one with 2+ ranks)",
       "member: sendcount*es; leader: ((L-1)(n-1) + n - L_next)*sendcount*es", kAny,
       allgather_hierarchical_cannot_run, make_allgather_hierarchical},
      {"ring", CollKind::kAllGather, "pipelined ring", "(n-1)*sendcount*es", kAny, allgather_ring_cannot_run,
       make_allgather_ring},
      {"compressed_hierarchical", CollKind::kAllGather,
       "compressed: each rank's block encoded once; the bytes gathered by node leaders, passed in node bundles "
       "around a ring of leaders and fanned out inside the node; decoded by every rank (the owner too)",
       "member: E(sendcount); leader: ((L-1)(n-1) + n - L_next)*E(sendcount)", kAny,
       allgather_compressed_hierarchical_cannot_run, make_allgather_compressed_hierarchical},
      {"compressed_ring", CollKind::kAllGather,
       "compressed: each rank's block encoded once, the bytes forwarded around a ring, decoded by every rank (the "
       "owner too)",
       "(n-1)*E(sendcount)", kAny, allgather_compressed_ring_cannot_run, make_allgather_compressed_ring},
      {"hierarchical", CollKind::kReduceScatter,
       "node leaders reduce their node's inputs, exchange the partials of each other node's blocks with that "
       "node's leader, reduce those of their own node's blocks and scatter them in the node (several nodes, one "
       "with 2+ ranks)",
       "member: n*recvcount*es; leader: (n-1)*recvcount*es", kAny, reduce_scatter_hierarchical_cannot_run,
       make_reduce_scatter_hierarchical},
      {"ring", CollKind::kReduceScatter, "pipelined ring", "(n-1)*recvcount*es", kAny, reduce_scatter_ring_cannot_run,
       make_reduce_scatter_ring},
      {"compressed_two_level", CollKind::kReduceScatter,
       "compressed, nodes of equal size: each rank sums its node's inputs for one lane of blocks in float32 (a "
       "node reduce-scatter), encodes each node sum once for its block's owner in the other nodes, adds the "
       "decoded sums it receives in node order",
       "(L-1)*N*recvcount*es + (N-1)*E(recvcount)", kAny, reduce_scatter_compressed_two_level_cannot_run,
       make_reduce_scatter_compressed_two_level},
      {"compressed_hierarchical", CollKind::kReduceScatter,
       "compressed: each node's leader sums its node's inputs in float32, encodes each node sum of another node's "
       "block once for that node's leader, adds the other nodes' decoded sums in node order and scatters in the "
       "node (several nodes, one with 2+ ranks)",
       "member: n*recvcount*es; leader: (L-1)*4*recvcount + (n-L)*E(recvcount)", kAny,
       reduce_scatter_compressed_hierarchical_cannot_run, make_reduce_scatter_compressed_hierarchical},
      {"compressed_pairwise", CollKind::kReduceScatter,
       "compressed: each contribution encoded once and sent to its block's owner in n-1 pairwise steps, added to "
       "the owner's own input in rank order",
       "(n-1)*E(recvcount)", kAny, reduce_scatter_compressed_pairwise_cannot_run,
       make_reduce_scatter_compressed_pairwise},
      // After compressed_pairwise, which runs every compressed call: chosen only by name.
      {"compressed_hierarchical_intra", CollKind::kReduceScatter,
       "compressed_hierarchical with the members' inputs encoded for their leader too (one more codec error per "
       "member, fewer bytes inside the node; chosen only by name)",
       "member: n*E(recvcount); leader: (L-1)*4*recvcount + (n-L)*E(recvcount)", kAny,
       reduce_scatter_compressed_hierarchical_intra_cannot_run, make_reduce_scatter_compressed_hierarchical_intra},
      {"pairwise", CollKind::kAlltoAll, "n-1 pairwise exchange steps, pipelined", "(n-1)*count*es", kAny,
       alltoall_pairwise_cannot_run, make_alltoall_pairwise},

      {"direct", CollKind::kGather, "every rank sends its block straight to the root, pipelined", "count*es (root: 0)",
       kAny, gather_direct_cannot_run, make_gather_direct},
      {"direct", CollKind::kScatter, "the root sends every rank its block straight, pipelined",
       "root: (n-1)*count*es (others: 0)", kAny, scatter_direct_cannot_run, make_scatter_direct},
      {"direct", CollKind::kSend, "a message per chunk, pipelined", "S", kAny, sendrecv_direct_cannot_run,
       make_sendrecv_direct},
      {"direct", CollKind::kRecv, "a message per chunk, pipelined", "0", kAny, sendrecv_direct_cannot_run,
       make_sendrecv_direct},
      {"compressed", CollKind::kSend, "compressed: encoded chunk by chunk, each sent as soon as it is encoded",
       "E(count)", kAny, sendrecv_compressed_cannot_run, make_sendrecv_compressed},
      {"compressed", CollKind::kRecv, "compressed: each chunk decoded as it arrives", "0", kAny,
       sendrecv_compressed_cannot_run, make_sendrecv_compressed},
      {"delta", CollKind::kSend, "AQ-SGD keyed delta message, then the receiver's answer", "message (a 64-byte header, "
       "evicted keys, full rows, E(delta rows)) + 5*8 (its parts' lengths)", kAny, sendrecv_delta_cannot_run, make_sendrecv_delta},
      {"delta", CollKind::kRecv, "AQ-SGD keyed delta message applied as it arrives, then answered", "256 (the answer)",
       kAny, sendrecv_delta_cannot_run, make_sendrecv_delta},
  };
  return list;
}

const Algorithm* find_algorithm(CollKind kind, const std::string& name) {
  for (const Algorithm& a : algorithms())
    if (a.collective == kind && name == a.name) return &a;
  return nullptr;
}

}  // namespace qccl::coll
