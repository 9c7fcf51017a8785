// The communicator's node map (collectives/node_map.h): which ranks share a host, from the host
// identities the ranks exchanged at bootstrap (PeerInfo::same_host: host name and boot id), or, to
// emulate a multi-node job on one machine, from QCCL_NODE_MAP.
//
// QCCL_NODE_MAP grammar: one node label per rank of the communicator, in rank order, separated by
// commas: non-negative decimal integers, no spaces ("0,0,1,1": ranks 0 and 1 on one node, 2 and 3 on
// another). Ranks with equal labels share a node; labels need not be dense or sorted. A communicator
// made by qcclCommSplit from a parent with QCCL_NODE_MAP keeps its members' nodes.
#pragma once

#include <string>
#include <vector>

#include "collectives/node_map.h"
#include "src/bootstrap.h"

namespace qccl {

// The labels QCCL_NODE_MAP's `value` lists for a communicator of `nranks` ranks. Throws
// Error(qcclInvalidArgument) naming the variable and value when it does not follow the grammar or
// does not list nranks labels.
std::vector<int> parse_node_map(const std::string& value, int nranks);

// The map of a communicator whose ranks reported `peers` (indexed by rank): from `override`
// (QCCL_NODE_MAP's value) when it is not empty (checked as parse_node_map does), else by host.
coll::NodeMap compute_node_map(const std::vector<PeerInfo>& peers, const std::string& override);

// QCCL_NODE_MAP's value for the ranks `members` (indexes into map) of a child communicator.
std::string node_map_of_members(const coll::NodeMap& map, const std::vector<int>& members);

}  // namespace qccl
