// Hierarchical compressed reduce-scatter over the node map (QSDP's hierarchical gradient
// ReduceScatter, shared/specs/qsdp.md §2.2 C, for one link per node): a full-precision reduce inside
// each node, then one quantized exchange of node partial sums between the nodes' leaders, then the
// scatter inside the node. Each block's node partial sum is encoded exactly once and crosses each
// node boundary once, so a block carries one rounding error per remote node (not per remote rank),
// and node n's link carries the blocks of every other node once: n - L_n encoded blocks.
//
// Per fragment f (chunk f of every one of the n blocks, cut at whole codec buckets), on node m with
// leader l:
//   member:  send l its input for chunk f of every block, as it is (the call's datatype); receive
//            its own block's chunk, summed, in float32 from l, and store it in the call's datatype.
//   leader:  acc_q = its own input for block q plus its members' in rank order (float32), for every
//            block q. For each other node m' and each block q of m': encode acc_q once (with error
//            feedback, acc_q plus this rank's residual, which then keeps what the encoding lost) and
//            send it to m''s leader. For each block q of node m: add the decoded node sums of the
//            other nodes in node order (never arrival order: the bits do not depend on timing, the
//            chunk size or the pipeline depth), divide by n for an average, and store its own block
//            or send the member its block.
// The messages one rank sends another within a fragment are received in that order (Plan's
// ordering rule): a member sends the blocks in rank order, leaders send a node's blocks in rank order.
//
// Error with nearest rounding, for each element of a block of node m:
//   |out - exact| <= sum over the other nodes m' of (s_m' / 2 + e_m') + float32 rounding
//                    + the output's rounding,
// s_m' the step of the bucket of node m''s encoded sum holding the element, e_m' quant.h's float32
// term (stochastic rounding: s_m' instead of s_m' / 2, and unbiased). Each s_m' is that of a sum of
// L_m' inputs, so the bound has one term per remote node where the flat pairwise reduce-scatter has
// one per remote rank, each of an input's range. Error feedback: the leaders' residuals hold the
// node sums' losses, and telescope over calls; members keep none.
//
// Datatype: float32, float16 or bfloat16, read into float32 and rounded once by the Store of the
// block's owner (which counts the non-finite values it writes: the call reports qcclNonFinite on the
// rank whose block holds NaN or Inf).
//
// Wire bytes per fragment (E encoded, S raw): a member sends n S of its datatype and nothing else;
// a leader sends each member its block in float32 and each other node's leader that node's blocks
// encoded: (L - 1) 4|chunk| + (n - L) E.
//
// Quantized inside the node as well (compressed_hierarchical_intra; QSDP leaves the intra-node
// precision open, shared/specs/qsdp.md §6 Q4): a member encodes each of its n inputs once with the
// call's codec (and its own residual, with error feedback) and sends the leader n E; the leader adds
// the decoded inputs in rank order. Where the intra-node link is slower than the codecs (PCIe, a
// virtualised host), that trades a codec error per member for (L - 1) n (S - E) fewer bytes on it.
// The bound gains one term per member q of any node, of q's own input:
//   |out - exact| <= sum over members q of (s_q / 2 + e_q) + sum over the other nodes m' of
//                    (s_m' / 2 + e_m') + float32 rounding + the output's rounding,
// where s_m' is now the step of the sum the leader formed from its members' decoded inputs.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/ring.h"
#include "kernels/convert.h"

namespace qccl::coll {

namespace {

class ReduceScatterCompressedHierarchical final : public Plan {
 public:
  ReduceScatterCompressedHierarchical(const CollArgs& args, const PlanOptions& options, bool encode_members)
      : Plan(args),
        encode_members_(encode_members),
        nodes_(*args.nodes),
        node_(nodes_.node_of(args.rank)),
        leader_(nodes_.leader(node_)),
        mates_(nodes_.ranks_of(node_)),
        chunk_(compressed_chunk(args, options.chunk_bytes, args.count, /*raw_messages=*/true)),
        pieces_(args, chunk_, /*sums=*/true) {}

  size_t fragments() const override { return pieces_.size(); }

  // Leader: a float32 accumulator per block; the members' inputs (raw or encoded); one encoding per
  // block of the other nodes (outgoing) and one per (other node, block of this node) (incoming).
  // Member: one float32 block; encoding its inputs, a float32 staging buffer and n encodings.
  size_t scratch_bytes() const override {
    if (args_.rank != leader_)
      return whole_lines(chunk_ * sizeof(float) * (encode_members_ ? 2 : 1)) +
             (encode_members_ ? n() * encoded_stride() : 0);
    return floats_bytes() + members_bytes() + encoded_count() * encoded_stride();
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int n = args_.nranks, me = args_.rank;
    const size_t es = args_.element_size();
    p.use_codec(pieces_.codec(f));  // the call's codec, or exact for an exact segment
    const Piece pc = pieces_[f];
    const size_t bytes = pieces_.encoded_bytes(f);
    const auto total = static_cast<uint32_t>(fragments());
    auto label = [&](int q) { return static_cast<uint32_t>(q) * total + static_cast<uint32_t>(f); };
    auto begin = [&](int q) { return static_cast<size_t>(q) * args_.count + pc.offset; };  // in the input
    const char* input = static_cast<const char*>(args_.sendbuf);
    char* output = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    int slot = 0;

    if (me != leader_) {
      float* block = reinterpret_cast<float*>(scratch);
      float* staging = block + chunk_;
      auto encoded = [&](int q) {
        return scratch + whole_lines(2 * chunk_ * sizeof(float)) + static_cast<size_t>(q) * encoded_stride();
      };
      std::vector<int> sends;
      for (int q = 0; q < n; ++q) {
        sends.push_back(slot);
        if (encode_members_) {
          encode_input(args_, p, encoded(q), staging, begin(q), pc.count);
          p.send(slot++, leader_, label(q), encoded(q), bytes);
        } else {
          p.send(slot++, leader_, label(q), input + begin(q) * es, pc.count * es);
        }
      }
      const int back = slot++;
      p.recv(back, leader_, label(n), block, pc.count * sizeof(float));
      for (int s : sends) p.wait(s);  // in place, the store overwrites what was sent
      p.wait(back);
      p.store(output, block, pc.count);
      return;
    }

    auto acc = [&](int q) { return reinterpret_cast<float*>(scratch) + static_cast<size_t>(q) * chunk_; };
    std::byte* members_base = scratch + floats_bytes();
    auto from_member = [&](size_t member, int q) {  // member's input for block q, raw or encoded
      return members_base + (member * static_cast<size_t>(n) + static_cast<size_t>(q)) * member_stride();
    };
    std::byte* encoded_base = members_base + members_bytes();
    auto outgoing = [&](int q) { return encoded_base + static_cast<size_t>(q) * encoded_stride(); };
    auto incoming = [&](int node, size_t local) {
      return encoded_base + (static_cast<size_t>(n) + static_cast<size_t>(node) * mates_.size() + local) * encoded_stride();
    };

    // Post every receive first: the members' inputs, and the other leaders' sums of this node's blocks.
    std::vector<int> from_members;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int q = 0; q < n; ++q) {
        from_members.push_back(slot);
        p.recv(slot++, mates_[m], label(q), from_member(m - 1, q), encode_members_ ? bytes : pc.count * es);
      }
    std::vector<int> from_nodes;  // [other node in node order][block of this node]
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_)
        for (size_t j = 0; j < mates_.size(); ++j) {
          from_nodes.push_back(slot);
          p.recv(slot++, nodes_.leader(node), label(mates_[j]), incoming(node, j), bytes);
        }

    // The node's sums, full precision, members in rank order.
    for (int q = 0; q < n; ++q) p.load(acc(q), input + begin(q) * es, pc.count);
    size_t k = 0;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int q = 0; q < n; ++q) {
        p.wait(from_members[k++]);
        if (encode_members_)
          p.decode_add(acc(q), from_member(m - 1, q), pc.count);
        else
          p.load_add(acc(q), from_member(m - 1, q), pc.count);
      }

    // Each other node's blocks, encoded once and sent to its leader.
    std::vector<int> sends;
    for (int node = 0; node < nodes_.nodes(); ++node) {
      if (node == node_) continue;
      for (int q : nodes_.ranks_of(node)) {
        if (float* residual = residual_of(args_)) p.add_float(acc(q), residual + begin(q), pc.count);
        encode_contribution(args_, p, outgoing(q), acc(q), begin(q), pc.count);
        sends.push_back(slot);
        p.send(slot++, nodes_.leader(node), label(q), outgoing(q), bytes);
      }
    }

    // This node's blocks: the other nodes' sums in node order, then out to their owners.
    k = 0;
    for (int node = 0, other = 0; node < nodes_.nodes(); ++node) {
      if (node == node_) continue;
      for (size_t j = 0; j < mates_.size(); ++j) {
        p.wait(from_nodes[static_cast<size_t>(other) * mates_.size() + j]);
        p.decode_add(acc(mates_[j]), incoming(node, j), pc.count);
      }
      ++other;
    }
    for (int q : mates_) {
      if (args_.op == RedOp::kAvg) p.divide(acc(q), pc.count);
      if (q == me) {
        p.store(output, acc(q), pc.count);
      } else {
        sends.push_back(slot);
        p.send(slot++, q, label(n), acc(q), pc.count * sizeof(float));
      }
    }
    for (int s : sends) p.wait(s);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    node_links(*args_.nodes, args_.rank, /*other_leaders=*/true, send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override { return sent(pieces_.block_encoded_bytes(), sizeof(float)); }
  // The uncompressed hierarchical reduce-scatter's: every block in the call's datatype (a leader's
  // sums for its members too, which this one sends in float32).
  uint64_t raw_wire_bytes() const override {
    return sent(args_.count * args_.element_size(), args_.element_size());
  }

 private:
  // Bytes this rank sends over all fragments when an encoded block takes `block_bytes` and a
  // leader's sums for its members `sum_bytes` a value.
  uint64_t sent(uint64_t block_bytes, uint64_t sum_bytes) const {
    const uint64_t n = static_cast<uint64_t>(args_.nranks), count = args_.count;
    if (args_.rank != leader_) return n * (encode_members_ ? block_bytes : count * args_.element_size());
    const uint64_t members = mates_.size() - 1;
    return members * count * sum_bytes + (n - mates_.size()) * block_bytes;
  }
  size_t n() const { return static_cast<size_t>(args_.nranks); }
  size_t floats_bytes() const { return whole_lines(n() * chunk_ * sizeof(float)); }
  size_t member_stride() const { return encode_members_ ? encoded_stride() : chunk_ * args_.element_size(); }
  size_t members_bytes() const { return whole_lines((mates_.size() - 1) * n() * member_stride()); }
  size_t encoded_count() const { return static_cast<size_t>(args_.nranks) + static_cast<size_t>(nodes_.nodes()) * mates_.size(); }
  size_t encoded_stride() const { return whole_lines(max_encoded_bytes(args_, chunk_, /*sums=*/true)); }

  bool encode_members_;  // members send their inputs encoded (compressed_hierarchical_intra)
  const NodeMap& nodes_;
  int node_;
  int leader_;
  std::vector<int> mates_;  // the ranks of this node, in rank order (the leader first)
  size_t chunk_;
  Pieces pieces_;  // the fragments, cut at segments
};

}  // namespace

const char* reduce_scatter_compressed_hierarchical_cannot_run(const CollArgs& args) {
  if (const char* why = reduce_scatter_compressed_pairwise_cannot_run(args)) return why;
  return needs_node_hierarchy(args);
}

std::unique_ptr<Plan> make_reduce_scatter_compressed_hierarchical(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterCompressedHierarchical>(args, options, /*encode_members=*/false);
}

const char* reduce_scatter_compressed_hierarchical_intra_cannot_run(const CollArgs& args) {
  return reduce_scatter_compressed_hierarchical_cannot_run(args);
}

std::unique_ptr<Plan> make_reduce_scatter_compressed_hierarchical_intra(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterCompressedHierarchical>(args, options, /*encode_members=*/true);
}

}  // namespace qccl::coll
