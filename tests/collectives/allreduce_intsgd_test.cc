// IntSGD's all-reduce (allreduce_intsgd.cc) run by the real executor on a simulated network, for 1 to
// 8 ranks and the three wire types: the decoded result is S / (n alpha) (or S / alpha) for S the exact
// integer sum of every rank's clipped Int(alpha x), computed here in int64 from the element functions;
// the same bits on every rank, for every chunk size, pipeline depth and rank order; within 1/alpha of
// the exact average (1/(2 alpha) to nearest); E||e||^2 <= d / (4 n alpha^2) with independent rank
// streams, and a correlated-stream control that this bound catches; adversarial inputs at the clip
// bound never overflow; NaN reported on every rank; the exact first round; closed-form wire bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "collectives/intsgd.h"
#include "collectives/intsgd_schedule.h"
#include "collectives/ring.h"
#include "kernels/codec.h"
#include "kernels/int_codec.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using kernels::DataType;
using kernels::RedOp;

struct Call {
  std::vector<std::vector<float>> x;  // per rank
  std::vector<std::vector<float>> out;
  kernels::CodecConfig codec;
  coll::IntsgdRound round;
  std::vector<std::shared_ptr<coll::IntsgdCall>> calls;  // per rank, with `round` set
  RedOp op = RedOp::kAvg;
  uint64_t step = 3;
  bool same_streams = false;  // every rank rounds with rank 0's key (a broken configuration)
  std::vector<int> key_rank;  // the rank whose key rank r uses (default: its own)
  std::shared_ptr<SimRun> sim;  // (shared: calls are copied to rerun the same inputs)
};

void run(Call& call, size_t chunk_bytes = 4096, int depth = 2, bool in_place = false) {
  const int n = static_cast<int>(call.x.size());
  const size_t count = call.x[0].size();
  call.out.assign(n, std::vector<float>(count, -777.0f));
  std::vector<CollArgs> args(n);
  call.calls.clear();
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = count, a.dtype = DataType::kFloat32, a.op = call.op;
    a.rank = r, a.nranks = n;
    if (in_place) call.out[r] = call.x[r];
    a.sendbuf = in_place ? call.out[r].data() : call.x[r].data();
    a.recvbuf = call.out[r].data();
    a.codec = &call.codec;
    const int key_rank = call.same_streams ? 0 : call.key_rank.empty() ? r : call.key_rank[r];
    a.rng = kernels::PhiloxKey{call.codec.seed, call.step, static_cast<uint32_t>(key_rank), 0};
    call.calls.push_back(std::make_shared<coll::IntsgdCall>(a, nullptr, 0.0));
    call.calls.back()->set_round(call.round);
    a.method_call = call.calls.back().get();
  }
  call.sim = std::make_shared<SimRun>(run_on_sim(args, "intsgd", chunk_bytes, depth));
}

// What every rank must decode: S_i = sum over ranks of the element function's integer, in int64.
std::vector<float> reference(const Call& call, std::vector<int64_t>* sums = nullptr, size_t* clipped = nullptr) {
  const int n = static_cast<int>(call.x.size());
  const size_t count = call.x[0].size();
  const kernels::IntClip clip = kernels::int_clip(call.codec.bits, n);
  const bool stochastic = call.codec.rounding == kernels::Rounding::kStochastic;
  std::vector<int64_t> s(count, 0);
  for (int r = 0; r < n; ++r) {
    const int key_rank = call.same_streams ? 0 : call.key_rank.empty() ? r : call.key_rank[r];
    const kernels::PhiloxKey key{call.codec.seed, call.step, static_cast<uint32_t>(key_rank), 0};
    for (size_t i = 0; i < count; ++i) {
      bool c = false, nf = false;
      s[i] += static_cast<int64_t>(kernels::int_encode_value(call.x[r][i], call.round.alpha,
                                                            kernels::philox_uniform(key, i), stochastic, clip, &c, &nf));
      if (clipped && c) ++*clipped;
    }
  }
  const double scale = 1.0 / ((call.op == RedOp::kAvg ? n : 1) * static_cast<double>(call.round.alpha));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = kernels::int_decode_value(static_cast<int32_t>(s[i]), scale);
  if (sums) *sums = s;
  return out;
}

uint64_t ring_values(int r, int n, size_t count) {
  auto size = [&](int s) { return count / n + (static_cast<size_t>((s + n) % n) < count % n ? 1 : 0); };
  uint64_t sent = 0;
  for (int k = 0; k < n - 1; ++k) sent += size((r - k - 1 + n) % n) + size((r - k + n) % n);
  return sent;
}

Call make_call(int n, size_t count, const std::string& spec, float alpha, uint32_t seed) {
  Call call;
  call.codec = kernels::parse_codec_spec(spec);
  call.round.alpha = alpha;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  call.x.assign(n, std::vector<float>(count));
  for (auto& v : call.x)
    for (float& e : v) e = normal(rng);
  return call;
}

TEST_CASE("IntSGD: every rank decodes the exact integer sum; bounds, identical bits, closed-form bytes", "[intsgd]") {
  for (int bits : {8, 16, 32}) {
    for (int n : {1, 2, 3, 4, 5, 8}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{40001}}) {
        for (const char* round : {"stochastic", "nearest"}) {
          for (RedOp op : {RedOp::kAvg, RedOp::kSum}) {
            const std::string spec = "int" + std::to_string(bits) + ":alpha=1,round=" + round + ",seed=5";
            // alpha keeps |alpha x| (|x| < 4 or so) well inside every rank's range: nothing clips.
            const float alpha = bits == 8 ? 4.0f / n : bits == 16 ? 1000.0f : 1e6f;
            Call call = make_call(n, count, spec, alpha, static_cast<uint32_t>(bits * 100 + n * 10 + count));
            for (auto& v : call.x)
              for (float& e : v) e = std::clamp(e, -3.5f, 3.5f);
            call.op = op;
            INFO("int" << bits << " n " << n << " count " << count << " " << round << (op == RedOp::kSum ? " sum" : " avg"));
            run(call);
            size_t clipped = 0;
            const std::vector<float> expect = reference(call, nullptr, &clipped);
            REQUIRE(clipped == 0);
            const double bound = (std::string(round) == "stochastic" ? 1.0 : 0.5) / alpha;
            for (int r = 0; r < n; ++r) {
              REQUIRE(call.out[r] == expect);  // bit for bit, every rank
              REQUIRE(call.sim->ops[r]->stats().nonfinite == 0);
              REQUIRE(*call.calls[r]->clipped() == 0);
              const uint64_t bytes = ring_values(r, n, count) * static_cast<uint64_t>(bits / 8);
              CHECK(call.sim->plan_bytes[r] == bytes);
              CHECK(call.sim->ops[r]->stats().bytes_sent == bytes);
              CHECK(call.sim->raw_bytes[r] == ring_values(r, n, count) * 4);
            }
            double worst = 0;
            for (size_t i = 0; i < count; ++i) {
              double mean = 0;
              for (int r = 0; r < n; ++r) mean += call.x[r][i];
              if (op == RedOp::kAvg) mean /= n;
              const double err = std::abs(call.out[0][i] - mean) / (op == RedOp::kAvg ? 1.0 : n);
              worst = std::max(worst, err);
            }
            // + float32 rounding of alpha x (|x| 2^-24) and of the result (half an ulp of up to 28)
            CHECK(worst <= bound * (1 + 1e-5) + 8 * 0x1p-24);
          }
        }
      }
    }
  }
}

TEST_CASE("IntSGD: the sums do not depend on chunk size, pipeline depth, rank order or in-place buffers",
          "[intsgd]") {
  const size_t count = 30011;
  for (int n : {2, 3, 4, 7}) {
    INFO("n " << n);
    // Deterministic rounding: a rank's integers depend on its data alone, so permuting which rank
    // holds which data permutes the terms of every sum.
    Call call = make_call(n, count, "int16:alpha=1,round=nearest", 1000.0f, 17u + n);
    run(call, 4096, 2);
    const std::vector<float> first = call.out[0];
    for (size_t chunk : {size_t{64}, size_t{1000}, size_t{65536}})
      for (int depth : {1, 3}) {
        run(call, chunk, depth);
        for (int r = 0; r < n; ++r) REQUIRE(call.out[r] == first);
      }
    run(call, 2048, 2, /*in_place=*/true);
    for (int r = 0; r < n; ++r) REQUIRE(call.out[r] == first);
    Call rotated = call;
    std::rotate(rotated.x.begin(), rotated.x.begin() + 1, rotated.x.end());
    std::reverse(rotated.x.begin(), rotated.x.end());
    run(rotated, 4096, 2);
    for (int r = 0; r < n; ++r) REQUIRE(rotated.out[r] == first);
    // Randomized rounding: each rank's stream follows its data (the rank that rounds data j uses
    // key j), and the sums are again the same bits.
    Call stochastic = make_call(n, count, "int8:alpha=1,seed=3", 20.0f / n, 23u + n);
    run(stochastic, 4096, 2);
    const std::vector<float> expect = stochastic.out[0];
    Call moved = stochastic;
    std::rotate(moved.x.begin(), moved.x.begin() + 1, moved.x.end());
    moved.key_rank.resize(n);
    for (int r = 0; r < n; ++r) moved.key_rank[r] = (r + 1) % n;
    run(moved, 1536, 3);
    for (int r = 0; r < n; ++r) REQUIRE(moved.out[r] == expect);
  }
  // The control: float32 ring sums of the same data do depend on the order (so the test above can
  // tell): sum the rotated data in float and find a value that differs.
  Call call = make_call(5, count, "int16:alpha=1,round=nearest", 1000.0f, 99u);
  size_t differs = 0;
  for (size_t i = 0; i < count; ++i) {
    float forward = 0, backward = 0;
    for (int r = 0; r < 5; ++r) forward += call.x[r][i], backward += call.x[4 - r][i];
    differs += forward != backward;
  }
  CHECK(differs > 0);
}

TEST_CASE("IntSGD: E||e||^2 <= d / (4 n alpha^2) with independent rank streams; correlated streams break it",
          "[intsgd][stats]") {
  const int n = 4;
  const size_t d = 40000;
  const float alpha = 8.0f;
  Call call = make_call(n, d, "int16:alpha=1,seed=11", alpha, 5u);
  for (int r = 1; r < n; ++r) call.x[r] = call.x[0];  // the same data everywhere: correlation shows most
  auto squared_error = [&](Call& c) {
    run(c, 8192, 2);
    double sq = 0;
    for (size_t i = 0; i < d; ++i) sq += std::pow(static_cast<double>(c.out[0][i]) - c.x[0][i], 2);
    return sq;
  };
  // Each e_i is the mean of n independent errors in (-1/alpha, 1/alpha) with variance <= 1/(4 alpha^2),
  // so E e_i^2 <= 1/(4 n alpha^2) and e_i^2 <= 1/alpha^2: the sum of d of them has standard deviation
  // below sqrt(d) / alpha^2.
  const double bound = d / (4.0 * n * alpha * alpha), sigma = std::sqrt(static_cast<double>(d)) / (alpha * alpha);
  const double independent = squared_error(call);
  CHECK(independent <= bound + 5 * sigma);
  call.same_streams = true;
  const double correlated = squared_error(call);  // ~ d / (6 alpha^2): n times more
  CHECK(correlated > bound + 5 * sigma);
}

TEST_CASE("IntSGD: inputs far past the clip bound never overflow the sum, and clips are counted", "[intsgd]") {
  const size_t count = 2000;
  for (int bits : {8, 16, 32}) {
    for (int n = 1; n <= 8; ++n) {
      INFO("int" << bits << " n " << n);
      Call call = make_call(n, count, "int" + std::to_string(bits) + ":alpha=1,seed=2", 1.0f, 7u);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          const int pattern = static_cast<int>(i % 4);
          call.x[r][i] = pattern == 0 ? 3e38f : pattern == 1 ? -3e38f : pattern == 2 ? ((r + i) % 2 ? 1e20f : -1e20f)
                                                                                  : call.x[r][i];
        }
      call.op = RedOp::kSum;
      run(call, 1024, 2);
      std::vector<int64_t> sums;
      size_t clipped = 0;
      const std::vector<float> expect = reference(call, &sums, &clipped);
      const kernels::IntClip clip = kernels::int_clip(bits, n);
      size_t clipped_here = 0;
      for (int r = 0; r < n; ++r) {
        REQUIRE(call.out[r] == expect);
        clipped_here += *call.calls[r]->clipped();
      }
      CHECK(clipped_here == clipped);
      CHECK(clipped >= static_cast<size_t>(n) * count / 2);
      const int64_t top = (int64_t{1} << (bits - 1)) - 1;
      for (size_t i = 0; i < count; ++i) REQUIRE((sums[i] <= top && sums[i] >= -top - 1));
      // All at the top, all at the bottom: the float32 bounds (hi_f = hi up to int16; int32 rounds inward).
      CHECK(sums[0] == int64_t{n} * static_cast<int64_t>(clip.hi_f));
      CHECK(sums[1] == int64_t{n} * static_cast<int64_t>(clip.lo_f));
      CHECK(static_cast<double>(std::nextafter(clip.hi_f, 3e38f)) > static_cast<double>(clip.hi));  // the largest below
      CHECK(call.out[0][0] == static_cast<float>(int64_t{n} * static_cast<int64_t>(clip.hi_f)));
    }
  }
}

TEST_CASE("IntSGD: NaN or Inf on one rank is never summed: its fragment is NaN on every rank", "[intsgd]") {
  for (int n : {1, 2, 4, 5}) {
    const size_t count = 5000, chunk = 512;  // values per fragment piece (chunk_bytes / 4)
    Call call = make_call(n, count, "int8:alpha=1,seed=1", 2.0f, 3u);
    call.x[n - 1][1234] = std::numeric_limits<float>::quiet_NaN();
    call.x[0][4000] = -std::numeric_limits<float>::infinity();
    run(call, chunk * 4, 2);
    // Fragment f is piece f of every segment.
    auto fragment = [&](size_t i) {
      const coll::Segments segments{count, n};
      int s = n - 1;
      while (segments.begin(s) > i) --s;
      return (i - segments.begin(s)) / chunk;
    };
    size_t expect_nan = 0;
    for (size_t i = 0; i < count; ++i) expect_nan += fragment(i) == fragment(1234) || fragment(i) == fragment(4000);
    for (int r = 0; r < n; ++r) {
      INFO("n " << n << " rank " << r);
      CHECK(call.sim->ops[r]->stats().nonfinite == expect_nan);
      for (size_t i = 0; i < count; ++i) {
        const bool tainted = fragment(i) == fragment(1234) || fragment(i) == fragment(4000);
        REQUIRE(std::isnan(call.out[r][i]) == tainted);
        if (!tainted) REQUIRE(call.out[r][i] == call.out[0][i]);
      }
    }
  }
}

TEST_CASE("IntSGD: an adaptive alpha past float32's range is held to its normal numbers, never 0 or Inf",
          "[intsgd]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("int8:eps=1e150");  // the largest eps
  coll::IntsgdMemory memory;
  memory.r = 1, memory.has_r = true;
  // sqrt(100) / 1e150 is 0 in float32: every output was then 0/0.
  CHECK(coll::intsgd_round(codec, &memory, 0, 100, 2).alpha == std::numeric_limits<float>::min());
  memory.r = 0;  // gradients all zero: sqrt(d) / eps, a finite alpha again
  const kernels::CodecConfig tiny = kernels::parse_codec_spec("int8:eps=1e-300");
  CHECK(coll::intsgd_round(tiny, &memory, 0, 100, 2).alpha == std::numeric_limits<float>::max());
}

TEST_CASE("IntSGD: the exact round is the float ring all-reduce, with float bytes", "[intsgd]") {
  for (int n : {1, 2, 3, 6}) {
    const size_t count = 10007;
    Call call = make_call(n, count, "int8", 0.0f, 41u);
    call.round.exact = true;
    run(call, 4096, 2);
    for (int r = 0; r < n; ++r) {
      INFO("n " << n << " rank " << r);
      CHECK(call.out[r] == call.out[0]);
      CHECK(call.sim->ops[r]->stats().bytes_sent == ring_values(r, n, count) * 4);
      CHECK(call.sim->plan_bytes[r] == ring_values(r, n, count) * 4);
    }
    for (size_t i = 0; i < count; ++i) {
      double mean = 0;
      for (int r = 0; r < n; ++r) mean += call.x[r][i];
      mean /= n;
      REQUIRE(call.out[0][i] == Approx(mean).margin(1e-5));
    }
  }
}

}  // namespace
}  // namespace qccl::test
