// Two-level compressed reduce-scatter over a node map of equal-sized nodes (QSDP's hierarchical
// gradient ReduceScatter as shared/specs/qsdp.md §2.2 C lays it out): every rank of a node takes a
// share of the node's work, where reduce_scatter_compressed_hierarchical.cc gives it all to the
// leader (whose CPU then bounds the collective on a small machine: docs/PERF.md).
//
// With N nodes of L ranks, call a rank's position among its node's ranks its lane. Block q belongs
// to rank q, in lane l_q. Per fragment f (chunk f of every block, cut at whole codec buckets), rank
// (node m, lane l):
//   1. Inside the node, full precision: it sends each node-mate its input for the blocks of that
//      mate's lane (N blocks, the call's datatype) and sums, in float32, its own input and its mates'
//      (in rank order) for the N blocks of its own lane: the node sums S_m[q], l_q = l.
//   2. Across nodes, one encoding per node sum: for every other node m', it encodes S_m[q] for the
//      block q of m' in lane l (with error feedback, plus its residual there) and sends it to that
//      block's owner, q itself. It receives from the rank of lane l of every other node the encoded
//      node sum of its own block, and adds them to S_m[itself] in node order (never arrival order),
//      divides by n for an average, and stores its block in the call's datatype.
// Each block is encoded once per remote node and crosses each node boundary once; node m's ranks
// send the other nodes n - L encoded blocks in all (the optimum, as the leader's algorithm), and each
// rank adds L inputs of N blocks where the leader adds L inputs of n. The messages one rank sends
// another within a fragment are received in the order sent (Plan's rule): blocks in rank order.
//
// Error: as reduce_scatter_compressed_hierarchical.cc (one codec error per remote node, that of
// the node's float32 sum of L inputs), with the sums added in the same order: with rounding to
// nearest, the same bits as the leader's algorithm (stochastic rounding draws from the key of the
// rank that encodes, a lane's rank here and the leader there). Error feedback: the rank of
// lane l_q of node m keeps the residual of S_m[q] (q of another node); residuals telescope over calls.
//
// Wire bytes per rank: (L - 1) * N * |block| * es inside the node, (N - 1) * E(|block|) across.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/ring.h"
#include "kernels/convert.h"

namespace qccl::coll {

namespace {

class ReduceScatterCompressedTwoLevel final : public Plan {
 public:
  ReduceScatterCompressedTwoLevel(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        nodes_(*args.nodes),
        node_(nodes_.node_of(args.rank)),
        lane_(nodes_.local_index(args.rank)),
        mates_(nodes_.ranks_of(node_)),
        chunk_(compressed_chunk(args, options.chunk_bytes, args.count, /*raw_messages=*/true)),
        pieces_(args, chunk_, /*sums=*/true) {
    for (int node = 0; node < nodes_.nodes(); ++node) lane_blocks_.push_back(nodes_.ranks_of(node)[lane_]);
  }

  size_t fragments() const override { return pieces_.size(); }

  // A float32 sum per block of this lane (N), the mates' inputs for them ((L - 1) N, the call's
  // datatype), an encoding per node (N: outgoing to the other nodes, incoming from them).
  size_t scratch_bytes() const override {
    const size_t n_nodes = static_cast<size_t>(nodes_.nodes()), mates = mates_.size() - 1;
    return whole_lines(n_nodes * chunk_ * sizeof(float)) +
           whole_lines(mates * n_nodes * chunk_ * args_.element_size()) + 2 * n_nodes * encoded_stride();
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const size_t es = args_.element_size();
    const size_t n_nodes = static_cast<size_t>(nodes_.nodes());
    p.use_codec(pieces_.codec(f));  // the call's codec, or exact for an exact segment
    const Piece pc = pieces_[f];
    const size_t bytes = pieces_.encoded_bytes(f);
    const auto total = static_cast<uint32_t>(fragments());
    auto label = [&](int q) { return static_cast<uint32_t>(q) * total + static_cast<uint32_t>(f); };
    auto begin = [&](int q) { return static_cast<size_t>(q) * args_.count + pc.offset; };  // in the input
    const char* input = static_cast<const char*>(args_.sendbuf);
    // Scratch: sum(node) for the block of `node` in this lane; raw(mate, node); out/in encodings.
    auto sum = [&](size_t node) { return reinterpret_cast<float*>(scratch) + node * chunk_; };
    std::byte* raw_base = scratch + whole_lines(n_nodes * chunk_ * sizeof(float));
    auto raw = [&](size_t mate, size_t node) { return raw_base + (mate * n_nodes + node) * chunk_ * es; };
    std::byte* encoded_base = raw_base + whole_lines((mates_.size() - 1) * n_nodes * chunk_ * es);
    auto outgoing = [&](size_t node) { return encoded_base + node * encoded_stride(); };
    auto incoming = [&](size_t node) { return encoded_base + (n_nodes + node) * encoded_stride(); };
    int slot = 0;

    // 1. Inside the node: post the receives of the mates' inputs for this lane's blocks, send each
    //    mate the inputs for its lane's blocks.
    std::vector<int> from_mates, sends;
    for (size_t j = 0, m = 0; j < mates_.size(); ++j) {
      if (mates_[j] == args_.rank) continue;
      for (size_t node = 0; node < n_nodes; ++node) {
        from_mates.push_back(slot);
        p.recv(slot++, mates_[j], label(lane_blocks_[node]), raw(m, node), pc.count * es);
      }
      ++m;
    }
    std::vector<int> from_nodes(n_nodes, -1);  // 2's receives, posted early
    for (size_t node = 0; node < n_nodes; ++node)
      if (static_cast<int>(node) != node_) {
        from_nodes[node] = slot;
        p.recv(slot++, lane_blocks_[node], label(args_.rank), incoming(node), bytes);
      }
    for (int mate : mates_) {
      if (mate == args_.rank) continue;
      const int their_lane = nodes_.local_index(mate);
      for (size_t node = 0; node < n_nodes; ++node) {
        const int q = nodes_.ranks_of(static_cast<int>(node))[their_lane];
        sends.push_back(slot);
        p.send(slot++, mate, label(q), input + begin(q) * es, pc.count * es);
      }
    }
    // The node sums of this lane's blocks: this rank's input, then its mates' in rank order. (Summed
    // in rank order with this rank's input in its place, they are the bits the leader's algorithm
    // adds: its own input first, which is the lowest rank's, then the others in rank order.)
    for (size_t node = 0; node < n_nodes; ++node) {
      bool first = true;
      for (size_t j = 0, m = 0; j < mates_.size(); ++j) {
        const void* src = mates_[j] == args_.rank ? static_cast<const void*>(input + begin(lane_blocks_[node]) * es)
                                                  : static_cast<const void*>(raw(m, node));
        if (mates_[j] != args_.rank) {
          p.wait(from_mates[m * n_nodes + node]);
          ++m;
        }
        if (first) p.load(sum(node), src, pc.count);
        else p.load_add(sum(node), src, pc.count);
        first = false;
      }
    }

    // 2. Across nodes: each other node's block of this lane, encoded once and sent to its owner.
    for (size_t node = 0; node < n_nodes; ++node) {
      if (static_cast<int>(node) == node_) continue;
      const int q = lane_blocks_[node];
      if (float* residual = residual_of(args_)) p.add_float(sum(node), residual + begin(q), pc.count);
      encode_contribution(args_, p, outgoing(node), sum(node), begin(q), pc.count);
      sends.push_back(slot);
      p.send(slot++, q, label(q), outgoing(node), bytes);
    }
    float* own = sum(static_cast<size_t>(node_));
    for (size_t node = 0; node < n_nodes; ++node)
      if (static_cast<int>(node) != node_) {
        p.wait(from_nodes[node]);
        p.decode_add(own, incoming(node), pc.count);
      }
    if (args_.op == RedOp::kAvg) p.divide(own, pc.count);
    for (int s : sends) p.wait(s);  // in place, the store overwrites inputs sent above
    p.store(static_cast<char*>(args_.recvbuf) + pc.offset * es, own, pc.count);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int mate : mates_)
      if (mate != args_.rank) {
        send_to->push_back(mate);
        recv_from->push_back(mate);
      }
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_) {
        send_to->push_back(lane_blocks_[static_cast<size_t>(node)]);
        recv_from->push_back(lane_blocks_[static_cast<size_t>(node)]);
      }
  }

  uint64_t wire_bytes_sent() const override { return sent(pieces_.block_encoded_bytes()); }
  uint64_t raw_wire_bytes() const override { return sent(args_.count * args_.element_size()); }

 private:
  uint64_t sent(uint64_t block_bytes) const {
    const uint64_t n_nodes = static_cast<uint64_t>(nodes_.nodes()), mates = mates_.size() - 1;
    return mates * n_nodes * args_.count * args_.element_size() + (n_nodes - 1) * block_bytes;
  }
  size_t encoded_stride() const { return whole_lines(max_encoded_bytes(args_, chunk_, /*sums=*/true)); }

  const NodeMap& nodes_;
  int node_;
  int lane_;
  std::vector<int> mates_;        // the ranks of this node, in rank order
  std::vector<int> lane_blocks_;  // per node, its rank in this rank's lane
  size_t chunk_;
  Pieces pieces_;  // the fragments, cut at segments
};

}  // namespace

const char* reduce_scatter_compressed_two_level_cannot_run(const CollArgs& args) {
  if (const char* why = reduce_scatter_compressed_pairwise_cannot_run(args)) return why;
  if (const char* why = needs_node_hierarchy(args)) return why;
  const size_t size = args.nodes->ranks_of(0).size();
  for (int node = 1; node < args.nodes->nodes(); ++node)
    if (args.nodes->ranks_of(node).size() != size) return "nodes of different sizes (compressed_hierarchical runs them)";
  return nullptr;
}

std::unique_ptr<Plan> make_reduce_scatter_compressed_two_level(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterCompressedTwoLevel>(args, options);
}

}  // namespace qccl::coll
