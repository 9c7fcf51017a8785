// The learned-levels codec (kernels/levels.h) and QSDP's level fitting (learn_levels): levels fitted
// to Laplace and Gaussian buckets quantize them with a smaller mean squared error than the evenly
// spaced levels (shared/specs/qsdp.md §4 P8: the paper's claim, and this project's target of 0.75 at
// 4 bits on Laplace buckets); every decoded value within the proven bound of levels.h; stochastic
// rounding unbiased within a variance-derived bound; exact cases; and the spec grammar.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/levels.h"
#include "kernels/philox.h"
#include "kernels/quant.h"
#include "tests/kernels/hwy_targets.h"

namespace qccl::kernels {
namespace {

enum class Shape { kLaplace, kGaussian, kUniform };

// `buckets` buckets of `bucket` values of one distribution, each with its own scale and offset.
std::vector<float> make_buckets(Shape shape, size_t buckets, size_t bucket, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::exponential_distribution<double> exponential;
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<float> x(buckets * bucket);
  for (size_t b = 0; b < buckets; ++b) {
    const double scale = std::exp(uniform(rng)), offset = uniform(rng);
    for (size_t i = 0; i < bucket; ++i) {
      double v = 0;
      if (shape == Shape::kLaplace) v = (rng() & 1 ? 1 : -1) * exponential(rng);
      if (shape == Shape::kGaussian) v = normal(rng);
      if (shape == Shape::kUniform) v = uniform(rng);
      x[b * bucket + i] = static_cast<float>(offset + scale * v);
    }
  }
  return x;
}

std::vector<float> round_trip(const CodecConfig& c, const std::vector<float>& x, uint64_t step = 0) {
  std::vector<std::byte> wire(c.encoded_bytes(x.size()));
  encode(c, x.data(), x.size(), wire.data(), PhiloxKey{c.seed, step, 0, 0}, 0);
  std::vector<float> y(x.size());
  decode(c, wire.data(), x.size(), y.data());
  return y;
}

double mse(const std::vector<float>& x, const std::vector<float>& y) {
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
  return sum / static_cast<double>(x.size());
}

CodecConfig with_levels(const std::string& spec, std::vector<float> levels) {
  CodecConfig c = parse_codec_spec(spec);
  c.levels = std::move(levels);
  return c;
}

// Random valid levels for `bits`: sorted uniforms between the pinned endpoints.
std::vector<float> random_levels(int bits, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> l(size_t{1} << bits);
  for (float& v : l) v = uniform(rng);
  std::sort(l.begin(), l.end());
  l.front() = 0.0f, l.back() = 1.0f;
  for (size_t k = 1; k + 1 < l.size(); ++k)
    if (!(l[k] > l[k - 1])) l[k] = std::nextafter(l[k - 1], 2.0f);
  if (!(l[l.size() - 2] < 1.0f)) l[l.size() - 2] = std::nextafter(1.0f, 0.0f);
  return l;
}

}  // namespace

TEST_CASE("learned levels: lower MSE than evenly spaced levels on Laplace and Gaussian buckets", "[levels]") {
  // 60 buckets to learn from, 30 others to measure on; one pass, rate 0.01 (QSDP App. C).
  struct Case {
    Shape shape;
    int bits;
    double most;  // the largest MSE ratio accepted
  };
  for (const Case& k : {Case{Shape::kLaplace, 4, 0.75}, Case{Shape::kLaplace, 3, 0.95}, Case{Shape::kLaplace, 2, 0.95},
                        Case{Shape::kGaussian, 4, 0.95}, Case{Shape::kGaussian, 3, 0.95}}) {
    const std::vector<float> train = make_buckets(k.shape, 60, 1024, 1), test = make_buckets(k.shape, 30, 1024, 2);
    const std::string spec = "q" + std::to_string(k.bits) + ":bucket=1024";
    const CodecConfig uniform = parse_codec_spec(spec);
    const CodecConfig learned = with_levels(spec, learn_levels(train.data(), train.size(), k.bits, 1024, 0.01, 1));
    const double ratio = mse(test, round_trip(learned, test)) / mse(test, round_trip(uniform, test));
    INFO((k.shape == Shape::kLaplace ? "Laplace" : "Gaussian") << " b=" << k.bits << ": MSE learned / uniform = " << ratio);
    CHECK(ratio <= k.most);
    CHECK(ratio > 0.2);  // a codec that cheated (e.g. sent more bits) would look too good
  }
  // Uniform data: no gain is claimed (the paper and spec §4 P8), but no loss beyond the rate's jitter
  // either: the end levels stay at 0 and 1 while the inner ones learn (moved with the others and
  // put back after the pass, they left the inner levels too far inward: 1.06 at b=4, 1.13 at b=2).
  const std::vector<float> train = make_buckets(Shape::kUniform, 60, 1024, 1), test = make_buckets(Shape::kUniform, 30, 1024, 2);
  for (int bits : {2, 4}) {
    const std::string spec = "q" + std::to_string(bits) + ":bucket=1024";
    const CodecConfig learned = with_levels(spec, learn_levels(train.data(), train.size(), bits, 1024, 0.01, 1));
    const double ratio = mse(test, round_trip(learned, test)) / mse(test, round_trip(parse_codec_spec(spec), test));
    INFO("uniform buckets, b=" << bits << ": MSE learned / uniform = " << ratio);
    CHECK(ratio <= 1.03);
  }
}

TEST_CASE("learned levels: sorted, strictly increasing, pinned at 0 and 1, deterministic", "[levels]") {
  const std::vector<float> data = make_buckets(Shape::kLaplace, 20, 512, 7);
  for (int bits = 1; bits <= 8; ++bits) {
    const std::vector<float> a = learn_levels(data.data(), data.size(), bits, 512, 0.01, 2);
    REQUIRE(a.size() == (size_t{1} << bits));
    CHECK(a.front() == 0.0f);
    CHECK(a.back() == 1.0f);
    for (size_t k = 1; k < a.size(); ++k) CHECK(a[k] > a[k - 1]);
    CHECK(learn_levels(data.data(), data.size(), bits, 512, 0.01, 2) == a);
  }
  // Nothing to learn from: the evenly spaced levels come back.
  const std::vector<float> constant(1024, 3.0f);
  const std::vector<float> even = learn_levels(constant.data(), constant.size(), 2, 512, 0.01, 1);
  CHECK(even == std::vector<float>{0.0f, 1.0f / 3, 2.0f / 3, 1.0f});
}

TEST_CASE("learned levels: every value within the bound of levels.h, both roundings", "[levels]") {
  std::mt19937_64 rng(11);
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* round : {"nearest", "stochastic", "shift"})
      for (Shape shape : {Shape::kLaplace, Shape::kGaussian, Shape::kUniform}) {
        const std::vector<float> levels = random_levels(bits, rng);
        const CodecConfig c = with_levels("q" + std::to_string(bits) + ":bucket=64,round=" + round + ",seed=3", levels);
        std::vector<float> x = make_buckets(shape, 10, 64, rng());
        x[130] = 1e6f;  // one outlier in bucket 2
        const std::vector<float> y = round_trip(c, x);
        const float top = static_cast<float>(quant_levels(bits));
        double widest = 0;
        for (size_t k = 1; k < levels.size(); ++k) widest = std::max(widest, (static_cast<double>(levels[k]) - levels[k - 1]) * top);
        size_t over = 0;
        for (size_t b = 0; b < 10; ++b) {
          const double lo = *std::min_element(x.begin() + b * 64, x.begin() + (b + 1) * 64);
          const double hi = *std::max_element(x.begin() + b * 64, x.begin() + (b + 1) * 64);
          const double s = (hi - lo) / top;
          const double e = 0x1p-13 * s * widest + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, bits - 149);
          const double bound = (std::string(round) == "nearest" ? s * widest / 2 : s * widest) + e;
          for (size_t i = b * 64; i < (b + 1) * 64; ++i)
            if (!(std::fabs(static_cast<double>(y[i]) - x[i]) <= bound) || y[i] < lo - e || y[i] > hi + e) ++over;
        }
        INFO("q" << bits << " " << round);
        CHECK(over == 0);
      }
}

TEST_CASE("learned levels: stochastic rounding is unbiased (variance-derived bound)", "[levels]") {
  const CodecConfig c = with_levels("q2:bucket=8,round=stochastic,seed=5", {0.0f, 0.1f, 0.7f, 1.0f});
  // One bucket: 0 and 3 pin the range [0, 3] (s = 1, positions 0, 0.3, 2.1, 3); the rest are probes.
  const std::vector<float> x = {0.0f, 3.0f, 0.2f, 1.0f, 2.0f, 2.5f, 0.05f, 2.9f};
  const float g[4] = {0.0f, 0.3f, 2.1f, 3.0f};
  const int trials = 4000;
  std::vector<double> sum(x.size(), 0.0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<float> y = round_trip(c, x, static_cast<uint64_t>(t));
    for (size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
  }
  for (size_t i = 2; i < x.size(); ++i) {
    size_t k = 0;
    while (g[k + 1] <= x[i]) ++k;
    const double variance = (x[i] - g[k]) * (g[k + 1] - x[i]);  // Bernoulli between the two levels
    const double mean = sum[i] / trials;
    INFO("x = " << x[i] << ", mean " << mean);
    CHECK(std::fabs(mean - x[i]) <= 5 * std::sqrt(variance / trials) + 1e-6);
  }
}

TEST_CASE("learned levels: exact cases and non-finite buckets", "[levels]") {
  const CodecConfig c = with_levels("q2:bucket=8", {0.0f, 0.25f, 0.5f, 1.0f});
  // A constant bucket decodes exactly; a bucket's minimum is reproduced exactly (code 0).
  std::vector<float> x = {5, 5, 5, 5, 5, 5, 5, 5, -2, 1, 0, 7, 3, 2, 6, 4};
  std::vector<float> y = round_trip(c, x);
  for (size_t i = 0; i < 8; ++i) CHECK(y[i] == 5.0f);
  CHECK(y[8] == -2.0f);
  // NaN in a bucket: the whole bucket decodes to NaN, reported as such, and the next bucket is intact.
  x[3] = NAN;
  std::vector<std::byte> wire(c.encoded_bytes(x.size()));
  CHECK(encode(c, x.data(), x.size(), wire.data(), PhiloxKey{}, 0).nonfinite == 1);
  y.assign(x.size(), 0.0f);
  CHECK(decode(c, wire.data(), x.size(), y.data()) == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(std::isnan(y[i]));
  CHECK(y[8] == -2.0f);
  // decode_accumulate adds the same values.
  std::vector<float> acc(x.size(), 1.0f);
  decode_accumulate(c, wire.data(), x.size(), acc.data());
  CHECK(acc[8] == -1.0f);
}

// The encoder and decoder (codec.cc's vector loops) give the bytes and values of levels.h's element
// functions applied one value at a time: every width, rounding, bucket and tail, ties between two
// levels, -0, constant buckets and non-finite ones.
TEST_CASE("learned levels: the vector loops give the element functions' bytes and values", "[levels]") {
  for_each_target([] {
    std::mt19937_64 rng(29);
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    for (int bits = 1; bits <= 8; ++bits) {
      for (const char* round : {"nearest", "stochastic", "shift"}) {
        for (uint32_t bucket : {8u, 24u, 512u}) {
          INFO("q" << bits << ", round=" << round << ", bucket=" << bucket);
          const CodecConfig c =
              with_levels("q" + std::to_string(bits) + ":seed=5,round=" + round + ",bucket=" + std::to_string(bucket),
                          random_levels(bits, rng));
          const LevelPositions g = level_positions(c);
          const size_t count = 3 * bucket + 13;  // a partial bucket and a partial group of 8
          std::vector<float> x(count);
          for (float& v : x) v = uniform(rng);
          // The first bucket: its values at every level and halfway between two (ties), with its
          // range [0, L] so that t = x; -0 beside +0; then a constant bucket; NaN in the last one.
          const float top = g.g[g.count - 1];
          for (size_t i = 0; i < bucket; ++i) {
            const uint32_t k = static_cast<uint32_t>(i / 2 % (g.count - 1));
            x[i] = i % 2 ? g.g[k] : 0.5f * (g.g[k] + g.g[k + 1]);
          }
          x[0] = 0.0f, x[1] = top, x[2] = -0.0f;
          for (size_t i = bucket; i < 2 * bucket; ++i) x[i] = 1.5f;
          x[count - 5] = NAN;
          const PhiloxKey key{c.seed, 7, 0, 0};
          const uint64_t first = 13;
          // The element functions' wire bytes.
          std::vector<std::byte> want(c.encoded_bytes(count)), got(want.size());
          auto* meta = reinterpret_cast<BucketMeta*>(want.data());
          auto* codes = reinterpret_cast<uint8_t*>(want.data()) + quant_meta_bytes(count, bucket);
          for (size_t b = 0; b * bucket < count; ++b) {
            const size_t begin = b * bucket, n = std::min<size_t>(bucket, count - begin);
            float lo = INFINITY, hi = -INFINITY;
            bool finite = true;
            for (size_t i = begin; i < begin + n; ++i) {
              if (!std::isfinite(x[i]))
                finite = false;
              else if (x[i] < lo || (x[i] == lo && std::signbit(x[i])))
                lo = x[i];
              if (std::isfinite(x[i]) && (x[i] > hi || (x[i] == hi && !std::signbit(x[i])))) hi = x[i];
            }
            if (!finite) lo = hi = 0.0f;
            const BucketMeta m = bucket_meta(lo, hi, finite, bits);
            std::memcpy(&meta[b], &m, sizeof m);
            for (size_t i = 0; i < n; i += 8) {
              uint32_t word[8] = {0, 0, 0, 0, 0, 0, 0, 0};
              for (size_t j = 0; j < 8 && i + j < n; ++j) {
                const size_t e = begin + i + j;
                const float u = c.rounding == Rounding::kStochastic ? philox_uniform(key, first + e)
                                : c.rounding == Rounding::kShift
                                    ? philox_uniform(key, shift_uniform_index(first + begin))
                                    : -1.0f;
                word[j] = quantize_with_levels(x[e], m, u, g.g, g.count);
              }
              pack8(word, bits, codes + (begin + i) / 8 * static_cast<size_t>(bits));
            }
          }
          CHECK(encode(c, x.data(), count, got.data(), key, first).nonfinite == 1);
          CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
          // Decoding, plain and accumulating: dequantize_from_levels of every code.
          std::vector<float> y(count), acc(count, 0.25f);
          const size_t nan_bucket = (count - 5) / bucket;  // decoded to NaN in full, and counted so
          CHECK(decode(c, want.data(), count, y.data()) == std::min<size_t>(bucket, count - nan_bucket * bucket));
          decode_accumulate(c, want.data(), count, acc.data());
          size_t mismatches = 0;
          for (size_t e = 0; e < count; ++e) {
            uint32_t word[8];
            unpack8(codes + e / 8 * static_cast<size_t>(bits), bits, word);
            const float v = dequantize_from_levels(word[e % 8], meta[e / bucket], g.g);
            const float a = 0.25f + v;
            if (std::memcmp(&y[e], &v, 4) != 0 || std::memcmp(&acc[e], &a, 4) != 0) ++mismatches;
          }
          CHECK(mismatches == 0);
        }
      }
    }
  });
}

TEST_CASE("learned levels: the spec carries them, and bad lists are refused with the reason", "[levels]") {
  const CodecConfig c = parse_codec_spec("q2:bucket=64,levels=0/0.125/0.6/1");
  CHECK(c.levels == std::vector<float>{0.0f, 0.125f, 0.6f, 1.0f});
  const CodecConfig again = parse_codec_spec(c.canonical());
  CHECK(again.levels == c.levels);
  CHECK(again.hash() == c.hash());
  CHECK(c.hash() != parse_codec_spec("q2:bucket=64").hash());
  CHECK(c.hash() != parse_codec_spec("q2:bucket=64,levels=0/0.125/0.61/1").hash());
  CHECK(c.encoded_bytes(1000) == parse_codec_spec("q2:bucket=64").encoded_bytes(1000));  // same wire size
  for (const char* bad : {"q2:levels=0/0.5/1", "q2:levels=0.1/0.2/0.5/1", "q2:levels=0/0.2/0.5/0.9",
                          "q2:levels=0/0.5/0.2/1", "q2:levels=0/0.5/0.5/1", "q2:levels=0/x/0.5/1", "q2:levels=0/-1/0.5/1",
                          "fp16:levels=0/1", "q1:levels="}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_codec_spec(bad), Catch::Contains("levels") || Catch::Contains("unknown key"));
  }
}

}  // namespace qccl::kernels
