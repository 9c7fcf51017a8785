// IntSGD's integer codec (kernels/int_codec.h, kernels/intsgd.h): the clip bounds, the launchers
// against the element functions on every Highway target, Lemma 1 (unbiased rounding, its variance
// and its deterministic bound), wrapping sums that are exact whatever the order, exact sums of
// squares, and the alpha rule of Proposition 2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/codec.h"
#include "kernels/int_codec.h"
#include "kernels/intsgd.h"
#include "tests/kernels/hwy_targets.h"

namespace qccl::kernels {
namespace {

int64_t wire_at(int bits, const std::vector<char>& buf, size_t i) {
  switch (bits) {
    case 8: return reinterpret_cast<const int8_t*>(buf.data())[i];
    case 16: return reinterpret_cast<const int16_t*>(buf.data())[i];
    default: return reinterpret_cast<const int32_t*>(buf.data())[i];
  }
}

// Encodes x with the launcher and checks every value against the element function.
void check_encode_matches_elements(int bits, int nranks, bool stochastic, const std::vector<float>& x, float alpha,
                                   uint64_t first) {
  const IntClip clip = int_clip(bits, nranks);
  const PhiloxKey key{11, 5, 3, 0};
  std::vector<char> out(x.size() * bits / 8);
  const IntEncodeReport report = int_encode(bits, x.data(), x.size(), alpha, stochastic, clip, key, first, out.data());
  size_t clipped = 0, nonfinite = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bool c = false, nf = false;
    const float v = int_encode_value(x[i], alpha, philox_uniform(key, first + i), stochastic, clip, &c, &nf);
    clipped += c, nonfinite += nf;
    INFO("bits " << bits << " n " << nranks << " value " << i << " x " << x[i]);
    REQUIRE(wire_at(bits, out, i) == static_cast<int64_t>(v));
  }
  CHECK(report.clipped == clipped);
  CHECK(report.nonfinite == nonfinite);
}

std::vector<float> awkward_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  const float specials[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 63.0f, 63.5f, 64.0f, -64.0f, -64.5f,
                            1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), 3e38f};
  for (size_t i = 0; i < std::size(specials) && i * 7 < n; ++i) x[i * 7] = specials[i];
  return x;
}

TEST_CASE("clip bounds keep every n-rank sum inside the wire type, computed in integers", "[intsgd]") {
  CHECK((int_clip(8, 2).lo == -64 && int_clip(8, 2).hi == 63));
  CHECK((int_clip(8, 3).lo == -42 && int_clip(8, 3).hi == 42));
  CHECK((int_clip(8, 16).lo == -8 && int_clip(8, 16).hi == 7));
  CHECK((int_clip(8, 1).lo == -128 && int_clip(8, 1).hi == 127));
  // The float32 trap: (2^31 - 1) / 16 is 2^27 in float32, and 16 * 2^27 overflows int32.
  CHECK(int_clip(32, 16).hi == 134217727);
  CHECK(int_clip(32, 16).hi_f <= 134217727.0f);
  for (int bits : {8, 16, 32}) {
    for (int n = 1; n <= 64; ++n) {
      const IntClip c = int_clip(bits, n);
      INFO("bits " << bits << " n " << n);
      const int64_t top = (int64_t{1} << (bits - 1)) - 1;
      CHECK(int64_t{n} * c.hi <= top);
      CHECK(int64_t{n} * c.lo >= -top - 1);
      CHECK(int64_t{n} * (int64_t{c.hi} + 1) > top);  // the widest range that is safe
      CHECK((static_cast<int64_t>(c.hi_f) <= c.hi && static_cast<int64_t>(c.lo_f) >= c.lo));
      CHECK(static_cast<double>(c.hi_f) == std::floor(static_cast<double>(c.hi_f)));
    }
  }
}

TEST_CASE("the launchers are the element functions, value for value, on every Highway target", "[intsgd][hwy]") {
  for_each_target([] {
    for (int bits : {8, 16, 32}) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{255}, size_t{256}, size_t{257}, size_t{1031}}) {
        const std::vector<float> x = awkward_values(n, static_cast<uint32_t>(n + bits));
        for (bool stochastic : {true, false}) {
          check_encode_matches_elements(bits, 3, stochastic, x, 1.7f, 0);
          check_encode_matches_elements(bits, 8, stochastic, x, 1000.0f, 4093);  // mid-block start, heavy clipping
        }
        // Decode: S * scale in double, rounded once.
        std::vector<char> sums(n * bits / 8);
        std::mt19937 rng(static_cast<uint32_t>(n));
        for (auto& b : sums) b = static_cast<char>(rng());
        std::vector<float> out(n);
        const double scale = 1.0 / (3.0 * 1.7f);
        int_decode(bits, sums.data(), n, scale, out.data());
        for (size_t i = 0; i < n; ++i)
          REQUIRE(out[i] == int_decode_value(static_cast<int32_t>(wire_at(bits, sums, i)), scale));
        // Wrapping add.
        std::vector<char> acc(sums.rbegin(), sums.rend());
        const std::vector<char> before = acc;
        int_add(bits, sums.data(), acc.data(), n);
        const int64_t mod = int64_t{1} << bits;
        for (size_t i = 0; i < n; ++i) {
          int64_t expect = (wire_at(bits, sums, i) + wire_at(bits, before, i)) % mod;
          if (expect < -(mod / 2)) expect += mod;
          if (expect >= mod / 2) expect -= mod;
          REQUIRE(wire_at(bits, acc, i) == expect);
        }
      }
    }
  });
}

TEST_CASE("randomized rounding is unbiased with variance p(1 - p) (Lemma 1)", "[intsgd][stats]") {
  const IntClip wide = int_clip(32, 1);
  const int kSamples = 20000;
  for (float t : {0.3f, -0.3f, 2.75f, -7.125f, 1e-6f, -1e-6f, 1000.5f, 5.0f, -12.0f, 0.0f}) {
    double sum = 0, sum_sq = 0;
    const double f = std::floor(static_cast<double>(t)), p = t - f;
    std::vector<float> x(kSamples, t);
    std::vector<int32_t> m(kSamples);
    const IntEncodeReport r = int_encode(32, x.data(), x.size(), 1.0f, true, wide, PhiloxKey{3, 1, 0, 0}, 0, m.data());
    CHECK(r.clipped == 0);
    for (int32_t v : m) {
      REQUIRE((v == f || v == f + 1));
      sum += v, sum_sq += static_cast<double>(v) * v;
    }
    const double mean = sum / kSamples, var = sum_sq / kSamples - mean * mean;
    INFO("t " << t);
    CHECK(std::abs(mean - t) <= 5.0 * std::sqrt(p * (1 - p) / kSamples) + 1e-12);
    if (p == 0) CHECK(var == 0);  // whole numbers pass exactly
    // The sample variance of N Bernoulli(p) draws has standard deviation sqrt(p(1-p)) |1-2p| / sqrt(N).
    CHECK(std::abs(var - p * (1 - p)) <= 5.0 * std::sqrt(p * (1 - p) / kSamples) + 1e-12);
    CHECK(var <= 0.25 + 5.0 * 0.5 / std::sqrt(kSamples));
  }
}

TEST_CASE("Q(x) = Int(alpha x) / alpha stays within 1/alpha (1/(2 alpha) to nearest) and E||Q - x||^2 <= d/(4 alpha^2)",
          "[intsgd][stats]") {
  const size_t d = 50000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x) v = normal(rng);
  for (float alpha : {3.0f, 37.5f, 1000.0f}) {
    for (bool stochastic : {true, false}) {
      std::vector<int32_t> m(d);
      int_encode(32, x.data(), d, alpha, stochastic, int_clip(32, 1), PhiloxKey{9, 2, 1, 0}, 0, m.data());
      double worst = 0, sq = 0;
      for (size_t i = 0; i < d; ++i) {
        const double q = m[i] / static_cast<double>(alpha), e = q - x[i];
        worst = std::max(worst, std::abs(e));
        sq += e * e;
      }
      // fl(alpha x) is off by half an ulp of alpha x: at most |x| 2^-24 in units of x.
      const double ulp = 8.0 * 0x1p-24;
      INFO("alpha " << alpha << (stochastic ? " stochastic" : " nearest"));
      if (stochastic) {
        CHECK(worst < 1.0 / alpha + ulp);
        // E||Q - x||^2 = sum p(1 - p) / alpha^2 <= d / (4 alpha^2); the sum of d independent terms in
        // [0, 1/alpha^2] has standard deviation below sqrt(d) / (2 alpha^2).
        CHECK(sq <= d / (4.0 * alpha * alpha) + 5.0 * std::sqrt(static_cast<double>(d)) / (2.0 * alpha * alpha));
      } else {
        CHECK(worst <= 0.5 / alpha + ulp);
      }
    }
  }
}

TEST_CASE("sums of clipped integers are exact in the wire type, whatever the order, even when partial sums wrap",
          "[intsgd][sum]") {
  std::mt19937 rng(13);
  for (int bits : {8, 16, 32}) {
    for (int n = 1; n <= 8; ++n) {
      const IntClip clip = int_clip(bits, n);
      const size_t count = 64;
      // Adversarial contributions: all at the top, all at the bottom, alternating extremes, random.
      std::vector<std::vector<char>> parts(n, std::vector<char>(count * bits / 8));
      for (int r = 0; r < n; ++r) {
        std::vector<float> x(count);
        for (size_t i = 0; i < count; ++i) {
          const int pattern = static_cast<int>(i % 4);
          x[i] = pattern == 0 ? 1e30f : pattern == 1 ? -1e30f : pattern == 2 ? ((r + i) % 2 ? 1e30f : -1e30f)
                                                                             : static_cast<float>(rng() % 1000) - 500.0f;
        }
        const IntEncodeReport rep =
            int_encode(bits, x.data(), count, 1.0f, true, clip, PhiloxKey{1, 0, static_cast<uint32_t>(r), 0}, 0,
                       parts[r].data());
        CHECK(rep.clipped >= count / 2);  // every extreme is clipped
      }
      std::vector<int> order(n);
      for (int r = 0; r < n; ++r) order[r] = r;
      std::vector<char> first_sum;
      for (int trial = 0; trial < 4; ++trial) {
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<char> acc = parts[order[0]];
        for (int k = 1; k < n; ++k) int_add(bits, parts[order[k]].data(), acc.data(), count);
        for (size_t i = 0; i < count; ++i) {
          int64_t exact = 0;
          for (int r = 0; r < n; ++r) exact += wire_at(bits, parts[r], i);
          INFO("bits " << bits << " n " << n << " element " << i);
          REQUIRE(wire_at(bits, acc, i) == exact);  // the final sum fits, so the wrapped sum is exact
        }
        if (trial == 0) first_sum = acc;
        CHECK(acc == first_sum);
      }
    }
  }
}

TEST_CASE("sums of squares and the largest integer are exact for int32 extremes", "[intsgd][sum]") {
  std::vector<int32_t> s = {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), -1, 0, 7};
  for (int i = 0; i < 1000; ++i) s.push_back(std::numeric_limits<int32_t>::min());
  IntSums sums;
  int_accumulate_sums(32, s.data(), s.size(), &sums);
  unsigned __int128 expect = 0;
  for (int32_t v : s) expect += static_cast<unsigned __int128>(static_cast<int64_t>(v) * static_cast<int64_t>(v));
  CHECK(sums.squares_lo == static_cast<uint64_t>(expect));
  CHECK(sums.squares_hi == static_cast<uint64_t>(expect >> 64));
  CHECK(sums.max_abs == 2147483648u);
  IntSums halves, second;
  int_accumulate_sums(32, s.data(), 500, &halves);
  int_accumulate_sums(32, s.data() + 500, s.size() - 500, &second);
  halves.merge(second);
  CHECK((halves.squares_lo == sums.squares_lo && halves.squares_hi == sums.squares_hi && halves.max_abs == sums.max_abs));
  const std::vector<int8_t> small = {-128, 127, 3};
  IntSums s8;
  int_accumulate_sums(8, small.data(), small.size(), &s8);
  CHECK((s8.squares_lo == 16384u + 16129u + 9u && s8.max_abs == 128u));
}

TEST_CASE("alpha follows Proposition 2: d eta^2 / alpha^2 = eta^2 eps^2 + 2 n r", "[intsgd][alpha]") {
  for (double d : {1.0, 1000.0, 1e9}) {
    for (int n : {1, 4, 8}) {
      for (double r : {0.0, 1e-12, 0.37, 1e6}) {
        for (double eta : {1.0, 0.1, 1e-4}) {
          const double eps = 1e-8, a = intsgd_alpha(d, n, r, eta, eps);
          INFO("d " << d << " n " << n << " r " << r << " eta " << eta);
          REQUIRE(std::isfinite(a));
          CHECK(d * eta * eta / (a * a) == Approx(eta * eta * eps * eps + 2.0 * n * r).epsilon(1e-12));
        }
      }
    }
  }
  CHECK(intsgd_alpha(1e6, 4, 0.0, 0.1, 1e-8) == Approx(1e3 / 1e-8));
  CHECK(intsgd_moving_average(2.0, 4.0, 0.9) == Approx(0.9 * 2.0 + 0.1 * 4.0));
}

}  // namespace
}  // namespace qccl::kernels
