// The compressed all-reduce algorithms (ring with per-hop re-encoding, and scatter-reduce-allgather)
// run by the real executor on a simulated network: results within each algorithm's proven error
// bound, identical bits on every rank, the same bits for every chunk size and pipeline depth, wire
// bytes equal to the closed form written out here, error feedback that telescopes, and NaN/Inf reported, never hidden.
#include <catch2/catch.hpp>

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

const char* const kAlgorithms[] = {"ring_compressed", "sra_compressed"};

struct Job {
  int n = 2;
  size_t count = 1000;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  kernels::CodecConfig codec;
  std::string algorithm = "sra_compressed";
  size_t chunk_bytes = 4096;
  int depth = 2;
  uint64_t step = 0;
  bool error_feedback = false;
};

struct Result {
  std::vector<std::vector<uint8_t>> out;  // per rank, in the job's datatype
  std::vector<double> exact;              // the double-precision reduction of the (rounded) inputs
  SimRun sim;
};

// Every rank's inputs (uniform in [-1, 1] from a fixed seed), rounded to the datatype.
std::vector<std::vector<uint8_t>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<uint8_t>> in(job.n, std::vector<uint8_t>(job.count * kernels::element_size(job.dtype)));
  for (auto& b : in)
    for (size_t i = 0; i < job.count; ++i) store(job.dtype, b.data(), i, uniform(rng));
  return in;
}

Result run(const Job& job, const std::vector<std::vector<uint8_t>>& in, std::vector<std::vector<float>>* residuals = nullptr) {
  Result res;
  const size_t es = kernels::element_size(job.dtype);
  res.out.assign(job.n, std::vector<uint8_t>(job.count * es, 0xee));
  res.exact.assign(job.count, 0.0);
  std::vector<CollArgs> args(job.n);
  std::vector<coll::QuantizedCall> calls(job.n);  // the method's calls: their residuals
  for (int r = 0; r < job.n; ++r) {
    for (size_t i = 0; i < job.count; ++i) res.exact[i] += load(job.dtype, in[r].data(), i);
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = job.count, a.dtype = job.dtype, a.op = job.op;
    a.rank = r, a.nranks = job.n, a.sendbuf = in[r].data(), a.recvbuf = res.out[r].data();
    a.codec = &job.codec;
    a.rng = kernels::PhiloxKey{job.codec.seed, job.step, static_cast<uint32_t>(r), 0};
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  if (job.op == RedOp::kAvg)
    for (double& e : res.exact) e /= job.n;
  res.sim = run_on_sim(args, job.algorithm, job.chunk_bytes, job.depth);
  return res;
}

// The proven bound on |result - exact| for inputs in [-1, 1] (quant.h, and each algorithm's header):
// nearest rounding errs by at most half a bucket step per encode, stochastic by less than one step.
// SRA encodes n-1 contributions (range <= 2) and the owner's sum (range <= 2n) once each; the ring
// re-encodes partial sums of h+1 inputs (range <= 2(h+1)) at hops h = 0 .. n-1. Casts err by half an
// ulp of what they encode; a float16/bfloat16 output rounds once more.
double error_bound(const Job& job) {
  const kernels::CodecConfig& c = job.codec;
  double per_unit_range = 0;  // error of one encode per unit of its input range
  double relative = 0;        // error of one encode relative to the encoded magnitude
  switch (c.kind) {
    case kernels::CodecKind::kNone: break;
    case kernels::CodecKind::kFp16: relative = 0x1p-11; break;
    case kernels::CodecKind::kBf16: relative = 0x1p-8; break;
    case kernels::CodecKind::kQuant:
      per_unit_range = (c.rounding == kernels::Rounding::kStochastic ? 1.0 : 0.5) / ((1u << c.bits) - 1);
      break;
    case kernels::CodecKind::kSign:
      FAIL("the sign codec runs Marsit (allreduce_marsit_test.cc)");
      break;
    case kernels::CodecKind::kInt:
      FAIL("the int codecs run IntSGD (allreduce_intsgd_test.cc)");
      break;
    case kernels::CodecKind::kFft:
      FAIL("the fft codec runs FFT sparsification (allreduce_fft_test.cc)");
      break;
    case kernels::CodecKind::kAq:
      FAIL("the aq codecs are point-to-point (sendrecv_compressed)");
      break;
  }
  const int n = job.n;
  double ranges = 0, magnitudes = 0;  // sums over the encodes an element goes through
  if (job.algorithm == "sra_compressed") {
    ranges = 2.0 * (n - 1) + 2.0 * n;
    magnitudes = (n - 1) + n;
  } else {
    for (int h = 0; h < n; ++h) ranges += 2.0 * (h + 1), magnitudes += h + 1;
  }
  double bound = per_unit_range * ranges * 1.0001 + relative * magnitudes + 1e-5 * n;  // + float32 sums
  if (job.dtype == DataType::kFloat16) bound += n * 0x1p-11;
  if (job.dtype == DataType::kBfloat16) bound += n * 0x1p-8;
  return job.op == RedOp::kAvg ? bound / n + 1e-6 : bound;
}

std::vector<kernels::CodecConfig> all_codecs() {
  std::vector<kernels::CodecConfig> out;
  for (const char* spec : {"none", "fp16", "bf16"}) out.push_back(kernels::parse_codec_spec(spec));
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* round : {"nearest", "stochastic"})
      out.push_back(kernels::parse_codec_spec("q" + std::to_string(bits) + ":bucket=64,round=" + round + ",seed=3"));
  return out;
}

// Bytes of one encoded run of m values, written out from the codec's format (kernels/quant.h): a q
// codec sends every bucket's float minimum and maximum, then the codes packed 8 values to `bits`
// bytes; fp16 and bf16 send 2 bytes per value, none 4.
uint64_t encoded_bytes(const kernels::CodecConfig& codec, size_t m) {
  switch (codec.kind) {
    case kernels::CodecKind::kNone: return 4 * m;
    case kernels::CodecKind::kFp16:
    case kernels::CodecKind::kBf16: return 2 * m;
    case kernels::CodecKind::kQuant:
      return 8 * ((m + codec.bucket - 1) / codec.bucket) + (m + 7) / 8 * static_cast<uint64_t>(codec.bits);
    default: FAIL("not a value codec: " << codec.canonical());
  }
  return 0;
}

// Bytes rank r sends, with `bytes` the size of one segment's message (encoded or raw). count is split
// into n segments, the first count % n one element longer. The ring re-encodes as it reduces: the
// reduce-scatter sends every segment but the rank's own, the allgather forwards every segment but its
// successor's. SRA sends its contribution to every other segment's owner, then its own segment's sum
// to each of the n-1 others. Together, both send every segment 2(n-1) times.
template <class Bytes>
uint64_t closed_form_bytes(const Job& job, int r, Bytes bytes) {
  const int n = job.n;
  auto segment = [&](int i) { return bytes(job.count / n + (static_cast<size_t>(i) < job.count % n ? 1 : 0)); };
  uint64_t all = 0;
  for (int i = 0; i < n; ++i) all += segment(i);
  if (job.algorithm == "ring_compressed") return 2 * all - segment(r) - segment((r + 1) % n);
  return all - segment(r) + static_cast<uint64_t>(n - 1) * segment(r);
}

std::string describe(const Job& job) {
  return job.algorithm + " n=" + std::to_string(job.n) + " count=" + std::to_string(job.count) + " " +
         kernels::data_type_name(job.dtype) + " " + kernels::red_op_name(job.op) + " " + job.codec.canonical() +
         " chunk=" + std::to_string(job.chunk_bytes) + " depth=" + std::to_string(job.depth);
}

}  // namespace

TEST_CASE("compressed all-reduce: within the proven bound, identical bits on every rank, closed-form bytes",
          "[compressed]") {
  for (const char* algorithm : kAlgorithms)
    for (const kernels::CodecConfig& codec : all_codecs())
      for (int n : {2, 3, 5, 8})
        for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
          for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
            Job job;
            job.algorithm = algorithm, job.codec = codec, job.n = n, job.dtype = dtype, job.op = op;
            job.count = 997 + static_cast<size_t>(n);  // not a multiple of n, the bucket or the chunk
            INFO(describe(job));
            const auto in = make_inputs(job, 11 + n);
            const Result res = run(job, in);
            double worst = 0;
            for (size_t i = 0; i < job.count; ++i)
              worst = std::max(worst, std::fabs(load(dtype, res.out[0].data(), i) - res.exact[i]));
            CHECK(worst <= error_bound(job));
            for (int r = 1; r < n; ++r) CHECK(res.out[r] == res.out[0]);
            const size_t es = kernels::element_size(dtype);
            uint64_t total = 0, segments_encoded = 0;
            for (int i = 0; i < n; ++i)
              segments_encoded += encoded_bytes(codec, job.count / n + (static_cast<size_t>(i) < job.count % n ? 1 : 0));
            for (int r = 0; r < n; ++r) {
              CHECK(res.sim.ops[r]->stats().bytes_sent == res.sim.plan_bytes[r]);
              CHECK(res.sim.plan_bytes[r] ==
                    closed_form_bytes(job, r, [&](size_t m) { return encoded_bytes(codec, m); }));
              CHECK(res.sim.raw_bytes[r] == closed_form_bytes(job, r, [&](size_t m) { return uint64_t{m * es}; }));
              total += res.sim.ops[r]->stats().bytes_sent;
              CHECK(res.sim.ops[r]->stats().nonfinite == 0);
              if (codec.kind == kernels::CodecKind::kQuant) CHECK(res.sim.plan_bytes[r] < res.sim.raw_bytes[r]);
            }
            CHECK(total == 2ull * (n - 1) * segments_encoded);
          }
}

TEST_CASE("compressed all-reduce: the same bits for every chunk size and pipeline depth", "[compressed]") {
  for (const char* algorithm : kAlgorithms)
    for (const char* spec : {"q4:bucket=64,round=stochastic,seed=9", "q8:bucket=128", "q1:bucket=64", "fp16", "bf16"}) {
      Job base;
      base.algorithm = algorithm, base.codec = kernels::parse_codec_spec(spec), base.n = 4, base.count = 5000;
      base.chunk_bytes = 1 << 20, base.depth = 1;
      const auto in = make_inputs(base, 5);
      const Result reference = run(base, in);
      for (size_t chunk : {size_t{256}, size_t{1000}, size_t{2048}})
        for (int depth : {1, 2, 5}) {
          Job job = base;
          job.chunk_bytes = chunk, job.depth = depth;
          INFO(describe(job));
          const Result res = run(job, in);
          for (int r = 0; r < job.n; ++r) CHECK(res.out[r] == reference.out[0]);
        }
    }
}

TEST_CASE("compressed chunks: a chunk encoding to under an eighth of its input grows to the fewest buckets that "
          "encode to min_message_bytes, where every message is encoded",
          "[compressed]") {
  CHECK(coll::min_message_bytes(256 * 1024) == 32 * 1024);  // the default chunk: an eighth
  CHECK(coll::min_message_bytes(4096) == 512);
  CHECK(coll::min_message_bytes(4 << 20) == 32 * 1024);  // at most 32 KiB
  const size_t run = size_t{1} << 24;
  for (size_t chunk_bytes : {size_t{4096}, size_t{60 * 1024}, size_t{256 * 1024}, size_t{1} << 20})
    for (const char* spec : {"q8", "q4", "q3", "q2", "q1", "q1:bucket=64", "q2:bucket=4096", "fp16", "none"})
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16}) {
        const kernels::CodecConfig codec = kernels::parse_codec_spec(spec);
        CollArgs args;
        args.kind = CollKind::kAllReduce, args.dtype = dtype, args.codec = &codec;
        INFO(spec << " on " << kernels::data_type_name(dtype) << ", chunk " << chunk_bytes << " bytes");
        const size_t align = codec.alignment(), least = coll::min_message_bytes(chunk_bytes);
        const size_t input = std::max(align, chunk_bytes / args.element_size() / align * align);
        const size_t chunk = coll::compressed_chunk(args, chunk_bytes, run);
        CHECK(chunk % align == 0);
        // Plans that also send raw values, and calls with exact segments, keep chunk_bytes of input.
        CHECK(coll::compressed_chunk(args, chunk_bytes, run, /*raw_messages=*/true) == input);
        const std::vector<coll::Segment> segments = {{0, run / 2, false}, {run / 2, run - run / 2, true}};
        args.segments = &segments;
        CHECK(coll::compressed_chunk(args, chunk_bytes, run) == input);
        const std::vector<coll::Segment> encoded = {{0, run / 2, false}, {run / 2, run - run / 2, false}};
        args.segments = &encoded;  // segments none of them exact: as without
        CHECK(coll::compressed_chunk(args, chunk_bytes, run) == chunk);
        args.segments = nullptr;
        if (codec.encoded_bytes(input) >= least) {
          CHECK(chunk == input);  // an encoding of an eighth of the input or more: chunk_bytes of input
        } else {
          CHECK(codec.encoded_bytes(chunk) >= least);  // the fewest buckets that reach it
          CHECK(codec.encoded_bytes(chunk - align) < least);
          CHECK(codec.encoded_bytes(chunk) <= chunk_bytes);  // the chunk still bounds the message
        }
        CHECK(coll::compressed_chunk(args, chunk_bytes, 100) ==
              (100 + align - 1) / align * align);  // the run bounds it
      }
  // At the default chunk: whole buckets, codes and headers, of 32 KiB (q1's 512-value bucket is 72 bytes, 456 of
  // them: 3.6x q4's 64 Ki values; q2's 136, 241 of them: 1.9x).
  for (const char* spec : {"q1", "q2"}) {
    const kernels::CodecConfig codec = kernels::parse_codec_spec(spec);
    CollArgs args;
    args.kind = CollKind::kAllReduce, args.dtype = DataType::kFloat32, args.codec = &codec;
    const size_t bucket = codec.alignment(), per_bucket = codec.encoded_bytes(bucket);
    CHECK(coll::compressed_chunk(args, 256 * 1024, run) == (32 * 1024 + per_bucket - 1) / per_bucket * bucket);
  }
}

TEST_CASE("compressed all-reduce: wire bytes are 2(n-1)/n * E(S) when segments are whole buckets", "[compressed]") {
  for (const char* algorithm : kAlgorithms)
    for (int n : {2, 4, 8}) {
      Job job;
      job.algorithm = algorithm, job.codec = kernels::parse_codec_spec("q2:bucket=512"), job.n = n;
      job.count = 512 * 8 * 3;  // every segment a whole number of buckets
      job.chunk_bytes = 2048;   // 512 values, grown to min_message_bytes: 2 buckets, 2-6 chunks a segment
      const Result res = run(job, make_inputs(job, 1));
      const size_t segment = job.count / n;
      const uint64_t encoded = 8 * (segment / 512) + segment / 8 * 2;  // metas + 2-bit codes
      for (int r = 0; r < n; ++r) CHECK(res.sim.ops[r]->stats().bytes_sent == 2 * (n - 1) * encoded);
    }
}

TEST_CASE("compressed all-reduce: stochastic rounding is keyed by the step", "[compressed]") {
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

TEST_CASE("error feedback: inputs minus results telescope to the residuals, and stop nearest-rounding drift",
          "[compressed]") {
  for (const char* algorithm : kAlgorithms) {
    Job job;
    job.algorithm = algorithm, job.n = 4, job.count = 256, job.op = RedOp::kAvg;
    job.codec = kernels::parse_codec_spec("q2:bucket=64,ef=on");
    // Inputs constant over steps: nearest rounding then errs the same way every step, so without
    // error feedback the sum of the results drifts away from the sum of the inputs linearly.
    std::vector<std::vector<uint8_t>> in(job.n, std::vector<uint8_t>(job.count * 4));
    for (int r = 0; r < job.n; ++r)
      for (size_t i = 0; i < job.count; ++i) store(job.dtype, in[r].data(), i, std::sin(0.37 * i + r));
    std::vector<std::vector<float>> residual(job.n, std::vector<float>(job.count, 0.0f));
    const int steps = 50;
    std::vector<double> sum_results(job.count, 0.0), sum_plain(job.count, 0.0), exact(job.count, 0.0);
    Job plain = job;
    plain.codec = kernels::parse_codec_spec("q2:bucket=64");
    for (int t = 0; t < steps; ++t) {
      const Result with = run(job, in, &residual);
      const Result without = run(plain, in);
      for (size_t i = 0; i < job.count; ++i) {
        sum_results[i] += load(job.dtype, with.out[0].data(), i);
        sum_plain[i] += load(job.dtype, without.out[0].data(), i);
        exact[i] += with.exact[i];
      }
    }
    INFO(algorithm);
    double drift_with = 0, drift_without = 0, telescope = 0;
    for (size_t i = 0; i < job.count; ++i) {
      // The residuals hold what every rank's contributions have not yet delivered, in sum units.
      double pending = 0;
      for (int r = 0; r < job.n; ++r) pending += residual[r][i];
      telescope = std::max(telescope, std::fabs(exact[i] - sum_results[i] - pending / job.n));
      drift_with = std::max(drift_with, std::fabs(exact[i] - sum_results[i]));
      drift_without = std::max(drift_without, std::fabs(exact[i] - sum_plain[i]));
    }
    CHECK(telescope <= 1e-4 * steps);  // float32 rounding of the accumulators only
    // With error feedback the drift stays within what the residuals can hold (a few bucket steps,
    // range 2n / 3 levels for 2-bit codes); without it, it grows with the number of steps.
    CHECK(drift_with <= 2.0 * job.n / 3.0);
    CHECK(drift_without > 2 * drift_with);
  }
}

// What NaN and Inf become (include/qccl.h, qcclNonFinite). The casts (none, fp16, bf16) carry them
// as an uncompressed float sum would: +Inf stays +Inf, -Inf stays -Inf, +Inf meeting -Inf or NaN is
// NaN, and no other output is touched. The q codecs cannot carry them: every value of the bucket
// that held one decodes to NaN, and no other bucket is touched. Every rank counts the same non-finite
// outputs (the call's qcclNonFinite), and none is ever finite garbage.
TEST_CASE("NaN or Inf in one rank's input: the casts carry it, q codecs make its bucket NaN, every rank counts it",
          "[compressed]") {
  struct Bad {
    const char* name;
    float rank1, rank2;  // the inputs at index 100 of ranks 1 and 2 (NaN on rank 2: left as it was)
    float cast_result;   // what the casts give there (NaN: a NaN)
  };
  const Bad bads[] = {{"+Inf", INFINITY, NAN, INFINITY},
                      {"-Inf", -INFINITY, NAN, -INFINITY},
                      {"NaN", NAN, NAN, NAN},
                      {"+Inf and -Inf", INFINITY, -INFINITY, NAN}};
  constexpr size_t kAt = 100, kBucket = 64;
  for (const char* algorithm : kAlgorithms)
    for (const char* spec : {"none", "fp16", "bf16", "q8:bucket=64", "q3:bucket=64,round=stochastic"})
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
        for (const Bad& bad : bads) {
          Job job;
          job.algorithm = algorithm, job.codec = kernels::parse_codec_spec(spec), job.n = 3, job.count = 640;
          job.dtype = dtype;
          auto in = make_inputs(job, 4);
          store(job.dtype, in[1].data(), kAt, bad.rank1);
          if (!std::isnan(bad.rank2)) store(job.dtype, in[2].data(), kAt, bad.rank2);
          INFO(describe(job) << " input " << bad.name);
          const Result res = run(job, in);
          const bool cast = job.codec.kind != kernels::CodecKind::kQuant;
          const size_t first = cast ? kAt : kAt / kBucket * kBucket, last = cast ? kAt + 1 : first + kBucket;
          for (int r = 0; r < job.n; ++r) {
            INFO("rank " << r);
            CHECK(res.sim.ops[r]->stats().nonfinite == last - first);
            for (size_t i = 0; i < job.count; ++i) {
              const double v = load(job.dtype, res.out[r].data(), i);
              if (i < first || i >= last) {
                if (!std::isfinite(v)) FAIL_CHECK("output " << i << " is " << v);
              } else if (!cast || std::isnan(bad.cast_result)) {
                if (!std::isnan(v)) FAIL_CHECK("output " << i << " is " << v << ", not NaN");
              } else {
                CHECK(v == bad.cast_result);
              }
            }
          }
        }
}

TEST_CASE("fp16: an input or a sum of 65520 or more becomes Inf, counted like an Inf input", "[compressed]") {
  // 70000 on one rank, and 40000 on two whose sum (80000) is what overflows: both +-Inf everywhere.
  for (const char* algorithm : kAlgorithms)
    for (float sign : {1.0f, -1.0f})
      for (bool sum : {false, true}) {
        Job job;
        job.algorithm = algorithm, job.codec = kernels::parse_codec_spec("fp16"), job.n = 3, job.count = 640;
        auto in = make_inputs(job, 5);
        store(job.dtype, in[1].data(), 100, sign * (sum ? 40000.0f : 70000.0f));
        if (sum) store(job.dtype, in[2].data(), 100, sign * 40000.0f);
        INFO(describe(job) << (sum ? " sum " : " input ") << sign * (sum ? 80000 : 70000));
        const Result res = run(job, in);
        for (int r = 0; r < job.n; ++r) {
          CHECK(res.sim.ops[r]->stats().nonfinite == 1);
          CHECK(load(job.dtype, res.out[r].data(), 100) == sign * INFINITY);
        }
      }
}

}  // namespace qccl::test
