#include "collectives/node_map.h"

#include <map>

namespace qccl::coll {

NodeMap NodeMap::from_labels(const std::vector<int>& labels) {
  NodeMap m;
  std::map<int, int> node_of_label;  // in rank order, so nodes are numbered by their lowest rank
  for (size_t r = 0; r < labels.size(); ++r) {
    const auto [it, added] = node_of_label.emplace(labels[r], static_cast<int>(m.ranks_.size()));
    if (added) {
      m.ranks_.emplace_back();
      m.leaders_.push_back(static_cast<int>(r));
    }
    std::vector<int>& ranks = m.ranks_[static_cast<size_t>(it->second)];
    m.node_of_rank_.push_back(it->second);
    m.local_index_.push_back(static_cast<int>(ranks.size()));
    ranks.push_back(static_cast<int>(r));
  }
  return m;
}

std::string NodeMap::describe() const {
  std::string out = std::to_string(nodes()) + (nodes() == 1 ? " node:" : " nodes:");
  for (int r = 0; r < nranks(); ++r) out += (r ? "," : " ") + std::to_string(node_of(r));
  return out;
}

bool node_links(const NodeMap& nodes, int rank, bool other_leaders, std::vector<int>* send_to,
                std::vector<int>* recv_from) {
  auto link = [&](int peer) {
    send_to->push_back(peer);
    recv_from->push_back(peer);
  };
  const int node = nodes.node_of(rank), leader = nodes.leader(node);
  if (rank != leader) {
    link(leader);
    return false;
  }
  for (int mate : nodes.ranks_of(node))
    if (mate != leader) link(mate);
  if (other_leaders)
    for (int other : nodes.leaders())
      if (other != leader) link(other);
  return true;
}

}  // namespace qccl::coll
