// The hierarchical reduce-scatters run by the real executor on a simulated network, on node maps 2x2,
// 4x2, 2+3, 1+3 and an interleaved one. Uncompressed: every datatype and op exact (small integers,
// tests/common/reference.h), closed-form bytes. Compressed: each rank's block within the proven bound of a
// double-precision reduction (one codec error per remote node, of that node's float32 sum, plus
// float32 rounding: shared/specs/qsdp.md §4 P1/P11 with the sum over remote nodes), the same bits for
// every chunk size and pipeline depth, wire bytes equal to a closed form written here from the
// plan's description, error feedback that telescopes to the node leaders' residuals, and float16 /
// bfloat16 outputs. compressed_hierarchical_intra (members encode their inputs for the leader) is held
// to the same properties with one more codec error per member, and to its residuals.
#include <catch2/catch.hpp>

#include <algorithm>
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

struct Job {
  std::vector<int> labels;  // node label per rank
  size_t count = 1000;      // recvcount
  RedOp op = RedOp::kSum;
  const kernels::CodecConfig* codec = nullptr;
  size_t chunk_bytes = 4096;
  int depth = 2;
  uint64_t step = 0;
  bool in_place = false;
  DataType dtype = DataType::kFloat32;
  int n() const { return static_cast<int>(labels.size()); }
};

// Every rank's input, n * count values in [-1, 1] times a per-element scale up to 7, representable in
// the job's datatype.
std::vector<std::vector<float>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<float>> in(job.n(), std::vector<float>(job.n() * job.count));
  for (auto& b : in) {
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(uniform(rng) * (1 + i % 7));
    std::vector<std::byte> typed(b.size() * kernels::element_size(job.dtype));
    kernels::store_float(job.dtype, b.data(), typed.data(), b.size());
    kernels::load_float(job.dtype, typed.data(), b.data(), b.size());
  }
  return in;
}

struct Result {
  std::vector<std::vector<float>> out;  // per rank, its block in float32
  SimRun sim;
};

Result run(const Job& job, const std::vector<std::vector<float>>& in, std::vector<std::vector<float>>* residuals = nullptr,
           const std::string& algorithm = "compressed_hierarchical") {
  const int n = job.n();
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  const size_t es = kernels::element_size(job.dtype);
  Result res;
  res.out.assign(n, std::vector<float>(job.count, -12345.0f));
  std::vector<std::vector<std::byte>> send(n), out(n);
  std::vector<CollArgs> args(n);
  std::vector<coll::QuantizedCall> calls(n);
  for (int r = 0; r < n; ++r) {
    send[r].resize(in[r].size() * es);
    kernels::store_float(job.dtype, in[r].data(), send[r].data(), in[r].size());
    out[r].resize(job.count * es);
    CollArgs& a = args[r];
    a.kind = CollKind::kReduceScatter, a.count = job.count, a.dtype = job.dtype, a.op = job.op;
    a.rank = r, a.nranks = n, a.nodes = &nodes;
    a.sendbuf = send[r].data();
    a.recvbuf = job.in_place ? send[r].data() + r * job.count * es : out[r].data();
    a.codec = job.codec;
    a.rng = kernels::PhiloxKey{job.codec->seed, job.step, static_cast<uint32_t>(r), 0};
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  res.sim = run_on_sim(args, algorithm, job.chunk_bytes, job.depth);
  for (int r = 0; r < n; ++r)
    kernels::load_float(job.dtype, static_cast<const std::byte*>(args[r].recvbuf), res.out[r].data(), job.count);
  return res;
}

bool members_encode(const std::string& algorithm) { return algorithm == "compressed_hierarchical_intra"; }

// What member q's input for block b reaches its leader as: as it is, or (members_encode) decoded from
// q's encoding of it, the whole block at once (chunks are whole buckets from the block's start, and
// the rounding is keyed by rank, step and element index, so this is the plan's bits).
std::vector<float> member_value(const Job& job, const std::vector<std::vector<float>>& in, int q, int b,
                                const std::string& algorithm) {
  std::vector<float> x(in[q].begin() + b * job.count, in[q].begin() + (b + 1) * job.count);
  if (!members_encode(algorithm)) return x;
  std::vector<std::byte> wire(job.codec->encoded_bytes(job.count));
  const kernels::PhiloxKey key{job.codec->seed, job.step, static_cast<uint32_t>(q), 0};
  kernels::encode(*job.codec, x.data(), job.count, wire.data(), key, static_cast<uint64_t>(b) * job.count);
  kernels::decode(*job.codec, wire.data(), job.count, x.data());
  return x;
}

// The leader's float32 sum of node `node`'s inputs for block b: its own first, then the members' in
// rank order (what the plan computes, float by float).
std::vector<float> node_sum(const Job& job, const NodeMap& nodes, const std::vector<std::vector<float>>& in, int node, int b,
                            const std::string& algorithm = "compressed_hierarchical") {
  std::vector<float> sum(job.count, 0.0f);
  bool first = true;
  for (int q : nodes.ranks_of(node)) {
    const std::vector<float> x = first ? member_value(job, in, q, b, "") : member_value(job, in, q, b, algorithm);
    for (size_t i = 0; i < job.count; ++i) sum[i] = first ? x[i] : sum[i] + x[i];
    first = false;
  }
  return sum;
}

// The proven bound on |decode(encode(x)) - x| per value (quant.h): nearest s/2 + e, stochastic s + e,
// s = (max - min) / (2^N - 1) per bucket, e = 2^-13 s + 2^-22 max(|min|, |max|) + 2^(N-149); the casts
// half an ulp of the value.
std::vector<double> codec_bounds(const kernels::CodecConfig& c, const std::vector<float>& x) {
  std::vector<double> bound(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    if (c.kind == kernels::CodecKind::kFp16) bound[i] = std::fabs(x[i]) * 0x1p-11 + 0x1p-25;
    if (c.kind == kernels::CodecKind::kBf16) bound[i] = std::fabs(x[i]) * 0x1p-8;
  }
  if (c.kind != kernels::CodecKind::kQuant) return bound;
  for (size_t b = 0; b < x.size(); b += c.bucket) {
    const size_t end = std::min<size_t>(x.size(), b + c.bucket);
    const double lo = *std::min_element(x.begin() + b, x.begin() + end), hi = *std::max_element(x.begin() + b, x.begin() + end);
    const double s = (hi - lo) / ((1u << c.bits) - 1);
    const double e = 0x1p-13 * s + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, c.bits - 149);
    for (size_t i = b; i < end; ++i) bound[i] = (c.rounding == kernels::Rounding::kStochastic ? s : s / 2) + e;
  }
  return bound;
}

// Per element of rank r's block: the codec bound of each remote node's sum (and with members_encode,
// of each member's input), plus the float32 rounding of the n-1 additions of partial sums below 8n
// (2^-24 of each), divided for an average; then the output's rounding (float16: 2^-11 |y| + 2^-25,
// bfloat16: 2^-8 |y|).
std::vector<double> error_bounds(const Job& job, const std::vector<std::vector<float>>& in, int r,
                                 const std::vector<double>& exact, const std::string& algorithm) {
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  const int n = job.n();
  std::vector<double> bound(job.count, (n - 1) * 8.0 * n * 0x1p-24);
  for (int node = 0; node < nodes.nodes(); ++node) {
    if (node != nodes.node_of(r)) {
      const std::vector<double> b = codec_bounds(*job.codec, node_sum(job, nodes, in, node, r, algorithm));
      for (size_t i = 0; i < job.count; ++i) bound[i] += b[i];
    }
    if (!members_encode(algorithm)) continue;
    for (int q : nodes.ranks_of(node)) {
      if (q == nodes.leader(node)) continue;
      const std::vector<double> b =
          codec_bounds(*job.codec, std::vector<float>(in[q].begin() + r * job.count, in[q].begin() + (r + 1) * job.count));
      for (size_t i = 0; i < job.count; ++i) bound[i] += b[i];
    }
  }
  for (size_t i = 0; i < job.count; ++i) {
    if (job.op == RedOp::kAvg) bound[i] = bound[i] / n + 8.0 * 0x1p-24;
    const double y = std::fabs(exact[i]) + bound[i];
    if (job.dtype == DataType::kFloat16) bound[i] += y * 0x1p-11 + 0x1p-25;
    if (job.dtype == DataType::kBfloat16) bound[i] += y * 0x1p-8;
  }
  return bound;
}

std::vector<double> exact_block(const Job& job, const std::vector<std::vector<float>>& in, int r) {
  std::vector<double> exact(job.count, 0.0);
  for (int q = 0; q < job.n(); ++q)
    for (size_t i = 0; i < job.count; ++i) exact[i] += in[q][r * job.count + i];
  if (job.op == RedOp::kAvg)
    for (double& e : exact) e /= job.n();
  return exact;
}

uint64_t encoded_block_bytes(const kernels::CodecConfig& c, size_t count) {
  if (c.kind == kernels::CodecKind::kFp16 || c.kind == kernels::CodecKind::kBf16) return 2 * count;
  uint64_t bytes = 0;  // quant.h: per bucket two float32 and ceil(L/8) * N bytes of codes
  for (size_t b = 0; b < count; b += c.bucket) bytes += 8 + (std::min<size_t>(c.bucket, count - b) + 7) / 8 * c.bits;
  return bytes;
}

// Bytes each rank sends, in all and to other nodes. compressed_hierarchical: a member n raw blocks
// of its datatype to its leader (compressed_hierarchical_intra: n encoded blocks); a leader its members' blocks in float32 and the other nodes' blocks
// encoded to their leaders. compressed_two_level (L ranks per node, N nodes): N raw blocks to each
// mate, and one encoded block to each other node.
struct Bytes {
  uint64_t all, inter_node;
};
std::vector<Bytes> bytes_sent(const Job& job, const std::string& algorithm) {
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  const uint64_t n = static_cast<uint64_t>(job.n()), es = kernels::element_size(job.dtype);
  const uint64_t encoded = encoded_block_bytes(*job.codec, job.count);
  std::vector<Bytes> bytes(n);
  for (uint64_t r = 0; r < n; ++r) {
    const uint64_t size = nodes.ranks_of(nodes.node_of(static_cast<int>(r))).size(), count_nodes = nodes.nodes();
    if (algorithm == "compressed_two_level")
      bytes[r] = {(size - 1) * count_nodes * job.count * es + (count_nodes - 1) * encoded, (count_nodes - 1) * encoded};
    else if (nodes.leader(nodes.node_of(static_cast<int>(r))) == static_cast<int>(r))
      bytes[r] = {(size - 1) * job.count * 4 + (n - size) * encoded, (n - size) * encoded};
    else
      bytes[r] = {n * (members_encode(algorithm) ? encoded : job.count * es), 0};
  }
  return bytes;
}

// The algorithms that run a node map: the two-level one needs nodes of equal size.
std::vector<std::string> algorithms_for(const std::vector<int>& labels) {
  const NodeMap nodes = NodeMap::from_labels(labels);
  bool equal = true;
  for (int node = 1; node < nodes.nodes(); ++node) equal &= nodes.ranks_of(node).size() == nodes.ranks_of(0).size();
  if (equal) return {"compressed_hierarchical", "compressed_hierarchical_intra", "compressed_two_level"};
  return {"compressed_hierarchical", "compressed_hierarchical_intra"};
}

// Who keeps the residual of a node sum of block r for node `node`: its leader, or its rank in r's lane.
int residual_owner(const NodeMap& nodes, int node, int r, const std::string& algorithm) {
  return algorithm == "compressed_two_level" ? nodes.ranks_of(node)[nodes.local_index(r)] : nodes.leader(node);
}

const std::vector<std::vector<int>>& node_maps() {
  static const std::vector<std::vector<int>> maps = {
      {0, 0, 1, 1}, {0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 1, 1, 1}, {0, 1, 1, 1}, {0, 1, 0, 1, 0, 1}};
  return maps;
}

std::string describe(const Job& job) {
  std::string map;
  for (int l : job.labels) map += std::to_string(l);
  return "map " + map + " count=" + std::to_string(job.count) + " " + kernels::data_type_name(job.dtype) + " " +
         job.codec->canonical() + (job.op == RedOp::kAvg ? " avg" : " sum") + " chunk=" + std::to_string(job.chunk_bytes) +
         " depth=" + std::to_string(job.depth) + (job.in_place ? " in place" : "");
}

std::vector<kernels::CodecConfig> codecs() {
  std::vector<kernels::CodecConfig> out;
  for (const char* spec : {"q8:bucket=128", "q4:bucket=64,round=stochastic,seed=5", "q2:bucket=64", "fp16", "bf16"})
    out.push_back(kernels::parse_codec_spec(spec));
  return out;
}

}  // namespace

TEST_CASE("hierarchical reduce-scatter: every datatype and op exact, closed-form bytes", "[hierarchical]") {
  const DataType types[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,    DataType::kUint32,
                            DataType::kInt64,   DataType::kUint64,  DataType::kFloat16,  DataType::kBfloat16,
                            DataType::kFloat32, DataType::kFloat64};
  for (const auto& labels : node_maps())
    for (DataType dtype : types)
      for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg})
        for (bool in_place : {false, true})
          for (size_t count : {size_t{0}, size_t{3}, size_t{777}}) {
            const int n = static_cast<int>(labels.size());
            const NodeMap nodes = NodeMap::from_labels(labels);
            const size_t es = kernels::element_size(dtype);
            INFO("map of " << n << " ranks, " << kernels::data_type_name(dtype) << " op " << static_cast<int>(op)
                           << " count " << count << (in_place ? " in place" : ""));
            std::vector<std::vector<uint8_t>> send(n, std::vector<uint8_t>(n * count * es)), out(n);
            std::vector<CollArgs> args(n);
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < n * count; ++i) store(dtype, send[r].data(), i, input_value(dtype, op, r, i));
              out[r].assign(count * es, 0xee);
              CollArgs& a = args[r];
              a.kind = CollKind::kReduceScatter, a.count = count, a.dtype = dtype, a.op = op;
              a.rank = r, a.nranks = n, a.nodes = &nodes;
              a.sendbuf = send[r].data();
              a.recvbuf = in_place ? send[r].data() + r * count * es : out[r].data();
            }
            const SimRun sim = run_on_sim(args, "hierarchical", 1024, 2);
            for (int r = 0; r < n; ++r) {
              size_t wrong = 0;
              for (size_t i = 0; i < count; ++i)
                if (load(dtype, args[r].recvbuf, i) != expected_reduction(dtype, op, n, r * count + i)) ++wrong;
              CHECK(wrong == 0);
              const bool leader = nodes.leader(nodes.node_of(r)) == r;
              CHECK(sim.plan_bytes[r] == static_cast<uint64_t>(leader ? n - 1 : n) * count * es);
              CHECK(sim.ops[r]->stats().bytes_sent == sim.plan_bytes[r]);
            }
          }
}

TEST_CASE("hierarchical compressed reduce-scatter: within one codec error per remote node, closed-form bytes",
          "[hierarchical]") {
  for (const auto& labels : node_maps())
    for (const std::string& algorithm : algorithms_for(labels))
      for (const kernels::CodecConfig& codec : codecs())
        for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16})
          for (RedOp op : {RedOp::kSum, RedOp::kAvg})
            for (bool in_place : {false, true}) {
              Job job{labels};
              job.codec = &codec, job.dtype = dtype, job.op = op, job.in_place = in_place, job.count = 1001;
              INFO(algorithm << " " << describe(job));
              const auto in = make_inputs(job, 31);
              const Result res = run(job, in, nullptr, algorithm);
              const std::vector<Bytes> bytes = bytes_sent(job, algorithm);
              for (int r = 0; r < job.n(); ++r) {
                const std::vector<double> exact = exact_block(job, in, r);
                const std::vector<double> bound = error_bounds(job, in, r, exact, algorithm);
                size_t over = 0;
                for (size_t i = 0; i < job.count; ++i)
                  if (!(std::fabs(res.out[r][i] - exact[i]) <= bound[i])) ++over;
                CHECK(over == 0);
                CHECK(res.sim.plan_bytes[r] == bytes[r].all);
                // What the uncompressed hierarchical algorithm sends (compressionRatio's numerator):
                // every block in the call's datatype (a leader's float32 sums for its members used to
                // count 4 bytes a value at 16 bits).
                if (algorithm != "compressed_two_level") {
                  const NodeMap nodes = NodeMap::from_labels(labels);
                  const bool leader = nodes.leader(nodes.node_of(r)) == r;
                  CHECK(res.sim.raw_bytes[r] == static_cast<uint64_t>(leader ? job.n() - 1 : job.n()) * job.count *
                                                    kernels::element_size(dtype));
                }
                CHECK(res.sim.ops[r]->stats().bytes_sent == bytes[r].all);
                CHECK(res.sim.ops[r]->stats().inter_node_bytes_sent == bytes[r].inter_node);
                CHECK(res.sim.ops[r]->stats().nonfinite == 0);
              }
            }
}

TEST_CASE("two-level compressed reduce-scatter: with rounding to nearest, the leader algorithm's bits",
          "[hierarchical]") {
  for (const auto& labels : node_maps()) {
    const std::vector<std::string> algorithms = algorithms_for(labels);
    if (std::find(algorithms.begin(), algorithms.end(), "compressed_two_level") == algorithms.end()) continue;
    for (const kernels::CodecConfig& codec : codecs()) {
      if (codec.rounding == kernels::Rounding::kStochastic) continue;
      for (bool in_place : {false, true}) {
        Job job{labels};
        job.codec = &codec, job.in_place = in_place, job.count = 2001, job.op = RedOp::kAvg;
        INFO(describe(job));
        const auto in = make_inputs(job, 17);
        const Result leader = run(job, in, nullptr, "compressed_hierarchical");
        const Result lanes = run(job, in, nullptr, "compressed_two_level");
        for (int r = 0; r < job.n(); ++r) CHECK(lanes.out[r] == leader.out[r]);
      }
    }
  }
}

TEST_CASE("hierarchical compressed reduce-scatter: the bound can fail (2-bit codes are not exact)", "[hierarchical]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q2:bucket=64");
  Job job{{0, 0, 1, 1}};
  job.codec = &codec;
  const auto in = make_inputs(job, 3);
  const Result res = run(job, in);
  double worst = 0;
  const std::vector<double> exact = exact_block(job, in, 0);
  for (size_t i = 0; i < job.count; ++i) worst = std::max(worst, std::fabs(res.out[0][i] - exact[i]));
  CHECK(worst > 0.1);
}

TEST_CASE("hierarchical compressed reduce-scatter: the same bits for every chunk size and pipeline depth",
          "[hierarchical]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q4:bucket=64,round=stochastic,seed=9");
  for (const auto& labels : node_maps()) {
    Job base{labels};
    base.codec = &codec, base.count = 3001, base.chunk_bytes = 1 << 20, base.depth = 1;
    const auto in = make_inputs(base, 5);
    for (const std::string& algorithm : algorithms_for(labels)) {
      const Result reference = run(base, in, nullptr, algorithm);
      for (size_t chunk : {size_t{256}, size_t{1000}, size_t{4096}})
        for (int depth : {1, 2, 5}) {
          Job job = base;
          job.chunk_bytes = chunk, job.depth = depth;
          INFO(algorithm << " " << describe(job));
          const Result res = run(job, in, nullptr, algorithm);
          for (int r = 0; r < job.n(); ++r) CHECK(res.out[r] == reference.out[r]);
        }
    }
  }
}

TEST_CASE("hierarchical compressed reduce-scatter: error feedback telescopes to the leaders' residuals",
          "[hierarchical]") {
  // Each remote node's encoding rank (its leader, or its rank in the block's lane) sends
  // decode(encode(S + r_old)) = S + r_old - r_new, so over T calls the sum of a block's outputs is the
  // sum of its exact values minus those ranks' final residuals there (they start at zero), up to
  // float32 rounding. Where members encode their inputs, every member's residual there as well.
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q2:bucket=64");
  for (const auto& labels : node_maps()) {
    for (const std::string& algorithm : algorithms_for(labels)) {
      Job job{labels};
      job.codec = &codec, job.count = 700;
      const NodeMap nodes = NodeMap::from_labels(labels);
      const int n = job.n(), calls = 4;
      std::vector<std::vector<float>> residuals(n, std::vector<float>(n * job.count, 0.0f));
      std::vector<std::vector<double>> got(n, std::vector<double>(job.count, 0.0)), want = got;
      for (int t = 0; t < calls; ++t) {
        job.step = static_cast<uint64_t>(t);
        const auto in = make_inputs(job, 100 + t);
        const Result res = run(job, in, &residuals, algorithm);
        for (int r = 0; r < n; ++r) {
          const std::vector<double> exact = exact_block(job, in, r);
          for (size_t i = 0; i < job.count; ++i) got[r][i] += res.out[r][i], want[r][i] += exact[i];
        }
      }
      for (int r = 0; r < n; ++r) {
        INFO(algorithm << ", map of " << n << " ranks, rank " << r);
        size_t over = 0;
        for (size_t i = 0; i < job.count; ++i) {
          double telescoped = want[r][i];
          for (int node = 0; node < nodes.nodes(); ++node)
            if (node != nodes.node_of(r)) telescoped -= residuals[residual_owner(nodes, node, r, algorithm)][r * job.count + i];
          if (members_encode(algorithm))
            for (int q = 0; q < n; ++q)
              if (q != nodes.leader(nodes.node_of(q))) telescoped -= residuals[q][r * job.count + i];
          if (!(std::fabs(got[r][i] - telescoped) <= calls * 4.0 * n * 8.0 * n * 0x1p-24)) ++over;
        }
        CHECK(over == 0);
        // With the leader's algorithm, members keep no residual.
        if (algorithm == "compressed_hierarchical")
          for (int q : nodes.ranks_of(nodes.node_of(r)))
            if (q != nodes.leader(nodes.node_of(r)))
              CHECK(std::all_of(residuals[q].begin(), residuals[q].end(), [](float v) { return v == 0.0f; }));
      }
    }
  }
}

TEST_CASE("hierarchical compressed reduce-scatter: stochastic rounding unbiased over remote nodes' sums",
          "[hierarchical]") {
  // spec qsdp.md §4 P4 for the hierarchy: over K calls with independent rounding (the step keys it),
  // the mean of an output approaches the exact sum, within 5 standard deviations of the mean of K
  // draws whose variance is the sum over remote nodes of s^2 f (1 - f) (each node sum rounded once).
  // Where members encode their inputs, each member's rounding adds s_q^2 f (1 - f) and the node sum
  // is itself random: its step is bounded by that of the exact sum's range widened by its members'
  // steps on both sides, and its variance by a quarter of that step squared.
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q2:bucket=64,round=stochastic,seed=4");
  for (const auto& labels : {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 1, 1, 1}}) {
    for (const std::string& algorithm : algorithms_for(labels)) {
      Job job{labels};
      job.codec = &codec, job.count = 256;
      const NodeMap nodes = NodeMap::from_labels(labels);
      const int n = job.n(), trials = 400;
      const auto in = make_inputs(job, 77);
      std::vector<std::vector<double>> mean(n, std::vector<double>(job.count, 0.0));
      for (int t = 0; t < trials; ++t) {
        job.step = static_cast<uint64_t>(t);
        const Result res = run(job, in, nullptr, algorithm);
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < job.count; ++i) mean[r][i] += res.out[r][i] / static_cast<double>(trials);
      }
      for (int r = 0; r < n; ++r) {
        const std::vector<double> exact = exact_block(job, in, r);
        std::vector<double> variance(job.count, 0.0);
        // Per bucket of x: its step and, at each element, s^2 f (1 - f).
        auto add_rounding = [&](const std::vector<float>& x, double widen, std::vector<double>* steps) {
          for (size_t b = 0; b < job.count; b += codec.bucket) {
            const size_t end = std::min<size_t>(job.count, b + codec.bucket);
            const double lo = *std::min_element(x.begin() + b, x.begin() + end);
            const double hi = *std::max_element(x.begin() + b, x.begin() + end);
            const double s = (hi - lo) / 3;
            for (size_t i = b; i < end; ++i) {
              const double t = s > 0 ? (x[i] - lo) / s : 0, f = t - std::floor(t);
              if (steps) (*steps)[i] = s;
              const double wide = s + 2 * widen / 3;  // the step of the range widened by `widen` on each side
              variance[i] += widen > 0 ? wide * wide / 4 : s * s * f * (1 - f);
            }
          }
        };
        for (int node = 0; node < nodes.nodes(); ++node) {
          std::vector<double> member_steps(job.count, 0.0);  // the sum of the node's members' steps
          if (members_encode(algorithm))
            for (int q : nodes.ranks_of(node)) {
              if (q == nodes.leader(node)) continue;
              std::vector<double> steps(job.count);
              add_rounding(std::vector<float>(in[q].begin() + r * job.count, in[q].begin() + (r + 1) * job.count), 0,
                           &steps);
              for (size_t i = 0; i < job.count; ++i) member_steps[i] += steps[i];
            }
          if (node == nodes.node_of(r)) continue;
          const double widen = *std::max_element(member_steps.begin(), member_steps.end());
          add_rounding(node_sum(job, nodes, in, node, r), widen, nullptr);
        }
        size_t over = 0;
        for (size_t i = 0; i < job.count; ++i)
          if (!(std::fabs(mean[r][i] - exact[i]) <= 5 * std::sqrt(variance[i] / trials) + 1e-5)) ++over;
        INFO(algorithm << ", rank " << r);
        CHECK(over == 0);
      }
    }
  }
}

TEST_CASE("hierarchical compressed reduce-scatter: NaN in a member's input reaches its block's owner, reported",
          "[hierarchical]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q8:bucket=64");
  Job job{{0, 0, 1, 1}};
  job.codec = &codec;
  auto in = make_inputs(job, 9);
  in[3][0 * job.count + 5] = NAN;  // rank 3 (a member of node 1) poisons block 0 (rank 0, node 0)
  const Result res = run(job, in);
  CHECK(std::isnan(res.out[0][5]));
  CHECK(res.sim.ops[0]->stats().nonfinite > 0);
  for (int r = 1; r < job.n(); ++r) CHECK(res.sim.ops[r]->stats().nonfinite == 0);
}

// A leader of 100 ranks among 400 (300 nodes of one rank) posts 69,899 transfers a fragment: past
// the 65,536 a program's slot index held when it was 16 bits wide (the leader's receives then landed
// on busy slots: qcclInternalError), and more than the guard that was to refuse such maps counted.
TEST_CASE("hierarchical reduce-scatters: a leader of more than 65,536 transfers a fragment", "[hierarchical]") {
  std::vector<int> labels(100, 0);
  for (int node = 1; node <= 300; ++node) labels.push_back(node);
  const int n = static_cast<int>(labels.size());
  const NodeMap nodes = NodeMap::from_labels(labels);
  SECTION("uncompressed, exact") {
    const size_t count = 3;
    std::vector<std::vector<float>> send(n, std::vector<float>(n * count)), out(n, std::vector<float>(count, -1.0f));
    std::vector<CollArgs> args(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < n * count; ++i)
        send[r][i] = static_cast<float>(input_value(DataType::kFloat32, RedOp::kSum, r, i));
      CollArgs& a = args[r];
      a.kind = CollKind::kReduceScatter, a.count = count, a.dtype = DataType::kFloat32, a.op = RedOp::kSum;
      a.rank = r, a.nranks = n, a.nodes = &nodes, a.sendbuf = send[r].data(), a.recvbuf = out[r].data();
    }
    run_on_sim(args, "hierarchical", 1024, 2);
    size_t wrong = 0;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        wrong += out[r][i] != expected_reduction(DataType::kFloat32, RedOp::kSum, n, r * count + i);
    CHECK(wrong == 0);
  }
  SECTION("compressed, within one codec error per remote node") {
    const kernels::CodecConfig codec = kernels::parse_codec_spec("q8:bucket=8");
    Job job{labels};
    job.codec = &codec, job.count = 8;
    const auto in = make_inputs(job, 5);
    const Result res = run(job, in);
    size_t over = 0;
    for (int r = 0; r < n; ++r) {
      const std::vector<double> exact = exact_block(job, in, r);
      const std::vector<double> bound = error_bounds(job, in, r, exact, "compressed_hierarchical");
      for (size_t i = 0; i < job.count; ++i) over += !(std::fabs(res.out[r][i] - exact[i]) <= bound[i]);
    }
    CHECK(over == 0);
  }
}

// fp16 carries a node sum in float16 (include/qccl.h): where the sum of a node's inputs passes 65504
// while every input and the result of the flat algorithm fit, the block's owner in another node gets
// Inf and counts it; its own node's ranks do not.
TEST_CASE("hierarchical compressed reduce-scatters: fp16 node sums beyond float16's range arrive as Inf, counted",
          "[hierarchical]") {
  const kernels::CodecConfig fp16 = kernels::parse_codec_spec("fp16");
  for (const char* algorithm : {"compressed_hierarchical", "compressed_two_level"}) {
    Job job{{0, 0, 1, 1}};
    job.codec = &fp16, job.count = 5;
    const std::vector<std::vector<float>> in(job.n(), std::vector<float>(job.n() * job.count, 40000.0f));
    const Result res = run(job, in, nullptr, algorithm);
    INFO(algorithm);
    for (int r = 0; r < job.n(); ++r) {
      // Every block gets the other node's sum of 80000, encoded once: Inf (the rank's own node's sum
      // is never encoded).
      CHECK(std::isinf(res.out[r][0]));
      CHECK(res.sim.ops[r]->stats().nonfinite == job.count);
    }
  }
}

TEST_CASE("hierarchical compressed reduce-scatter: declines uncompressed calls and flat node maps", "[hierarchical]") {
  for (const char* name : {"compressed_hierarchical", "compressed_hierarchical_intra"}) {
    const coll::Algorithm* hier = coll::find_algorithm(CollKind::kReduceScatter, name);
    REQUIRE(hier);
    const kernels::CodecConfig codec = kernels::parse_codec_spec("q8");
    const NodeMap two = NodeMap::from_labels({0, 0, 1, 1}), flat = NodeMap::from_labels({0, 1, 2, 3});
    CollArgs a;
    a.kind = CollKind::kReduceScatter, a.nranks = 4, a.count = 10, a.nodes = &two;
    CHECK(hier->cannot_run(a) != nullptr);  // no codec
    a.codec = &codec;
    CHECK(hier->cannot_run(a) == nullptr);
    a.nodes = &flat;
    CHECK(hier->cannot_run(a) != nullptr);
    a.nodes = nullptr;
    CHECK(hier->cannot_run(a) != nullptr);
  }
}

}  // namespace qccl::test
