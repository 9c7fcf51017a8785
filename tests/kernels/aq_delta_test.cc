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

  // A message whose scale is Inf (no encoder writes one: a malformed payload) commits nothing either.
  x[9] = x[20] = 0.5f;
  REQUIRE(aq_delta_send(c, x.data(), n, DataType::kFloat16, m.data(), wire.data(), PhiloxKey{}, 0) == 0);
  wire[2 * 3] = 0x00, wire[2 * 3 + 1] = 0xFC;  // channel 3's scale: -Inf
  const std::vector<uint8_t> receiver_before = mr;
  CHECK(aq_delta_receive(c, wire.data(), n, DataType::kFloat16, mr.data(), out.data()) == 4);
  CHECK(mr == receiver_before);
  for (size_t i = 0; i < n; ++i) CHECK(std::isnan(out[i]) == (i % 8 == 3));
}

// The fused launchers against the arithmetic they fuse, composed from the codec's launchers: out =
// encode(x - float(m)), then float(m) + decode(out) rounded to m's type; the receiver's x = float(m) +
// decode(in). Bit for bit, contiguous and over rows scattered in memory whose lengths are no multiple
// of the channels or of a code group, for blocks of rows, one channel, stochastic rounding, and the
// three store types; with a NaN channel, m untouched on both ends and the receiver's x NaN there.
TEST_CASE("aq delta: the fused launchers give the composed arithmetic's bits, over scattered rows", "[aq_delta]") {
  const char* specs[] = {"aq4:channels=16", "aq3:channels=5,rows=3,round=stochastic,seed=8", "aq2:channels=1",
                         "aq8:channels=13,round=stochastic,seed=2", "aq4:channels=1600"};
  for (const char* spec : specs) {
    for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32}) {
      for (bool with_nan : {false, true}) {
        const CodecConfig c = parse_codec_spec(spec);
        const size_t row = c.channels == 1600 ? 3200 : 37, nrows = c.channels == 1600 ? 3 : 7, n = row * nrows;
        const size_t es = element_size(t);
        INFO(spec << ", " << data_type_name(t) << (with_nan ? ", a NaN" : ""));
        std::mt19937_64 rng(17);
        std::vector<float> x = gaussian(n, rng), m_float = gaussian(n, rng, 0.9f);
        if (with_nan) x[n / 2] = NAN;
        std::vector<uint8_t> m(n * es);
        store_float(t, m_float.data(), m.data(), n);
        const PhiloxKey key{c.seed, 5, 1, 0};
        // The composed reference.
        std::vector<float> last(n), delta(n);
        load_float(t, m.data(), last.data(), n);
        for (size_t i = 0; i < n; ++i) delta[i] = x[i] - last[i];
        std::vector<uint8_t> wire_ref(c.encoded_bytes(n)), m_ref = m;
        const size_t bad_ref = encode(c, delta.data(), n, wire_ref.data(), key, 11).nonfinite;
        REQUIRE(bad_ref == (with_nan ? 1u : 0u));
        std::vector<float> x_ref(n);
        load_float(t, m.data(), x_ref.data(), n);
        decode_accumulate(c, wire_ref.data(), n, x_ref.data());
        if (!bad_ref) store_float(t, x_ref.data(), m_ref.data(), n);
        // Contiguous.
        std::vector<uint8_t> wire(c.encoded_bytes(n)), m_send = m, m_recv = m;
        std::vector<float> got(n);
        CHECK(aq_delta_send(c, x.data(), n, t, m_send.data(), wire.data(), key, 11) == bad_ref);
        CHECK(wire == wire_ref);
        CHECK(m_send == m_ref);
        const size_t nan_values = aq_delta_receive(c, wire.data(), n, t, m_recv.data(), got.data());
        CHECK((nan_values > 0) == with_nan);
        CHECK(m_recv == m_ref);
        CHECK(std::memcmp(got.data(), x_ref.data(), n * sizeof(float)) == 0);  // NaN bits too
        // Scattered: each row its own allocation, m read from one place and written to another.
        std::vector<std::vector<float>> x_rows(nrows), out_rows(nrows, std::vector<float>(row));
        std::vector<std::vector<uint8_t>> m_rows(nrows), m_new(nrows, std::vector<uint8_t>(row * es, 0xEE));
        std::vector<const float*> xp(nrows);
        std::vector<float*> outp(nrows);
        std::vector<const void*> mp(nrows);
        std::vector<void*> mnp(nrows);
        for (size_t r = 0; r < nrows; ++r) {
          x_rows[r].assign(x.begin() + long(r * row), x.begin() + long((r + 1) * row));
          m_rows[r].assign(m.begin() + long(r * row * es), m.begin() + long((r + 1) * row * es));
          xp[r] = x_rows[r].data(), outp[r] = out_rows[r].data(), mp[r] = m_rows[r].data(), mnp[r] = m_new[r].data();
        }
        const AqDeltaRows rows{nrows, row, t, mp.data(), mnp.data()};
        std::vector<uint8_t> wire_rows(c.encoded_bytes(n));
        CHECK(aq_delta_send_rows(c, xp.data(), rows, wire_rows.data(), key, 11) == bad_ref);
        CHECK(wire_rows == wire_ref);
        for (size_t r = 0; r < nrows; ++r) {
          INFO("row " << r);
          const std::vector<uint8_t> want = bad_ref ? std::vector<uint8_t>(row * es, 0xEE)  // untouched
                                                    : std::vector<uint8_t>(m_ref.begin() + long(r * row * es),
                                                                           m_ref.begin() + long((r + 1) * row * es));
          CHECK(m_new[r] == want);
          m_new[r].assign(row * es, 0xEE);
        }
        CHECK((aq_delta_receive_rows(c, wire_ref.data(), rows, outp.data()) > 0) == with_nan);
        for (size_t r = 0; r < nrows; ++r) {
          INFO("row " << r);
          if (!bad_ref) {
            CHECK(std::memcmp(out_rows[r].data(), x_ref.data() + r * row, row * sizeof(float)) == 0);
            CHECK(std::memcmp(m_new[r].data(), m_ref.data() + r * row * es, row * es) == 0);
          } else {  // nothing written
            CHECK(out_rows[r] == std::vector<float>(row, 0.0f));
            CHECK(m_new[r] == std::vector<uint8_t>(row * es, 0xEE));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qccl::kernels
