// Hierarchical compressed all-reduce over the node map: the scatter-reduce-allgather of
// allreduce_sra_compressed.cc run among the nodes' leaders on their nodes' sums (QSDP's two levels,
// qsdp.md §2.2, applied to the all-reduce). Inside a node the values travel uncompressed over the
// fast link; across nodes each node's sum is encoded once and each owner's sum once more.
//
// Per fragment f (chunk f of every one of the N node segments; node m owns segment m), on node m with
// leader l:
//   member:  send l its input for chunk f of every segment (in segment order); receive from l each
//            segment's owner bytes and decode them into recvbuf once its own sends are done (in place,
//            the decode overwrites what they read).
//   leader:  acc_j = its input for segment j (plus its error-feedback residual) + its members' inputs
//            in rank order, in float32, for every j; then, among the leaders, the pairwise steps of
//            sra: encode acc_j once for every other node j and send it to j's leader, add the other
//            nodes' encoded sums of segment m to acc_m in node order (never arrival order, so the
//            bits do not depend on timing), encode acc_m once (divided by n for an average) and send
//            those bytes to every leader; every leader decodes every owner's bytes into recvbuf and
//            forwards them to its members. Every rank decodes the same bytes: the same bits, and the
//            same count of non-finite outputs.
//
// Error with nearest rounding: |result - exact| <= the N - 1 other nodes' encodes plus the owner's,
// each half a bucket step of what it encoded (+ float32 sums); sra over n ranks has n - 1 plus one.
// Error feedback keeps a residual on the leaders only (their encodes are the only ones).
//
// Wire bytes: a member sends its whole input, count * es, to its leader; a leader sends each member
// the owners' bytes, (L - 1) * E(S), and the other leaders sum over k of E(seg(m + k)) + (N - 1) *
// E(seg(m)), E the chunked encoded size. Across node boundaries only the leaders' encoded bytes travel: a node's
// link carries 2(N - 1)/N * E(S) each way, where sra sends every rank's encoded contributions.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class AllReduceHierarchicalCompressed final : public Plan {
 public:
  AllReduceHierarchicalCompressed(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        nodes_(*args.nodes),
        node_(nodes_.node_of(args.rank)),
        leader_(nodes_.leader(node_)),
        mates_(nodes_.ranks_of(node_)),
        leaders_(nodes_.leaders(), leader_),
        segments_{args.count, nodes_.nodes()},
        // leader: the N node sums, a decode scratch; the members' raw inputs; encoded: 2 outgoing, one per node
        layout_{compressed_chunk(args, options.chunk_bytes, segments_.max_size(), /*raw_messages=*/true),
                static_cast<size_t>(nodes_.nodes()) + 1, 2 + static_cast<size_t>(nodes_.nodes())},
        // member: a decode scratch, the owners' bytes of every segment
        member_layout_{layout_.chunk, 1, static_cast<size_t>(nodes_.nodes())} {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), layout_.chunk); }

  // Leader: the compressed layout, then a raw buffer per member and segment. Member: its layout.
  size_t scratch_bytes() const override {
    const size_t raw = static_cast<size_t>(nodes_.nodes()) * raw_bytes();
    return args_.rank == leader_ ? layout_.bytes(args_) + (mates_.size() - 1) * raw : member_layout_.bytes(args_);
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int nodes = nodes_.nodes(), me = args_.rank;
    const size_t es = args_.element_size();
    const auto total = static_cast<uint32_t>(fragments());
    auto part = [&](int segment) { return piece(segments_.size(segment), layout_.chunk, f); };
    auto begin = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };
    auto count = [&](int segment) { return part(segment).count; };
    auto in = [&](int segment) { return static_cast<const char*>(args_.sendbuf) + begin(segment) * es; };
    auto out = [&](int segment) { return static_cast<char*>(args_.recvbuf) + begin(segment) * es; };
    auto msg = [&](int step) { return static_cast<uint32_t>(step) * total + static_cast<uint32_t>(f); };
    int slot = 0;

    const kernels::CodecConfig& codec = *args_.codec;
    auto bytes = [&](int segment) { return codec.encoded_bytes(count(segment)); };

    if (me != leader_) {
      auto owner_bytes = [&](int segment) {
        return member_layout_.encoded_buffer(args_, scratch, static_cast<size_t>(segment));
      };
      std::vector<int> sends;
      for (int j = 0; j < nodes; ++j) {
        sends.push_back(slot);
        p.send(slot++, leader_, msg(j), in(j), count(j) * es);
      }
      const int first_result = slot;
      for (int j = 0; j < nodes; ++j) p.recv(slot++, leader_, msg(nodes + j), owner_bytes(j), bytes(j));
      for (int s : sends) p.wait(s);
      for (int j = 0; j < nodes; ++j) {
        p.wait(first_result + j);
        p.decode_out(out(j), owner_bytes(j), count(j), member_layout_.float_buffer(scratch, 0));
      }
      return;
    }

    const int own = node_;
    auto acc = [&](int segment) { return layout_.float_buffer(scratch, static_cast<size_t>(segment)); };
    float* decoded = layout_.float_buffer(scratch, static_cast<size_t>(nodes));
    std::byte* outgoing[2] = {layout_.encoded_buffer(args_, scratch, 0), layout_.encoded_buffer(args_, scratch, 1)};
    // received[q]: node q's encoded sum of this node's segment, then (allgather) node q's segment.
    auto received = [&](int q) { return layout_.encoded_buffer(args_, scratch, 2 + static_cast<size_t>(q)); };
    auto raw = [&](size_t m, int segment) {
      return scratch + layout_.bytes(args_) +
             ((m - 1) * static_cast<size_t>(nodes) + static_cast<size_t>(segment)) * raw_bytes();
    };

    // The node's sums: this rank's input (and residual), then the members' in rank order.
    std::vector<int> from_members;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int j = 0; j < nodes; ++j) {
        from_members.push_back(slot);
        p.recv(slot++, mates_[m], msg(j), raw(m, j), count(j) * es);
      }
    for (int j = 0; j < nodes; ++j) load_contribution(args_, p, acc(j), begin(j), count(j));
    size_t k = 0;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int j = 0; j < nodes; ++j) {
        p.wait(from_members[k++]);
        p.load_add(acc(j), raw(m, j), count(j));
      }

    // Scatter-reduce among the leaders: each node sum encoded once, sent to its segment's owner.
    const int sr = slot;  // slots: sr receives, sr + 1 and sr + 2 alternate sends
    for (int step = 1; step < nodes; ++step) {
      const int to = leaders_.position_at(step), from = leaders_.position_at(-step);
      std::byte* buffer = outgoing[step % 2];
      if (step >= 3) p.wait(sr + 1 + step % 2);  // the send that last used this buffer
      encode_contribution(args_, p, buffer, acc(to), begin(to), count(to));
      p.recv(sr, leaders_.member(from), msg(2 * nodes + step - 1), received(from), bytes(own));
      p.send(sr + 1 + step % 2, leaders_.member(to), msg(2 * nodes + step - 1), buffer, bytes(to));
      p.wait(sr);
    }
    p.wait(sr + 1);
    p.wait(sr + 2);
    for (int q = 0; q < nodes; ++q)
      if (q != own) p.decode_add(acc(own), received(q), count(own));
    encode_owned(args_, p, received(own), acc(own), begin(own), count(own));

    // Allgather of the owners' bytes among the leaders; every leader decodes the same bytes.
    const int ag = sr + 3;
    p.decode_out(out(own), received(own), count(own), decoded);
    for (int step = 1; step < nodes; ++step) {
      const int to = leaders_.position_at(step), from = leaders_.position_at(-step);
      p.recv(ag, leaders_.member(from), msg(3 * nodes + step - 2), received(from), bytes(from));
      p.send(ag + 1, leaders_.member(to), msg(3 * nodes + step - 2), received(own), bytes(own));
      p.wait(ag);
      p.decode_out(out(from), received(from), count(from), decoded);
      p.wait(ag + 1);
    }

    // The owners' bytes to the members, segment by segment.
    slot = ag + 2;
    std::vector<int> sends;
    for (size_t m = 1; m < mates_.size(); ++m)
      for (int j = 0; j < nodes; ++j) {
        sends.push_back(slot);
        p.send(slot++, mates_[m], msg(nodes + j), received(j), bytes(j));
      }
    for (int s : sends) p.wait(s);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    node_links(*args_.nodes, args_.rank, /*other_leaders=*/true, send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    return bytes_sent([this](size_t n) { return chunked_encoded_bytes(*args_.codec, n, layout_.chunk); });
  }
  uint64_t raw_wire_bytes() const override {
    return bytes_sent([this](size_t n) { return static_cast<uint64_t>(n * args_.element_size()); });
  }

 private:
  size_t raw_bytes() const { return layout_.chunk * args_.element_size(); }

  template <class Encoded>
  uint64_t bytes_sent(Encoded encoded) const {
    if (args_.rank != leader_) return static_cast<uint64_t>(args_.count) * args_.element_size();
    const int nodes = leaders_.size();
    uint64_t all = 0;
    for (int q = 0; q < nodes; ++q) all += encoded(segments_.size(q));
    uint64_t total = (mates_.size() - 1) * all;
    for (int step = 1; step < nodes; ++step)
      total += encoded(segments_.size(leaders_.position_at(step))) + encoded(segments_.size(node_));
    return total;
  }

  const NodeMap& nodes_;
  int node_;
  int leader_;
  std::vector<int> mates_;  // the ranks of this node, in rank order (the leader first)
  Ring leaders_;            // one rank per node, in node order: position q is node q's leader
  Segments segments_;       // segment q belongs to node q
  CompressedScratch layout_;
  CompressedScratch member_layout_;
};

}  // namespace

const char* allreduce_hierarchical_compressed_cannot_run(const CollArgs& args) {
  if (const char* why = value_codec_with_two_ranks(args)) return why;
  return needs_node_hierarchy(args);
}

std::unique_ptr<Plan> make_allreduce_hierarchical_compressed(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceHierarchicalCompressed>(args, options);
}

}  // namespace qccl::coll
