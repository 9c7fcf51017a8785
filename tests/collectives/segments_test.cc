// Segments (CollArgs::segments, qcclSegment_t) in every compressed AllGather and ReduceScatter
// algorithm, on a simulated network: exact segments arrive bit for bit (AllGather) or summed without
// codec error (ReduceScatter); a quantized segment's bits are those of the codec run on that segment
// alone, its bucket grid starting at the segment (spec qsdp.md §4 P12), so changing another segment
// changes nothing in it; the bits do not depend on the chunk size; wire bytes are the sum over the
// segments of their encoded or exact sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "collectives/compressed.h"
#include "collectives/node_map.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using coll::NodeMap;
using coll::Segment;

// 1000 values: quantized, exact, a quantized run of one value, exact, quantized.
const std::vector<Segment>& segments() {
  static const std::vector<Segment> list = {
      {0, 300, false}, {300, 70, true}, {370, 1, false}, {371, 200, true}, {571, 429, false}};
  return list;
}
constexpr size_t kBlock = 1000;

struct Setup {
  CollKind kind;
  std::string algorithm;
  std::vector<int> labels;
};

std::vector<Setup> setups() {
  return {{CollKind::kAllGather, "compressed_ring", {0, 1, 2}},
          {CollKind::kAllGather, "compressed_hierarchical", {0, 0, 1, 1, 1}},
          {CollKind::kReduceScatter, "compressed_pairwise", {0, 1, 2}},
          {CollKind::kReduceScatter, "compressed_hierarchical", {0, 0, 1, 1, 1}},
          {CollKind::kReduceScatter, "compressed_two_level", {0, 1, 0, 1}},
          {CollKind::kReduceScatter, "compressed_hierarchical_intra", {0, 0, 1, 1, 1}}};
}

// Every rank's input in float32 (representable in dtype): AllGather one block, ReduceScatter n.
std::vector<std::vector<float>> inputs(const Setup& s, DataType dtype, uint64_t seed) {
  const size_t n = s.labels.size(), per_rank = s.kind == CollKind::kAllGather ? kBlock : n * kBlock;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<float>> in(n, std::vector<float>(per_rank));
  for (auto& v : in) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(uniform(rng) * (1 + i % 3));
    std::vector<std::byte> typed(v.size() * kernels::element_size(dtype));
    kernels::store_float(dtype, v.data(), typed.data(), v.size());
    kernels::load_float(dtype, typed.data(), v.data(), v.size());
  }
  return in;
}

struct Run {
  std::vector<std::vector<float>> out;  // AllGather: n blocks per rank; ReduceScatter: its block
  std::vector<uint64_t> bytes;
};

Run run(const Setup& s, const kernels::CodecConfig& codec, DataType dtype, const std::vector<std::vector<float>>& in,
        size_t chunk) {
  const int n = static_cast<int>(s.labels.size());
  const NodeMap nodes = NodeMap::from_labels(s.labels);
  const size_t es = kernels::element_size(dtype), out_count = s.kind == CollKind::kAllGather ? n * kBlock : kBlock;
  std::vector<std::vector<std::byte>> send(n), recv(n, std::vector<std::byte>(out_count * es));
  std::vector<CollArgs> args(n);
  std::vector<coll::QuantizedCall> calls(n);
  for (int r = 0; r < n; ++r) {
    send[r].resize(in[r].size() * es);
    kernels::store_float(dtype, in[r].data(), send[r].data(), in[r].size());
    CollArgs& a = args[r];
    a.kind = s.kind, a.count = kBlock, a.dtype = dtype, a.rank = r, a.nranks = n, a.nodes = &nodes;
    a.sendbuf = send[r].data(), a.recvbuf = recv[r].data();
    a.codec = &codec, a.rng = kernels::PhiloxKey{codec.seed, 1, static_cast<uint32_t>(r), 0};
    a.method_call = &calls[r];
    a.segments = &segments();
  }
  const SimRun sim = run_on_sim(args, s.algorithm, chunk, 2);
  Run result;
  for (int r = 0; r < n; ++r) {
    result.out.emplace_back(out_count);
    kernels::load_float(dtype, recv[r].data(), result.out.back().data(), out_count);
    result.bytes.push_back(sim.ops[r]->stats().bytes_sent);
    CHECK(sim.plan_bytes[r] == result.bytes.back());
  }
  return result;
}

// What one block encodes to, segment by segment: exact segments of inputs in their datatype, of
// node sums (the hierarchical reduce-scatters) in float32.
uint64_t block_bytes(const kernels::CodecConfig& codec, DataType dtype, bool sums) {
  uint64_t bytes = 0;
  for (const Segment& g : segments())
    bytes += g.exact ? g.count * (sums ? 4 : kernels::element_size(dtype)) : codec.encoded_bytes(g.count);
  return bytes;
}

}  // namespace

TEST_CASE("segments: exact runs exact, quantized runs coded on their own, bits independent of chunking",
          "[segments]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q2:bucket=64");  // coarse: errors show
  for (const Setup& s : setups())
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16}) {
      INFO(s.algorithm << " " << kernels::data_type_name(dtype));
      const int n = static_cast<int>(s.labels.size());
      const auto in = inputs(s, dtype, 5);
      const Run base = run(s, codec, dtype, in, 1 << 20);
      for (size_t chunk : {size_t{256}, size_t{1024}}) {
        const Run other = run(s, codec, dtype, in, chunk);
        for (int r = 0; r < n; ++r) CHECK(other.out[r] == base.out[r]);
      }
      // Another segment's values change nothing in this one: perturb segment 0 of every block.
      auto changed = in;
      for (auto& v : changed)
        for (size_t b = 0; b * kBlock < v.size(); ++b)
          for (size_t i = 0; i < 300; ++i) v[b * kBlock + i] *= 3.0f;
      const Run perturbed = run(s, codec, dtype, changed, 1 << 20);
      for (int r = 0; r < n; ++r)
        for (size_t b = 0; b * kBlock < base.out[r].size(); ++b)
          for (size_t i = 300; i < kBlock; ++i) REQUIRE(perturbed.out[r][b * kBlock + i] == base.out[r][b * kBlock + i]);
      if (s.kind == CollKind::kAllGather) {
        // Exact segments bit for bit; quantized ones = the codec run on the segment alone.
        for (int q = 0; q < n; ++q)
          for (const Segment& g : segments()) {
            std::vector<float> want(in[q].begin() + g.offset, in[q].begin() + g.offset + g.count);
            if (!g.exact) {
              std::vector<std::byte> wire(codec.encoded_bytes(g.count));
              kernels::encode(codec, want.data(), g.count, wire.data(), kernels::PhiloxKey{}, 0);
              kernels::decode(codec, wire.data(), g.count, want.data());
              std::vector<std::byte> typed(g.count * kernels::element_size(dtype));  // the output's rounding
              kernels::store_float(dtype, want.data(), typed.data(), g.count);
              kernels::load_float(dtype, typed.data(), want.data(), g.count);
            }
            for (int r = 0; r < n; ++r)
              CHECK(std::vector<float>(base.out[r].begin() + q * kBlock + g.offset,
                                       base.out[r].begin() + q * kBlock + g.offset + g.count) == want);
          }
      } else {
        // Exact segments: the sum up to float32 (and the output's) rounding; quantized: visibly off.
        for (int r = 0; r < n; ++r) {
          double exact_err = 0, coded_err = 0;
          for (const Segment& g : segments())
            for (size_t i = g.offset; i < g.offset + g.count; ++i) {
              double sum = 0, scale = 0;
              for (int q = 0; q < n; ++q) sum += in[q][r * kBlock + i], scale += std::fabs(in[q][r * kBlock + i]);
              const double err = std::fabs(base.out[r][i] - sum) / (scale + 1e-30);
              (g.exact ? exact_err : coded_err) = std::max(g.exact ? exact_err : coded_err, err);
            }
          CHECK(exact_err <= (dtype == DataType::kBfloat16 ? 0x1p-8 : 8 * n * 0x1p-24));
          CHECK(coded_err > 0.01);
        }
      }
      // Wire bytes: the plans' closed forms with a block of block_bytes().
      const uint64_t b = block_bytes(codec, dtype, false), es = kernels::element_size(dtype);
      if (s.algorithm == "compressed_ring" || s.algorithm == "compressed_pairwise")
        for (int r = 0; r < n; ++r) CHECK(base.bytes[r] == static_cast<uint64_t>(n - 1) * b);
      if (s.algorithm == "compressed_two_level")  // nodes of 2: N raw blocks to the mate, one block out
        for (int r = 0; r < n; ++r) CHECK(base.bytes[r] == 2 * kBlock * es + block_bytes(codec, dtype, true));
      if (s.algorithm == "compressed_hierarchical_intra")  // members (1, 3, 4): n blocks, exact runs in float32
        for (int r : {1, 3, 4}) CHECK(base.bytes[r] == n * block_bytes(codec, dtype, true));
    }
}

}  // namespace qccl::test
