// reduce_scatter_compressed_pairwise run by the real executor on a simulated network: each rank's
// block within the proven bound (the sum over the other ranks' contributions of their per-bucket
// codec error, plus float32 rounding) of a double-precision reduction, the same bits for every chunk
// size and pipeline depth, the owner's own input never encoded, wire bytes equal to a closed form
// written here independently, error feedback that telescopes, and float16/bfloat16 outputs within
// the same bound plus half an ulp of the result.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "collectives/compressed.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;

struct Job {
  int n = 2;
  size_t count = 1000;  // recvcount
  RedOp op = RedOp::kSum;
  kernels::CodecConfig codec;
  size_t chunk_bytes = 4096;
  int depth = 2;
  uint64_t step = 0;
  bool in_place = false;
  DataType dtype = DataType::kFloat32;
};

struct Result {
  std::vector<std::vector<float>> out;  // per rank, its block
  SimRun sim;
};

// Every rank's input, n * count float32 values in [-1, 1] times a per-element scale up to 7.
std::vector<std::vector<float>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<float>> in(job.n, std::vector<float>(job.n * job.count));
  for (auto& b : in)
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(uniform(rng) * (1 + i % 7));
  return in;
}

// The inputs rounded to the job's datatype (so that the reference sums what the ranks send).
void round_to(DataType dtype, std::vector<std::vector<float>>* in) {
  for (auto& b : *in) {
    std::vector<std::byte> typed(b.size() * kernels::element_size(dtype));
    kernels::store_float(dtype, b.data(), typed.data(), b.size());
    kernels::load_float(dtype, typed.data(), b.data(), b.size());
  }
}

// Runs the job on inputs `in` (float32 values representable in job.dtype); res.out holds the blocks
// converted back to float32.
Result run(const Job& job, const std::vector<std::vector<float>>& in, std::vector<std::vector<float>>* residuals = nullptr) {
  Result res;
  const size_t es = kernels::element_size(job.dtype);
  res.out.assign(job.n, std::vector<float>(job.count, -12345.0f));
  std::vector<std::vector<std::byte>> send(job.n), out(job.n);  // in place: recvbuff = sendbuff + rank * recvcount
  std::vector<CollArgs> args(job.n);
  std::vector<coll::QuantizedCall> calls(job.n);  // the method's calls: their residuals
  for (int r = 0; r < job.n; ++r) {
    send[r].resize(in[r].size() * es);
    kernels::store_float(job.dtype, in[r].data(), send[r].data(), in[r].size());
    out[r].resize(job.count * es);
    kernels::store_float(job.dtype, res.out[r].data(), out[r].data(), job.count);
    CollArgs& a = args[r];
    a.kind = CollKind::kReduceScatter, a.count = job.count, a.dtype = job.dtype, a.op = job.op;
    a.rank = r, a.nranks = job.n;
    a.sendbuf = send[r].data();
    a.recvbuf = job.in_place ? send[r].data() + r * job.count * es : out[r].data();
    a.codec = &job.codec;
    a.rng = kernels::PhiloxKey{job.codec.seed, job.step, static_cast<uint32_t>(r), 0};
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  res.sim = run_on_sim(args, "compressed_pairwise", job.chunk_bytes, job.depth);
  for (int r = 0; r < job.n; ++r)
    kernels::load_float(job.dtype, job.in_place ? send[r].data() + r * job.count * es : out[r].data(), res.out[r].data(),
                        job.count);
  return res;
}

// The proven bound on |decode(encode(x)) - x| for each value of one contribution (count values,
// buckets starting at its first value; quant.h): nearest rounding s/2 + e, stochastic s + e, with
// s = (max - min) / (2^N - 1) and e = 2^-13 s + 2^-22 max(|min|, |max|) + 2^(N-149); the casts half
// an ulp of the value.
std::vector<double> codec_bounds(const kernels::CodecConfig& c, const float* x, size_t count) {
  std::vector<double> bound(count, 0.0);
  for (size_t i = 0; i < count; ++i) {
    if (c.kind == kernels::CodecKind::kFp16) bound[i] = std::fabs(x[i]) * 0x1p-11 + 0x1p-25;
    if (c.kind == kernels::CodecKind::kBf16) bound[i] = std::fabs(x[i]) * 0x1p-8;
  }
  if (c.kind != kernels::CodecKind::kQuant) return bound;
  for (size_t b = 0; b < count; b += c.bucket) {
    const size_t end = std::min<size_t>(count, b + c.bucket);
    const double lo = *std::min_element(x + b, x + end), hi = *std::max_element(x + b, x + end);
    const double s = (hi - lo) / ((1u << c.bits) - 1);
    const double e = 0x1p-13 * s + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, c.bits - 149);
    for (size_t i = b; i < end; ++i) bound[i] = (c.rounding == kernels::Rounding::kStochastic ? s : s / 2) + e;
  }
  return bound;
}

// Per element of rank r's block: the sum over the n-1 other contributions of their codec bound,
// plus the float32 rounding of n-1 additions of partial sums below 8n (2^-24 of each) and, for an
// average, the division (which also divides the rest).
std::vector<double> error_bounds(const Job& job, const std::vector<std::vector<float>>& in, int r) {
  std::vector<double> bound(job.count, (job.n - 1) * 8.0 * job.n * 0x1p-24);
  for (int q = 0; q < job.n; ++q) {
    if (q == r) continue;
    const std::vector<double> b = codec_bounds(job.codec, in[q].data() + r * job.count, job.count);
    for (size_t i = 0; i < job.count; ++i) bound[i] += b[i];
  }
  if (job.op == RedOp::kAvg)
    for (double& b : bound) b = b / job.n + 8.0 * 0x1p-24;
  return bound;
}

// The float32 bound plus the output's rounding: half an ulp of the float32 result y, whose magnitude
// is at most |exact| + bound (float16: 2^-11 |y|, or 2^-25 among subnormals; bfloat16: 2^-8 |y|).
std::vector<double> output_bounds(const Job& job, const std::vector<double>& bound, const std::vector<double>& want) {
  std::vector<double> out = bound;
  for (size_t i = 0; i < out.size(); ++i) {
    const double y = std::fabs(want[i]) + bound[i];
    if (job.dtype == DataType::kFloat16) out[i] += y * 0x1p-11 + 0x1p-25;
    if (job.dtype == DataType::kBfloat16) out[i] += y * 0x1p-8;
  }
  return out;
}

std::vector<double> exact(const Job& job, const std::vector<std::vector<float>>& in, int r) {
  std::vector<double> e(job.count, 0.0);
  for (int q = 0; q < job.n; ++q)
    for (size_t i = 0; i < job.count; ++i) e[i] += in[q][r * job.count + i];
  if (job.op == RedOp::kAvg)
    for (double& v : e) v /= job.n;
  return e;
}

uint64_t encoded_size(const kernels::CodecConfig& c, size_t count) {
  switch (c.kind) {
    case kernels::CodecKind::kNone: return 4 * count;
    case kernels::CodecKind::kFp16:
    case kernels::CodecKind::kBf16: return 2 * count;
    default: break;
  }
  uint64_t bytes = 0;
  for (size_t b = 0; b < count; b += c.bucket) bytes += 8 + (std::min<size_t>(c.bucket, count - b) + 7) / 8 * c.bits;
  return bytes;
}

std::vector<kernels::CodecConfig> all_codecs() {
  std::vector<kernels::CodecConfig> out;
  for (const char* spec : {"none", "fp16", "bf16"}) out.push_back(kernels::parse_codec_spec(spec));
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* round : {"nearest", "stochastic"})
      out.push_back(kernels::parse_codec_spec("q" + std::to_string(bits) + ":bucket=64,round=" + round + ",seed=3"));
  return out;
}

std::string describe(const Job& job) {
  return "n=" + std::to_string(job.n) + " recvcount=" + std::to_string(job.count) + " " +
         kernels::red_op_name(job.op) + " " + job.codec.canonical() + " chunk=" + std::to_string(job.chunk_bytes) +
         " depth=" + std::to_string(job.depth) + (job.in_place ? " in place" : "") + " " +
         kernels::data_type_name(job.dtype);
}

}  // namespace

TEST_CASE("compressed reduce-scatter: within the bound of the other ranks' contributions, closed-form bytes",
          "[compressed]") {
  for (const kernels::CodecConfig& codec : all_codecs())
    for (int n : {2, 3, 4, 8})
      for (RedOp op : {RedOp::kSum, RedOp::kAvg})
        for (bool in_place : {false, true}) {
          Job job;
          job.codec = codec, job.n = n, job.op = op, job.in_place = in_place;
          job.count = 997 + static_cast<size_t>(n);  // odd, not a multiple of the bucket or the chunk
          INFO(describe(job));
          const auto in = make_inputs(job, 11 + n);
          const Result res = run(job, in);
          for (int r = 0; r < n; ++r) {
            const std::vector<double> want = exact(job, in, r), bound = error_bounds(job, in, r);
            size_t over = 0;
            for (size_t i = 0; i < job.count; ++i)
              if (!(std::fabs(res.out[r][i] - want[i]) <= bound[i])) ++over;
            CHECK(over == 0);
            CHECK(res.sim.plan_bytes[r] == static_cast<uint64_t>(n - 1) * encoded_size(codec, job.count));
            CHECK(res.sim.ops[r]->stats().bytes_sent == res.sim.plan_bytes[r]);
            CHECK(res.sim.raw_bytes[r] == static_cast<uint64_t>(n - 1) * job.count * sizeof(float));
            CHECK(res.sim.ops[r]->stats().nonfinite == 0);
          }
        }
}

TEST_CASE("compressed reduce-scatter: the owner's own input is never encoded", "[compressed]") {
  // Every other rank contributes zeros, which a q1 bucket encodes exactly (s = 0): the result is the
  // owner's input to the bit, far finer than a 1-bit code could carry.
  Job job;
  job.codec = kernels::parse_codec_spec("q1:bucket=64"), job.n = 4, job.count = 333;
  auto in = make_inputs(job, 7);
  for (int q = 0; q < job.n; ++q)
    for (int r = 0; r < job.n; ++r)
      if (q != r) std::fill_n(in[q].begin() + static_cast<ptrdiff_t>(r * job.count), job.count, 0.0f);
  const Result res = run(job, in);
  for (int r = 0; r < job.n; ++r)
    CHECK(std::equal(res.out[r].begin(), res.out[r].end(), in[r].begin() + static_cast<ptrdiff_t>(r * job.count)));
}

TEST_CASE("compressed reduce-scatter: nearest rounding is not exact (the bound test can fail)", "[compressed]") {
  Job job;
  job.codec = kernels::parse_codec_spec("q2:bucket=64"), job.n = 3;
  const auto in = make_inputs(job, 1);
  const Result res = run(job, in);
  const std::vector<double> want = exact(job, in, 1);
  double worst = 0;
  for (size_t i = 0; i < job.count; ++i) worst = std::max(worst, std::fabs(res.out[1][i] - want[i]));
  CHECK(worst > 0.1);
}

TEST_CASE("compressed reduce-scatter: zero count sends nothing", "[compressed]") {
  for (int n : {2, 3}) {
    Job job;
    job.codec = kernels::parse_codec_spec("q4"), job.n = n, job.count = 0;
    const Result res = run(job, make_inputs(job, 1));
    for (int r = 0; r < n; ++r) CHECK(res.sim.ops[r]->stats().bytes_sent == 0);
  }
}

TEST_CASE("compressed reduce-scatter: the same bits for every chunk size and pipeline depth", "[compressed]") {
  for (const char* spec : {"q4:bucket=64,round=stochastic,seed=9", "q8:bucket=128", "fp16", "bf16"})
    for (int n : {2, 3, 4, 8}) {
      Job base;
      base.codec = kernels::parse_codec_spec(spec), base.n = n, base.count = 5001, base.op = RedOp::kAvg;
      base.chunk_bytes = 1 << 20, base.depth = 1;
      const auto in = make_inputs(base, 5);
      const Result reference = run(base, in);
      for (size_t chunk : {size_t{256}, size_t{1000}, size_t{2048}})
        for (int depth : {1, 2, 5}) {
          Job job = base;
          job.chunk_bytes = chunk, job.depth = depth;
          INFO(describe(job));
          const Result res = run(job, in);
          for (int r = 0; r < n; ++r) CHECK(res.out[r] == reference.out[r]);
        }
    }
}

TEST_CASE("compressed reduce-scatter: stochastic rounding is keyed by the step", "[compressed]") {
  Job job;
  job.codec = kernels::parse_codec_spec("q2:bucket=64,round=stochastic");
  job.n = 3;
  const auto in = make_inputs(job, 2);
  job.step = 5;
  const Result a = run(job, in), b = run(job, in);
  job.step = 6;
  const Result c = run(job, in);
  CHECK(a.out[0] == b.out[0]);
  CHECK(a.out[0] != c.out[0]);
}

TEST_CASE("compressed reduce-scatter: error feedback telescopes to the residuals", "[compressed]") {
  for (int n : {2, 4}) {
    Job job;
    job.n = n, job.count = 300, job.op = RedOp::kAvg;
    job.codec = kernels::parse_codec_spec("q2:bucket=64,ef=on");
    Job plain = job;
    plain.codec = kernels::parse_codec_spec("q2:bucket=64");
    const auto in = make_inputs(job, 3);  // constant over steps: nearest rounding drifts without feedback
    std::vector<std::vector<float>> residual(n, std::vector<float>(n * job.count, 0.0f));
    const int steps = 40;
    std::vector<std::vector<double>> sum_with(n, std::vector<double>(job.count)), sum_without = sum_with;
    for (int t = 0; t < steps; ++t) {
      const Result with = run(job, in, &residual), without = run(plain, in);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < job.count; ++i) sum_with[r][i] += with.out[r][i], sum_without[r][i] += without.out[r][i];
    }
    double telescope = 0, drift_with = 0, drift_without = 0, own_residual = 0;
    for (int r = 0; r < n; ++r) {
      const std::vector<double> want = exact(job, in, r);
      for (size_t i = 0; i < job.count; ++i) {
        // What the other ranks' contributions to block r have not yet delivered, in average units.
        double pending = 0;
        for (int q = 0; q < n; ++q) pending += q == r ? 0.0 : residual[q][r * job.count + i];
        own_residual = std::max(own_residual, static_cast<double>(std::fabs(residual[r][r * job.count + i])));
        telescope = std::max(telescope, std::fabs(steps * want[i] - sum_with[r][i] - pending / n));
        drift_with = std::max(drift_with, std::fabs(steps * want[i] - sum_with[r][i]));
        drift_without = std::max(drift_without, std::fabs(steps * want[i] - sum_without[r][i]));
      }
    }
    INFO("n=" << n);
    CHECK(own_residual == 0);                // the own block is never encoded
    CHECK(telescope <= 1e-5 * steps * 8);    // float32 rounding only
    CHECK(drift_with <= (n - 1) * 14.0 / 3 / n);  // the other ranks' residuals, each within a bucket step
    CHECK(drift_without > 2 * drift_with);
  }
}

TEST_CASE("compressed reduce-scatter: NaN or Inf in a contribution reaches its owner, reported there",
          "[compressed]") {
  for (const char* spec : {"q8:bucket=64", "fp16", "bf16", "none"})
    for (float bad : {NAN, INFINITY}) {
      Job job;
      job.codec = kernels::parse_codec_spec(spec), job.n = 3, job.count = 640;
      auto in = make_inputs(job, 4);
      in[1][2 * job.count + 100] = bad;  // rank 1's contribution to rank 2's block
      INFO(describe(job) << " input " << bad);
      const Result res = run(job, in);
      CHECK(res.sim.ops[2]->stats().nonfinite > 0);
      CHECK_FALSE(std::isfinite(res.out[2][100]));
      CHECK(std::isfinite(res.out[2][600]));
      CHECK(res.sim.ops[0]->stats().nonfinite == 0);
    }
}

TEST_CASE("compressed reduce-scatter: float16 and bfloat16 outputs within the bound plus half an ulp",
          "[compressed]") {
  for (DataType dtype : {DataType::kFloat16, DataType::kBfloat16})
    for (const char* spec : {"none", "fp16", "bf16", "q8:bucket=64", "q4:bucket=64,round=stochastic,seed=3"})
      for (int n : {2, 3, 4})
        for (RedOp op : {RedOp::kSum, RedOp::kAvg})
          for (bool in_place : {false, true}) {
            Job job;
            job.codec = kernels::parse_codec_spec(spec), job.n = n, job.op = op, job.in_place = in_place;
            job.dtype = dtype, job.count = 997 + static_cast<size_t>(n);
            INFO(describe(job));
            auto in = make_inputs(job, 21 + n);
            round_to(dtype, &in);
            const Result res = run(job, in);
            size_t over = 0, over_float32 = 0;
            for (int r = 0; r < n; ++r) {
              const std::vector<double> want = exact(job, in, r), bound = error_bounds(job, in, r);
              const std::vector<double> typed = output_bounds(job, bound, want);
              for (size_t i = 0; i < job.count; ++i) {
                const double error = std::fabs(res.out[r][i] - want[i]);
                if (!(error <= typed[i])) ++over;
                if (!(error <= bound[i])) ++over_float32;
              }
              CHECK(res.sim.plan_bytes[r] == static_cast<uint64_t>(n - 1) * encoded_size(job.codec, job.count));
              CHECK(res.sim.ops[r]->stats().bytes_sent == res.sim.plan_bytes[r]);
              CHECK(res.sim.raw_bytes[r] == static_cast<uint64_t>(n - 1) * job.count * 2);
              CHECK(res.sim.ops[r]->stats().nonfinite == 0);
            }
            CHECK(over == 0);
            // The output's rounding is real: without its half ulp, the bound of exact contributions fails.
            if (job.codec.kind == kernels::CodecKind::kNone) CHECK(over_float32 > 0);
          }
}

TEST_CASE("compressed reduce-scatter: float16 and bfloat16 bits do not depend on the chunk size or depth",
          "[compressed]") {
  for (DataType dtype : {DataType::kFloat16, DataType::kBfloat16})
    for (int n : {2, 3}) {
      Job base;
      base.codec = kernels::parse_codec_spec("q4:bucket=64,round=stochastic,seed=9"), base.n = n, base.count = 3001;
      base.dtype = dtype, base.chunk_bytes = 1 << 20, base.depth = 1;
      auto in = make_inputs(base, 5);
      round_to(dtype, &in);
      const Result reference = run(base, in);
      for (size_t chunk : {size_t{256}, size_t{1000}})
        for (int depth : {1, 3}) {
          Job job = base;
          job.chunk_bytes = chunk, job.depth = depth;
          INFO(describe(job));
          const Result res = run(job, in);
          for (int r = 0; r < n; ++r) CHECK(res.out[r] == reference.out[r]);
        }
    }
}

TEST_CASE("compressed reduce-scatter: NaN or Inf in the owner's own input is reported too", "[compressed]") {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
    for (float bad : {NAN, INFINITY}) {
      Job job;
      job.codec = kernels::parse_codec_spec("q8:bucket=64"), job.n = 3, job.count = 640, job.dtype = dtype;
      auto in = make_inputs(job, 4);
      round_to(dtype, &in);
      in[2][2 * job.count + 100] = bad;  // rank 2's own block: never encoded
      INFO(describe(job) << " input " << bad);
      const Result res = run(job, in);
      CHECK(res.sim.ops[2]->stats().nonfinite == 1);
      CHECK_FALSE(std::isfinite(res.out[2][100]));
      CHECK(std::isfinite(res.out[2][101]));
      CHECK(res.sim.ops[0]->stats().nonfinite == 0);
      CHECK(res.sim.ops[1]->stats().nonfinite == 0);
    }
}

TEST_CASE("compressed reduce-scatter: a float16 sum beyond 65504 is Inf, reported", "[compressed]") {
  Job job;
  job.codec = kernels::parse_codec_spec("none"), job.n = 2, job.count = 64, job.dtype = DataType::kFloat16;
  std::vector<std::vector<float>> in(2, std::vector<float>(2 * job.count, 1.0f));
  in[0][5] = in[1][5] = 40000.0f;  // rank 0's block: 80000 overflows float16
  const Result res = run(job, in);
  CHECK(res.out[0][5] == INFINITY);
  CHECK(res.out[0][6] == 2.0f);
  CHECK(res.sim.ops[0]->stats().nonfinite == 1);
  CHECK(res.sim.ops[1]->stats().nonfinite == 0);
}

}  // namespace qccl::test
