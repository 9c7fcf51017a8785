// Which ranks of a communicator share a host (a node): what hierarchical plans split their rings and
// trees by (intra-node members, one leader per node). The communicator computes it once when it is
// created, from the hosts its ranks reported at bootstrap or from QCCL_NODE_MAP (src/node_map.h), and
// owns it; plans see it through CollArgs::nodes.
//
// Nodes are numbered 0 .. nodes()-1 in order of their lowest rank, so the same grouping always gives
// the same map, and rank 0 is on node 0. Ranks of a node are listed in rank order; a node's leader is
// its lowest rank.
#pragma once

#include <string>
#include <vector>

namespace qccl::coll {

class NodeMap {
 public:
  NodeMap() = default;
  // From one label per rank (any integers; equal labels share a node), renumbered as described above.
  static NodeMap from_labels(const std::vector<int>& labels);
  // Every rank on one node.
  static NodeMap single_node(int nranks) { return from_labels(std::vector<int>(static_cast<size_t>(nranks), 0)); }

  int nranks() const { return static_cast<int>(node_of_rank_.size()); }
  int nodes() const { return static_cast<int>(ranks_.size()); }
  int node_of(int rank) const { return node_of_rank_[static_cast<size_t>(rank)]; }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  // The ranks of `node`, in rank order.
  const std::vector<int>& ranks_of(int node) const { return ranks_[static_cast<size_t>(node)]; }
  // The position of `rank` among the ranks of its node.
  int local_index(int rank) const { return local_index_[static_cast<size_t>(rank)]; }
  int leader(int node) const { return ranks_of(node).front(); }
  // One rank per node (its lowest), in node order.
  const std::vector<int>& leaders() const { return leaders_; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  // "2 nodes: 0,0,1,1" (the node of each rank).
  std::string describe() const;

 private:
  std::vector<int> node_of_rank_;
  std::vector<int> local_index_;
  std::vector<std::vector<int>> ranks_;
  std::vector<int> leaders_;
};

// A two-level plan's links (Plan::links) inside the node: a member's with its leader, a leader's with
// its members, and with `other_leaders`, also every other node's leader. Returns whether `rank` leads
// its node (a leader's links across nodes beyond these are the plan's own).
bool node_links(const NodeMap& nodes, int rank, bool other_leaders, std::vector<int>* send_to,
                std::vector<int>* recv_from);

}  // namespace qccl::coll
