// The hierarchical compressed all-reduce (collectives/allreduce_hierarchical_compressed.cc) run by the
// real executor on a simulated network, over node maps even and uneven, contiguous and interleaved:
// results within its proven bound, identical bits on every rank (members decode the owners' bytes as
// the leaders do), the same bits for every chunk size, pipeline depth and in place, closed-form wire
// bytes with only the leaders' encoded bytes between nodes, error feedback on the leaders only, NaN
// counted by every rank, and the registry's choice on multi-rank nodes.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

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
  std::vector<int> labels = {0, 0, 1, 1};  // node of each rank
  size_t count = 1001;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  kernels::CodecConfig codec = kernels::parse_codec_spec("q4:bucket=64");
  size_t chunk_bytes = 2048;
  int depth = 2;
  bool in_place = false;
  int n() const { return static_cast<int>(labels.size()); }
};

struct Result {
  std::vector<std::vector<uint8_t>> out;
  std::vector<double> exact;
  SimRun sim;
};

std::vector<std::vector<uint8_t>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<uint8_t>> in(job.n(), std::vector<uint8_t>(job.count * kernels::element_size(job.dtype)));
  for (auto& b : in)
    for (size_t i = 0; i < job.count; ++i) store(job.dtype, b.data(), i, uniform(rng));
  return in;
}

Result run(const Job& job, std::vector<std::vector<uint8_t>> in, std::vector<std::vector<float>>* residuals = nullptr) {
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  const int n = job.n();
  Result res;
  res.exact.assign(job.count, 0.0);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < job.count; ++i) res.exact[i] += load(job.dtype, in[r].data(), i);
  if (job.op == RedOp::kAvg)
    for (double& e : res.exact) e /= n;
  res.out = job.in_place ? in : std::vector<std::vector<uint8_t>>(n, std::vector<uint8_t>(in[0].size(), 0xee));
  std::vector<CollArgs> args(n);
  std::vector<coll::QuantizedCall> calls(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = job.count, a.dtype = job.dtype, a.op = job.op;
    a.rank = r, a.nranks = n, a.nodes = &nodes, a.codec = &job.codec;
    a.sendbuf = job.in_place ? res.out[r].data() : in[r].data();
    a.recvbuf = res.out[r].data();
    a.rng = kernels::PhiloxKey{job.codec.seed, 3, static_cast<uint32_t>(r), 0};
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  res.sim = run_on_sim(args, "hierarchical_compressed", job.chunk_bytes, job.depth);
  return res;
}

// Every element goes through the N - 1 other nodes' encodes of their sums (range <= 2 L_q, magnitude
// <= L_q) and its owner's encode of the total (range <= 2n, magnitude <= n): at most 4n of range and
// 2n of magnitude in all. Nearest rounding errs by half a bucket step (range / (2^b - 1)) per
// encode, stochastic by less than a step, the casts by half an ulp; a 16-bit output rounds once more.
double error_bound(const Job& job) {
  const kernels::CodecConfig& c = job.codec;
  double per_unit_range = 0, relative = 0;
  if (c.kind == kernels::CodecKind::kQuant)
    per_unit_range = (c.rounding == kernels::Rounding::kStochastic ? 1.0 : 0.5) / ((1u << c.bits) - 1);
  if (c.kind == kernels::CodecKind::kFp16) relative = 0x1p-11;
  if (c.kind == kernels::CodecKind::kBf16) relative = 0x1p-8;
  const double n = job.n();
  double bound = per_unit_range * 4 * n * 1.0001 + relative * 2 * n + 1e-5 * n;
  if (job.dtype == DataType::kFloat16) bound += n * 0x1p-11;
  if (job.dtype == DataType::kBfloat16) bound += n * 0x1p-8;
  return job.op == RedOp::kAvg ? bound / n + 1e-6 : bound;
}

// Bytes of one encoded run of m values (kernels/quant.h: a q codec sends each bucket's float minimum
// and maximum, then the codes; the casts 2 bytes a value, none 4).
uint64_t encoded_bytes(const kernels::CodecConfig& codec, size_t m) {
  switch (codec.kind) {
    case kernels::CodecKind::kNone:
      return 4 * m;
    case kernels::CodecKind::kFp16:
    case kernels::CodecKind::kBf16:
      return 2 * m;
    default:
      return 8 * ((m + codec.bucket - 1) / codec.bucket) + (m + 7) / 8 * static_cast<uint64_t>(codec.bits);
  }
}

std::string describe(const Job& job) {
  std::string labels;
  for (int l : job.labels) labels += std::to_string(l);
  return "nodes " + labels + " count=" + std::to_string(job.count) + " " + kernels::data_type_name(job.dtype) + " " +
         kernels::red_op_name(job.op) + " " + job.codec.canonical() + " chunk=" + std::to_string(job.chunk_bytes) +
         " depth=" + std::to_string(job.depth) + (job.in_place ? " in place" : "");
}

const std::vector<std::vector<int>> kMaps = {
    {0, 0, 1, 1}, {0, 0, 1, 2, 2, 2}, {0, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 1, 1, 1, 1}};

}  // namespace

TEST_CASE("hierarchical compressed all-reduce: within the bound, identical bits on every rank, closed-form bytes",
          "[compressed]") {
  for (const auto& labels : kMaps)
    for (const char* spec :
         {"none", "fp16", "bf16", "q8:bucket=64", "q4:bucket=64,round=stochastic,seed=5", "q1:bucket=64"})
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16})
        for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
          Job job;
          job.labels = labels, job.codec = kernels::parse_codec_spec(spec), job.dtype = dtype, job.op = op;
          job.count = 997 + labels.size();  // not a multiple of the node count or the bucket
          job.chunk_bytes = 1 << 20;        // one chunk per segment: the closed form below
          INFO(describe(job));
          const Result res = run(job, make_inputs(job, 17 + labels.size()));
          double worst = 0;
          for (size_t i = 0; i < job.count; ++i)
            worst = std::max(worst, std::fabs(load(dtype, res.out[0].data(), i) - res.exact[i]));
          CHECK(worst <= error_bound(job));
          const NodeMap nodes = NodeMap::from_labels(labels);
          const int n = job.n(), k = nodes.nodes();
          auto segment = [&](int q) { return job.count / k + (static_cast<size_t>(q) < job.count % k ? 1 : 0); };
          uint64_t all = 0;
          for (int q = 0; q < k; ++q) all += encoded_bytes(job.codec, segment(q));
          for (int r = 0; r < n; ++r) {
            INFO("rank " << r);
            CHECK(res.out[r] == res.out[0]);
            const int node = nodes.node_of(r);
            const uint64_t expected =
                nodes.leader(node) != r
                    ? job.count * kernels::element_size(dtype)  // a member's input, raw, to its leader
                    : (nodes.ranks_of(node).size() - 1) * all + (all - encoded_bytes(job.codec, segment(node))) +
                          (k - 1) * encoded_bytes(job.codec, segment(node));
            CHECK(res.sim.plan_bytes[r] == expected);
            CHECK(res.sim.ops[r]->stats().bytes_sent == expected);
            // Across nodes only leaders send, encoded: every other node's segment once, their own to all.
            for (int q = 0; q < n; ++q)
              if (!nodes.same_node(r, q) && res.sim.net->payload_bytes.count({r, q})) CHECK(nodes.leader(node) == r);
            CHECK(res.sim.ops[r]->stats().nonfinite == 0);
          }
        }
}

TEST_CASE("hierarchical compressed all-reduce: the same bits for every chunk size, pipeline depth and in place",
          "[compressed]") {
  for (const auto& labels : kMaps)
    for (const char* spec : {"q4:bucket=64,round=stochastic,seed=9", "q8:bucket=128", "bf16"}) {
      Job base;
      base.labels = labels, base.codec = kernels::parse_codec_spec(spec), base.count = 5000;
      base.chunk_bytes = 1 << 20, base.depth = 1;
      const auto in = make_inputs(base, 5);
      const Result reference = run(base, in);
      for (size_t chunk : {size_t{256}, size_t{1000}, size_t{4096}})
        for (int depth : {1, 3})
          for (bool in_place : {false, true}) {
            Job job = base;
            job.chunk_bytes = chunk, job.depth = depth, job.in_place = in_place;
            INFO(describe(job));
            const Result res = run(job, in);
            for (int r = 0; r < job.n(); ++r) CHECK(res.out[r] == reference.out[0]);
          }
    }
}

TEST_CASE("hierarchical compressed all-reduce: error feedback lives on the leaders and telescopes", "[compressed]") {
  Job job;
  job.labels = {0, 0, 1, 2, 2, 2}, job.count = 256, job.op = RedOp::kAvg;
  job.codec = kernels::parse_codec_spec("q2:bucket=64,ef=on");
  const int n = job.n();
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(job.count * 4));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < job.count; ++i) store(job.dtype, in[r].data(), i, std::sin(0.37 * i + r));
  std::vector<std::vector<float>> residual(n, std::vector<float>(job.count, 0.0f));
  Job plain = job;
  plain.codec = kernels::parse_codec_spec("q2:bucket=64");
  const int steps = 40;
  std::vector<double> sum_results(job.count, 0.0), sum_plain(job.count, 0.0), exact(job.count, 0.0);
  for (int t = 0; t < steps; ++t) {
    const Result with = run(job, in, &residual), without = run(plain, in);
    for (int r = 1; r < n; ++r) CHECK(with.out[r] == with.out[0]);
    for (size_t i = 0; i < job.count; ++i) {
      sum_results[i] += load(job.dtype, with.out[0].data(), i);
      sum_plain[i] += load(job.dtype, without.out[0].data(), i);
      exact[i] += with.exact[i];
    }
  }
  const NodeMap nodes = NodeMap::from_labels(job.labels);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    bool touched = false;
    for (float v : residual[r]) touched |= v != 0.0f;
    CHECK(touched == (nodes.leader(nodes.node_of(r)) == r));  // only the leaders encode
  }
  double drift_with = 0, drift_without = 0, telescope = 0;
  for (size_t i = 0; i < job.count; ++i) {
    double pending = 0;  // what the leaders' contributions have not yet delivered, in sum units
    for (int r = 0; r < n; ++r) pending += residual[r][i];
    telescope = std::max(telescope, std::fabs(exact[i] - sum_results[i] - pending / n));
    drift_with = std::max(drift_with, std::fabs(exact[i] - sum_results[i]));
    drift_without = std::max(drift_without, std::fabs(exact[i] - sum_plain[i]));
  }
  CHECK(telescope <= 1e-4 * steps);  // float32 rounding of the accumulators only
  CHECK(drift_without > 2 * drift_with);
}

TEST_CASE("hierarchical compressed all-reduce: a NaN in a member's input makes its bucket NaN on every rank",
          "[compressed]") {
  for (const auto& labels : kMaps) {
    Job job;
    job.labels = labels, job.count = 640, job.codec = kernels::parse_codec_spec("q8:bucket=64");
    auto in = make_inputs(job, 4);
    const int member = 1;  // rank 1 is a member in the maps {0,0,...} and a leader in {0,1,...}
    store(job.dtype, in[member].data(), 100, NAN);
    INFO(describe(job));
    const Result res = run(job, in);
    for (int r = 0; r < job.n(); ++r) {
      INFO("rank " << r);
      CHECK(res.sim.ops[r]->stats().nonfinite == 64);
      for (size_t i = 64; i < 128; ++i) CHECK(std::isnan(load(job.dtype, res.out[r].data(), i)));
      CHECK(std::isfinite(load(job.dtype, res.out[r].data(), 63)));
      CHECK(std::isfinite(load(job.dtype, res.out[r].data(), 128)));
    }
  }
}

TEST_CASE("the registry picks the hierarchical compressed all-reduce on nodes of several ranks only", "[compressed]") {
  const kernels::CodecConfig q8 = kernels::parse_codec_spec("q8");
  auto first = [&](const std::vector<int>& labels) {
    const NodeMap nodes = NodeMap::from_labels(labels);
    CollArgs a;
    a.kind = CollKind::kAllReduce, a.count = 1 << 20, a.nranks = static_cast<int>(labels.size());
    a.codec = &q8, a.nodes = &nodes;
    for (const coll::Algorithm& algorithm : coll::algorithms())
      if (algorithm.collective == CollKind::kAllReduce && !algorithm.cannot_run(a)) return std::string(algorithm.name);
    return std::string("none");
  };
  CHECK(first({0, 0, 1, 1}) == "hierarchical_compressed");
  CHECK(first({0, 1, 2, 3}) == "sra_compressed");  // one rank per node: the flat algorithm is the same
  CHECK(first({0, 0, 0, 0}) == "sra_compressed");  // one node
}

}  // namespace qccl::test
