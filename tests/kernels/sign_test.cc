// Marsit's sign codec (kernels/sign.h, kernels/marsit.h): the bit layout, the bit-sliced
// Bernoulli(1/k) words against a lane-by-lane comparison of the same random fractions, their
// frequency against a binomial bound, the merge against the paper's form, the pack and decode with
// the lazy compensation (c = w - g after a round, bit for bit), and its full-precision-round helpers.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/codec.h"
#include "kernels/marsit.h"
#include "kernels/sign.h"
#include "tests/kernels/hwy_targets.h"

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

// A compensation of n values with a pending round: random stored values, words and eta (some words
// with eta 0, nothing pending), and c, the values it stands for, by the element function.
struct TestCompensation {
  std::vector<float> stored, eta;
  std::vector<uint32_t> words;
  explicit TestCompensation(size_t n, uint32_t seed) : stored(n), eta(sign_words(n)), words(sign_words(n)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (float& v : stored) v = 0.5f * normal(rng);
    for (size_t w = 0; w < words.size(); ++w) words[w] = rng(), eta[w] = w % 3 == 1 ? 0.0f : 0.0625f * (1 + w % 5);
  }
  Compensation view() { return Compensation{stored.data(), words.data(), eta.data()}; }
  float c(size_t j) const {
    return compensation_value(stored[j], words[j / 32], static_cast<unsigned>(j % 32), eta[j / 32]);
  }
};

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_CASE("pack_signs: bit i of the run is w = u + c > 0; stored = w, the old values backed up; NaN counted",
          "[sign]") {
  for_each_target([] {
    for (size_t total : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{100}, size_t{1000}})
      for (size_t first : {size_t{0}, size_t{32}, size_t{64}}) {
        if (first >= total) continue;
        const size_t n = total - first;
        TestCompensation c(total, static_cast<uint32_t>(total + first));
        const TestCompensation before = c;
        std::vector<float> u(n);
        std::mt19937 rng(static_cast<uint32_t>(n));
        std::normal_distribution<float> normal;
        for (float& v : u) v = normal(rng);
        u[0] = -c.c(first);  // w is exactly 0 (bit 0), or -0 + 0
        if (n > 5) u[5] = std::numeric_limits<float>::quiet_NaN();
        if (n > 40) u[40] = std::numeric_limits<float>::infinity();
        std::vector<uint32_t> words(sign_words(n), 0xdeadbeef), alone(sign_words(n));
        std::vector<float> backup(n, -7.0f);
        const Compensation view = c.view();
        const size_t nonfinite = pack_signs(u.data(), &view, first, n, words.data(), backup.data());
        CHECK(nonfinite == (n > 5 ? 1u : 0u) + (n > 40 ? 1u : 0u));
        CHECK(pack_signs(u.data(), nullptr, 0, n, alone.data(), nullptr) == nonfinite);
        for (size_t i = 0; i < 32 * words.size(); ++i) {
          INFO("total " << total << ", first " << first << ", i " << i);
          const uint32_t bit = (words[i / 32] >> (i % 32)) & 1u, bit_alone = (alone[i / 32] >> (i % 32)) & 1u;
          if (i >= n) {  // pads
            REQUIRE(bit == 0u);
            REQUIRE(bit_alone == 0u);
            continue;
          }
          const float w = u[i] + before.c(first + i);
          REQUIRE(bit == (w > 0.0f ? 1u : 0u));
          REQUIRE(bit_alone == (u[i] > 0.0f ? 1u : 0u));
          REQUIRE(same_float(c.stored[first + i], w));
          REQUIRE(same_float(backup[i], before.stored[first + i]));
        }
        for (size_t j = 0; j < first; ++j) REQUIRE(same_float(c.stored[j], before.stored[j]));  // outside the run
        REQUIRE(c.words == before.words);
        REQUIRE(c.eta == before.eta);
      }
  });
}

TEST_CASE("decode_signs: g = eta (2 bit - 1), in place on u; the round recorded, so c = w - g", "[sign]") {
  for_each_target([] {
    const size_t total = 64 + 77;
    const std::vector<uint32_t> words = {0x12345678u, 0xffff0000u, 0x0000ffffu};
    for (bool in_place : {false, true}) {
      TestCompensation c(total, 5);
      std::vector<float> u(77), g(77);
      for (size_t i = 0; i < u.size(); ++i) u[i] = 0.01f * static_cast<float>(i) - 0.3f;
      std::vector<float> w(77);
      for (size_t i = 0; i < w.size(); ++i) w[i] = u[i] + c.c(64 + i);
      const Compensation view = c.view();
      pack_signs(u.data(), &view, 64, u.size(), std::vector<uint32_t>(3).data(), nullptr);
      float* out = in_place ? u.data() : g.data();
      decode_signs(words.data(), u.size(), 0.5f, out, &view, 64);
      for (size_t i = 0; i < u.size(); ++i) {
        INFO("in place " << in_place << ", i " << i);
        const float expect = (words[i / 32] >> (i % 32)) & 1u ? 0.5f : -0.5f;
        REQUIRE(out[i] == expect);
        REQUIRE(same_float(c.c(64 + i), w[i] - expect));  // Marsit Alg. 1 line 10: c <- w - g
      }
      for (size_t k = 0; k < 3; ++k) CHECK((c.words[2 + k] == words[k] && c.eta[2 + k] == 0.5f));
    }
    std::vector<float> g(77);  // without a compensation: g alone
    decode_signs(words.data(), g.size(), 0.25f, g.data(), nullptr, 0);
    for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == ((words[i / 32] >> (i % 32)) & 1u ? 0.25f : -0.25f));
  });
}

TEST_CASE("sign rounds through the lazy compensation equal c <- (u + c) - g step by step", "[sign]") {
  for_each_target([] {
    const size_t n = 1000;
    std::vector<float> c_eager(n, 0.0f), stored(n, 0.0f), eta(sign_words(n), 0.0f), g(n), u(n);
    std::vector<uint32_t> pending(sign_words(n), 0), words(sign_words(n));
    const Compensation c{stored.data(), pending.data(), eta.data()};
    std::mt19937 rng(21);
    std::normal_distribution<float> normal;
    for (int round = 0; round < 20; ++round) {
      for (float& v : u) v = 0.01f * normal(rng);
      const float eta_s = round % 4 == 3 ? 0.02f : 0.005f;  // the codec may change between calls
      pack_signs(u.data(), &c, 0, n, words.data(), nullptr);
      for (uint32_t& w : words) w ^= rng();  // what the network round might return
      decode_signs(words.data(), n, eta_s, g.data(), &c, 0);
      std::vector<float> lazy(n);
      add_compensation(nullptr, c, 0, n, lazy.data());
      for (size_t j = 0; j < n; ++j) {
        c_eager[j] = (u[j] + c_eager[j]) - g[j];
        INFO("round " << round << ", value " << j);
        REQUIRE(same_float(lazy[j], c_eager[j]));
      }
    }
  });
}

TEST_CASE("add_compensation and reset_compensation from any first value", "[sign]") {
  for_each_target([] {
    for (size_t first : {size_t{0}, size_t{5}, size_t{32}, size_t{37}})
      for (size_t n : {size_t{1}, size_t{27}, size_t{31}, size_t{64}, size_t{100}, size_t{333}}) {
        INFO("first " << first << ", n " << n);
        const size_t total = first + n + 40;
        TestCompensation c(total, static_cast<uint32_t>(first * 1000 + n));
        const TestCompensation before = c;
        std::vector<float> x(n), w(n), c_alone(n);
        for (size_t i = 0; i < n; ++i) x[i] = 0.1f * static_cast<float>(i) - 3.0f;
        add_compensation(x.data(), c.view(), first, n, w.data());
        add_compensation(nullptr, c.view(), first, n, c_alone.data());
        std::vector<float> in_place = x;
        add_compensation(in_place.data(), c.view(), first, n, in_place.data());
        for (size_t i = 0; i < n; ++i) {
          REQUIRE(same_float(w[i], x[i] + before.c(first + i)));
          REQUIRE(same_float(c_alone[i], before.c(first + i)));
          REQUIRE(same_float(in_place[i], w[i]));
        }
        std::vector<float> g(n, 1.0f);
        g[0] = std::numeric_limits<float>::quiet_NaN();
        if (n > 30) g[30] = -std::numeric_limits<float>::infinity();
        CHECK(reset_compensation(g.data(), c.view(), first, n) == (n > 30 ? 2u : 1u));
        for (size_t j = 0; j < total; ++j) {
          INFO("value " << j);
          const bool inside = j >= first && j < first + n;
          if (inside && std::isfinite(g[j - first])) REQUIRE(c.c(j) == 0.0f);
          else REQUIRE(same_float(c.c(j), before.c(j)));  // kept where g is not finite, and outside
        }
        REQUIRE(c.words == before.words);
        REQUIRE(c.eta == before.eta);
      }
  });
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
