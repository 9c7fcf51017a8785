// kernels/half.h against references built from double arithmetic (ldexp, nearest-value search), not
// from the bit tricks under test: every 16-bit pattern, every tie between neighbours, and a sweep
// of float32 patterns.
#include "kernels/half.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace qccl::kernels {
namespace {

static_assert(std::numeric_limits<float>::is_iec559 && std::numeric_limits<double>::is_iec559);

// The bit functions are usable at compile time.
static_assert(float_bits_to_half_bits(0x3F800000u) == 0x3C00);  // 1.0
static_assert(float_bits_to_half_bits(0x477FF000u) == 0x7C00);  // 65520 -> Inf
static_assert(half_bits_to_float_bits(0x0001) == 0x33800000u);  // 2^-24
static_assert(float_bits_to_bf16_bits(0x7F800001u) == 0x7FC0);  // NaN stays NaN
static_assert(bf16_bits_to_float_bits(0xBF80) == 0xBF800000u);  // -1.0

// Layout of a 16-bit format: mantissa bits, exponent bias; the value of a bit pattern via ldexp.
struct Format16 {
  int mant_bits;
  int bias;
  double value(uint16_t h) const {  // not for Inf/NaN
    const int e = (h >> mant_bits) & ((0x7FFF >> mant_bits));
    const int m = h & ((1 << mant_bits) - 1);
    const double mag = e == 0 ? std::ldexp(m, 1 - bias - mant_bits)
                              : std::ldexp(m + (1 << mant_bits), e - bias - mant_bits);
    return (h & 0x8000) ? -mag : mag;
  }
  uint16_t inf() const { return static_cast<uint16_t>(0x7FFF & ~((1 << mant_bits) - 1)); }
  bool is_nan(uint16_t h) const { return (h & 0x7FFF) > inf(); }
  uint16_t quiet_bit() const { return static_cast<uint16_t>(1 << (mant_bits - 1)); }
};
constexpr Format16 kHalf{10, 15};
constexpr Format16 kBf16{7, 127};

// Nearest 16-bit value to x (finite, not NaN) with ties to the even pattern, by binary search over
// the positive patterns, whose values increase with the pattern. The entry for inf() is the value
// one step past the largest finite one (2^16 for half, 2^128 for bfloat16), so that overflow rounds
// as IEEE says: to Inf from the tie with that value on.
struct Nearest16 {
  explicit Nearest16(const Format16& f) : inf(f.inf()) {
    for (uint16_t h = 0; h < inf; ++h) values.push_back(f.value(h));
    values.push_back(2 * values[inf - 1] - values[inf - 2]);
  }
  uint16_t operator()(double x) const {
    const double ax = std::fabs(x);
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (ax >= values[inf]) return static_cast<uint16_t>(sign | inf);
    // First value above ax; the one before it is <= ax.
    const auto hi =
        static_cast<uint16_t>(std::upper_bound(values.begin(), values.end(), ax) - values.begin());
    const auto lo = static_cast<uint16_t>(hi - 1);
    const double dlo = ax - values[lo], dhi = values[hi] - ax;
    const uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    return static_cast<uint16_t>(sign | pick);
  }
  uint16_t inf;
  std::vector<double> values;
};

uint16_t to16(const Format16& f, float x) {
  return &f == &kHalf ? float_to_half(x) : float_to_bf16(x);
}
float from16(const Format16& f, uint16_t h) {
  return &f == &kHalf ? half_to_float(h) : bf16_to_float(h);
}

void check_widening_exhaustive(const Format16& f) {
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float x = from16(f, h);
    const uint32_t bits = float_to_bits(x);
    INFO("pattern 0x" << std::hex << i << " -> 0x" << bits);
    if ((h & 0x7FFF) == f.inf()) {
      REQUIRE(std::isinf(x));
      REQUIRE(std::signbit(x) == ((h & 0x8000) != 0));
    } else if (f.is_nan(h)) {  // sign and payload kept; half (like F16C) also sets the quiet bit
      REQUIRE(std::isnan(x));
      const uint32_t quiet = &f == &kHalf ? 0x400000u : 0;
      REQUIRE(bits == ((h & 0x8000u) << 16 | 0x7F800000u | quiet |
                       (h & ((1u << f.mant_bits) - 1)) << (23 - f.mant_bits)));
    } else {
      REQUIRE(static_cast<double>(x) == f.value(h));
      REQUIRE(std::signbit(x) == ((h & 0x8000) != 0));
    }
  }
}

void check_narrowing_round_trip_and_ties(const Format16& f) {
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<uint16_t>(i);
    INFO("pattern 0x" << std::hex << i);
    if (f.is_nan(h)) {
      REQUIRE(to16(f, from16(f, h)) == (h | f.quiet_bit()));  // quieted, payload kept
      continue;
    }
    REQUIRE(to16(f, from16(f, h)) == h);
    if ((h & 0x7FFF) >= f.inf()) continue;
    // The tie between h and its successor away from zero (for the largest finite value, the
    // successor is Inf, standing for the next power of two), and the floats on either side of it.
    const uint16_t next = static_cast<uint16_t>(h + 1);
    const double lo = std::fabs(f.value(h));
    const double hi =
        (next & 0x7FFF) == f.inf() ? 2 * lo - std::fabs(f.value(h - 1)) : std::fabs(f.value(next));
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const auto tie =
        static_cast<float>(sign * (lo + hi) / 2);  // exact: one more bit than the format
    REQUIRE(static_cast<double>(tie) == sign * (lo + hi) / 2);
    const uint16_t even = (h & 1) ? next : h;
    REQUIRE(to16(f, tie) == even);
    REQUIRE(to16(f, std::nextafter(tie, 0.0f)) == h);
    REQUIRE(to16(f, std::nextafter(tie, static_cast<float>(sign * INFINITY))) == next);
  }
}

// Every 997th float32 pattern (4.3 million, all exponents and both signs) against Nearest16.
void check_narrowing_sweep(const Format16& f) {
  const Nearest16 nearest16(f);
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 997) {
    const auto bits = static_cast<uint32_t>(u);
    const float x = bits_to_float(bits);
    const uint16_t got = to16(f, x);
    if (std::isnan(x)) {
      const uint16_t expect =
          static_cast<uint16_t>((bits >> 16 & 0x8000) | f.inf() | f.quiet_bit() |
                                ((bits & 0x7FFFFF) >> (23 - f.mant_bits)));
      if (got != expect) FAIL("NaN 0x" << std::hex << bits << " -> 0x" << got);
    } else if (got != nearest16(x)) {
      FAIL("0x" << std::hex << bits << " -> 0x" << got << ", nearest is 0x" << nearest16(x));
    }
  }
}

TEST_CASE("half_to_float widens every pattern exactly", "[half]") {
  check_widening_exhaustive(kHalf);
}
TEST_CASE("bf16_to_float widens every pattern exactly", "[half]") {
  check_widening_exhaustive(kBf16);
}

TEST_CASE("float_to_half: round trip and nearest-even ties for every pattern", "[half]") {
  check_narrowing_round_trip_and_ties(kHalf);
}
TEST_CASE("float_to_bf16: round trip and nearest-even ties for every pattern", "[half]") {
  check_narrowing_round_trip_and_ties(kBf16);
}

TEST_CASE("float_to_half matches the nearest half on a sweep of float patterns", "[half]") {
  check_narrowing_sweep(kHalf);
}
TEST_CASE("float_to_bf16 matches the nearest bfloat16 on a sweep of float patterns", "[half]") {
  check_narrowing_sweep(kBf16);
}

TEST_CASE("float_to_half: named cases", "[half]") {
  CHECK(float_to_half(1.0f) == 0x3C00);
  CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3C00);      // tie, down to even
  CHECK(float_to_half(1.0f + 3 * 0x1p-11f) == 0x3C02);  // tie, up to even
  CHECK(float_to_half(65504.0f) == 0x7BFF);
  CHECK(float_to_half(65519.996f) == 0x7BFF);
  CHECK(float_to_half(65520.0f) == 0x7C00);  // tie with 2^16: overflows to Inf
  CHECK(float_to_half(-1e6f) == 0xFC00);
  CHECK(float_to_half(FLT_MAX) == 0x7C00);
  CHECK(float_to_half(INFINITY) == 0x7C00);
  CHECK(float_to_half(0x1p-14f) == 0x0400);             // smallest normal
  CHECK(float_to_half(0x1p-14f - 0x1p-25f) == 0x0400);  // tie between 0x3FF and 0x400: even
  CHECK(float_to_half(0x1p-24f) == 0x0001);             // smallest subnormal
  CHECK(float_to_half(0x1p-25f) == 0x0000);             // tie with zero: even
  CHECK(float_to_half(0x1.8p-25f) == 0x0001);
  CHECK(float_to_half(-0x1p-26f) == 0x8000);
  CHECK(float_to_half(FLT_TRUE_MIN) == 0x0000);  // float32 subnormal
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(bits_to_float(0x7F800001u)) == 0x7E00);  // payload only in low bits: not Inf
  CHECK(float_to_half(bits_to_float(0xFFC00000u)) == 0xFE00);
  CHECK(float_to_half(bits_to_float(0x7FFFFFFFu)) == 0x7FFF);
}

TEST_CASE("float_to_bf16: named cases", "[half]") {
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);      // tie, down to even
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);  // tie, up to even
  CHECK(float_to_bf16(FLT_MAX) == 0x7F80);             // past the last tie: Inf
  CHECK(float_to_bf16(-INFINITY) == 0xFF80);
  CHECK(float_to_bf16(FLT_TRUE_MIN) == 0x0000);  // tie between 0 and 2^-133: even
  CHECK(float_to_bf16(bits_to_float(0x00008001u)) == 0x0001);
  CHECK(float_to_bf16(bits_to_float(0x7F800001u)) == 0x7FC0);  // NaN never rounds into Inf
  CHECK(float_to_bf16(bits_to_float(0xFFFFFFFFu)) == 0xFFFF);  // nor past the sign bit
  CHECK(float_to_bf16(bits_to_float(0x7FFFFFFFu)) == 0x7FFF);
}

}  // namespace
}  // namespace qccl::kernels
