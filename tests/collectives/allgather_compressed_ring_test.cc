// allgather_compressed_ring run by the real executor on a simulated network: every block within the
// codec's proven per-bucket bound of its owner's input (double-precision reference), identical bits
// on every rank, the same bits for every chunk size and pipeline depth, wire bytes equal to a closed
// form written here independently, error feedback that telescopes, and NaN reported on every rank.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "collectives/compressed.h"
#include "kernels/codec.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;

struct Job {
  int n = 2;
  size_t count = 1000;  // sendcount
  DataType dtype = DataType::kFloat32;
  kernels::CodecConfig codec;
  size_t chunk_bytes = 4096;
  int depth = 2;
  uint64_t step = 0;
  bool in_place = false;
};

struct Result {
  std::vector<std::vector<uint8_t>> out;  // per rank, n * count values in the job's datatype
  SimRun sim;
};

std::vector<std::vector<uint8_t>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<uint8_t>> in(job.n, std::vector<uint8_t>(job.count * kernels::element_size(job.dtype)));
  for (auto& b : in)
    for (size_t i = 0; i < job.count; ++i) store(job.dtype, b.data(), i, uniform(rng) * (1 + i % 7));
  return in;
}

Result run(const Job& job, const std::vector<std::vector<uint8_t>>& in, std::vector<std::vector<float>>* residuals = nullptr) {
  Result res;
  const size_t es = kernels::element_size(job.dtype);
  res.out.assign(job.n, std::vector<uint8_t>(job.n * job.count * es, 0xee));
  std::vector<CollArgs> args(job.n);
  std::vector<coll::QuantizedCall> calls(job.n);  // the method's calls: their residuals
  for (int r = 0; r < job.n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllGather, a.count = job.count, a.dtype = job.dtype;
    a.rank = r, a.nranks = job.n, a.recvbuf = res.out[r].data();
    if (job.in_place) {
      std::copy(in[r].begin(), in[r].end(), res.out[r].begin() + static_cast<ptrdiff_t>(r * job.count * es));
      a.sendbuf = res.out[r].data() + r * job.count * es;
    } else {
      a.sendbuf = in[r].data();
    }
    a.codec = &job.codec;
    a.rng = kernels::PhiloxKey{job.codec.seed, job.step, static_cast<uint32_t>(r), 0};
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  res.sim = run_on_sim(args, "compressed_ring", job.chunk_bytes, job.depth);
  return res;
}

// The proven bound on |decode(encode(x)) - x| for element i of a block (quant.h): per bucket of
// the block (buckets start at the block's first value), s = (max - min) / (2^N - 1); nearest rounding
// errs by s/2 + e, stochastic by less than s + e, e = 2^-13 s + 2^-22 max(|min|, |max|) + 2^(N-149).
// The casts err by half an ulp of the value; a float16/bfloat16 output rounds once more.
std::vector<double> error_bounds(const Job& job, const std::vector<uint8_t>& block) {
  std::vector<double> bound(job.count, 0.0);
  const kernels::CodecConfig& c = job.codec;
  for (size_t i = 0; i < job.count; ++i) {
    const double x = std::fabs(load(job.dtype, block.data(), i));
    if (c.kind == kernels::CodecKind::kFp16) bound[i] = x * 0x1p-11 + 0x1p-25;
    if (c.kind == kernels::CodecKind::kBf16) bound[i] = x * 0x1p-8;
  }
  if (c.kind == kernels::CodecKind::kQuant) {
    for (size_t b = 0; b < job.count; b += c.bucket) {
      const size_t end = std::min<size_t>(job.count, b + c.bucket);
      double lo = INFINITY, hi = -INFINITY;
      for (size_t i = b; i < end; ++i) {
        lo = std::min(lo, load(job.dtype, block.data(), i));
        hi = std::max(hi, load(job.dtype, block.data(), i));
      }
      const double s = (hi - lo) / ((1u << c.bits) - 1);
      const double e = 0x1p-13 * s + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, c.bits - 149);
      for (size_t i = b; i < end; ++i) bound[i] = (c.rounding == kernels::Rounding::kStochastic ? s : s / 2) + e;
    }
  }
  for (size_t i = 0; i < job.count; ++i) {
    const double x = std::fabs(load(job.dtype, block.data(), i)) + bound[i];
    if (job.dtype == DataType::kFloat16) bound[i] += x * 0x1p-11 + 0x1p-25;
    if (job.dtype == DataType::kBfloat16) bound[i] += x * 0x1p-8;
  }
  return bound;
}

// The codec's encoded size, written from the wire format (quant.h: per bucket two float32 and
// ceil(L/8) * N bytes of codes; the casts 2 bytes per value; none 4).
uint64_t encoded_size(const kernels::CodecConfig& c, size_t count) {
  switch (c.kind) {
    case kernels::CodecKind::kNone: return 4 * count;
    case kernels::CodecKind::kFp16:
    case kernels::CodecKind::kBf16: return 2 * count;
    default: break;
  }
  uint64_t bytes = 0;
  for (size_t b = 0; b < count; b += c.bucket) {
    const size_t len = std::min<size_t>(c.bucket, count - b);
    bytes += 8 + (len + 7) / 8 * static_cast<uint64_t>(c.bits);
  }
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
  return "n=" + std::to_string(job.n) + " sendcount=" + std::to_string(job.count) + " " +
         kernels::data_type_name(job.dtype) + " " + job.codec.canonical() + " chunk=" + std::to_string(job.chunk_bytes) +
         " depth=" + std::to_string(job.depth) + (job.in_place ? " in place" : "");
}

}  // namespace

TEST_CASE("compressed all-gather: every block within its bound, identical bits on every rank, closed-form bytes",
          "[compressed]") {
  for (const kernels::CodecConfig& codec : all_codecs())
    for (int n : {1, 2, 3, 4, 8})
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
        for (bool in_place : {false, true}) {
          Job job;
          job.codec = codec, job.n = n, job.dtype = dtype, job.in_place = in_place;
          job.count = 997 + static_cast<size_t>(n);  // odd, not a multiple of the bucket or the chunk
          INFO(describe(job));
          const auto in = make_inputs(job, 11 + n);
          const Result res = run(job, in);
          const size_t es = kernels::element_size(dtype);
          for (int q = 0; q < n; ++q) {
            const std::vector<double> bound = error_bounds(job, in[q]);
            size_t over = 0;
            for (size_t i = 0; i < job.count; ++i) {
              const double got = load(dtype, res.out[0].data() + q * job.count * es, i);
              if (!(std::fabs(got - load(dtype, in[q].data(), i)) <= bound[i])) ++over;
            }
            CHECK(over == 0);
          }
          for (int r = 1; r < n; ++r) CHECK(res.out[r] == res.out[0]);
          for (int r = 0; r < n; ++r) {
            CHECK(res.sim.plan_bytes[r] == static_cast<uint64_t>(n - 1) * encoded_size(codec, job.count));
            CHECK(res.sim.ops[r]->stats().bytes_sent == res.sim.plan_bytes[r]);
            CHECK(res.sim.raw_bytes[r] == static_cast<uint64_t>(n - 1) * job.count * es);
            CHECK(res.sim.ops[r]->stats().nonfinite == 0);
          }
        }
}

TEST_CASE("compressed all-gather: nearest rounding is not exact (the bound test can fail)", "[compressed]") {
  Job job;
  job.codec = kernels::parse_codec_spec("q2:bucket=64"), job.n = 3;
  const auto in = make_inputs(job, 1);
  const Result res = run(job, in);
  double worst = 0;
  for (size_t i = 0; i < job.count; ++i)
    worst = std::max(worst, std::fabs(load(job.dtype, res.out[1].data(), i) - load(job.dtype, in[0].data(), i)));
  CHECK(worst > 0.1);  // 2-bit codes of values up to 7 in size
}

TEST_CASE("compressed all-gather: zero count sends nothing", "[compressed]") {
  for (int n : {1, 2, 3}) {
    Job job;
    job.codec = kernels::parse_codec_spec("q4"), job.n = n, job.count = 0;
    const Result res = run(job, make_inputs(job, 1));
    for (int r = 0; r < n; ++r) CHECK(res.sim.ops[r]->stats().bytes_sent == 0);
  }
}

TEST_CASE("compressed all-gather: the same bits for every chunk size and pipeline depth", "[compressed]") {
  for (const char* spec : {"q4:bucket=64,round=stochastic,seed=9", "q8:bucket=128", "fp16", "bf16"})
    for (int n : {2, 3, 4, 8}) {
      Job base;
      base.codec = kernels::parse_codec_spec(spec), base.n = n, base.count = 5001;
      base.chunk_bytes = 1 << 20, base.depth = 1;
      const auto in = make_inputs(base, 5);
      const Result reference = run(base, in);
      for (size_t chunk : {size_t{256}, size_t{1000}, size_t{2048}})
        for (int depth : {1, 2, 5}) {
          Job job = base;
          job.chunk_bytes = chunk, job.depth = depth;
          INFO(describe(job));
          const Result res = run(job, in);
          for (int r = 0; r < n; ++r) CHECK(res.out[r] == reference.out[0]);
        }
    }
}

TEST_CASE("compressed all-gather: stochastic rounding is keyed by the step", "[compressed]") {
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

TEST_CASE("compressed all-gather: error feedback telescopes to the residuals", "[compressed]") {
  for (int n : {2, 3}) {
    Job job;
    job.n = n, job.count = 300;
    job.codec = kernels::parse_codec_spec("q2:bucket=64,ef=on");
    Job plain = job;
    plain.codec = kernels::parse_codec_spec("q2:bucket=64");
    const auto in = make_inputs(job, 3);  // constant over steps: nearest rounding drifts without feedback
    std::vector<std::vector<float>> residual(n, std::vector<float>(job.count, 0.0f));
    const int steps = 40;
    std::vector<double> sum_with(n * job.count, 0.0), sum_without(n * job.count, 0.0);
    for (int t = 0; t < steps; ++t) {
      const Result with = run(job, in, &residual), without = run(plain, in);
      for (int r = 1; r < n; ++r) CHECK(with.out[r] == with.out[0]);
      for (size_t i = 0; i < n * job.count; ++i) {
        sum_with[i] += load(job.dtype, with.out[0].data(), i);
        sum_without[i] += load(job.dtype, without.out[0].data(), i);
      }
    }
    double telescope = 0, drift_with = 0, drift_without = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < job.count; ++i) {
        const double exact = steps * load(job.dtype, in[q].data(), i);
        const size_t at = q * job.count + i;
        telescope = std::max(telescope, std::fabs(exact - sum_with[at] - residual[q][i]));
        drift_with = std::max(drift_with, std::fabs(exact - sum_with[at]));
        drift_without = std::max(drift_without, std::fabs(exact - sum_without[at]));
      }
    INFO("n=" << n);
    CHECK(telescope <= 1e-5 * steps * 8);  // float32 rounding of values up to 7 only
    CHECK(drift_with <= 14.0 / 3);         // within one bucket step (range <= 14, 3 levels)
    CHECK(drift_without > 2 * drift_with);
  }
}

TEST_CASE("compressed all-gather: NaN or Inf in one block is reported on every rank, never made finite",
          "[compressed]") {
  for (const char* spec : {"q8:bucket=64", "fp16", "bf16", "none"})
    for (float bad : {NAN, INFINITY}) {
      Job job;
      job.codec = kernels::parse_codec_spec(spec), job.n = 3, job.count = 640;
      auto in = make_inputs(job, 4);
      store(job.dtype, in[1].data(), 100, bad);
      INFO(describe(job) << " input " << bad);
      const Result res = run(job, in);
      for (int r = 0; r < job.n; ++r) {
        CHECK(res.sim.ops[r]->stats().nonfinite == res.sim.ops[0]->stats().nonfinite);
        CHECK(res.sim.ops[r]->stats().nonfinite > 0);
        CHECK_FALSE(std::isfinite(load(job.dtype, res.out[r].data(), job.count + 100)));
        CHECK(std::isfinite(load(job.dtype, res.out[r].data(), job.count + 600)));
      }
    }
}

}  // namespace qccl::test
