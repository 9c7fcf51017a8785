// Marsit's sign codec (kernels/sign.h, kernels/marsit.h): the bit layout, the bit-sliced
// Bernoulli(1/k) words against a lane-by-lane comparison of the same random fractions, their
// frequency against a binomial bound, the merge against the paper's form, and the decode with its
// compensation update.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/codec.h"
#include "kernels/marsit.h"
#include "kernels/sign.h"

namespace qccl::kernels {
namespace {

// Lane b of word `word`: the 32-bit fraction U_b whose binary digit d is bit b of random word d (the
// d-th of the 32 words from blocks 8 * word .. 8 * word + 7); the lane is 1 when U_b < threshold.
uint32_t bernoulli_reference(const PhiloxKey& key, uint64_t word, uint32_t threshold) {
  uint32_t digits[32];
  for (int block = 0; block < 8; ++block) {
    const PhiloxBlock r = philox4x32_10(key, word * 8 + block);
    for (int i = 0; i < 4; ++i) digits[block * 4 + i] = r.v[i];
  }
  uint32_t out = 0;
  for (int b = 0; b < 32; ++b) {
    uint32_t u = 0;
    for (int d = 0; d < 32; ++d) u |= ((digits[d] >> b) & 1u) << (31 - d);
    out |= static_cast<uint32_t>(u < threshold) << b;
  }
  return out;
}

TEST_CASE("bernoulli_word is the comparison U < p lane by lane, exactly", "[sign]") {
  const PhiloxKey key{7, 3, 2, 5};
  for (uint32_t k : {2u, 3u, 4u, 5u, 6u, 7u, 8u, 12u, 100u, 65537u}) {
    const uint32_t threshold = bernoulli_threshold(k);
    for (uint64_t word = 0; word < 512; ++word) {
      INFO("k " << k << ", word " << word);
      REQUIRE(bernoulli_word(key, word, threshold) == bernoulli_reference(key, word, threshold));
    }
  }
  CHECK(bernoulli_threshold(2) == 0x80000000u);
  CHECK(bernoulli_threshold(3) == 0x55555555u);
}

TEST_CASE("bernoulli_word's bits are 1 with probability 1/k (5-sigma binomial bound)", "[sign]") {
  const PhiloxKey key{1, 0, 4, 0};
  const uint64_t words = 1 << 15;  // 2^20 bits
  for (uint32_t k : {2u, 3u, 4u, 5u, 7u, 8u, 100u}) {
    double ones = 0;
    for (uint64_t w = 0; w < words; ++w) ones += __builtin_popcount(bernoulli_word(key, w, bernoulli_threshold(k)));
    const double n = 32.0 * words, p = 1.0 / k;
    INFO("k " << k << ": " << ones << " ones of " << n);
    CHECK(std::abs(ones - n * p) <= 5 * std::sqrt(n * p * (1 - p)));
  }
}

TEST_CASE("marsit_merge: agreeing bits pass, k = 1 is the local bits, the paper's form bit for bit", "[sign]") {
  std::mt19937 rng(3);
  const PhiloxKey key{11, 2, 0, 0};
  for (int i = 0; i < 20000; ++i) {
    const uint32_t a = rng(), s = rng(), k = 2 + rng() % 9;
    const uint64_t word = rng();
    const PhiloxKey hop{key.seed, key.step, k, 1};
    const uint32_t out = marsit_merge(a, s, k, hop, word);
    REQUIRE((out & ~(a ^ s)) == (a & s));  // where a and s agree, their bit
    const uint32_t r = bernoulli_word(hop, word, bernoulli_threshold(k));
    const uint32_t v = ~(s ^ r);
    REQUIRE(out == ((a & s) | ((a ^ s) & v)));  // Wu et al. eq. 2
    REQUIRE(marsit_merge(a, s, 1, hop, word) == s);
  }
}

TEST_CASE("pack_signs: bit j % 32 of word j / 32 is u + c > 0; zeros send 0; pads are 0; NaN counted", "[sign]") {
  for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{100}, size_t{1000}}) {
    std::vector<float> u(n), c(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal;
    for (size_t j = 0; j < n; ++j) u[j] = normal(rng), c[j] = 0.5f * normal(rng);
    u[0] = -0.0f, c[0] = 0.0f;
    if (n > 2) u[2] = 1.0f, c[2] = -1.0f;  // the sum is exactly 0: bit 0
    if (n > 5) u[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint32_t> words(sign_words(n), 0xdeadbeef), alone(sign_words(n));
    const size_t nonfinite = pack_signs(u.data(), c.data(), n, words.data());
    pack_signs(u.data(), nullptr, n, alone.data());
    CHECK(nonfinite == (n > 5 ? 1u : 0u));
    for (size_t j = 0; j < 32 * words.size(); ++j) {
      const uint32_t bit = (words[j / 32] >> (j % 32)) & 1u, bit_alone = (alone[j / 32] >> (j % 32)) & 1u;
      INFO("n " << n << ", j " << j);
      REQUIRE(bit == (j < n && u[j] + c[j] > 0.0f ? 1u : 0u));
      REQUIRE(bit_alone == (j < n && u[j] > 0.0f ? 1u : 0u));
    }
  }
}

TEST_CASE("decode_signs: g = eta (2 bit - 1), c += u - g, in place on u", "[sign]") {
  const size_t n = 77;
  std::vector<uint32_t> words = {0x12345678u, 0xffff0000u, 0x0000ffffu};
  std::vector<float> u(n), c(n), g(n);
  for (size_t j = 0; j < n; ++j) u[j] = 0.01f * static_cast<float>(j) - 0.3f, c[j] = 0.001f * static_cast<float>(j);
  std::vector<float> c2 = c, in_place = u;
  decode_signs(words.data(), n, 0.5f, g.data(), c.data(), u.data());
  decode_signs(words.data(), n, 0.5f, in_place.data(), c2.data(), in_place.data());
  for (size_t j = 0; j < n; ++j) {
    const float expect = (words[j / 32] >> (j % 32)) & 1u ? 0.5f : -0.5f;
    REQUIRE(g[j] == expect);
    REQUIRE(c[j] == 0.001f * static_cast<float>(j) + (u[j] - expect));
    REQUIRE(in_place[j] == g[j]);
    REQUIRE(c2[j] == c[j]);
  }
}

TEST_CASE("merge_signs keys word w of a run by first_word + w", "[sign]") {
  std::vector<uint32_t> a(40), s(40), whole(40), tail(25);
  std::mt19937 rng(9);
  for (size_t w = 0; w < 40; ++w) a[w] = rng(), s[w] = rng();
  const PhiloxKey key{5, 1, 3, 2};
  merge_signs(a.data(), s.data(), whole.data(), 40, 3, key, 100);
  merge_signs(a.data() + 15, s.data() + 15, tail.data(), 25, 3, key, 115);
  for (size_t w = 0; w < 40; ++w) REQUIRE(whole[w] == marsit_merge(a[w], s[w], 3, key, 100 + w));
  for (size_t w = 0; w < 25; ++w) REQUIRE(tail[w] == whole[15 + w]);
}

TEST_CASE("merge_signs (vectorized) equals marsit_merge for every k, agreement level and offset", "[sign]") {
  std::mt19937 rng(17);
  // Word offsets around 2^29, where the Philox block index 8 * word carries into its high word.
  for (uint64_t first : {uint64_t{0}, uint64_t{77}, (uint64_t{1} << 29) - 9, uint64_t{1} << 40})
    for (uint32_t k : {1u, 2u, 3u, 5u, 8u, 9u, 64u, 1000u})
      for (double agree : {0.0, 0.5, 0.97, 1.0})
        for (size_t n : {size_t{1}, size_t{31}, size_t{70}, size_t{1029}}) {
          std::vector<uint32_t> a(n), s(n), out(n);
          for (size_t w = 0; w < n; ++w) {
            a[w] = rng();
            uint32_t flip = 0;
            for (int b = 0; b < 32; ++b) flip |= static_cast<uint32_t>(rng() % 1000 >= agree * 1000) << b;
            s[w] = a[w] ^ flip;
          }
          const PhiloxKey key{first + k, 3, k, 1u << 10 | 5};
          merge_signs(a.data(), s.data(), out.data(), n, k, key, first);
          for (size_t w = 0; w < n; ++w) {
            INFO("first " << first << ", k " << k << ", agreement " << agree << ", n " << n << ", word " << w);
            REQUIRE(out[w] == marsit_merge(a[w], s[w], k, key, first + w));
          }
          std::vector<uint32_t> in_place = s;  // out aliasing the local bits, as the executor may
          merge_signs(a.data(), in_place.data(), in_place.data(), n, k, key, first);
          REQUIRE(in_place == out);
        }
}

TEST_CASE("the sign codec through encode/decode: 4 bytes per 32 values, +-eta", "[sign]") {
  const CodecConfig codec = parse_codec_spec("sign:eta_s=0.125");
  CHECK(codec.encoded_bytes(0) == 0);
  CHECK(codec.encoded_bytes(1) == 4);
  CHECK(codec.encoded_bytes(33) == 8);
  CHECK(codec.alignment() == 32);
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, 3.0f, -0.0f};
  uint32_t word = 0;
  encode(codec, x.data(), x.size(), &word, PhiloxKey{}, 0);
  CHECK(word == 0b01001u);
  std::vector<float> out(x.size());
  CHECK(decode(codec, &word, x.size(), out.data()) == 0);
  CHECK(out == std::vector<float>{0.125f, -0.125f, -0.125f, 0.125f, -0.125f});
}

}  // namespace
}  // namespace qccl::kernels
