// AQ-SGD's quantizer (kernels/aq_quant.h, aq_codec.cc) against shared/specs/aqsgd.md §6: the code
// grid and wire size (P1, with the spec's GPT2 micro-batch), every code against a double-precision
// reference of §2.2's formulas and the reconstruction bound (P2), exact dequantization (P3), the
// unbiasedness of stochastic rounding inside the grid with a variance-derived bound, and the
// reference's top clip caught as biased (P8), c_Q < sqrt(1/2) for the widths the theorem covers,
// blocks of rows encoding independently, NaN/Inf/overflow channels, and the spec grammar.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/aq_quant.h"
#include "kernels/codec.h"
#include "kernels/half.h"
#include "kernels/philox.h"

namespace qccl::kernels {
namespace {

std::vector<float> gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// The smallest fp16 value >= v (v >= 0, at most 65504), as a float.
float fp16_up(double v) {
  uint16_t h = float_to_half(static_cast<float>(v));
  if (half_to_float(h) < v) ++h;
  return half_to_float(h);
}

// Code j of a block read from its documented layout (aq_quant.h): bits at j * bits, LSB first.
uint32_t code_at(const uint8_t* codes, size_t j, int bits) {
  uint32_t u = 0;
  for (int b = 0; b < bits; ++b) {
    const size_t bit = j * static_cast<size_t>(bits) + static_cast<size_t>(b);
    u |= static_cast<uint32_t>((codes[bit / 8] >> (bit % 8)) & 1u) << b;
  }
  return u;
}

TEST_CASE("aq: the spec grammar", "[aq]") {
  const CodecConfig c = parse_codec_spec("aq4:channels=1600,rows=0,round=stochastic,seed=3");
  CHECK(c.kind == CodecKind::kAq);
  CHECK(c.bits == 4);
  CHECK(c.channels == 1600);
  CHECK(c.rows == 0);
  CHECK(c.rounding == Rounding::kStochastic);
  CHECK(parse_codec_spec(c.canonical()).canonical() == c.canonical());
  CHECK(parse_codec_spec("aq2").canonical() == "aq2:channels=1,rows=0,round=nearest,seed=0");
  CHECK(parse_codec_spec("aq8:rows=4").alignment() == 4);
  CHECK(parse_codec_spec("aq8:rows=4,channels=10").alignment() == 40);
  CHECK(parse_codec_spec("aq8").alignment() == 0);  // one block: never cut
  auto error_of = [](const std::string& spec) {
    try {
      parse_codec_spec(spec);
    } catch (const CodecSpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("aq1"), Catch::Contains("never correct"));
  CHECK_THAT(error_of("aq9"), Catch::Contains("unknown codec 'aq9'"));
  CHECK_THAT(error_of("aq4:ef=on"), Catch::Contains("no residual"));
  CHECK_THAT(error_of("aq4:channels=0"), Catch::Contains("out of range"));
  CHECK_THAT(error_of("aq4:rows=-1"), Catch::Contains("not a non-negative integer"));
  CHECK_THAT(error_of("aq4:round=shift"), Catch::Contains("round is nearest, stochastic"));
  CHECK_THAT(error_of("aq4:bucket=8"), Catch::Contains("only q1 .. q8 have buckets"));
  CHECK_THAT(error_of("aq4:theta=1"), Catch::Contains("channels, rows, round, seed"));
}

TEST_CASE("aq: wire size (P1), the spec's GPT2 micro-batch included", "[aq]") {
  // GPT2-1.5B: a micro-batch of 1 x 1024 tokens x 1600 channels at 4 bits, one fp16 scale per channel.
  CHECK(parse_codec_spec("aq4:channels=1600").encoded_bytes(1024 * 1600) == 819200 + 3200);
  for (int bits = 2; bits <= 8; ++bits)
    for (size_t n : {size_t{1}, size_t{7}, size_t{13}, size_t{100}, size_t{1001}}) {
      const CodecConfig c = parse_codec_spec("aq" + std::to_string(bits) + ":channels=13,rows=5");
      size_t want = 0;
      for (size_t b = 0; b < n; b += 65) {
        const size_t values = std::min<size_t>(65, n - b);
        want += 2 * std::min<size_t>(values, 13) + (values * bits + 7) / 8;
      }
      CHECK(c.encoded_bytes(n) == want);
    }
  CHECK(parse_codec_spec("aq3").encoded_bytes(0) == 0);
}

// Every code of every block against §2.2 evaluated in double, the decoded value exact (P3), and the
// per-channel bound (P2): |x - x^| <= 2^-(b-1) s, s = max|x| rounded up to fp16, which exceeds max|x|
// by less than 2^-10 of it, or 2^-24 below fp16's normal range (channels of 1e-8: rounded to nearest,
// their scale was 0 and they decoded to 0).
TEST_CASE("aq: codes, exact dequantization and the reconstruction bound against a double reference", "[aq]") {
  for (int bits = 2; bits <= 8; ++bits) {
    for (uint32_t channels : {1u, 3u, 16u}) {
      for (uint32_t rows : {0u, 1u, 4u}) {
        const CodecConfig c = parse_codec_spec("aq" + std::to_string(bits) + ":channels=" + std::to_string(channels) +
                                               ",rows=" + std::to_string(rows));
        const size_t n = 16 * 9 + 5;  // a partial last row and block
        // Channels of several scales, down to where fp16 + 1e-6 would not absorb the 1e-6 (the
        // reference's divisor, which shrank such channels: aq_quant.h).
        std::vector<float> x = gaussian(n, 100 + bits + channels);
        for (size_t i = 0; i < n; i += 3) x[i] *= 8.0f;
        for (size_t i = 1; i < n; i += 4) x[i] *= 1e-4f;
        for (size_t i = 3; i < n; i += 16) x[i] *= 1e-8f;  // with 16 channels, channel 3 entire
        for (size_t i = 6; i < n; i += 16) x[i] *= 4e-6f;  // channel 6 among fp16's subnormals
        x[1] = 0.0f, x[2] = -0.0f;
        std::vector<uint8_t> wire(c.encoded_bytes(n));
        CHECK(encode(c, x.data(), n, wire.data(), PhiloxKey{}, 0).nonfinite == 0);
        std::vector<float> y(n);
        CHECK(decode(c, wire.data(), n, y.data()) == 0);
        const double half = std::ldexp(1.0, bits - 1);
        const size_t block = rows ? size_t{rows} * channels : n;
        size_t at = 0;
        for (size_t b0 = 0; b0 < n; b0 += block) {
          const size_t m = std::min(block, n - b0), h = std::min<size_t>(m, channels);
          for (size_t ch = 0; ch < h; ++ch) {
            double mx = 0;
            for (size_t j = ch; j < m; j += channels) mx = std::max(mx, std::fabs(static_cast<double>(x[b0 + j])));
            const float s = fp16_up(mx);
            CHECK(s - mx < (mx >= 0x1p-14 ? 0x1p-10 * mx : 0x1p-24));
            uint16_t sent;
            std::memcpy(&sent, wire.data() + at + 2 * ch, 2);
            REQUIRE(half_to_float(sent) == s);
            // r = 2^F / s in float32 (0 for s = 0), y = x * r rounded once to float32 (aq_quant.h)
            const float r = s > 0 ? static_cast<float>(half / s) : 0.0f;
            for (size_t j = ch; j < m; j += channels) {
              const double yv = static_cast<float>(static_cast<double>(x[b0 + j]) * r);
              double k = std::nearbyint(yv);  // half to even, the default rounding mode
              k = std::min(std::max(k, -half), half - 1);
              const uint32_t code = code_at(wire.data() + at + 2 * h, j, bits);
              INFO("bits " << bits << " channels " << channels << " rows " << rows << " value " << b0 + j);
              REQUIRE(code == static_cast<uint32_t>(k + half));
              REQUIRE(static_cast<double>(y[b0 + j]) == k / half * s);  // exact (P3)
              REQUIRE(std::fabs(static_cast<double>(x[b0 + j]) - y[b0 + j]) <= s / half);
            }
          }
          at += aq_block_bytes(m, channels, bits);
        }
        CHECK(at == wire.size());
      }
    }
  }
}

// The launchers' vector paths against the element functions, stochastic rounding included: the
// codes the host writes are aq_quantize's with philox_uniform(key, first + j), which is what the CUDA
// kernels compute too (codec_cuda_test compares the two bit for bit on a device).
TEST_CASE("aq: the host launchers write the element functions' codes, stochastic rounding included", "[aq]") {
  const PhiloxKey key{7, 3, 2, 1};
  for (const char* spec : {"aq4:round=stochastic", "aq3:channels=16,rows=2,round=stochastic",
                           "aq7:channels=37,round=stochastic", "aq2:channels=5,rows=3,round=stochastic", "aq8:channels=1"}) {
    const CodecConfig c = parse_codec_spec(spec);
    for (uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 33}) {
      const size_t n = 1000;
      const std::vector<float> x = gaussian(n, first + 17);
      std::vector<uint8_t> wire(c.encoded_bytes(n));
      encode(c, x.data(), n, wire.data(), key, first);
      const size_t block = c.rows ? size_t{c.rows} * c.channels : n;
      size_t at = 0;
      for (size_t b0 = 0; b0 < n; b0 += block) {
        const size_t m = std::min(block, n - b0), h = std::min<size_t>(m, c.channels);
        for (size_t j = 0; j < m; ++j) {
          uint16_t s;
          std::memcpy(&s, wire.data() + at + 2 * (j % c.channels), 2);
          const float u = c.rounding == Rounding::kStochastic ? philox_uniform(key, first + b0 + j) : 0.0f;
          const uint32_t want =
              aq_quantize(x[b0 + j], aq_factor(half_to_float(s), c.bits), u, c.rounding == Rounding::kStochastic, c.bits);
          INFO(spec << " first " << first << " value " << b0 + j);
          REQUIRE(code_at(wire.data() + at + 2 * h, j, c.bits) == want);
        }
        at += aq_block_bytes(m, c.channels, c.bits);
      }
      std::vector<float> y(n), acc(n, 1.5f);
      decode(c, wire.data(), n, y.data());
      decode_accumulate(c, wire.data(), n, acc.data());
      at = 0;
      for (size_t b0 = 0; b0 < n; b0 += block) {
        const size_t m = std::min(block, n - b0), h = std::min<size_t>(m, c.channels);
        for (size_t j = 0; j < m; ++j) {
          uint16_t s;
          std::memcpy(&s, wire.data() + at + 2 * (j % c.channels), 2);
          const float v = aq_dequantize(code_at(wire.data() + at + 2 * h, j, c.bits), half_to_float(s), c.bits);
          REQUIRE(y[b0 + j] == v);
          REQUIRE(acc[b0 + j] == 1.5f + v);
        }
        at += aq_block_bytes(m, c.channels, c.bits);
      }
    }
  }
}

TEST_CASE("aq: zeros, NaN, Inf and magnitudes beyond float16", "[aq]") {
  const CodecConfig c = parse_codec_spec("aq4:channels=4");
  std::vector<float> zeros(12, 0.0f), out(12, 1.0f);
  std::vector<uint8_t> wire(c.encoded_bytes(12));
  CHECK(encode(c, zeros.data(), 12, wire.data(), PhiloxKey{}, 0).nonfinite == 0);
  for (size_t j = 0; j < 12; ++j) CHECK(code_at(wire.data() + 8, j, 4) == 8u);  // 2^(b-1): zero
  CHECK(decode(c, wire.data(), 12, out.data()) == 0);
  for (float v : out) CHECK(v == 0.0f);

  // channel 1 holds NaN, channel 2 Inf, channel 3 70000 (fp16 Inf): only channel 0 survives.
  std::vector<float> x = gaussian(12, 5);
  x[5] = NAN, x[2] = INFINITY, x[11] = 70000.0f;
  CHECK(encode(c, x.data(), 12, wire.data(), PhiloxKey{}, 0).nonfinite == 3);
  CHECK(decode(c, wire.data(), 12, out.data()) == 9);
  for (size_t j = 0; j < 12; ++j) {
    INFO("value " << j);
    CHECK(std::isnan(out[j]) == (j % 4 != 0));
  }
  // A scale of Inf, which no encoder writes (a malformed payload): its channel decodes to NaN and is
  // counted, as a NaN scale's (it decoded to NaN and Inf, uncounted).
  x = gaussian(12, 6);
  CHECK(encode(c, x.data(), 12, wire.data(), PhiloxKey{}, 0).nonfinite == 0);
  wire[2 * 2] = 0x00, wire[2 * 2 + 1] = 0x7C;  // channel 2's scale: +Inf
  std::vector<float> acc(12, 1.0f);
  CHECK(decode(c, wire.data(), 12, out.data()) == 3);
  CHECK(decode_accumulate(c, wire.data(), 12, acc.data()) == 3);
  for (size_t j = 0; j < 12; ++j) {
    INFO("value " << j);
    CHECK(std::isnan(out[j]) == (j % 4 == 2));
    CHECK(std::isnan(acc[j]) == (j % 4 == 2));
  }
  // 65504 is float16's largest: still a scale.
  x = {65504.0f, 1.0f, -65504.0f, 2.0f};
  const CodecConfig one = parse_codec_spec("aq8");
  std::vector<uint8_t> w1(one.encoded_bytes(4));
  std::vector<float> o1(4);
  CHECK(encode(one, x.data(), 4, w1.data(), PhiloxKey{}, 0).nonfinite == 0);
  CHECK(decode(one, w1.data(), 4, o1.data()) == 0);
  CHECK(o1[2] == -65504.0f);
  CHECK(o1[0] == 65504.0f * 127 / 128);  // the top clip
}

// Blocks of rows are independent: a run cut at multiples of rows * channels encodes to the
// concatenation of its pieces' encodings (stochastic rounding keyed by the index in the whole run).
TEST_CASE("aq: blocks of rows encode independently, whatever the cut", "[aq]") {
  const CodecConfig c = parse_codec_spec("aq3:channels=10,rows=3,round=stochastic,seed=9");
  const size_t n = 30 * 7 + 17;
  const std::vector<float> x = gaussian(n, 77);
  const PhiloxKey key{9, 4, 1, 0};
  std::vector<uint8_t> whole(c.encoded_bytes(n));
  encode(c, x.data(), n, whole.data(), key, 0);
  std::vector<uint8_t> pieces;
  for (size_t at = 0; at < n; at += 60) {
    const size_t m = std::min<size_t>(60, n - at);
    std::vector<uint8_t> part(c.encoded_bytes(m));
    encode(c, x.data() + at, m, part.data(), key, at);
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  CHECK(pieces == whole);
  std::vector<float> acc = gaussian(n, 78), plain(n), want(acc);
  decode(c, whole.data(), n, plain.data());
  for (size_t i = 0; i < n; ++i) want[i] += plain[i];
  decode_accumulate(c, whole.data(), n, acc.data());
  CHECK(std::memcmp(acc.data(), want.data(), n * 4) == 0);
}

// P8: for values strictly inside the grid, the mean of N stochastic decodes is within 4 sigma of x,
// sigma = step / (2 sqrt N) (a value's rounding is a Bernoulli of variance <= step^2 / 4); the empirical
// variance is at most step^2 / 4. The top clip is biased, and the test sees it.
TEST_CASE("aq: stochastic rounding is unbiased inside the grid; the top clip is not (P8)", "[aq]") {
  const int kDraws = 4000;
  // At scale 1, and at 1e-5, a channel the reference's divisor fp16(s + 1e-6) shrank by 9%.
  for (float scale : {1.0f, 1e-5f})
  for (int bits : {2, 4, 8}) {
    const CodecConfig c = parse_codec_spec("aq" + std::to_string(bits) + ":round=stochastic,seed=21");
    // The block's scale comes from x[0]; the others sit inside the grid, one near the top clip.
    std::vector<float> x = {1.0f, 0.3337f, -0.71f, 0.05f, -0.999f, 0.0f, 1.0f - std::ldexp(1.0f, -bits)};
    for (float& v : x) v *= scale;
    const size_t n = x.size();
    const double step = std::ldexp(static_cast<double>(fp16_up(x[0])), 1 - bits);  // s / 2^F
    std::vector<double> sum(n, 0.0), sq(n, 0.0);
    std::vector<uint8_t> wire(c.encoded_bytes(n));
    std::vector<float> y(n);
    for (int t = 0; t < kDraws; ++t) {
      encode(c, x.data(), n, wire.data(), PhiloxKey{21, static_cast<uint64_t>(t), 0, 0}, 0);
      decode(c, wire.data(), n, y.data());
      for (size_t i = 0; i < n; ++i) sum[i] += y[i], sq[i] += static_cast<double>(y[i]) * y[i];
    }
    const double sigma = step / (2 * std::sqrt(static_cast<double>(kDraws)));
    for (size_t i = 1; i + 1 < n; ++i) {
      const double mean = sum[i] / kDraws, var = sq[i] / kDraws - mean * mean;
      INFO("scale " << scale << " bits " << bits << " x " << x[i] << " mean " << mean);
      CHECK(std::fabs(mean - x[i]) <= 4 * sigma);
      CHECK(var <= step * step / 4 * 1.05);  // 5%: the variance's own sampling error at N = 4000
    }
    // x = 1 (and 1 - step/2) above the top level 1 - step: clipped, biased by far more than 4 sigma.
    CHECK(x[0] - sum[0] / kDraws > 100 * sigma);
  }
}

// The theorem's c_Q = E||x - Q(x)|| / ||x|| < sqrt(1/2) for Gaussian vectors (one scale), at the
// widths that meet it with stochastic rounding (b >= 3; at b = 2 it is about 0.65, too near).
TEST_CASE("aq: c_Q below sqrt(1/2) on Gaussian vectors for b >= 3", "[aq]") {
  for (int bits = 3; bits <= 8; ++bits) {
    const CodecConfig c = parse_codec_spec("aq" + std::to_string(bits) + ":round=stochastic");
    double ratio = 0;
    const int kVectors = 20;
    for (int t = 0; t < kVectors; ++t) {
      const std::vector<float> x = gaussian(1000, 300 + t);
      std::vector<uint8_t> wire(c.encoded_bytes(x.size()));
      std::vector<float> y(x.size());
      encode(c, x.data(), x.size(), wire.data(), PhiloxKey{0, static_cast<uint64_t>(t), 0, 0}, 0);
      decode(c, wire.data(), x.size(), y.data());
      double err = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) err += (x[i] - y[i]) * (x[i] - y[i]), norm += x[i] * x[i];
      ratio += std::sqrt(err / norm) / kVectors;
    }
    INFO("bits " << bits << " c_Q " << ratio);
    CHECK(ratio < std::sqrt(0.5));
    CHECK(ratio > std::ldexp(0.5, -bits));  // and it is a real error, not zero
  }
}

}  // namespace
}  // namespace qccl::kernels
