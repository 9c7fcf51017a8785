// Hierarchical reduce-scatter over the node map, uncompressed, every datatype and op: each node's
// leader reduces its node's inputs, sends every other node's leader the node's partial results of
// that node's blocks, reduces the partials it receives for its own node's blocks (node order) and
// scatters them inside the node. Node m's link carries n - L_m blocks each way, where a flat ring over
// node-major ranks carries n - 1 over each node boundary.
//
// Per fragment f (chunk f of every one of the n blocks), on node m with leader l:
//   member:  send l its input for chunk f of every block, in rank order of the blocks; receive its
//            own block's chunk, reduced, from l.
//   leader:  acc_q = its input for block q op its members' in rank order, for every block q; send
//            each other node's leader the acc_q of that node's blocks (rank order); then for each
//            block q of node m, acc_q op the other nodes' partials in node order (never arrival
//            order, so the result does not depend on timing), divided by n for an average, to its
//            owner (itself: recvbuf).
// The messages one rank sends another within a fragment are received in that order (Plan's
// ordering rule). The op is applied in the call's datatype, as by the flat algorithms, so integer and
// min/max reductions are exact and float sums differ from the ring's only by association.
//
// Wire bytes per rank: a member n * recvcount * es (its whole input, to the leader); a leader
// (L - 1) * recvcount * es to its members and (n - L) * recvcount * es to the other leaders.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class ReduceScatterHierarchical final : public Plan {
 public:
  ReduceScatterHierarchical(const CollArgs& args, const PlanOptions& options)
      : Plan(args), nodes_(*args.nodes), node_(nodes_.node_of(args.rank)), leader_(nodes_.leader(node_)),
        mates_(nodes_.ranks_of(node_)), chunk_(chunk_elements(options.chunk_bytes, args.element_size(), args.count)) {}

  size_t fragments() const override { return ceil_div(args_.count, chunk_); }

  // Leader: a partial result per block, the members' inputs, the other nodes' partials of this node's
  // blocks. Member: its block as received (copied out once every send of the fragment is done, which
  // in place is what the receive would overwrite).
  size_t scratch_bytes() const override {
    const size_t blocks = args_.rank != leader_ ? 1
                                                : static_cast<size_t>(args_.nranks) * mates_.size() +
                                                      static_cast<size_t>(nodes_.nodes()) * mates_.size();
    return blocks * chunk_ * args_.element_size();
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int n = args_.nranks, me = args_.rank;
    const size_t es = args_.element_size();
    const Piece pc = piece(args_.count, chunk_, f);
    const size_t bytes = pc.count * es;
    const auto total = static_cast<uint32_t>(fragments());
    auto label = [&](int q) { return static_cast<uint32_t>(q) * total + static_cast<uint32_t>(f); };
    auto in = [&](int q) { return static_cast<const char*>(args_.sendbuf) + (static_cast<size_t>(q) * args_.count + pc.offset) * es; };
    char* output = static_cast<char*>(args_.recvbuf) + pc.offset * es;
    auto buffer = [&](size_t i) { return scratch + i * chunk_ * es; };
    int slot = 0;

    if (me != leader_) {
      for (int q = 0; q < n; ++q) p.send(slot++, leader_, label(q), in(q), bytes);
      const int back = slot;
      p.recv(back, leader_, label(n), buffer(0), bytes);
      for (int s = 0; s < back; ++s) p.wait(s);
      p.wait(back);
      p.copy(output, buffer(0), bytes);
      return;
    }

    // Buffers: acc(q) for every block, raw(m, q) for member m (1 .. L-1), incoming(node, j).
    auto acc = [&](int q) { return buffer(static_cast<size_t>(q)); };
    auto raw = [&](size_t m, int q) { return buffer(static_cast<size_t>(n) * m + static_cast<size_t>(q)); };
    auto incoming = [&](int node, size_t j) {
      return buffer(static_cast<size_t>(n) * mates_.size() + static_cast<size_t>(node) * mates_.size() + j);
    };
    std::vector<int> from_members, from_nodes;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int q = 0; q < n; ++q) {
        from_members.push_back(slot);
        p.recv(slot++, mates_[m], label(q), raw(m, q), bytes);
      }
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_)
        for (size_t j = 0; j < mates_.size(); ++j) {
          from_nodes.push_back(slot);
          p.recv(slot++, nodes_.leader(node), label(mates_[j]), incoming(node, j), bytes);
        }

    // The node's partial results: this rank's input, then the members' in rank order.
    for (int q = 0; q < n; ++q) p.copy(acc(q), in(q), bytes);
    size_t k = 0;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int q = 0; q < n; ++q) {
        p.wait(from_members[k++]);
        p.reduce(acc(q), acc(q), raw(m, q), pc.count);
      }

    std::vector<int> sends;
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_)
        for (int q : nodes_.ranks_of(node)) {
          sends.push_back(slot);
          p.send(slot++, nodes_.leader(node), label(q), acc(q), bytes);
        }

    k = 0;
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_)
        for (size_t j = 0; j < mates_.size(); ++j) {
          p.wait(from_nodes[k++]);
          p.reduce(acc(mates_[j]), acc(mates_[j]), incoming(node, j), pc.count);
        }
    for (int q : mates_) {
      if (args_.op == RedOp::kAvg) p.average(acc(q), pc.count);
      if (q == me) {
        p.copy(output, acc(q), bytes);
      } else {
        sends.push_back(slot);
        p.send(slot++, q, label(n), acc(q), bytes);
      }
    }
    for (int s : sends) p.wait(s);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    node_links(*args_.nodes, args_.rank, /*other_leaders=*/true, send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    const uint64_t block = args_.count * args_.element_size(), n = static_cast<uint64_t>(args_.nranks);
    return (args_.rank != leader_ ? n : n - 1) * block;
  }

 private:
  const NodeMap& nodes_;
  int node_;
  int leader_;
  std::vector<int> mates_;  // the ranks of this node, in rank order (the leader first)
  size_t chunk_;
};

}  // namespace

const char* reduce_scatter_hierarchical_cannot_run(const CollArgs& args) {
  if (args.codec) return "uncompressed only (a codec was given)";
  return needs_node_hierarchy(args);
}

std::unique_ptr<Plan> make_reduce_scatter_hierarchical(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<ReduceScatterHierarchical>(args, options);
}

}  // namespace qccl::coll
