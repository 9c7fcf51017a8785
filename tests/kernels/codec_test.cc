// kernels/codec: the spec grammar, the wire size, Philox against Random123's known answers, the
// numerical promise of quant.h (error bound, clamped codes, unbiased stochastic rounding with the
// variance of Lemma 15), determinism and chunking invariance, NaN/Inf reporting, and the vectorised
// launchers of every Highway target against a plain scalar loop over the element functions (qsdp.md
// §4 P1-P4, P6, P7, P13). Fixed seeds throughout; every bound is derived next to its check.
#include "kernels/codec.h"
#include "kernels/convert.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/half.h"
#include "kernels/philox.h"
#include "kernels/quant.h"
#include "kernels/reduce.h"
#include "tests/kernels/hwy_targets.h"

namespace qccl::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

CodecConfig spec(const std::string& s) { return parse_codec_spec(s); }

PhiloxKey key_of(uint64_t seed, uint64_t step, uint32_t rank = 0, uint32_t stream = 0) {
  PhiloxKey k;
  k.seed = seed, k.step = step, k.rank = rank, k.stream = stream;
  return k;
}

bool same_bits(float a, float b) { return float_to_bits(a) == float_to_bits(b); }

// ---- The reference: the launcher loop written plainly over the element functions -------------------

// The bucket range the launchers promise: IEEE order with -0 below +0 (order-independent bits).
bool before(float a, float b) { return a < b || (a == b && std::signbit(a) && !std::signbit(b)); }

BucketMeta reference_meta(const float* x, size_t len, int bits) {
  float lo = x[0], hi = x[0];
  bool finite = true;
  for (size_t i = 0; i < len; ++i) {
    finite &= std::isfinite(x[i]);
    if (before(x[i], lo)) lo = x[i];
    if (before(hi, x[i])) hi = x[i];
  }
  // The launcher also sends a bucket as non-finite when its top code would decode to Inf.
  const BucketMeta m = bucket_meta(lo, hi, finite, bits);
  return std::isfinite(dequantize(quant_levels(bits), m)) ? m : bucket_meta(lo, hi, false, bits);
}

Bytes reference_encode(const CodecConfig& c, const std::vector<float>& in, const PhiloxKey& key, uint64_t first,
                       size_t* nonfinite) {
  const size_t n = in.size();
  Bytes out(c.encoded_bytes(n));
  *nonfinite = 0;
  if (c.kind == CodecKind::kNone) {
    if (n) memcpy(out.data(), in.data(), 4 * n);
    for (float x : in) *nonfinite += std::isfinite(x) ? 0 : 1;
    return out;
  }
  if (c.kind != CodecKind::kQuant) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = c.kind == CodecKind::kFp16 ? float_to_half(in[i]) : float_to_bf16(in[i]);
      memcpy(out.data() + 2 * i, &h, 2);
      *nonfinite += std::isfinite(c.kind == CodecKind::kFp16 ? half_to_float(h) : bf16_to_float(h)) ? 0 : 1;
    }
    return out;
  }
  uint8_t* codes = out.data() + quant_meta_bytes(n, c.bucket);
  for (size_t b0 = 0, k = 0; b0 < n; b0 += c.bucket, ++k) {
    const size_t len = std::min<size_t>(c.bucket, n - b0);
    const BucketMeta m = reference_meta(in.data() + b0, len, c.bits);
    memcpy(out.data() + 8 * k, &m, 8);
    *nonfinite += meta_is_nonfinite(m) ? 1 : 0;
    for (size_t g = 0; g < len; g += 8) {
      uint32_t group[8] = {};
      for (size_t i = 0; i < 8 && g + i < len; ++i) {
        const float u = c.rounding == Rounding::kStochastic ? philox_uniform(key, first + b0 + g + i)
                        : c.rounding == Rounding::kShift     ? philox_uniform(key, first + b0)  // the bucket's one
                                                             : 0.5f;
        group[i] = quantize(in[b0 + g + i], m, u, quant_levels(c.bits));
      }
      pack8(group, c.bits, codes + (b0 + g) / 8 * c.bits);
    }
  }
  return out;
}

// The decoded values (accumulate: added to out) and how many are not finite.
size_t reference_decode(const CodecConfig& c, const Bytes& in, size_t n, float* out, bool accumulate) {
  size_t nonfinite = 0;
  auto put = [&](size_t i, float v) {
    nonfinite += std::isfinite(v) ? 0 : 1;
    out[i] = accumulate ? out[i] + v : v;
  };
  if (c.kind != CodecKind::kQuant) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      float v;
      if (c.kind == CodecKind::kNone) {
        memcpy(&v, in.data() + 4 * i, 4);
      } else {
        memcpy(&h, in.data() + 2 * i, 2);
        v = c.kind == CodecKind::kFp16 ? half_to_float(h) : bf16_to_float(h);
      }
      put(i, v);
    }
    return nonfinite;
  }
  const uint8_t* codes = in.data() + quant_meta_bytes(n, c.bucket);
  for (size_t b0 = 0, k = 0; b0 < n; b0 += c.bucket, ++k) {
    BucketMeta m;
    memcpy(&m, in.data() + 8 * k, 8);
    for (size_t g = 0; b0 + g < std::min<size_t>(n, b0 + c.bucket); g += 8) {
      uint32_t group[8];
      unpack8(codes + (b0 + g) / 8 * c.bits, c.bits, group);
      for (size_t i = 0; i < 8 && g + i < c.bucket && b0 + g + i < n; ++i) put(b0 + g + i, dequantize(group[i], m));
    }
  }
  return nonfinite;
}

// ---- Through the library --------------------------------------------------------------------------

Bytes encode_bytes(const CodecConfig& c, const std::vector<float>& in, const PhiloxKey& key, uint64_t first,
                   size_t* nonfinite = nullptr) {
  Bytes out(c.encoded_bytes(in.size()));
  const EncodeReport r = encode(c, in.data(), in.size(), out.data(), key, first);
  if (nonfinite) *nonfinite = r.nonfinite;
  return out;
}

std::vector<float> decode_values(const CodecConfig& c, const Bytes& in, size_t n, size_t* nonfinite = nullptr) {
  std::vector<float> out(n);
  const size_t bad = decode(c, in.data(), n, out.data());
  if (nonfinite) *nonfinite = bad;
  return out;
}

BucketMeta meta_of(const Bytes& encoded, size_t k) {
  BucketMeta m;
  memcpy(&m, encoded.data() + 8 * k, 8);
  return m;
}

// ---- Inputs ---------------------------------------------------------------------------------------

std::vector<float> gaussian(size_t n, double scale, uint64_t seed, bool mixed_signs = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(scale * (mixed_signs ? normal(rng) : std::fabs(normal(rng)) + 0.5));
  return x;
}

// Finite floats of every exponent in [2^-60, 2^60), both signs, with exact ties, zeros of both signs,
// constant runs and (optionally) subnormals mixed in: the inputs that stress rounding and the bucket
// range.
std::vector<float> awkward(size_t n, uint64_t seed, bool subnormals = true) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    switch (r % 10) {
      case 0:
        x[i] = (r >> 8) & 1 ? 0.0f : -0.0f;
        break;
      case 1:
        x[i] = i ? x[i - 1] : 1.0f;
        break;  // runs of equal values
      case 2:
        x[i] = static_cast<float>(static_cast<int>(r >> 40) % 511) * 0.5f;
        break;  // ties
      case 3:
        if (subnormals) {
          x[i] = bits_to_float(static_cast<uint32_t>(r >> 20) & 0x807FFFFFu);
          break;
        }
        [[fallthrough]];
      default: {
        const float unit = static_cast<float>(static_cast<double>(r >> 40) * 0x1p-24) * 2.0f - 1.0f;
        x[i] = std::ldexp(unit, static_cast<int>((r >> 8) % 121) - 60);
      }
    }
  }
  return x;
}

// Random bit patterns: every exponent, NaN payloads of both signs, Inf, subnormals.
std::vector<float> any_bits(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = bits_to_float(static_cast<uint32_t>(rng()));
  return x;
}

// quant.h's e: float32 rounding in quantize and dequantize, and a subnormal (or underflowed) step.
double rounding_slack(double step, double lo, double hi, int bits) {
  return 0x1p-13 * step + 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + std::ldexp(1.0, bits - 149);
}

// ---- Philox -------------------------------------------------------------------------------------

// Random123's kat_vectors for philox4x32_10. philox.h's counter is (block low, block high, step low,
// rank ^ stream << 20 ^ step high) and its key (seed low, seed high), so each vector is a PhiloxKey.
TEST_CASE("philox4x32_10 matches Random123's known answers", "[codec][philox]") {
  struct Kat {
    PhiloxKey key;
    uint64_t block;
    uint32_t expect[4];
  };
  const Kat kats[] = {
      {key_of(0, 0), 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {key_of(~0ull, ~0ull), ~0ull, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {key_of(0x299f31d0a4093822ull, 0x13198a2eull, 0x03707344u),
       0x85a308d3243f6a88ull,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const PhiloxBlock r = philox4x32_10(k.key, k.block);
    for (int w = 0; w < 4; ++w) {
      INFO("block " << k.block << " word " << w);
      CHECK(r.v[w] == k.expect[w]);
    }
  }
  // Element i draws word i % 4 of block i / 4.
  for (int w = 0; w < 4; ++w) CHECK(philox_uniform(kats[0].key, w) == uniform_from_bits(kats[0].expect[w]));
}

TEST_CASE("uniform_from_bits stays in [0, 1)", "[codec][philox]") {
  CHECK(uniform_from_bits(0xFFFFFFFFu) < 1.0f);
  CHECK(uniform_from_bits(0xFFFFFFFFu) == 1.0f - 0x1p-24f);
  CHECK(uniform_from_bits(0) == 0.0f);
  CHECK(uniform_from_bits(0x00000100u) == 0x1p-24f);
}

// ---- Spec grammar -----------------------------------------------------------------------------------

std::string error_of(const std::string& s) {
  try {
    parse_codec_spec(s);
  } catch (const CodecSpecError& e) {
    return e.what();
  }
  return "(parsed without error)";
}

TEST_CASE("codec specs parse with their defaults and round-trip through canonical()", "[codec][spec]") {
  CHECK((spec("none").kind == CodecKind::kNone && spec("none").bits == 32 && spec("none").alignment() == 1));
  CHECK((spec("fp16").kind == CodecKind::kFp16 && spec("fp16").bits == 16));
  CHECK((spec("bf16").kind == CodecKind::kBf16 && spec("bf16").bits == 16));
  for (int b = 1; b <= 8; ++b) {
    const CodecConfig c = spec("q" + std::to_string(b));
    INFO("q" << b);
    CHECK((c.kind == CodecKind::kQuant && c.bits == b && c.bucket == 512 && c.alignment() == 512));
    CHECK((c.rounding == Rounding::kNearest && !c.error_feedback && c.seed == 0));
  }
  CHECK(spec("q4").canonical() == "q4:bucket=512,round=nearest,ef=off,seed=0");
  CHECK(spec("fp16:ef=on").canonical() == "fp16:ef=on");
  const CodecConfig full = spec("q3:seed=18446744073709551615,ef=on,round=stochastic,bucket=24");
  CHECK(full.bucket == 24);
  CHECK(full.rounding == Rounding::kStochastic);
  CHECK(full.error_feedback);
  CHECK(full.seed == ~0ull);
  CHECK(full.alignment() == 24);

  const CodecConfig sign = spec("sign:eta_s=0.01");
  CHECK((sign.kind == CodecKind::kSign && sign.bits == 1 && sign.period == 100 && sign.torus_rows == 0));
  CHECK(sign.eta == 0.01f);
  CHECK(sign.canonical() == "sign:eta_s=0.00999999978,k=100,topology=ring,seed=0");
  const CodecConfig torus = spec("sign:topology=torus:2x4,k=0,seed=3,eta_s=1e-3");
  CHECK((torus.torus_rows == 2 && torus.torus_cols == 4 && torus.period == 0 && torus.seed == 3));
  CHECK(!torus.full_precision_round(0));
  CHECK((sign.full_precision_round(0) && !sign.full_precision_round(1) && sign.full_precision_round(200)));

  for (int b : {8, 16, 32}) {
    const CodecConfig c = spec("int" + std::to_string(b));
    INFO("int" << b);
    CHECK((c.kind == CodecKind::kInt && c.bits == b && c.alignment() == 1 && c.encoded_bytes(1001) == 1001u * b / 8));
    CHECK((c.rounding == Rounding::kStochastic && c.alpha_mode == IntAlpha::kGrad && c.alpha0 == 0));
    CHECK((c.beta == 0.9 && c.eps == 1e-8 && c.seed == 0));
  }
  CHECK(spec("int8").canonical() == "int8:round=stochastic,alpha=grad,beta=0.9,eps=1e-08,seed=0");
  const CodecConfig fixed = spec("int32:alpha=256.5,round=nearest,seed=4");
  CHECK((fixed.alpha_mode == IntAlpha::kFixed && fixed.alpha == 256.5 && fixed.rounding == Rounding::kNearest));
  const CodecConfig lr = spec("int16:alpha=lr,beta=0,eps=1e-6,alpha0=100");
  CHECK((lr.alpha_mode == IntAlpha::kLr && lr.beta == 0 && lr.eps == 1e-6 && lr.alpha0 == 100));

  // canonical() spells every field that the codec uses, so equal text means an equal codec.
  // clang-format off
  const char* const specs[] = {"none", "none:ef=on", "fp16", "bf16", "bf16:ef=on", "q1", "q8", "q8:ef=on",
                               "q8:seed=1", "q8:seed=2", "q8:bucket=1024", "q8:round=stochastic",
                               "q3:seed=18446744073709551615,ef=on,round=stochastic,bucket=24",
                               "sign:eta_s=0.01", "sign:eta_s=0.02", "sign:eta_s=0.01,k=0", "sign:eta_s=0.01,seed=1",
                               "sign:eta_s=0.01,topology=torus:2x4", "sign:eta_s=0.01,topology=torus:4x2",
                               "int8", "int16", "int32", "int8:round=nearest", "int8:alpha=lr", "int8:alpha=2",
                               "int8:alpha=3", "int8:alpha0=50", "int8:beta=0.5", "int8:eps=1e-4", "int8:seed=9"};
  // clang-format on
  std::vector<uint64_t> hashes;
  for (const char* s : specs) {
    INFO(s);
    const CodecConfig c = spec(s);
    CHECK(spec(c.canonical()).canonical() == c.canonical());
    CHECK(spec(c.canonical()).hash() == c.hash());
    CHECK(c.hash() != 0);
    hashes.push_back(c.hash());
  }
  std::sort(hashes.begin(), hashes.end());
  CHECK(std::adjacent_find(hashes.begin(), hashes.end()) == hashes.end());  // different specs, different hashes
}

TEST_CASE("codec spec errors name the bad token", "[codec][spec]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of("q9"), Contains("'q9'"));
  CHECK_THAT(error_of("q0"), Contains("'q0'"));
  CHECK_THAT(error_of("int4"), Contains("'int4'"));
  CHECK_THAT(error_of("int8:alpha=0"), Contains("alpha=0"));
  CHECK_THAT(error_of("int8:alpha=-2"), Contains("alpha=-2"));
  CHECK_THAT(error_of("int8:alpha=1e39"), Contains("alpha=1e39"));
  // 0 in float32: every output was 0/0, and alpha0's the same; eps^2 infinite made alpha 0.
  CHECK_THAT(error_of("int8:alpha=1e-46"), Contains("'alpha=1e-46': alpha must be a positive normal float32"));
  CHECK_THAT(error_of("int8:alpha0=1e-300"), Contains("'alpha0=1e-300': alpha0 must be a positive normal"));
  CHECK_THAT(error_of("int8:eps=1e200"), Contains("'eps=1e200': eps must be at most 1e150"));
  CHECK(spec("int8:beta=0.0").beta == 0.0);  // 0 is in beta's range however it is written
  CHECK_THAT(error_of("q1:ef=on,round=stochastic"), Contains("q1 with ef=on") && Contains("diverges"));
  CHECK_THAT(error_of("int8:alpha=fast"), Contains("alpha=fast"));
  CHECK_THAT(error_of("int8:beta=1"), Contains("beta=1"));
  CHECK_THAT(error_of("int8:beta=-0.5"), Contains("beta=-0.5"));
  CHECK_THAT(error_of("int8:eps=0"), Contains("eps=0"));
  CHECK_THAT(error_of("int8:alpha0=0"), Contains("alpha0=0"));
  CHECK_THAT(error_of("int16:ef=on"), Contains("ef=on"));
  CHECK_THAT(error_of("int32:bucket=64"), Contains("bucket=64"));
  CHECK_THAT(error_of("int32:eta_s=1"), Contains("'eta_s'"));
  CHECK_THAT(error_of("q8x:bucket=8"), Contains("'q8x'"));
  CHECK_THAT(error_of("q8:foo=1"), Contains("'foo'"));
  CHECK_THAT(error_of("q8:bucket"), Contains("'bucket'"));
  CHECK_THAT(error_of("q8:bucket="), Contains("bucket="));
  CHECK_THAT(error_of("q8:bucket=12"), Contains("bucket=12"));
  CHECK_THAT(error_of("q8:bucket=0"), Contains("bucket=0"));
  CHECK_THAT(error_of("fp16:bucket=512"), Contains("bucket=512"));
  CHECK_THAT(error_of("bf16:round=nearest"), Contains("round=nearest"));
  CHECK_THAT(error_of("q8:round=up"), Contains("round=up"));
  // Not the last value silently:
  CHECK_THAT(error_of("q8:bucket=8,bucket=16"), Contains("'bucket=16': key 'bucket' is given twice"));
  CHECK_THAT(error_of("q8:ef=yes"), Contains("ef=yes"));
  CHECK_THAT(error_of("q8:seed=abc"), Contains("seed=abc"));
  CHECK_THAT(error_of("q8:seed=-1"), Contains("seed=-1"));
  CHECK_THAT(error_of("q8:seed=18446744073709551616"), Contains("seed=18446744073709551616"));
  CHECK_THAT(error_of("q8:"), Contains("nothing after ':'"));
  CHECK_THAT(error_of("q8:bucket=64,"), Contains("''"));
  CHECK_THAT(error_of("q8:=5"), Contains("'=5'"));
  CHECK_THAT(error_of("sign"), Contains("eta_s"));
  CHECK_THAT(error_of("sign:k=10"), Contains("eta_s"));
  CHECK_THAT(error_of("sign:eta_s=0"), Contains("eta_s=0"));
  CHECK_THAT(error_of("sign:eta_s=-1"), Contains("eta_s=-1"));
  CHECK_THAT(error_of("sign:eta_s=1e300"), Contains("eta_s=1e300"));
  CHECK_THAT(error_of("sign:eta_s=0.1,k=-1"), Contains("k=-1"));
  CHECK_THAT(error_of("sign:eta_s=0.1,ef=on"), Contains("ef=on"));
  CHECK_THAT(error_of("sign:eta_s=0.1,bucket=64"), Contains("bucket=64"));
  CHECK_THAT(error_of("sign:eta_s=0.1,topology=mesh"), Contains("topology=mesh"));
  CHECK_THAT(error_of("sign:eta_s=0.1,topology=torus:2x0"), Contains("topology=torus:2x0"));
  CHECK_THAT(error_of("sign:eta_s=0.1,topology=torus:2x4x"), Contains("topology=torus:2x4x"));
  CHECK_THAT(error_of("sign:eta_s=0.1,topology=torus:2048x1"), Contains("topology=torus:2048x1"));
}

// ---- Wire size ----------------------------------------------------------------------------------------

TEST_CASE("encoded_bytes is the closed form, and encode writes exactly that many bytes", "[codec][size]") {
  const size_t counts[] = {0, 1, 7, 8, 511, 512, 513, 4096 + 3};
  for (size_t n : counts) {
    INFO("count " << n);
    CHECK(spec("none").encoded_bytes(n) == 4 * n);
    CHECK(spec("fp16").encoded_bytes(n) == 2 * n);
    CHECK(spec("bf16").encoded_bytes(n) == 2 * n);
    for (uint32_t bucket : {8u, 24u, 512u, 1024u}) {
      for (int bits = 1; bits <= 8; ++bits) {
        const CodecConfig c = spec("q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket));
        // ceil(n / B) metas of two float32, and ceil(n / 8) groups of 8 codes in `bits` bytes.
        CHECK(c.encoded_bytes(n) == (n + bucket - 1) / bucket * 8 + (n + 7) / 8 * bits);
      }
    }
  }
  // Every byte of the formula is written (two different fills give the same bytes), none beyond it.
  for (const char* s : {"none", "fp16", "bf16", "q1:bucket=24", "q5:bucket=8", "q8", "q3:round=stochastic"}) {
    const CodecConfig c = spec(s);
    for (size_t n : counts) {
      INFO(s << " count " << n);
      const std::vector<float> x = gaussian(n, 1.0, n);
      Bytes a(c.encoded_bytes(n) + 64, 0xAA), b(c.encoded_bytes(n) + 64, 0x55);
      encode(c, x.data(), n, a.data(), key_of(1, 2), 0);
      encode(c, x.data(), n, b.data(), key_of(1, 2), 0);
      CHECK(std::equal(a.begin(), a.begin() + c.encoded_bytes(n), b.begin()));
      CHECK(std::all_of(a.begin() + c.encoded_bytes(n), a.end(), [](uint8_t v) { return v == 0xAA; }));
      CHECK(std::all_of(b.begin() + c.encoded_bytes(n), b.end(), [](uint8_t v) { return v == 0x55; }));
    }
  }
}

// ---- Every Highway target against the reference ------------------------------------------------------

std::vector<std::string> every_codec() {
  std::vector<std::string> specs = {"none", "fp16", "bf16"};
  for (int bits = 1; bits <= 8; ++bits) {
    for (const char* round : {"nearest", "stochastic", "shift"}) {
      for (const char* bucket : {"8", "24", "512"})
        specs.push_back("q" + std::to_string(bits) + ":bucket=" + bucket + ",round=" + round + ",seed=3");
    }
  }
  return specs;
}

// Encode at `first` from a misaligned input into a misaligned output; decode and decode-accumulate
// from misaligned bytes; everything must equal the reference bit for bit.
void check_against_reference(const CodecConfig& c, const std::vector<float>& x, uint64_t first) {
  const size_t n = x.size();
  const PhiloxKey key = key_of(c.seed, 11, 2, 1);
  size_t expect_bad = 0;
  const Bytes expect = reference_encode(c, x, key, first, &expect_bad);

  std::vector<float> in(n + 1);
  std::copy(x.begin(), x.end(), in.begin() + 1);
  Bytes out(expect.size() + 1);
  const EncodeReport r = encode(c, in.data() + 1, n, out.data() + 1, key, first);
  CHECK(r.nonfinite == expect_bad);
  CHECK(std::equal(expect.begin(), expect.end(), out.begin() + 1));

  std::vector<float> want(n), got(n + 1);
  const size_t want_bad = reference_decode(c, expect, n, want.data(), false);
  CHECK(decode(c, out.data() + 1, n, got.data() + 1) == want_bad);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += same_bits(want[i], got[i + 1]) ? 0 : 1;
  CHECK(differ == 0);

  std::vector<float> acc = gaussian(n, 3.0, n + 1);
  std::vector<float> acc_got(n + 1);
  std::copy(acc.begin(), acc.end(), acc_got.begin() + 1);
  reference_decode(c, expect, n, acc.data(), true);
  CHECK(decode_accumulate(c, out.data() + 1, n, acc_got.data() + 1) == want_bad);
  differ = 0;
  for (size_t i = 0; i < n; ++i) differ += same_bits(acc[i], acc_got[i + 1]) ? 0 : 1;
  CHECK(differ == 0);
}

void check_all_codecs() {
  const size_t counts[] = {1, 7, 8, 9, 31, 64, 255, 256, 257, 511, 512, 513, 1029, 4099};
  // The last first makes the Philox block counter carry from 2^32 - 1 into its high word.
  const uint64_t firsts[] = {0, 3, (uint64_t{1} << 34) - 6};
  for (const std::string& s : every_codec()) {
    const CodecConfig c = spec(s);
    for (size_t n : counts) {
      for (uint64_t first : firsts) {
        INFO(s << " count " << n << " first " << first);
        check_against_reference(c, awkward(n, n * 7 + first), first);
        check_against_reference(c, gaussian(n, 1e-3, n), first);
        check_against_reference(c, any_bits(n, n + first), first);
      }
    }
    // Buckets with NaN, Inf and ranges at the edge of float32, among finite ones.
    std::vector<float> x = gaussian(c.bucket * 5 + 3, 1.0, 5);
    x[1] = NAN;
    x[c.bucket + 2] = -INFINITY;
    x[2 * c.bucket] = 3e38f, x[2 * c.bucket + 1] = -3e38f;
    x[3 * c.bucket] = -std::numeric_limits<float>::max();
    x.back() = INFINITY;
    INFO(s << " with NaN and Inf");
    check_against_reference(c, x, 0);
  }
}

TEST_CASE("every Highway target matches the scalar reference byte for byte", "[codec][hwy]") {
  for_each_target([] { check_all_codecs(); });
}

TEST_CASE("copy_bytes copies every byte, whatever the distance between the buffers modulo 4 KiB", "[convert]") {
  // Both of its paths (the backward one for destinations 1..63 bytes after the source modulo 4 KiB),
  // sizes around the 64-byte blocks and the 4 KiB below which it is memcpy.
  std::vector<unsigned char> src(3 * 4096 + 8192), dst(3 * 4096 + 8192);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t from : {size_t{0}, size_t{4}, size_t{37}})
    for (size_t to : {size_t{0}, size_t{1}, size_t{16}, size_t{63}, size_t{64}, size_t{100}, size_t{4095}})
      for (size_t bytes : {size_t{0}, size_t{5}, size_t{64}, size_t{4095}, size_t{4096}, size_t{4096 + 63}, size_t{3 * 4096 + 1}}) {
        // Place dst so that (dst - src) mod 4096 = to, with src at offset `from` into its buffer.
        const unsigned char* s = src.data() + from;
        const auto base = reinterpret_cast<uintptr_t>(dst.data());
        const uintptr_t want = (reinterpret_cast<uintptr_t>(s) + to) & 4095;
        unsigned char* d = dst.data() + ((want - base) & 4095);
        REQUIRE(d + bytes <= dst.data() + dst.size());
        std::fill(dst.begin(), dst.end(), 0xAB);
        INFO("distance " << to << " bytes " << bytes);
        copy_bytes(d, s, bytes);
        CHECK(std::memcmp(d, s, bytes) == 0);
        // Nothing outside the destination was written.
        CHECK(std::count(dst.begin(), dst.end(), 0xAB) == static_cast<ptrdiff_t>(dst.size() - bytes) +
                                                            std::count(s, s + bytes, 0xAB));
      }
}

// convert.h's conversions go through those casts: the same bits as half.h, and load_add_float adds
// what load_float widens, for the same inputs as above.
TEST_CASE("convert.h's load_float, load_add_float and store_float are half.h's bit for bit", "[convert]") {
  std::vector<float> x = any_bits(1 << 16, 23);
  for (uint32_t h = 0; h < 0x10000; ++h) x.push_back(bits_to_float((h << 13) | 0x38000000u));
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16}) {
    const bool half = t == DataType::kFloat16;
    std::vector<uint16_t> stored(x.size());
    store_float(t, x.data(), stored.data(), x.size());
    std::vector<float> loaded(x.size()), acc(x.size(), 0.75f);
    load_float(t, stored.data(), loaded.data(), x.size());
    load_add_float(t, stored.data(), acc.data(), x.size());
    size_t bad_store = 0, bad_load = 0, bad_add = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float widened = half ? half_to_float(stored[i]) : bf16_to_float(stored[i]);
      bad_store += stored[i] == (half ? float_to_half(x[i]) : float_to_bf16(x[i])) ? 0 : 1;
      bad_load += same_bits(loaded[i], widened) ? 0 : 1;
      bad_add += same_bits(acc[i], 0.75f + widened) ? 0 : 1;
    }
    INFO(data_type_name(t));
    CHECK(bad_store == 0);
    CHECK(bad_load == 0);
    CHECK(bad_add == 0);
  }
}

// Every float16 and bfloat16 value, and float32 inputs that cover every exponent and NaN payload.
TEST_CASE("fp16 and bf16 casts are half.h's bit for bit; none is exact", "[codec][cast]") {
  std::vector<float> x = any_bits(1 << 18, 17);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    x.push_back(half_to_float(static_cast<uint16_t>(h)));
    x.push_back(bf16_to_float(static_cast<uint16_t>(h)));
    x.push_back(bits_to_float((h << 13) | 0x38000000u));  // every float16 rounding case near 1
  }
  for (const char* s : {"fp16", "bf16"}) {
    const CodecConfig c = spec(s);
    const bool half = c.kind == CodecKind::kFp16;
    const Bytes enc = encode_bytes(c, x, PhiloxKey(), 0);
    const std::vector<float> dec = decode_values(c, enc, x.size());
    size_t bad_cast = 0, bad_widen = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t h;
      memcpy(&h, enc.data() + 2 * i, 2);
      bad_cast += h == (half ? float_to_half(x[i]) : float_to_bf16(x[i])) ? 0 : 1;
      bad_widen += same_bits(dec[i], half ? half_to_float(h) : bf16_to_float(h)) ? 0 : 1;
    }
    INFO(s);
    CHECK(bad_cast == 0);
    CHECK(bad_widen == 0);
  }
  const Bytes raw = encode_bytes(spec("none"), x, PhiloxKey(), 0);
  CHECK(memcmp(raw.data(), x.data(), raw.size()) == 0);
  const std::vector<float> back = decode_values(spec("none"), raw, x.size());
  CHECK(memcmp(back.data(), x.data(), raw.size()) == 0);
}

// ---- Numerical promise of quant.h ------------------------------------------------------------------

// Checks every value of an encoded run against quant.h's bound, with the meta recomputed.
void check_bound(const CodecConfig& c, const std::vector<float>& x, const PhiloxKey& key) {
  const Bytes enc = encode_bytes(c, x, key, 0);
  const std::vector<float> y = decode_values(c, enc, x.size());
  const bool stochastic = c.rounding != Rounding::kNearest;  // stochastic or shift: the same bound
  size_t worst_bucket_fails = 0;
  for (size_t b0 = 0, k = 0; b0 < x.size(); b0 += c.bucket, ++k) {
    const size_t len = std::min<size_t>(c.bucket, x.size() - b0);
    const auto [lo_it, hi_it] = std::minmax_element(x.begin() + b0, x.begin() + b0 + len);
    const double lo = *lo_it, hi = *hi_it;
    const BucketMeta m = meta_of(enc, k);
    REQUIRE(m.min == static_cast<float>(lo));
    REQUIRE(m.step == bucket_meta(*lo_it, *hi_it, true, c.bits).step);
    const double s = m.step, e = rounding_slack(s, lo, hi, c.bits);
    size_t fails = 0;
    for (size_t i = b0; i < b0 + len; ++i) {
      const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
      // nearest: |x' - x| <= s/2 + e; stochastic: |x' - x| < s + e; both within [m - e, max + e].
      const bool ok = (stochastic ? err < s + e : err <= s / 2 + e) && y[i] >= lo - e && y[i] <= hi + e;
      if (!ok && fails++ == 0) {
        UNSCOPED_INFO("bucket " << k << " value " << i << ": x " << x[i] << " decoded " << y[i] << " lo " << lo
                                << " hi " << hi << " step " << s);
      }
    }
    worst_bucket_fails = std::max(worst_bucket_fails, fails);
    if (lo == hi) CHECK(std::equal(x.begin() + b0, x.begin() + b0 + len, y.begin() + b0));  // constant: exact
  }
  CHECK(worst_bucket_fails == 0);
}

TEST_CASE("q1..q8 round trips stay within quant.h's proven bound", "[codec][quant]") {
  const size_t counts[] = {1, 7, 8, 100, 511, 513, 4099};
  for (int bits = 1; bits <= 8; ++bits) {
    for (const char* round : {"nearest", "stochastic", "shift"}) {
      for (uint32_t bucket : {8u, 64u, 512u, 1000u}) {
        const CodecConfig c =
            spec("q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket) + ",round=" + round);
        for (size_t n : counts) {
          for (double scale : {1e-30, 1.0, 1e30}) {
            INFO(c.canonical() << " count " << n << " scale " << scale);
            check_bound(c, gaussian(n, scale, n + bits), key_of(9, bits));
            check_bound(c, gaussian(n, scale, n + bits, false), key_of(9, bits));  // one sign, offset
          }
          INFO(c.canonical() << " count " << n);
          std::vector<float> outlier = gaussian(n, 1.0, n);
          outlier[n / 2] = 1e4f;  // one value stretches its bucket's step
          check_bound(c, outlier, key_of(9, bits));
          std::vector<float> constant(n, -2.75f);
          check_bound(c, constant, key_of(9, bits));
          check_bound(c, awkward(n, n), key_of(9, bits));
        }
      }
    }
  }
}

// Steps in float32's subnormal range have only a few significant bits, and a range below
// 255 * 2^-150 gives s = 0: quant.h's absolute term 2^(N-149) is what covers them.
TEST_CASE("buckets with subnormal or underflowing steps stay within the bound", "[codec][quant]") {
  const CodecConfig c = spec("q8:bucket=8");
  for (float hi : {1e-38f, 1e-40f, 1e-44f}) {
    std::vector<float> x(8);
    for (size_t i = 0; i < x.size(); ++i) x[i] = hi * static_cast<float>(i) / 7.0f;
    check_bound(c, x, PhiloxKey());
  }
}

// qsdp.md F3: at x = max, (x - m) / s can exceed 2^N - 1 in float32, and u close to 1 pushes
// floor((x - m) / s + u) to 2^N. The code must still be clamped to 2^N - 1.
TEST_CASE("codes are clamped when rounding pushes them past 2^N - 1", "[codec][quant]") {
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float u_top = 1.0f - 0x1p-24f;  // the largest uniform_from_bits returns
  for (int bits = 1; bits <= 8; ++bits) {
    const uint32_t levels = quant_levels(bits);
    size_t overshoot = 0, pushed = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      float lo = unit(rng) * scale, hi = unit(rng) * scale;
      if (lo > hi) std::swap(lo, hi);
      if (lo == hi) continue;
      const BucketMeta m = bucket_meta(lo, hi, true, bits);
      overshoot += (hi - m.min) / m.step > static_cast<float>(levels) ? 1 : 0;
      pushed += floorf((hi - m.min) / m.step + u_top) > static_cast<float>(levels) ? 1 : 0;
      const double e = rounding_slack(m.step, lo, hi, bits);
      for (float u : {u_top, 1.0f, 0.5f}) {  // 1.0 is never drawn, but a clamp must not care
        const uint32_t code = quantize(hi, m, u, levels);
        REQUIRE(code <= levels);
        REQUIRE(dequantize(code, m) >= lo - e);
        REQUIRE(dequantize(code, m) <= hi + e);
      }
    }
    INFO("bits " << bits << ": (max - m) / s > 2^N - 1 in " << overshoot << " buckets, pushed past in " << pushed);
    // The case the clamp exists for did occur (about 10% of buckets from q3 on). Not for q1, where
    // s = max - m exactly, nor, in these trials, for q2.
    if (bits > 2) CHECK(overshoot > 0);
    CHECK(pushed > 0);
  }
}

// Whole buckets, stochastic: one minimum and 2^20 - 1 values at the maximum, so that about 2^20 *
// 2^-17 draws land where (x - m) / s + u rounds up to 256 in float32. The reference counts them.
// Buckets qualify when (max - m) / s >= 255 in float32; below, no u can reach 256.
TEST_CASE("q8 stochastic encodes of 2^20-value buckets clamp every pushed code", "[codec][quant]") {
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const CodecConfig c = spec("q8:bucket=1048576,round=stochastic");
  std::vector<std::pair<float, float>> ranges;
  while (ranges.size() < 3) {
    float lo = unit(rng) * 1e3f, hi = unit(rng) * 1e3f;
    if (lo > hi) std::swap(lo, hi);
    const BucketMeta m = bucket_meta(lo, hi, true, 8);
    if (lo < hi && (hi - m.min) / m.step >= 255.0f) ranges.emplace_back(lo, hi);
  }
  for (const auto& [lo, hi] : ranges) {
    std::vector<float> x(c.bucket, hi);
    x[0] = lo;
    const PhiloxKey key = key_of(5, 6);
    const BucketMeta m = bucket_meta(lo, hi, true, 8);
    size_t pushed = 0;
    for (size_t i = 1; i < x.size(); ++i)
      pushed += floorf((hi - m.min) / m.step + philox_uniform(key, i)) > 255.0f ? 1 : 0;
    INFO("bucket [" << lo << ", " << hi << "]: " << pushed << " codes pushed past 255 before the clamp");
    CHECK(pushed > 0);
    const std::vector<float> y = decode_values(c, encode_bytes(c, x, key, 0), x.size());
    const double e = rounding_slack(m.step, lo, hi, 8);
    size_t out_of_range = 0;
    for (size_t i = 1; i < x.size(); ++i) out_of_range += (y[i] >= hi - m.step - e && y[i] <= hi + e) ? 0 : 1;
    CHECK(out_of_range == 0);
    CHECK(y[0] == lo);
  }
}

// The first element whose uniform pushes floor(t + u) past `levels` under `key`.
uint64_t first_push(const PhiloxKey& key, float t, uint32_t levels) {
  for (uint64_t b = 0;; ++b) {
    const PhiloxBlock r = philox4x32_10(key, b);
    for (int w = 0; w < 4; ++w)
      if (floorf(t + uniform_from_bits(r.v[w])) > static_cast<float>(levels)) return 4 * b + w;
  }
}

// The same for every width, through encode: put the bucket maximum exactly where Philox draws a u
// that pushes its code to 2^N (for q1 that is only u = 1 - 2^-24, one draw in 2^24), so that a
// missing clamp would spill into the neighbouring code of the packed group.
TEST_CASE("stochastic encodes clamp the code at the bucket maximum for every width", "[codec][quant]") {
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const PhiloxKey key = key_of(12, 34);
  for (int bits = 1; bits <= 8; ++bits) {
    const uint32_t levels = quant_levels(bits);
    // Of some random buckets, the one whose fl((max - m) / s) is largest, so that the push is likeliest.
    float lo = 0, hi = 1, t = 0;
    for (int trial = 0; trial < 1000; ++trial) {
      float a = unit(rng), b = unit(rng);
      if (a > b) std::swap(a, b);
      const BucketMeta m = bucket_meta(a, b, true, bits);
      if (a < b && (b - m.min) / m.step > t) lo = a, hi = b, t = (b - m.min) / m.step;
    }
    REQUIRE(t >= static_cast<float>(levels));
    const uint64_t e = first_push(key, t, levels);
    const CodecConfig c = spec("q" + std::to_string(bits) + ":bucket=8,round=stochastic");
    std::vector<float> x(16, hi);
    x[0] = lo;
    const uint64_t first = e - 1;  // x[1], a maximum, draws the pushing u
    const Bytes enc = encode_bytes(c, x, key, first);
    size_t unused = 0;
    CHECK(enc == reference_encode(c, x, key, first, &unused));
    uint32_t codes[8];
    unpack8(enc.data() + quant_meta_bytes(x.size(), 8), bits, codes);
    INFO("q" << bits << " element " << e << " t " << t);
    CHECK(codes[0] == 0);
    CHECK(codes[1] == levels);
    const std::vector<float> y = decode_values(c, enc, x.size());
    const BucketMeta m = meta_of(enc, 0);
    const double slack = rounding_slack(m.step, lo, hi, bits);
    for (size_t i = 1; i < x.size(); ++i) {
      CHECK(y[i] <= hi + slack);
      CHECK(y[i] >= hi - m.step - slack);
    }
  }
}

// Bounds of the unbiasedness check. One draw x' takes a = fl(m + s c) with probability 1 - p and
// b = fl(m + s (c + 1)) with probability p, where c = floor(t), t = (x - m) / s, f = t - c.
//   - In exact arithmetic p = f and b - a = s: E[x'] = x and Var[x'] = s^2 f (1 - f) (Lemma 15).
//   - In float32, p differs from f by at most delta = 2^-13 (the code boundary moves by < 2^-14
//     codes, and u has a grid of 2^-24) and each decoded point by r = 2^-22 max(|m|, |max|), so
//     |E[x'] - x| <= e (quant.h's slack) and |Var - s^2 f (1 - f)| <= r s + r^2 + s^2 delta (using
//     p(1 - p) <= 1/4 and |p(1 - p) - f(1 - f)| <= |p - f|).
//   - Sampling: the mean of T draws has standard deviation sigma / sqrt(T), sigma^2 = Var; the
//     sample variance has (to leading order) variance (mu4 - sigma^4) / T, and for a two-point
//     variable mu4 - sigma^4 = (b - a)^4 pq (1 - 4 pq), pq = p(1 - p).
// Each check allows 5 standard deviations plus the deterministic terms.
TEST_CASE("stochastic rounding is unbiased with variance s^2 f(1 - f)", "[codec][quant][stats]") {
  constexpr size_t kTrials = 20000;
  constexpr double kDelta = 0x1p-13;
  const double fractions[] = {0.5, 0.25, 0.1, 0.9, 0.01, 0.99, 0.37};
  for (int bits : {1, 2, 4, 8}) {
    const CodecConfig c = spec("q" + std::to_string(bits) + ":bucket=64,round=stochastic,seed=99");
    std::vector<float> x(64, 0.0f);
    x[0] = -0.5f, x[1] = 0.75f;  // the bucket's minimum and maximum
    const BucketMeta m = bucket_meta(-0.5f, 0.75f, true, bits);
    for (size_t j = 0; j < std::size(fractions); ++j) {  // codes spread over [0, 2^N - 2]
      const uint32_t code = static_cast<uint32_t>(j * 37) % quant_levels(bits);
      x[2 + j] = static_cast<float>(m.min + m.step * (code + fractions[j]));
    }
    std::vector<std::vector<double>> draws(std::size(fractions));
    for (size_t trial = 0; trial < kTrials; ++trial) {
      const PhiloxKey key = key_of(c.seed, trial);  // independent counters: the step varies
      const std::vector<float> y = decode_values(c, encode_bytes(c, x, key, 0), x.size());
      for (size_t j = 0; j < draws.size(); ++j) draws[j].push_back(y[2 + j]);
    }
    for (size_t j = 0; j < draws.size(); ++j) {
      const double s = m.step, t = (static_cast<double>(x[2 + j]) - m.min) / s, f = t - std::floor(t);
      const double r = 0x1p-22 * 0.75, e = rounding_slack(s, -0.5, 0.75, c.bits);
      double mean = 0;
      for (double v : draws[j]) mean += v;
      mean /= kTrials;
      double var = 0;
      for (double v : draws[j]) var += (v - mean) * (v - mean);
      var /= kTrials - 1;
      const double sigma = s * std::sqrt(f * (1 - f));
      // max of y(1 - 4y) over pq = y in [f(1-f) - delta, f(1-f) + delta]: at y = 1/8 if inside.
      const double y_lo = std::max(0.0, f * (1 - f) - kDelta), y_hi = std::min(0.25, f * (1 - f) + kDelta);
      const double h =
          (y_lo <= 0.125 && 0.125 <= y_hi) ? 1.0 / 16 : std::max(y_lo * (1 - 4 * y_lo), y_hi * (1 - 4 * y_hi));
      const double var_sd = (s + 2 * r) * (s + 2 * r) * std::sqrt(h / kTrials);
      INFO("q" << bits << " x " << x[2 + j] << " f " << f << " mean " << mean << " var " << var << " expected "
               << sigma * sigma);
      CHECK(std::fabs(mean - x[2 + j]) <= 5 * sigma / std::sqrt(double(kTrials)) + e);
      CHECK(std::fabs(var - sigma * sigma) <= 5 * var_sd + r * s + r * r + s * s * kDelta);
    }
  }
}

TEST_CASE("round=shift: one uniform per bucket, unbiased per value with Lemma 5's variance", "[codec][quant][stats]") {
  // QSDP Definition 1: the grid shifted by one random r for the whole vector (here: bucket). Values
  // at the same fraction of their step always round the same way, and values f and f' of a step
  // round up together exactly when the shared u reaches 1 - min(f, f'); each value is still unbiased
  // with variance s^2 f(1 - f) (Lemma 5).
  constexpr size_t kTrials = 20000;
  const CodecConfig c = spec("q4:bucket=64,round=shift,seed=5");
  std::vector<float> x(64, 0.0f);
  x[0] = -0.5f, x[1] = 1.0f;
  const BucketMeta m = bucket_meta(-0.5f, 1.0f, true, 4);
  const double fractions[] = {0.3, 0.3, 0.7};  // x[2] and x[3] share a fraction, in different steps
  const uint32_t steps[] = {2, 9, 5};
  for (size_t j = 0; j < 3; ++j) x[2 + j] = static_cast<float>(m.min + m.step * (steps[j] + fractions[j]));
  double sum[3] = {0, 0, 0}, square[3] = {0, 0, 0};
  size_t together = 0, both_up = 0;
  for (size_t trial = 0; trial < kTrials; ++trial) {
    const std::vector<float> y = decode_values(c, encode_bytes(c, x, key_of(c.seed, trial), 0), x.size());
    bool up[3];
    for (size_t j = 0; j < 3; ++j) {
      sum[j] += y[2 + j], square[j] += static_cast<double>(y[2 + j]) * y[2 + j];
      up[j] = y[2 + j] > x[2 + j];
    }
    together += up[0] == up[1];
    both_up += up[1] && up[2];
  }
  CHECK(together == kTrials);  // dependent rounding: the same fraction, the same way
  // up[1] (f = 0.3) needs u >= 0.7, up[2] (f = 0.7) needs u >= 0.3: both exactly when u >= 0.7.
  CHECK(std::fabs(static_cast<double>(both_up) / kTrials - 0.3) <= 5 * std::sqrt(0.3 * 0.7 / kTrials));
  for (size_t j = 0; j < 3; ++j) {
    const double s = m.step, f = fractions[j];
    const double mean = sum[j] / kTrials, var = square[j] / kTrials - mean * mean;
    const double sigma = s * std::sqrt(f * (1 - f));
    INFO("value " << x[2 + j] << " mean " << mean << " var " << var << " expected " << sigma * sigma);
    CHECK(std::fabs(mean - x[2 + j]) <= 5 * sigma / std::sqrt(double(kTrials)) + rounding_slack(s, -0.5, 1.0, 4));
    CHECK(std::fabs(var - sigma * sigma) <= 0.1 * sigma * sigma);  // 20,000 Bernoulli draws: about 1% sd
  }
}

// ---- Determinism -----------------------------------------------------------------------------------

TEST_CASE("encoding is deterministic, keyed, and independent of chunking", "[codec][determinism]") {
  const std::vector<float> x = gaussian(64 * 9 + 13, 1.0, 41);
  for (const char* s : {"q1:bucket=64", "q3:bucket=64", "q8:bucket=64"}) {
    for (const char* round : {",round=nearest", ",round=stochastic", ",round=shift"}) {
      const CodecConfig c = spec(std::string(s) + round);
      const bool stochastic = c.rounding != Rounding::kNearest;
      INFO(c.canonical());
      const PhiloxKey key = key_of(7, 100, 3, 2);
      const uint64_t first = 640;
      const Bytes whole = encode_bytes(c, x, key, first);
      CHECK(whole == encode_bytes(c, x, key, first));

      // Cut at bucket multiples: each chunk's metas and codes are the matching slices of the whole.
      const size_t cuts[] = {0, 128, 192, 448, x.size()};
      const size_t meta_bytes = quant_meta_bytes(x.size(), c.bucket);
      Bytes metas, codes;
      std::vector<float> decoded;
      for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
        const std::vector<float> part(x.begin() + cuts[i], x.begin() + cuts[i + 1]);
        const Bytes enc = encode_bytes(c, part, key, first + cuts[i]);
        const size_t mb = quant_meta_bytes(part.size(), c.bucket);
        metas.insert(metas.end(), enc.begin(), enc.begin() + mb);
        codes.insert(codes.end(), enc.begin() + mb, enc.end());
        const std::vector<float> y = decode_values(c, enc, part.size());
        decoded.insert(decoded.end(), y.begin(), y.end());
      }
      CHECK(Bytes(whole.begin(), whole.begin() + meta_bytes) == metas);
      CHECK(Bytes(whole.begin() + meta_bytes, whole.end()) == codes);
      CHECK(decoded == decode_values(c, whole, x.size()));

      // Every field of the key changes stochastic bytes and no nearest byte.
      for (const PhiloxKey& other : {key_of(8, 100, 3, 2), key_of(7, 101, 3, 2), key_of(7, 100, 4, 2),
                                     key_of(7, 100, 3, 3), key_of(7, 100ull | (1ull << 40), 3, 2)}) {
        CHECK((encode_bytes(c, x, other, first) != whole) == stochastic);
      }
      CHECK((encode_bytes(c, x, key, first + 64) != whole) == stochastic);
    }
  }
}

// ---- NaN and Inf -------------------------------------------------------------------------------------

TEST_CASE("buckets holding NaN or Inf are reported and decode to NaN; others are untouched", "[codec][nonfinite]") {
  for (const char* s : {"q8:bucket=64", "q3:bucket=64,round=stochastic", "q1:bucket=8"}) {
    const CodecConfig c = spec(s);
    INFO(s);
    const size_t b = c.bucket, n = 5 * b + 5;  // five whole buckets and a partial one
    const std::vector<float> clean = gaussian(n, 2.0, 77);
    std::vector<float> x = clean;
    x[b + 3] = NAN;
    x[3 * b] = -INFINITY;
    x[n - 1] = INFINITY;  // the partial last bucket
    size_t bad = 0;
    const Bytes enc = encode_bytes(c, x, key_of(1, 2), 0, &bad);
    CHECK(bad == 3);
    size_t decoded_bad = 0;
    const std::vector<float> y = decode_values(c, enc, n, &decoded_bad);
    CHECK(decoded_bad == 2 * b + 5);
    const std::vector<float> want = decode_values(c, encode_bytes(c, clean, key_of(1, 2), 0), n);
    for (size_t i = 0; i < n; ++i) {
      const size_t k = i / b;
      if (k == 1 || k == 3 || k == 5) {
        CHECK(std::isnan(y[i]));
      } else {
        CHECK(same_bits(y[i], want[i]));  // per-bucket independence
      }
    }
    CHECK(std::isnan(meta_of(enc, 1).step));
    CHECK(!std::isnan(meta_of(enc, 2).step));
  }
  // Finite buckets whose top code would decode to Inf: max - m overflows float32 (an Inf step,
  // which decodes to NaN and Inf), or only s * (2^N - 1) does ([-FLT_MAX, 0]). They are reported as
  // non-finite and decode to NaN, like a bucket holding Inf.
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> over_range = {-3e38f, 3e38f, 1, 2, 3, 4, 5, 6, 0.5f};
  const std::vector<float> over_step = {-max, 0, -1, -2, -3, -4, -5, -6, 0.5f};
  for (int bits = 1; bits <= 8; ++bits) {
    const CodecConfig c = spec("q" + std::to_string(bits) + ":bucket=8");
    INFO(c.canonical());
    // [-FLT_MAX, 0] overflows in s * (2^N - 1) for some widths only (q5 and q7 among them).
    const bool step_overflows = !std::isfinite(dequantize(quant_levels(bits), bucket_meta(-max, 0, true, bits)));
    if (bits == 5 || bits == 7) REQUIRE(step_overflows);
    for (const std::vector<float>* wide : {&over_range, step_overflows ? &over_step : &over_range}) {
      size_t bad = 0, decoded_bad = 0;
      const std::vector<float> y =
          decode_values(c, encode_bytes(c, *wide, PhiloxKey(), 0, &bad), wide->size(), &decoded_bad);
      CHECK(bad == 1);
      CHECK(decoded_bad == 8);
      CHECK(std::all_of(y.begin(), y.begin() + 8, [](float v) { return std::isnan(v); }));
      CHECK(y[8] == 0.5f);
    }
  }
}

TEST_CASE("casts count what is not finite after the cast and carry NaN", "[codec][nonfinite]") {
  const std::vector<float> x = {1e6f, NAN, 1.0f, -INFINITY, 65504.0f, 65520.0f, -65519.0f, 3.4e38f, -0.0f};
  struct Want {
    const char* spec;
    size_t nonfinite;
  };
  // fp16: 1e6, NaN, -Inf, 65520 (the first value that rounds past 65504) and 3.4e38. bf16: NaN,
  // -Inf and 3.4e38, which rounds up to bfloat16 Inf. none: NaN and -Inf.
  for (const Want& w : {Want{"fp16", 5}, Want{"bf16", 3}, Want{"none", 2}}) {
    INFO(w.spec);
    const CodecConfig c = spec(w.spec);
    size_t bad = 0, decoded_bad = 0;
    const std::vector<float> y = decode_values(c, encode_bytes(c, x, PhiloxKey(), 0, &bad), x.size(), &decoded_bad);
    CHECK(bad == w.nonfinite);
    CHECK(decoded_bad == w.nonfinite);
    CHECK(std::isnan(y[1]));
    CHECK(y[3] == -INFINITY);
    CHECK(y[2] == 1.0f);
  }
}

// ---- decode_accumulate -------------------------------------------------------------------------------

TEST_CASE("decode_accumulate is acc + decode bit for bit", "[codec][accumulate]") {
  std::vector<float> with_nan = gaussian(1000, 1.0, 6);
  with_nan[100] = NAN;
  const std::vector<float> inputs[] = {awkward(3000, 5), with_nan};
  for (const char* s :
       {"none", "fp16", "bf16", "q1", "q2:bucket=24", "q4", "q5:round=stochastic", "q8", "q8:bucket=8", "int8",
        "int16:alpha=3.5", "int32:alpha=1000,round=nearest"}) {
    const CodecConfig c = spec(s);
    for (const std::vector<float>& in : inputs) {
      INFO(s << " count " << in.size());
      const Bytes enc = encode_bytes(c, in, key_of(3, 4), 0);
      size_t bad = 0;
      const std::vector<float> y = decode_values(c, enc, in.size(), &bad);
      std::vector<float> acc = gaussian(in.size(), 10.0, 8);
      const std::vector<float> before = acc;
      CHECK(decode_accumulate(c, enc.data(), in.size(), acc.data()) == bad);
      size_t differ = 0;
      for (size_t i = 0; i < acc.size(); ++i) differ += same_bits(acc[i], before[i] + y[i]) ? 0 : 1;
      CHECK(differ == 0);
    }
  }
}

}  // namespace
}  // namespace qccl::kernels
