// The FFT-sparsified all-reduce (collectives/allreduce_fft_allgather.cc) run by the real executor on a
// simulated network, against shared/specs/fftsparse.md §4: every rank's output bitwise identical and
// equal to the single-process reference, every rank's payloads decoded and added in rank order (P13,
// compared by this harness); payloads of every length from a header alone to the capacity (P14);
// wire bytes equal to (n - 1) times the payloads the reference encodes; error feedback conserved
// per step and over steps, everything-dropped included (P15); NaN or Inf reported on every rank,
// confined to its segment and leaving the residual alone; float16 / bfloat16, avg, in place, depths,
// fragments of one segment, several, or the whole call.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/fft.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/fft_sparse.h"
#include "kernels/types.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using kernels::DataType;
using kernels::RedOp;

struct Job {
  int n = 3;
  size_t count = 1000;
  std::string spec = "fft:theta=0.7,bits=12,mant=6,max=32,segment=256,fallback=off";
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int depth = 2;
  bool in_place = false;
  size_t chunk_bytes = 4096;  // four 256-value segments to a fragment
};

// Rank r's input: zeros (r % 3 == 0: header-only payloads), a smooth signal (few bins), or noise
// (all K bins), representable in the datatype.
std::vector<std::vector<float>> make_inputs(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.3);
  std::vector<std::vector<float>> in(job.n, std::vector<float>(job.count, 0.0f));
  for (int r = 0; r < job.n; ++r) {
    for (size_t i = 0; i < job.count; ++i) {
      if (r % 3 == 1) in[r][i] = static_cast<float>(std::sin(0.02 * double(i) + r) + 0.3 * std::cos(0.1 * double(i)));
      if (r % 3 == 2) in[r][i] = static_cast<float>(normal(rng));
    }
    std::vector<std::byte> typed(job.count * kernels::element_size(job.dtype));
    kernels::store_float(job.dtype, in[r].data(), typed.data(), job.count);
    kernels::load_float(job.dtype, typed.data(), in[r].data(), job.count);
  }
  return in;
}

struct Result {
  std::vector<std::vector<std::byte>> out;  // per rank, the output in the call's datatype
  SimRun sim;
};

Result run(const Job& job, const kernels::CodecConfig& codec, const std::vector<std::vector<float>>& in,
           std::vector<std::vector<float>>* residuals = nullptr) {
  const size_t es = kernels::element_size(job.dtype);
  Result res;
  std::vector<std::vector<std::byte>> send(job.n);
  res.out.assign(job.n, std::vector<std::byte>(job.count * es, std::byte{0xEE}));
  std::vector<CollArgs> args(job.n);
  std::vector<coll::FftCall> calls(job.n);
  for (int r = 0; r < job.n; ++r) {
    send[r].resize(job.count * es);
    kernels::store_float(job.dtype, in[r].data(), send[r].data(), job.count);
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = job.count, a.dtype = job.dtype, a.op = job.op;
    a.rank = r, a.nranks = job.n;
    a.sendbuf = send[r].data();
    a.recvbuf = job.in_place ? send[r].data() : res.out[r].data();
    a.codec = &codec;
    if (residuals) calls[r].residual = (*residuals)[r].data();
    a.method_call = &calls[r];
  }
  res.sim = run_on_sim(args, "fft_allgather", job.chunk_bytes, job.depth);
  if (job.in_place)
    for (int r = 0; r < job.n; ++r) res.out[r] = send[r];
  return res;
}

// The single-process reference (P13): each rank's contribution (its input plus its residual)
// encoded, every payload's bins added in rank order, one inverse transform (the codec's functions,
// tested on their own in fft_codec_test), divided for an average, rounded to the datatype. Also each
// rank's payload bytes.
struct Reference {
  std::vector<std::byte> out;
  std::vector<size_t> bytes;
};
Reference reference(const Job& job, const kernels::CodecConfig& codec, const std::vector<std::vector<float>>& in,
                    const std::vector<std::vector<float>>* residuals = nullptr) {
  Reference ref;
  std::vector<float> sum(job.count), contribution(job.count), spectrum(kernels::fft_spectrum_floats(codec, job.count));
  std::vector<uint8_t> wire(codec.encoded_bytes(job.count));
  auto ws = kernels::take_fft_workspace();
  for (int r = 0; r < job.n; ++r) {
    for (size_t i = 0; i < job.count; ++i) contribution[i] = in[r][i] + (residuals ? (*residuals)[r][i] : 0.0f);
    const size_t bytes = kernels::encode(codec, contribution.data(), job.count, wire.data(), kernels::PhiloxKey{}, 0).bytes;
    ref.bytes.push_back(bytes);
    kernels::fft_decode_spectrum(codec, wire.data(), bytes, job.count, spectrum.data(), r > 0, *ws);
  }
  kernels::fft_synthesize(codec, spectrum.data(), job.count, sum.data(), *ws);
  if (job.op == RedOp::kAvg) kernels::divide_float(sum.data(), job.count, static_cast<float>(job.n));
  ref.out.resize(job.count * kernels::element_size(job.dtype));
  kernels::store_float(job.dtype, sum.data(), ref.out.data(), job.count);
  return ref;
}

}  // namespace

TEST_CASE("fft all-reduce: every rank holds the single-process reference's bits (P13, P14), wire bytes", "[fft]") {
  for (int n : {2, 3, 5})
    for (size_t count : {size_t{1}, size_t{255}, size_t{999}, size_t{3 * 256 + 17}, size_t{2600}})
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
        for (RedOp op : {RedOp::kSum, RedOp::kAvg})
          for (bool in_place : {false, true}) {
            Job job;
            job.n = n, job.count = count, job.dtype = dtype, job.op = op, job.in_place = in_place;
            job.depth = 1 + static_cast<int>(count % 3);
            // A segment to a fragment, four, or the whole call (a fragment ends at a segment's end,
            // so the bits cannot depend on it); 2600 values make several fragments of each kind.
            const size_t chunks[] = {1024, 4096, size_t{1} << 20};
            job.chunk_bytes = chunks[(static_cast<size_t>(n) + count + (in_place ? 1 : 0)) % 3];
            const kernels::CodecConfig codec = kernels::parse_codec_spec(job.spec);
            INFO("n=" << n << " count=" << count << " " << kernels::data_type_name(dtype) << (op == RedOp::kAvg ? " avg" : " sum")
                      << (in_place ? " in place" : "") << " depth=" << job.depth << " chunk=" << job.chunk_bytes);
            const auto in = make_inputs(job, 40 + count);
            const Result res = run(job, codec, in);
            const Reference ref = reference(job, codec, in);
            for (int r = 0; r < n; ++r) {
              CHECK(res.out[r] == ref.out);
              const uint64_t sent = static_cast<uint64_t>(n - 1) * ref.bytes[r];
              CHECK(res.sim.ops[r]->stats().bytes_sent == sent);
              CHECK(res.sim.plan_bytes[r] >= sent);  // the capacity
              CHECK(res.sim.raw_bytes[r] == static_cast<uint64_t>(n - 1) * count * kernels::element_size(dtype));
              CHECK(res.sim.ops[r]->stats().nonfinite == 0);
            }
            // Zeros send headers alone (16 bytes a segment); the other inputs have no bin below the
            // range's smallest magnitude (2^-27 here), so they fill the capacity: K bins a segment.
            for (int r = 0; r < n; ++r) CHECK(ref.bytes[r] == (r % 3 == 0 ? 16 * ((count + 255) / 256) : codec.encoded_bytes(count)));
          }
}

TEST_CASE("fft all-reduce: the error is what the codec drops, within the bound of selection (P3 summed)", "[fft]") {
  // With truncation each payload decodes to a projection no longer than its input (P16), within
  // sqrt(theta_eff + quantization) of it; the sum's error is at most the sum of the ranks' errors.
  Job job;
  job.n = 4, job.count = 4096, job.spec = "fft:theta=0.9,bits=14,mant=9,max=64,segment=1024,fallback=off";
  const kernels::CodecConfig codec = kernels::parse_codec_spec(job.spec);
  const auto in = make_inputs(job, 5);
  const Result res = run(job, codec, in);
  std::vector<float> out(job.count);
  kernels::load_float(job.dtype, res.out[0].data(), out.data(), job.count);
  double error = 0, bound = 0;
  std::vector<float> decoded(job.count);
  std::vector<uint8_t> wire(codec.encoded_bytes(job.count));
  for (int r = 0; r < job.n; ++r) {
    kernels::encode(codec, in[r].data(), job.count, wire.data(), kernels::PhiloxKey{}, 0);
    kernels::decode(codec, wire.data(), job.count, decoded.data());
    double e = 0, x = 0;
    for (size_t i = 0; i < job.count; ++i) e += std::pow(double(in[r][i]) - decoded[i], 2), x += double(in[r][i]) * in[r][i];
    bound += std::sqrt(e);
    CHECK(std::sqrt(e) <= std::sqrt(0.9 + std::ldexp(1.0, -18)) * std::sqrt(x) * (1 + 1e-5) + 1e-6);
  }
  for (size_t i = 0; i < job.count; ++i) {
    double exact = 0;
    for (int r = 0; r < job.n; ++r) exact += in[r][i];
    error += std::pow(out[i] - exact, 2);
  }
  CHECK(std::sqrt(error) <= bound * (1 + 1e-5) + 1e-5);
  CHECK(std::sqrt(error) > 0.01);  // theta = 0.9 on noise: the error is real, the test can fail
}

TEST_CASE("fft all-reduce: error feedback conserves what was given, per step and over steps (P15)", "[fft]") {
  Job job;
  job.n = 3, job.count = 700, job.spec = "fft:theta=0.9,bits=10,mant=6,max=32,segment=256,ef=on,fallback=off";
  const kernels::CodecConfig codec = kernels::parse_codec_spec(job.spec);
  std::vector<std::vector<float>> residuals(job.n, std::vector<float>(job.count, 0.0f));
  std::vector<double> given(job.count, 0.0), got(job.count, 0.0);
  for (int t = 0; t < 4; ++t) {
    const auto in = make_inputs(job, 200 + t);
    const auto before = residuals;
    const Reference ref = reference(job, codec, in, &before);
    const Result res = run(job, codec, in, &residuals);
    std::vector<float> out(job.count), decoded(job.count), contribution(job.count);
    std::vector<uint8_t> wire(codec.encoded_bytes(job.count));
    for (int r = 0; r < job.n; ++r) CHECK(res.out[r] == ref.out);
    kernels::load_float(job.dtype, res.out[0].data(), out.data(), job.count);
    for (int r = 0; r < job.n; ++r) {
      // Per step: r_new = (g + r_old) - decode(encode(g + r_old)), bit for bit.
      for (size_t i = 0; i < job.count; ++i) contribution[i] = in[r][i] + before[r][i];
      kernels::encode(codec, contribution.data(), job.count, wire.data(), kernels::PhiloxKey{}, 0);
      kernels::decode(codec, wire.data(), job.count, decoded.data());
      size_t wrong = 0;
      for (size_t i = 0; i < job.count; ++i) wrong += residuals[r][i] != contribution[i] - decoded[i];
      CHECK(wrong == 0);
      for (size_t i = 0; i < job.count; ++i) given[i] += in[r][i];
    }
    for (size_t i = 0; i < job.count; ++i) got[i] += out[i];
  }
  // Over steps: the outputs plus the final residuals are what was given, up to float32 rounding.
  size_t over = 0;
  for (size_t i = 0; i < job.count; ++i) {
    double held = 0;
    for (int r = 0; r < job.n; ++r) held += residuals[r][i];
    over += !(std::fabs(got[i] + held - given[i]) <= 4 * job.n * 8 * 0x1p-22);
  }
  CHECK(over == 0);

  // Everything below the range's smallest magnitude: nothing is sent and the residual accumulates
  // every input exactly.
  Job tiny = job;
  tiny.n = 2;
  std::vector<std::vector<float>> r2(tiny.n, std::vector<float>(tiny.count, 0.0f)), sums = r2;
  for (int t = 0; t < 3; ++t) {
    std::vector<std::vector<float>> in(tiny.n, std::vector<float>(tiny.count));
    for (int r = 0; r < tiny.n; ++r)
      for (size_t i = 0; i < tiny.count; ++i) in[r][i] = 1e-12f * static_cast<float>((i + r + t) % 5);
    const Result res = run(tiny, codec, in, &r2);
    for (int r = 0; r < tiny.n; ++r) {
      for (size_t i = 0; i < tiny.count; ++i) sums[r][i] = in[r][i] + sums[r][i];
      CHECK(r2[r] == sums[r]);
      CHECK(res.sim.ops[r]->stats().bytes_sent == 16 * 3);  // three header-only segments
      std::vector<float> out(tiny.count);
      kernels::load_float(tiny.dtype, res.out[r].data(), out.data(), tiny.count);
      CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
    }
  }
}

TEST_CASE("fft all-reduce: NaN or Inf on one rank poisons its segment on every rank, reported, residual kept",
          "[fft]") {
  Job job;
  job.n = 3, job.count = 600, job.spec = "fft:theta=0.5,segment=256,max=32,ef=on,fallback=off";
  const kernels::CodecConfig codec = kernels::parse_codec_spec(job.spec);
  auto in = make_inputs(job, 9);
  in[1][300] = std::numeric_limits<float>::infinity();  // rank 1, segment 1 (256 .. 511)
  std::vector<std::vector<float>> residuals(job.n, std::vector<float>(job.count, 0.5f));
  const Result res = run(job, codec, in, &residuals);
  for (int r = 0; r < job.n; ++r) {
    std::vector<float> out(job.count);
    kernels::load_float(job.dtype, res.out[r].data(), out.data(), job.count);
    size_t wrong = 0;
    for (size_t i = 0; i < job.count; ++i) wrong += std::isnan(out[i]) != (i >= 256 && i < 512);
    CHECK(wrong == 0);
    CHECK(res.sim.ops[r]->stats().nonfinite == 256);
  }
  // Every rank's residual is as it was over the poisoned segment (spec §5.4: the step's outputs there
  // carry no contribution, so none is taken from a residual), and updated elsewhere: rank 1's own
  // encode left it, and the others' encodes, which saw finite values, had it taken back.
  for (int r = 0; r < job.n; ++r) {
    INFO("rank " << r);
    size_t kept = 0, not_updated = 0;
    for (size_t i = 0; i < job.count; ++i) (i >= 256 && i < 512 ? kept : not_updated) += residuals[r][i] == 0.5f;
    CHECK(kept == 256);
    CHECK(not_updated == 0);
  }
}

TEST_CASE("fft all-reduce: where the payloads could outweigh the dense ring, the ring runs (fallback=auto)", "[fft]") {
  const coll::Algorithm* sparse = coll::find_algorithm(CollKind::kAllReduce, "fft_allgather");
  const coll::Algorithm* dense = coll::find_algorithm(CollKind::kAllReduce, "fft_dense_ring");
  REQUIRE(sparse);
  REQUIRE(dense);
  // theta = 0.9 at 10 bits: a segment of 65536 values has at most 16 + 4097 + 8193 bytes, so n
  // ranks' payloads, n x 12306, stay below the ring's 2 x 262144 up to n = 42.
  const kernels::CodecConfig fft = kernels::parse_codec_spec("fft:theta=0.9,bits=10");
  const kernels::CodecConfig off = kernels::parse_codec_spec("fft:theta=0.9,bits=10,fallback=off");
  // Nearly every bin at 16 bits: about 2 bytes a value, never fewer than float16's ring moves (theta =
  // 0 itself always runs the ring: the test below).
  const kernels::CodecConfig wide = kernels::parse_codec_spec("fft:theta=0.001,bits=16,mant=12");
  coll::FftCall no_state, with_state;
  std::vector<float> residual(65536);
  with_state.residual = residual.data();
  CollArgs a;
  a.kind = CollKind::kAllReduce, a.count = 65536, a.dtype = DataType::kFloat32, a.op = RedOp::kSum;
  a.method_call = &no_state;
  struct Case {
    const kernels::CodecConfig* codec;
    int n;
    DataType dtype;
    const coll::FftCall* call;
    bool sparse_runs;
  };
  const DataType f32 = DataType::kFloat32, f16 = DataType::kFloat16;
  for (const Case& c : {Case{&fft, 42, f32, &no_state, true}, Case{&fft, 43, f32, &no_state, false},
                        Case{&off, 43, f32, &no_state, true}, Case{&wide, 3, f32, &no_state, true},
                        Case{&wide, 4, f32, &no_state, false}, Case{&wide, 2, f16, &no_state, false},
                        Case{&wide, 2, f16, &with_state, true}}) {
    a.codec = c.codec, a.nranks = c.n, a.dtype = c.dtype, a.method_call = c.call;
    INFO(c.codec->canonical() << " n=" << c.n << (c.call->residual ? " ef" : ""));
    CHECK((sparse->cannot_run(a) == nullptr) == c.sparse_runs);
    // The ring takes any fft call without error feedback (forced by name, or after fft_allgather
    // declined: the registry's order).
    CHECK((dense->cannot_run(a) == nullptr) == (c.call->residual == nullptr));
  }
  // With the link known (QCCL_LINK_RATE), Eq. 4: theta = 0.9 at 10 bits is k = 262144 / 12306 ~ 21.3
  // on float32; at a codec cost of 5 ns a value (1.25 ns a byte) it pays below 1 / (1.25 ns (1 - 1 /
  // 21.3)) ~ 762 MB/s and not above; at 1 ns a byte or more per link byte, never; fallback=off and
  // error feedback keep it.
  coll::LinkFacts slow{125e6, 5e-9}, fast{1.25e9, 5e-9}, edge_below{755e6, 5e-9}, edge_above{770e6, 5e-9};
  a.codec = &fft, a.nranks = 4, a.dtype = f32, a.method_call = &no_state;
  a.link = &slow;
  CHECK(sparse->cannot_run(a) == nullptr);
  a.link = &edge_below;
  CHECK(sparse->cannot_run(a) == nullptr);
  a.link = &edge_above;
  CHECK_THAT(sparse->cannot_run(a), Catch::Contains("link rate"));
  a.link = &fast;
  CHECK_THAT(sparse->cannot_run(a), Catch::Contains("link rate"));
  CHECK(dense->cannot_run(a) == nullptr);
  a.codec = &off;
  CHECK(sparse->cannot_run(a) == nullptr);
  a.codec = &fft, a.method_call = &with_state;
  CHECK(sparse->cannot_run(a) == nullptr);
  a.link = nullptr, a.method_call = &no_state;

  // The dense ring is exact: small integers sum without rounding.
  Job job;
  job.n = 4, job.count = 1000, job.spec = "fft:theta=0,bits=16,mant=12";
  const kernels::CodecConfig codec = kernels::parse_codec_spec(job.spec);
  std::vector<std::vector<float>> in(job.n, std::vector<float>(job.count));
  for (int r = 0; r < job.n; ++r)
    for (size_t i = 0; i < job.count; ++i) in[r][i] = static_cast<float>((r + 1) * (i % 5));
  std::vector<CollArgs> args(job.n);
  std::vector<std::vector<float>> out(job.n, std::vector<float>(job.count));
  for (int r = 0; r < job.n; ++r) {
    args[r].kind = CollKind::kAllReduce, args[r].count = job.count, args[r].dtype = DataType::kFloat32;
    args[r].op = RedOp::kSum, args[r].rank = r, args[r].nranks = job.n, args[r].codec = &codec;
    args[r].sendbuf = in[r].data(), args[r].recvbuf = out[r].data(), args[r].method_call = &no_state;
  }
  const SimRun sim = run_on_sim(args, "fft_dense_ring", 4096, 2);
  for (int r = 0; r < job.n; ++r) {
    size_t wrong = 0;
    for (size_t i = 0; i < job.count; ++i) wrong += out[r][i] != static_cast<float>(10 * (i % 5));
    CHECK(wrong == 0);
  }
}

TEST_CASE("fft all-reduce: theta=0 is lossless: the dense ring runs it, the plain all-reduce's bits", "[fft]") {
  // theta = 0 keeps every bin, but fft_allgather's range floats would round each (10 bits: about 2^-7
  // of a value): the spec's lossless theta = 0 (fftsparse.md §1.8, §5.2) is the uncompressed ring,
  // whatever fallback says. With error feedback nothing is lost, so the residual stays as it was: the
  // outputs plus the residuals still hold every input (P15).
  const coll::Algorithm* sparse = coll::find_algorithm(CollKind::kAllReduce, "fft_allgather");
  const coll::Algorithm* dense = coll::find_algorithm(CollKind::kAllReduce, "fft_dense_ring");
  REQUIRE(sparse);
  REQUIRE(dense);
  Job job;
  job.n = 4, job.count = 1000;
  for (const char* spec : {"fft:theta=0,segment=256", "fft:theta=0,segment=256,ef=on", "fft:theta=0,segment=256,fallback=off"}) {
    INFO(spec);
    const kernels::CodecConfig codec = kernels::parse_codec_spec(spec);
    const auto in = make_inputs(job, 77);
    std::vector<std::vector<float>> residuals(job.n, std::vector<float>(job.count, 0.25f));
    const auto before = residuals;
    std::vector<std::vector<float>> out(job.n, std::vector<float>(job.count)), plain_out = out;
    std::vector<CollArgs> args(job.n), plain(job.n);
    std::vector<coll::FftCall> calls(job.n);
    for (int r = 0; r < job.n; ++r) {
      CollArgs& a = args[r];
      a.kind = CollKind::kAllReduce, a.count = job.count, a.dtype = DataType::kFloat32, a.op = RedOp::kSum;
      a.rank = r, a.nranks = job.n, a.sendbuf = in[r].data();
      plain[r] = a;
      plain[r].recvbuf = plain_out[r].data();
      a.recvbuf = out[r].data(), a.codec = &codec, a.method_call = &calls[r];
      if (codec.error_feedback) calls[r].residual = residuals[r].data();
    }
    const char* why = sparse->cannot_run(args[0]);
    REQUIRE(why != nullptr);
    CHECK_THAT(why, Catch::Contains("theta=0"));
    CHECK(dense->cannot_run(args[0]) == nullptr);
    run_on_sim(args, "fft_dense_ring", 4096, 2);
    run_on_sim(plain, "ring", 4096, 2);
    for (int r = 0; r < job.n; ++r) {
      CHECK(out[r] == plain_out[r]);
      CHECK(residuals[r] == before[r]);
      // Within float32 summation of the inputs (fft_allgather's rounding was some 2^-8 of them).
      size_t off = 0;
      for (size_t i = 0; i < job.count; ++i) {
        double sum = 0, size = 0;
        for (int q = 0; q < job.n; ++q) sum += in[q][i], size += std::fabs(in[q][i]);
        off += !(std::fabs(out[r][i] - sum) <= job.n * 0x1p-24 * size);
      }
      CHECK(off == 0);
    }
  }
}

}  // namespace qccl::test
