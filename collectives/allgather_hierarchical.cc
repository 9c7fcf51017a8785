// Hierarchical allgather over the node map, compressed or not (QSDP's "hierarchical versions of the
// algorithms, to reduce the size of inter-node transmissions"; shared/specs/qsdp.md §2.3). Every
// block crosses each node boundary once, in one bundle per node, where a flat ring over node-major
// ranks carries n-1 blocks over each node's link and a flat exchange n-L (times L senders).
//
// Each node's leader (its lowest rank) gathers the blocks of its node, the leaders run a ring of
// node bundles, and each leader fans every block out to the other ranks of its node. With a codec,
// every rank encodes its own block once and only those bytes move: the leader forwards them and every
// rank, the owner too, decodes the same bytes, so the output is bitwise identical on every rank and
// to that of the flat compressed ring (spec §4 P5, P11). Without one, blocks are received straight
// into recvbuf and forwarded from there.
//
// Per fragment f (a chunk of every block, cut at whole codec buckets), on a rank of node m with
// leader l and the leaders' ring position j:
//   member:  send its block to l; receive from l every other block, in the order l received them
//            (its node's in rank order, then the bundles of nodes j-1, j-2, ... of the leaders'
//            ring), each decoded as it arrives.
//   leader:  receive its members' blocks; for k = 0 .. N-2 send the bundle of node j-k to the next
//            leader and receive that of node j-k-1 from the previous one; fan each block out to every
//            member but its owner as soon as the leader holds it.
// The messages one rank sends another within a fragment are received in the same order (Plan's
// ordering rule); a block's label is 1 + its owner's rank.
//
// With segments (CollArgs::segments, compressed only), fragments are cut at segment boundaries and
// exact segments travel in their datatype (compressed.h, Pieces).
//
// Wire bytes per fragment, E a block's bytes (encoded or raw), L the node's ranks, n the
// communicator's: a member sends E; a leader sends (L-1)(n-1)E to its members plus, to the next
// leader, the blocks of every node but the next one's.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/node_map.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AllGatherHierarchical final : public Plan {
 public:
  AllGatherHierarchical(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        nodes_(*args.nodes),
        node_(nodes_.node_of(args.rank)),
        leader_(nodes_.leader(node_)),
        leaders_(nodes_.leaders(), leader_),
        chunk_(args.codec ? compressed_chunk(args, options.chunk_bytes, args.count)
                          : chunk_elements(options.chunk_bytes, args.element_size(), args.count)),
        layout_{chunk_, 2, args.codec ? static_cast<size_t>(args.nranks) : 0},
        pieces_(args, chunk_) {
    // The order in which a node's leader holds the blocks: its node's, then the bundles of the nodes
    // before it along the leaders' ring.
    for (int k = 0; k < leaders_.size(); ++k)
      for (int q : nodes_.ranks_of(nodes_.node_of(leaders_.at(-k)))) arrival_.push_back(q);
  }

  size_t fragments() const override { return pieces_.size(); }
  size_t scratch_bytes() const override { return args_.codec ? layout_.bytes(args_) : 0; }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const Piece pc = pieces_[f];
    const size_t es = args_.element_size();
    if (args_.codec) p.use_codec(pieces_.codec(f));  // the call's codec, or exact for an exact segment
    const size_t bytes = args_.codec ? pieces_.encoded_bytes(f) : pc.count * es;
    const auto total = static_cast<uint32_t>(fragments());
    auto label = [&](int q) { return static_cast<uint32_t>(1 + q) * total + static_cast<uint32_t>(f); };
    auto out = [&](int q) {
      return static_cast<char*>(args_.recvbuf) + (static_cast<size_t>(q) * args_.count + pc.offset) * es;
    };
    // Where block q's bytes live on this rank: its encoding, or its place in recvbuf.
    auto block = [&](int q) -> void* {
      return args_.codec ? static_cast<void*>(layout_.encoded_buffer(args_, scratch, static_cast<size_t>(q))) : out(q);
    };
    float* staging = args_.codec ? layout_.float_buffer(scratch, 0) : nullptr;
    float* decoded = args_.codec ? layout_.float_buffer(scratch, 1) : nullptr;
    auto finish = [&](int q) {  // block q's bytes are here: its output values
      if (args_.codec) p.decode_out(out(q), block(q), pc.count, decoded);
    };
    const int me = args_.rank;
    int slot = 0;

    // This rank's block: encoded once, or copied into place (a no-op in place).
    if (args_.codec)
      encode_input(args_, p, block(me), staging, pc.offset, pc.count);
    else
      p.copy(out(me), static_cast<const char*>(args_.sendbuf) + pc.offset * es, bytes);

    const std::vector<int>& mates = nodes_.ranks_of(node_);
    if (me != leader_) {
      const int own = slot++;
      p.send(own, leader_, label(me), block(me), bytes);
      finish(me);
      std::vector<int> pending;  // slots of the receives, in arrival order
      for (int q : arrival_)
        if (q != me) {
          pending.push_back(slot);
          p.recv(slot++, leader_, label(q), block(q), bytes);
        }
      size_t i = 0;
      for (int q : arrival_)
        if (q != me) {
          p.wait(pending[i++]);
          finish(q);
        }
      p.wait(own);
      return;
    }

    std::vector<int> sends;  // slots of every send, waited for at the end
    auto fan_out = [&](int q) {
      for (int m : mates)
        if (m != leader_ && m != q) {
          sends.push_back(slot);
          p.send(slot++, m, label(q), block(q), bytes);
        }
    };
    std::vector<int> from_mates;
    for (int m : mates)
      if (m != leader_) {
        from_mates.push_back(slot);
        p.recv(slot++, m, label(m), block(m), bytes);
      }
    finish(me);
    fan_out(me);
    size_t i = 0;
    for (int m : mates)
      if (m != leader_) {
        p.wait(from_mates[i++]);
        fan_out(m);
        finish(m);
      }
    for (int k = 0; k + 1 < leaders_.size(); ++k) {
      const std::vector<int>& outgoing = nodes_.ranks_of(nodes_.node_of(leaders_.at(-k)));
      const std::vector<int>& incoming = nodes_.ranks_of(nodes_.node_of(leaders_.at(-k - 1)));
      const int first_in = slot;
      for (int q : incoming) p.recv(slot++, leaders_.prev(), label(q), block(q), bytes);
      for (int q : outgoing) {
        sends.push_back(slot);
        p.send(slot++, leaders_.next(), label(q), block(q), bytes);
      }
      for (size_t j = 0; j < incoming.size(); ++j) {
        p.wait(first_in + static_cast<int>(j));
        fan_out(incoming[j]);
        finish(incoming[j]);
      }
    }
    for (int s : sends) p.wait(s);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    if (node_links(*args_.nodes, args_.rank, /*other_leaders=*/false, send_to, recv_from) && leaders_.size() > 1)
      leaders_.links(send_to, recv_from);  // the leaders' ring
  }

  uint64_t wire_bytes_sent() const override { return blocks_sent() * block_bytes(); }
  uint64_t raw_wire_bytes() const override { return blocks_sent() * args_.count * args_.element_size(); }

 private:
  // Whole blocks this rank sends over all fragments (see the header comment).
  uint64_t blocks_sent() const {
    if (args_.rank != leader_) return 1;
    const uint64_t members = nodes_.ranks_of(node_).size() - 1;
    const uint64_t next_node = nodes_.ranks_of(nodes_.node_of(leaders_.next())).size();
    const uint64_t to_next = leaders_.size() > 1 ? static_cast<uint64_t>(args_.nranks) - next_node : 0;
    return members * static_cast<uint64_t>(args_.nranks - 1) + to_next;
  }
  uint64_t block_bytes() const {
    return args_.codec ? pieces_.block_encoded_bytes() : args_.count * args_.element_size();
  }

  const NodeMap& nodes_;
  int node_;
  int leader_;
  Ring leaders_;  // one rank per node, in node order
  size_t chunk_;
  CompressedScratch layout_;  // with a codec: staging, decode scratch, one encoding per rank's block
  Pieces pieces_;             // the fragments (cut at segments, with a codec)
  std::vector<int> arrival_;  // every rank, in the order this node's leader holds their blocks
};

}  // namespace

const char* allgather_hierarchical_cannot_run(const CollArgs& args) {
  if (args.codec) return "uncompressed only (a codec was given)";
  return needs_node_hierarchy(args);
}

const char* allgather_compressed_hierarchical_cannot_run(const CollArgs& args) {
  if (const char* why = allgather_compressed_ring_cannot_run(args)) return why;
  return needs_node_hierarchy(args);
}

std::unique_ptr<Plan> make_allgather_hierarchical(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllGatherHierarchical>(args, options);
}

std::unique_ptr<Plan> make_allgather_compressed_hierarchical(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllGatherHierarchical>(args, options);
}

}  // namespace qccl::coll
