// The hierarchical all-gathers run by the real executor on a simulated network, on node maps 2x2,
// 4x2, 2+3 (uneven), 1+3 and an interleaved one (0,1,0,1,...): uncompressed, every rank's output
// equals the inputs exactly; compressed, every rank's output is bitwise identical to every other
// rank's and to the flat compressed ring's (each block encoded once by its owner: spec qsdp.md §4
// P5, P11), for any chunk size and pipeline depth; every rank's wire bytes equal a closed form written
// here from the plan's description (a member sends its block; a leader fans n-1 blocks out to each
// member and sends the next leader every block but the next node's).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "collectives/compressed.h"
#include "collectives/node_map.h"
#include "kernels/codec.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using coll::NodeMap;

struct Job {
  std::vector<int> labels;  // node label per rank
  size_t count = 1000;      // sendcount
  DataType dtype = DataType::kFloat32;
  const kernels::CodecConfig* codec = nullptr;
  size_t chunk_bytes = 4096;
  int depth = 2;
  bool in_place = false;
  int n() const { return static_cast<int>(labels.size()); }
};

std::vector<std::vector<uint8_t>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<uint8_t>> in(job.n(), std::vector<uint8_t>(job.count * kernels::element_size(job.dtype)));
  for (auto& b : in)
    for (size_t i = 0; i < job.count; ++i) store(job.dtype, b.data(), i, uniform(rng) * (1 + i % 5));
  return in;
}

struct Result {
  std::vector<std::vector<uint8_t>> out;
  SimRun sim;
};

Result run(const Job& job, const std::vector<std::vector<uint8_t>>& in, const std::string& algorithm) {
  const int n = job.n();
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  const size_t es = kernels::element_size(job.dtype);
  Result res;
  res.out.assign(n, std::vector<uint8_t>(n * job.count * es, 0xee));
  std::vector<CollArgs> args(n);
  std::vector<coll::QuantizedCall> calls(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllGather, a.count = job.count, a.dtype = job.dtype, a.rank = r, a.nranks = n;
    a.recvbuf = res.out[r].data();
    a.nodes = &nodes;
    if (job.in_place) {
      if (job.count) std::copy(in[r].begin(), in[r].end(), res.out[r].begin() + static_cast<ptrdiff_t>(r * job.count * es));
      a.sendbuf = res.out[r].data() + r * job.count * es;
    } else {
      a.sendbuf = in[r].data();
    }
    if (job.codec) {
      a.codec = job.codec;
      a.rng = kernels::PhiloxKey{job.codec->seed, 3, static_cast<uint32_t>(r), 0};
      a.method_call = &calls[r];
    }
  }
  res.sim = run_on_sim(args, algorithm, job.chunk_bytes, job.depth);
  return res;
}

// Whole blocks each rank sends, from the description in the header comment.
std::vector<uint64_t> blocks_sent(const std::vector<int>& labels) {
  const NodeMap nodes = NodeMap::from_labels(labels);
  const int n = static_cast<int>(labels.size()), k = nodes.nodes();
  std::vector<uint64_t> blocks(n, 1);
  for (int node = 0; node < k; ++node) {
    const int next = (node + 1) % k;
    const uint64_t members = nodes.ranks_of(node).size() - 1;
    blocks[nodes.leader(node)] = members * (n - 1) + (n - nodes.ranks_of(next).size());
  }
  return blocks;
}

uint64_t encoded_block_bytes(const kernels::CodecConfig& c, size_t count) {
  if (c.kind == kernels::CodecKind::kFp16 || c.kind == kernels::CodecKind::kBf16) return 2 * count;
  uint64_t bytes = 0;  // quant.h: per bucket two float32 and ceil(L/8) * N bytes of codes
  for (size_t b = 0; b < count; b += c.bucket) bytes += 8 + (std::min<size_t>(c.bucket, count - b) + 7) / 8 * c.bits;
  return bytes;
}

const std::vector<std::vector<int>>& node_maps() {
  static const std::vector<std::vector<int>> maps = {
      {0, 0, 1, 1}, {0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 1, 1, 1}, {0, 1, 1, 1}, {0, 1, 0, 1, 0, 1}};
  return maps;
}

std::string describe(const Job& job) {
  std::string map;
  for (int l : job.labels) map += std::to_string(l);
  return "map " + map + " count=" + std::to_string(job.count) + " " + kernels::data_type_name(job.dtype) +
         (job.codec ? " " + job.codec->canonical() : "") + " chunk=" + std::to_string(job.chunk_bytes) +
         " depth=" + std::to_string(job.depth) + (job.in_place ? " in place" : "");
}

}  // namespace

TEST_CASE("hierarchical all-gather: exact output on every rank, closed-form bytes", "[hierarchical]") {
  for (const auto& labels : node_maps())
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt8, DataType::kFloat64})
      for (bool in_place : {false, true})
        for (size_t count : {size_t{0}, size_t{1}, size_t{1337}}) {
          Job job{labels};
          job.dtype = dtype, job.in_place = in_place, job.count = count;
          INFO(describe(job));
          const auto in = make_inputs(job, 7 + count);
          const Result res = run(job, in, "hierarchical");
          const size_t es = kernels::element_size(dtype);
          std::vector<uint8_t> expected;
          for (const auto& block : in) expected.insert(expected.end(), block.begin(), block.end());
          const std::vector<uint64_t> blocks = blocks_sent(labels);
          for (int r = 0; r < job.n(); ++r) {
            CHECK(res.out[r] == expected);
            CHECK(res.sim.plan_bytes[r] == blocks[r] * count * es);
            CHECK(res.sim.ops[r]->stats().bytes_sent == res.sim.plan_bytes[r]);
          }
        }
}

TEST_CASE("compressed hierarchical all-gather: the flat compressed ring's bits on every rank", "[hierarchical]") {
  std::vector<kernels::CodecConfig> codecs;
  for (const char* spec : {"q8:bucket=128", "q4:bucket=64,round=stochastic,seed=5", "q1:bucket=64", "fp16", "bf16"})
    codecs.push_back(kernels::parse_codec_spec(spec));
  for (const auto& labels : node_maps())
    for (const kernels::CodecConfig& codec : codecs)
      for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16})
        for (bool in_place : {false, true}) {
          Job job{labels};
          job.codec = &codec, job.dtype = dtype, job.in_place = in_place, job.count = 3001;
          INFO(describe(job));
          const auto in = make_inputs(job, 21);
          const Result flat = run(job, in, "compressed_ring");
          const Result hier = run(job, in, "compressed_hierarchical");
          const std::vector<uint64_t> blocks = blocks_sent(labels);
          for (int r = 0; r < job.n(); ++r) {
            CHECK(hier.out[r] == flat.out[0]);
            CHECK(hier.sim.plan_bytes[r] == blocks[r] * encoded_block_bytes(codec, job.count));
            CHECK(hier.sim.ops[r]->stats().bytes_sent == hier.sim.plan_bytes[r]);
            CHECK(hier.sim.raw_bytes[r] == blocks[r] * job.count * kernels::element_size(dtype));
            // Across nodes only a leader sends: to the next leader, every block but the next node's.
            const NodeMap nodes = NodeMap::from_labels(labels);
            const int node = nodes.node_of(r), next = (node + 1) % nodes.nodes();
            const uint64_t inter = nodes.leader(node) == r ? job.n() - nodes.ranks_of(next).size() : 0;
            CHECK(hier.sim.ops[r]->stats().inter_node_bytes_sent == inter * encoded_block_bytes(codec, job.count));
          }
        }
}

TEST_CASE("compressed hierarchical all-gather: the same bits for every chunk size and pipeline depth",
          "[hierarchical]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q4:bucket=64,round=stochastic,seed=9");
  for (const auto& labels : node_maps()) {
    Job base{labels};
    base.codec = &codec, base.count = 5001, base.chunk_bytes = 1 << 20, base.depth = 1;
    const auto in = make_inputs(base, 5);
    const Result reference = run(base, in, "compressed_hierarchical");
    for (size_t chunk : {size_t{256}, size_t{1000}, size_t{4096}})
      for (int depth : {1, 2, 5}) {
        Job job = base;
        job.chunk_bytes = chunk, job.depth = depth;
        INFO(describe(job));
        const Result res = run(job, in, "compressed_hierarchical");
        for (int r = 0; r < job.n(); ++r) CHECK(res.out[r] == reference.out[0]);
      }
  }
}

TEST_CASE("hierarchical all-gather: declines one node, one rank per node, and no node map", "[hierarchical]") {
  const coll::Algorithm* hier = coll::find_algorithm(CollKind::kAllGather, "hierarchical");
  REQUIRE(hier);
  CollArgs a;
  a.kind = CollKind::kAllGather, a.nranks = 4, a.count = 10;
  CHECK(hier->cannot_run(a) != nullptr);  // no node map
  for (const std::vector<int>& labels : {std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 1, 2, 3}}) {
    const NodeMap nodes = NodeMap::from_labels(labels);
    a.nodes = &nodes;
    CHECK(hier->cannot_run(a) != nullptr);
  }
  const NodeMap two = NodeMap::from_labels({0, 0, 1, 1});
  a.nodes = &two;
  CHECK(hier->cannot_run(a) == nullptr);
}

}  // namespace qccl::test
