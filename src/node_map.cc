#include "src/node_map.h"

#include <algorithm>

#include "base/errors.h"

namespace qccl {

std::vector<int> parse_node_map(const std::string& value, int nranks) {
  std::vector<int> labels;
  size_t at = 0;
  for (;;) {
    const size_t end = std::min(value.find(',', at), value.size());
    const std::string entry = value.substr(at, end - at);
    if (entry.empty() || entry.size() > 9 || entry.find_first_not_of("0123456789") != std::string::npos)
      fail(qcclInvalidArgument,
           "QCCL_NODE_MAP = \"%s\": entry %zu (\"%s\") is not a node label; expected one non-negative integer per "
           "rank, separated by commas, such as 0,0,1,1",
           value.c_str(), labels.size(), entry.c_str());
    labels.push_back(std::stoi(entry));
    if (end == value.size()) break;
    at = end + 1;
  }
  if (static_cast<int>(labels.size()) != nranks)
    fail(qcclInvalidArgument, "QCCL_NODE_MAP = \"%s\" lists %zu ranks; the communicator has %d", value.c_str(),
         labels.size(), nranks);
  return labels;
}

coll::NodeMap compute_node_map(const std::vector<PeerInfo>& peers, const std::string& override) {
  const int n = static_cast<int>(peers.size());
  if (!override.empty()) return coll::NodeMap::from_labels(parse_node_map(override, n));
  std::vector<int> labels(peers.size());  // the lowest rank on the same host
  for (int r = 0; r < n; ++r) {
    int first = 0;
    while (!peers[static_cast<size_t>(first)].same_host(peers[static_cast<size_t>(r)])) ++first;
    labels[static_cast<size_t>(r)] = first;
  }
  return coll::NodeMap::from_labels(labels);
}

std::string node_map_of_members(const coll::NodeMap& map, const std::vector<int>& members) {
  std::string out;
  for (size_t i = 0; i < members.size(); ++i) out += (i ? "," : "") + std::to_string(map.node_of(members[i]));
  return out;
}

}  // namespace qccl
