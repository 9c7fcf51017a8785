// A codec per step, proven on a test-only plan (not in the registry: the hierarchical collectives
// come with their own plans): a two-level all-gather over a node map and member-list rings, whose
// intra-node hops use one codec ("none": float32 as it is) and whose inter-node hops use another
// (q8), chosen step by step with Program::use_codec.
//
//   1. Gather within each node: every rank encodes its block with the intra-node codec and sends it
//      to its node's leader (the node's lowest rank), which decodes it.
//   2. Exchange between the leaders: a ring all-gather over the leaders (one per node) of the nodes'
//      blocks encoded once with the inter-node codec, forwarded unchanged and decoded by every leader.
//   3. Broadcast within each node: the leader sends every rank of its node each block but its own,
//      encoded with the intra-node codec.
//
// So a rank ends with its own node's blocks exact (the intra codec is lossless here) and every other
// node's blocks within q8's bound, with the same bits on every rank outside the block's node; the
// payload bytes on intra-node links and on inter-node links follow closed forms written in the test.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "collectives/compressed.h"
#include "collectives/node_map.h"
#include "collectives/ring.h"
#include "kernels/codec.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using kernels::DataType;
using coll::NodeMap;
using coll::Program;
using coll::Ring;

const kernels::CodecConfig& intra_codec() {
  static const kernels::CodecConfig codec = kernels::parse_codec_spec("none");
  return codec;
}

class AllGatherTwoLevel final : public coll::Plan {
 public:
  AllGatherTwoLevel(const CollArgs& args, const coll::PlanOptions& options)
      : Plan(args), nodes_(*args.nodes), node_(nodes_.node_of(args.rank)), local_(nodes_.ranks_of(node_), args.rank),
        leaders_(nodes_.leaders(), nodes_.leader(node_)),
        chunk_(coll::compressed_chunk(args, options.chunk_bytes, args.count)) {}

  size_t fragments() const override { return coll::ceil_div(args_.count, chunk_); }
  // Per rank's block: its intra-node encoding (received or to broadcast) and its inter-node encoding.
  size_t scratch_bytes() const override { return static_cast<size_t>(args_.nranks) * (intra_stride() + inter_stride()); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const kernels::CodecConfig* inter = args_.codec;
    const int n = args_.nranks, me = args_.rank, leader = nodes_.leader(node_);
    const coll::Piece pc = coll::piece(args_.count, chunk_, f);
    const auto total = static_cast<uint32_t>(fragments());
    auto msg = [&](uint32_t label) { return label * total + static_cast<uint32_t>(f); };
    auto intra = [&](int q) { return scratch + static_cast<size_t>(q) * intra_stride(); };
    auto inter_buf = [&](int q) { return scratch + static_cast<size_t>(n) * intra_stride() + static_cast<size_t>(q) * inter_stride(); };
    auto out = [&](int q) { return static_cast<float*>(args_.recvbuf) + static_cast<size_t>(q) * args_.count + pc.offset; };
    auto first = [&](int q) { return static_cast<uint64_t>(q) * args_.count + pc.offset; };
    const auto* in = static_cast<const float*>(args_.sendbuf) + pc.offset;
    const size_t intra_bytes = intra_codec().encoded_bytes(pc.count), inter_bytes = inter->encoded_bytes(pc.count);
    // Message labels: 0 the gather, 1 + q block q between leaders, 1 + n + q block q in the broadcast.
    const auto between_leaders = [&](int q) { return msg(1 + static_cast<uint32_t>(q)); };
    const auto broadcast = [&](int q) { return msg(1 + static_cast<uint32_t>(n + q)); };

    p.copy(out(me), in, pc.count * sizeof(float));
    if (me != leader) {
      p.use_codec(&intra_codec());
      p.encode(intra(me), in, pc.count, first(me), 0);
      p.send(1, leader, msg(0), intra(me), intra_bytes);
      for (int q = 0; q < n; ++q) {  // 3. the leader's broadcast, block by block in rank order
        if (q == me) continue;
        p.recv(0, leader, broadcast(q), intra(q), intra_bytes);
        p.wait(0);
        p.decode_out(out(q), intra(q), pc.count, nullptr);
      }
      p.wait(1);
      return;
    }

    // 1. Gather: decode each local block (intra codec), encode it once for the other nodes (inter).
    p.use_codec(inter);
    p.encode(inter_buf(me), in, pc.count, first(me), 0);
    for (int q : local_.members()) {
      if (q == me) continue;
      p.recv(0, q, msg(0), intra(q), intra_bytes);
      p.wait(0);
      p.use_codec(&intra_codec());
      p.decode_out(out(q), intra(q), pc.count, nullptr);
      p.use_codec(inter);
      p.encode(inter_buf(q), out(q), pc.count, first(q), 0);
    }
    // 2. Ring all-gather among the leaders (position = node), forwarding the inter-node bytes.
    for (int k = 0; k < leaders_.size() - 1; ++k) {
      const std::vector<int>& sending = nodes_.ranks_of(leaders_.position_at(-k));
      const std::vector<int>& receiving = nodes_.ranks_of(leaders_.position_at(-k - 1));
      for (size_t j = 0; j < receiving.size(); ++j)
        p.recv(2 + static_cast<int>(j), leaders_.prev(), between_leaders(receiving[j]), inter_buf(receiving[j]), inter_bytes);
      for (size_t j = 0; j < sending.size(); ++j)
        p.send(2 + static_cast<int>(receiving.size() + j), leaders_.next(), between_leaders(sending[j]), inter_buf(sending[j]),
               inter_bytes);
      for (size_t j = 0; j < receiving.size() + sending.size(); ++j) p.wait(2 + static_cast<int>(j));
      for (int q : receiving) p.decode_out(out(q), inter_buf(q), pc.count, nullptr);
    }
    // 3. Broadcast within the node (intra codec): every block but the receiver's own.
    p.use_codec(&intra_codec());
    for (int q = 0; q < n; ++q)
      if (!nodes_.same_node(q, me) || q == me) p.encode(intra(q), out(q), pc.count, first(q), 0);
    for (int to : local_.members()) {
      if (to == me) continue;
      for (int q = 0; q < n; ++q) {
        if (q == to) continue;
        p.send(1, to, broadcast(q), intra(q), intra_bytes);
        p.wait(1);
      }
    }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    const int leader = nodes_.leader(node_);
    if (args_.rank != leader) {
      send_to->push_back(leader);
      recv_from->push_back(leader);
      return;
    }
    for (int q : local_.members())
      if (q != leader) send_to->push_back(q), recv_from->push_back(q);
    leaders_.links(send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    uint64_t intra = 0, inter = 0;
    for (size_t f = 0; f < fragments(); ++f) {
      const size_t count = coll::piece(args_.count, chunk_, f).count;
      intra += intra_codec().encoded_bytes(count);
      inter += args_.codec->encoded_bytes(count);
    }
    const int n = args_.nranks, locals = local_.size() - 1;
    if (args_.rank != nodes_.leader(node_)) return intra;
    uint64_t blocks_forwarded = 0;  // leader ring: node k's blocks at step k
    for (int k = 0; k < leaders_.size() - 1; ++k) blocks_forwarded += nodes_.ranks_of(leaders_.position_at(-k)).size();
    return static_cast<uint64_t>(locals) * static_cast<uint64_t>(n - 1) * intra + blocks_forwarded * inter;
  }

 private:
  size_t intra_stride() const { return (intra_codec().encoded_bytes(chunk_) + 63) / 64 * 64; }
  size_t inter_stride() const { return (args_.codec->encoded_bytes(chunk_) + 63) / 64 * 64; }

  const NodeMap& nodes_;
  int node_;
  Ring local_;    // this rank's node, in rank order
  Ring leaders_;  // one rank per node, in node order (used by leaders only)
  size_t chunk_;
};

const char* two_level_cannot_run(const CollArgs& args) {
  if (!args.nodes) return "needs a node map";
  if (!args.codec) return "needs the inter-node codec";
  if (args.dtype != DataType::kFloat32) return "float32 only";
  return nullptr;
}

std::unique_ptr<coll::Plan> make_two_level(const CollArgs& args, const coll::PlanOptions& options) {
  return std::make_unique<AllGatherTwoLevel>(args, options);
}

const coll::Algorithm kTwoLevel = {"two_level_test", coll::CollKind::kAllGather,
                                   "test only: gather in node, leaders' ring with q8, broadcast in node",
                                   "see codec_per_step_test.cc", 0, two_level_cannot_run, make_two_level};

// q8's encoded size from its wire format (quant.h): per bucket two floats and 8 bits per value,
// packed in groups of 8 values.
uint64_t q8_size(size_t count, size_t bucket) {
  uint64_t bytes = 0;
  for (size_t b = 0; b < count; b += bucket) bytes += 8 + (std::min(bucket, count - b) + 7) / 8 * 8;
  return bytes;
}

// q8's nearest-rounding bound per value of a block (buckets from its first value): s/2 + quant.h's
// float32 term, s = (max - min) / 255.
std::vector<double> q8_bounds(const float* x, size_t count, size_t bucket) {
  std::vector<double> bound(count);
  for (size_t b = 0; b < count; b += bucket) {
    const size_t end = std::min(count, b + bucket);
    const double lo = *std::min_element(x + b, x + end), hi = *std::max_element(x + b, x + end);
    const double s = (hi - lo) / 255;
    for (size_t i = b; i < end; ++i)
      bound[i] = s / 2 + 0x1p-13 * s + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, 8 - 149);
  }
  return bound;
}

}  // namespace

TEST_CASE("a codec per step: a two-level all-gather, intra-node hops uncompressed, inter-node hops q8",
          "[compressed]") {
  const kernels::CodecConfig q8 = kernels::parse_codec_spec("q8:bucket=64");
  const std::vector<std::vector<int>> layouts = {{0, 0, 0, 1, 1, 1}, {0, 1, 0, 1}, {3, 3, 7, 5, 5, 5, 5}, {0, 1, 2},
                                                 {0, 0, 0, 0}};
  for (const std::vector<int>& labels : layouts)
    for (size_t count : {size_t{1}, size_t{200}, size_t{1000}})
      for (size_t chunk_bytes : {size_t{256}, size_t{1 << 20}}) {
        const NodeMap nodes = NodeMap::from_labels(labels);
        const int n = nodes.nranks();
        INFO(nodes.describe() << " count " << count << " chunk " << chunk_bytes);
        std::mt19937 rng(static_cast<uint32_t>(count + n));
        std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
        std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(n * count, -7.0f));
        for (auto& b : in)
          for (float& v : b) v = uniform(rng);
        std::vector<CollArgs> args(n);
        for (int r = 0; r < n; ++r) {
          CollArgs& a = args[r];
          a.kind = coll::CollKind::kAllGather, a.count = count, a.dtype = DataType::kFloat32;
          a.rank = r, a.nranks = n, a.sendbuf = in[r].data(), a.recvbuf = out[r].data();
          a.codec = &q8, a.nodes = &nodes;
          a.rng = kernels::PhiloxKey{q8.seed, 0, static_cast<uint32_t>(r), 0};
        }
        const SimRun sim = run_algorithm_on_sim(args, kTwoLevel, chunk_bytes, 2);

        // Results: the own node's blocks exact, the others' within q8's bound, the same bits everywhere.
        size_t inexact_local = 0, over = 0, differ = 0, lossy = 0;
        for (int q = 0; q < n; ++q) {
          const std::vector<double> bound = q8_bounds(in[q].data(), count, 64);
          const float* seen = nullptr;  // block q as the first rank outside its node decoded it
          for (int r = 0; r < n; ++r) {
            const float* got = out[r].data() + q * count;
            if (nodes.same_node(q, r)) {
              inexact_local += !std::equal(got, got + count, in[q].begin());
              continue;
            }
            for (size_t i = 0; i < count; ++i) {
              over += !(std::fabs(got[i] - in[q][i]) <= bound[i]);
              lossy += got[i] != in[q][i];
            }
            if (!seen) seen = got;
            differ += !std::equal(got, got + count, seen);
          }
        }
        CHECK(inexact_local == 0);
        CHECK(over == 0);
        CHECK(differ == 0);
        if (nodes.nodes() > 1 && count >= 200) CHECK(lossy > 0);  // q8 really ran on the inter-node hops

        // Wire bytes per link class: intra-node, the gather (4 bytes a value from every non-leader)
        // and the broadcast (n - 1 blocks to every non-leader); inter-node, every block once over each
        // of the N - 1 leader links it crosses: N (N - 1) blocks of L ranks in all when nodes are even.
        uint64_t intra = 0, inter = 0, inter_off_leaders = 0;
        for (const auto& [link, bytes] : sim.net->payload_bytes) {
          if (nodes.same_node(link.first, link.second)) {
            intra += bytes;
          } else {
            inter += bytes;
            const auto& leaders = nodes.leaders();
            inter_off_leaders += std::count(leaders.begin(), leaders.end(), link.first) == 0 ||
                                 std::count(leaders.begin(), leaders.end(), link.second) == 0;
          }
        }
        const uint64_t non_leaders = static_cast<uint64_t>(n - nodes.nodes());
        CHECK(intra == non_leaders * 4 * count + non_leaders * static_cast<uint64_t>(n - 1) * 4 * count);
        CHECK(inter == static_cast<uint64_t>(nodes.nodes() - 1) * static_cast<uint64_t>(n) * q8_size(count, 64));
        CHECK(inter_off_leaders == 0);
        for (int r = 0; r < n; ++r) CHECK(sim.ops[r]->stats().bytes_sent == sim.plan_bytes[r]);
      }
}

}  // namespace qccl::test
