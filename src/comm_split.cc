#include "src/comm_split.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "src/bootstrap.h"
#include "src/node_map.h"

namespace qccl {

// Two all-gathers over the parent: first every rank's (color, key), from which each rank computes
// the same members and order for every color; then the unique id of each new communicator, which its
// first member (its new rank 0) made by starting a bootstrap root in this process. Both exchanges
// involve every rank of the parent, those without a color too, so that the parent's collectives stay
// matched. A rank that cannot go on (its settings refused, its root not started) still takes part,
// saying so: every rank then fails at once, the parent intact, where the others would have waited
// for it until QCCL_TIMEOUT and broken the parent.
std::shared_ptr<Comm> split_comm(Comm& parent, int color, int key, const qcclConfig_t* overrides) {
  const int n = parent.nranks();
  Config config;
  std::unique_ptr<Error> refused;
  try {
    config = parent.config().with(overrides);
    Comm::check_settings(config, n);  // (the child's size is not known yet: the parent's bounds it)
  } catch (const Error& e) {
    refused = std::make_unique<Error>(e);
  }
  const int32_t mine[3] = {color < 0 ? -1 : color, key, refused ? 1 : 0};
  std::vector<int32_t> table(3 * static_cast<size_t>(n));
  parent.allgather_bytes(mine, table.data(), sizeof(mine));
  if (refused) throw *refused;
  for (int r = 0; r < n; ++r)
    if (table[3 * r + 2])
      fail(qcclInvalidArgument, "rank %d's config for this split was refused (its own error says why): no rank made "
           "the new communicator", r);

  std::vector<int> members;  // parent ranks of my color, in new-rank order
  if (color >= 0) {
    for (int r = 0; r < n; ++r)
      if (table[3 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return table[3 * a + 1] < table[3 * b + 1]; });  // ties: parent rank
  }
  const auto position = std::find(members.begin(), members.end(), parent.rank());
  const int new_rank = static_cast<int>(position - members.begin());
  const int size = static_cast<int>(members.size());

  qcclUniqueId id{};  // all zero: the root could not be started
  if (color >= 0 && new_rank == 0) {
    try {
      net::Socket listener = net::Socket::listen(net::local_address(config.socket_ifname));
      const BootstrapId root{random_magic(), listener.local_address()};
      encode_unique_id(root, &id);
      // Its first rank is this process, right after the exchange below, unless that fails: then the
      // service must not wait for ever.
      start_root_service(std::move(listener), root.magic, size, config.timeout_seconds,
                         net::Deadline::after(config.timeout_seconds));
    } catch (const std::exception& e) {  // (std::system_error where the root's thread cannot start)
      id = qcclUniqueId{};
      refused = std::make_unique<Error>(qcclSystemError, std::string("starting the new communicator's bootstrap root: ") +
                                                             e.what());
    }
  }
  std::vector<qcclUniqueId> ids(static_cast<size_t>(n));
  parent.allgather_bytes(&id, ids.data(), sizeof(id));
  if (refused) throw *refused;
  if (color < 0) return nullptr;
  const qcclUniqueId& root_id = ids[static_cast<size_t>(members[0])];
  if (std::all_of(root_id.internal, root_id.internal + sizeof(root_id.internal), [](char c) { return c == 0; }))
    fail(qcclSystemError, "parent rank %d, the new communicator's rank 0, could not start its bootstrap root (its own "
         "error says why)", members[0]);

  QCCL_INFO("qcclCommSplit: color %d key %d: rank %d of %d (parent rank %d of %d)", color, key, new_rank, size,
            parent.rank(), n);
  // An emulated node map (QCCL_NODE_MAP) lists the parent's ranks: the child keeps its members' nodes.
  if (!config.node_map.empty()) config.node_map = node_map_of_members(parent.node_map(), members);
  // The parent's other ranks still share this host's CPUs, which the child's own count leaves out: a
  // child of an oversubscribed parent yields as it does, and auto's model stretches its CPU costs as
  // the parent's. (The child was told QCCL_OVERSUBSCRIBED=1 instead, which says all ranks share one
  // machine: on real hosts its model divided each CPU among all its ranks, twice its parent's costs.)
  config.parent_host_ranks = parent.host_ranks();
  return Comm::create(decode_unique_id(root_id), size, new_rank, config);
}

}  // namespace qccl
