// AQ-SGD's delta messages (kernels/aq_delta.h) against shared/specs/aqsgd.md §6: the two ends' copies
// of every sample's last message bit-equal after any sequence of full and delta messages, stochastic
// rounding included, for float16, bfloat16 and float32 stores (P4); geometric convergence to a fixed
// activation down to the store's rounding floor (P6); the error of a slowly drifting activation
// bounded by the contraction's fixed point and far below a direct quantization's (P7); and a
// non-finite delta committing nothing on either end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/aq_delta.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/half.h"

namespace qccl::kernels {
namespace {

std::vector<float> gaussian(size_t n, std::mt19937_64& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// P4: random full and delta messages over random keys, each end applying the same messages to its own
// store; after every message both stores hold the same bits for every key.
TEST_CASE("aq delta: both ends' stores stay bit-equal through any sequence of messages (P4)", "[aq_delta]") {
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32}) {
    for (const char* spec : {"aq4:channels=16,round=stochastic,seed=3", "aq2:channels=7,rows=3", "aq8:channels=16"}) {
      const CodecConfig c = parse_codec_spec(spec);
      const size_t rows = 10, channels = c.channels, n = rows * channels, keys = 6;
      std::mt19937_64 rng(42);
      // Each end's store: per key, the last message in type t (raw bytes).
      std::vector<std::vector<uint8_t>> sender_m, receiver_m;
      std::vector<std::vector<float>> truth(keys);
      for (size_t k = 0; k < keys; ++k) {
        truth[k] = gaussian(n, rng);
        sender_m.emplace_back(n * element_size(t)), receiver_m.emplace_back(n * element_size(t));
      }
      std::vector<bool> seen(keys, false);
      std::vector<uint8_t> wire(c.encoded_bytes(n));
      std::vector<float> got(n);
      for (int step = 0; step < 200; ++step) {
        const size_t k = rng() % keys;
        // the activation drifts a little between a sample's visits
        for (float& v : truth[k]) v += 0.05f * std::normal_distribution<float>(0.0f, 1.0f)(rng);
        if (!seen[k] || rng() % 10 == 0) {  // first sight, or a forced full message (warm-up, eviction)
          store_float(t, truth[k].data(), sender_m[k].data(), n);
          std::memcpy(receiver_m[k].data(), sender_m[k].data(), sender_m[k].size());  // the full payload
          seen[k] = true;
        } else {
          REQUIRE(aq_delta_send(c, truth[k].data(), n, t, sender_m[k].data(), wire.data(),
                                PhiloxKey{c.seed, static_cast<uint64_t>(step), 0, 0}, 0) == 0);
          REQUIRE(aq_delta_receive(c, wire.data(), n, t, receiver_m[k].data(), got.data()) == 0);
          // the receiver's output rounds to its store
          std::vector<uint8_t> rounded(n * element_size(t));
          store_float(t, got.data(), rounded.data(), n);
          REQUIRE(rounded == receiver_m[k]);
        }
        INFO(data_type_name(t) << " " << spec << " step " << step << " key " << k);
        for (size_t j = 0; j < keys; ++j) REQUIRE(sender_m[j] == receiver_m[j]);
      }
    }
  }
}

// P6: sending the same activation a again and again, the error contracts by 2^-(b-1) (plus the fp16
// rounding of the scale, 2^-11) per message, down to a floor: half an ulp of max |a| in a float16
// store, the quantizer's 1e-6 guard in a float32 one.
TEST_CASE("aq delta: a fixed activation is reached geometrically, down to the store's floor (P6)", "[aq_delta]") {
  for (int bits : {2, 4, 8}) {
    for (DataType t : {DataType::kFloat16, DataType::kFloat32}) {
      const CodecConfig c = parse_codec_spec("aq" + std::to_string(bits) + ":channels=16");
      const size_t n = 64 * 16;
      std::mt19937_64 rng(7);
      const std::vector<float> a = gaussian(n, rng);
      double top = 0;
      for (float v : a) top = std::max(top, std::fabs(double{v}));
      // floor: half an ulp of max |a| in the store (fp16: 11 significant bits), or for a float32 store
      // the quantizer's own: a channel's delta below about 1e-6 is scaled by fp16(s + 1e-6), the
      // reference's guard, and by a subnormal fp16 s, and contracts no further
      const double floor = t == DataType::kFloat16 ? std::ldexp(1.0, std::ilogb(top) - 11) : 1e-6;
      std::vector<uint8_t> m(n * element_size(t), 0), mr(m), wire(c.encoded_bytes(n));
      std::vector<float> zeros(n, 0.0f), mf(n), out(n);
      store_float(t, zeros.data(), m.data(), n), store_float(t, zeros.data(), mr.data(), n);  // m = 0
      const double c_q = std::ldexp(1.0, 1 - bits) + std::ldexp(1.0, -11);
      double err = top;  // ||a - 0||
      for (int k = 0; k < 40; ++k) {  // enough for b = 2 (a halving per message) to reach the floor
        REQUIRE(aq_delta_send(c, a.data(), n, t, m.data(), wire.data(), PhiloxKey{}, 0) == 0);
        REQUIRE(aq_delta_receive(c, wire.data(), n, t, mr.data(), out.data()) == 0);
        REQUIRE(m == mr);
        load_float(t, m.data(), mf.data(), n);
        double next = 0;
        for (size_t i = 0; i < n; ++i) next = std::max(next, std::fabs(double{a[i]} - mf[i]));
        INFO("bits " << bits << " " << data_type_name(t) << " message " << k << ": " << err << " -> " << next);
        CHECK(next <= c_q * err + floor);
        err = next;
      }
      // converged to the floor (a few store ulps)
      CHECK(err <= 4 * floor + 1e-30);
    }
  }
}

// P7: a_t = a_(t-1) + eps G_t. The delta error satisfies err_t <= c (|Delta_t| + err_(t-1)) (c the
// contraction of one message, |Delta_t| the largest step), so it settles near c / (1 - c) times the
// step, while quantizing a_t directly (DirectQ) errs by about c max |a_t|; the ratio goes to 0 with
// eps.
TEST_CASE("aq delta: a drifting activation's error follows the drift, far below DirectQ's (P7)", "[aq_delta]") {
  const CodecConfig c = parse_codec_spec("aq4:channels=32");
  const size_t n = 128 * 32;
  const double c_q = 0.125 + std::ldexp(1.0, -11);
  for (float eps : {1e-2f, 1e-3f}) {
    std::mt19937_64 rng(11);
    std::vector<float> a = gaussian(n, rng), mf(n), out(n), dq(n);
    std::vector<uint8_t> m(n * 4), mr(n * 4), wire(c.encoded_bytes(n));
    store_float(DataType::kFloat32, a.data(), m.data(), n), store_float(DataType::kFloat32, a.data(), mr.data(), n);
    double delta_err = 0, direct_err = 0, bound = 0;  // m starts at a (a full message)
    for (int t = 0; t < 40; ++t) {
      const std::vector<float> g = gaussian(n, rng);
      double step = 0;
      for (size_t i = 0; i < n; ++i) a[i] += eps * g[i], step = std::max(step, std::fabs(double{eps} * g[i]));
      load_float(DataType::kFloat32, m.data(), mf.data(), n);
      double before = 0;
      for (size_t i = 0; i < n; ++i) before = std::max(before, std::fabs(double{a[i]} - mf[i]));
      REQUIRE(aq_delta_send(c, a.data(), n, DataType::kFloat32, m.data(), wire.data(), PhiloxKey{}, 0) == 0);
      REQUIRE(aq_delta_receive(c, wire.data(), n, DataType::kFloat32, mr.data(), out.data()) == 0);
      REQUIRE(m == mr);
      load_float(DataType::kFloat32, m.data(), mf.data(), n);
      delta_err = 0;
      for (size_t i = 0; i < n; ++i) delta_err = std::max(delta_err, std::fabs(double{a[i]} - mf[i]));
      INFO("eps " << eps << " t " << t);
      CHECK(delta_err <= c_q * before + 1e-6);  // one message contracts what it was sent
      std::vector<uint8_t> dwire(c.encoded_bytes(n));  // DirectQ: the same codec on a_t itself
      encode(c, a.data(), n, dwire.data(), PhiloxKey{}, 0);
      decode(c, dwire.data(), n, dq.data());
      direct_err = 0;
      for (size_t i = 0; i < n; ++i) direct_err = std::max(direct_err, std::fabs(double{a[i]} - dq[i]));
      // P7's recursion, with the float32 store's rounding (half an ulp of |a| < 8) added per message
      bound = c_q * (step + bound) + 0x1p-21;
      CHECK(delta_err <= bound);
    }
    INFO("eps " << eps << ": delta error " << delta_err << ", DirectQ error " << direct_err);
    CHECK(delta_err < (eps < 5e-3f ? 0.01 : 0.1) * direct_err);
  }
}

TEST_CASE("aq delta: a non-finite delta commits nothing on either end", "[aq_delta]") {
  const CodecConfig c = parse_codec_spec("aq4:channels=8");
  const size_t n = 32;
  std::mt19937_64 rng(3);
  std::vector<float> x = gaussian(n, rng), out(n);
  std::vector<uint8_t> m(n * 2), mr(n * 2), wire(c.encoded_bytes(n));
  store_float(DataType::kFloat16, x.data(), m.data(), n), store_float(DataType::kFloat16, x.data(), mr.data(), n);
  const std::vector<uint8_t> before = m;
  x[9] = NAN;                                    // channel 1
  x[20] = 1e6f;                                  // channel 4: a delta beyond fp16's range
  CHECK(aq_delta_send(c, x.data(), n, DataType::kFloat16, m.data(), wire.data(), PhiloxKey{}, 0) == 2);
  CHECK(m == before);
  CHECK(aq_delta_receive(c, wire.data(), n, DataType::kFloat16, mr.data(), out.data()) == 8);  // 2 channels x 4 rows
  CHECK(mr == before);
  for (size_t i = 0; i < n; ++i) CHECK(std::isnan(out[i]) == (i % 8 == 1 || i % 8 == 4));
}

}  // namespace
}  // namespace qccl::kernels
