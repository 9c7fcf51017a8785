// kernels/reduce: every datatype x op against an element-wise reference (exact integers; floating
// point through double, which rounds once to float32 since 53 >= 2*24 + 2 makes double rounding
// innocuous for + and *), at many counts, misaligned, in place and out of place, on every Highway
// target compiled in and supported by this CPU.
#include "kernels/reduce.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/half.h"
#include "tests/kernels/hwy_targets.h"

namespace qccl::kernels {
namespace {

constexpr DataType kAllTypes[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,
                                  DataType::kUint32,  DataType::kInt64,   DataType::kUint64,
                                  DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                                  DataType::kBfloat16};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
constexpr DataType kFloatTypes[] = {DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                                    DataType::kBfloat16};

// ---- Elements as raw bits -----------------------------------------------------------------------

uint64_t load_bits(DataType t, const unsigned char* p, size_t i) {
  uint64_t v = 0;
  memcpy(&v, p + i * element_size(t), element_size(t));  // little-endian
  return v;
}
void store_bits(DataType t, unsigned char* p, size_t i, uint64_t v) {
  memcpy(p + i * element_size(t), &v, element_size(t));
}
uint64_t mask_of(DataType t) {
  return element_size(t) == 8 ? ~0ull : (1ull << (8 * element_size(t))) - 1;
}
int64_t sign_extend(DataType t, uint64_t v) {
  const int shift = 64 - 8 * static_cast<int>(element_size(t));
  return static_cast<int64_t>(v << shift) >> shift;
}
bool is_signed_int(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
}

double float_value(DataType t, uint64_t v) {
  switch (t) {
    case DataType::kFloat16: return half_to_float(static_cast<uint16_t>(v));
    case DataType::kBfloat16: return bf16_to_float(static_cast<uint16_t>(v));
    case DataType::kFloat32: return bits_to_float(static_cast<uint32_t>(v));
    default: {
      double d;
      memcpy(&d, &v, 8);
      return d;
    }
  }
}
// The canonical NaN every floating result carries: positive, all payload bits set.
uint64_t canonical_nan(DataType t) { return mask_of(t) >> 1; }
uint64_t float_bits(DataType t, double d) {
  if (std::isnan(d)) return canonical_nan(t);
  const auto f = static_cast<float>(d);
  switch (t) {
    case DataType::kFloat16: return float_to_half(f);
    case DataType::kBfloat16: return float_to_bf16(f);
    case DataType::kFloat32: return float_to_bits(f);
    default: {
      uint64_t v;
      memcpy(&v, &d, 8);
      return v;
    }
  }
}

// ---- The reference ------------------------------------------------------------------------------

uint64_t reference_int(DataType t, RedOp op, uint64_t a, uint64_t b) {
  const bool s = is_signed_int(t);
  const bool a_less = s ? sign_extend(t, a) < sign_extend(t, b) : a < b;
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return (a + b) & mask_of(t);
    case RedOp::kProd: return (a * b) & mask_of(t);
    case RedOp::kMax: return a_less ? b : a;
    case RedOp::kMin: return a_less ? a : b;
  }
  return 0;
}

// max/min: NaN wins; -0 < +0; otherwise the larger/smaller value.
double reference_max_min(bool is_max, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  if (a == 0 && b == 0) {
    const bool negative =
        is_max ? (std::signbit(a) && std::signbit(b)) : (std::signbit(a) || std::signbit(b));
    return negative ? -0.0 : 0.0;
  }
  return is_max ? (a < b ? b : a) : (a < b ? a : b);
}

uint64_t reference_float(DataType t, RedOp op, uint64_t abits, uint64_t bbits) {
  const double a = float_value(t, abits), b = float_value(t, bbits);
  double r = 0;
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: r = a + b; break;
    case RedOp::kProd: r = a * b; break;
    case RedOp::kMax: r = reference_max_min(true, a, b); break;
    case RedOp::kMin: r = reference_max_min(false, a, b); break;
  }
  return float_bits(t, r);  // float16/bfloat16: via float32, as the promise says
}

uint64_t reference(DataType t, RedOp op, uint64_t a, uint64_t b) {
  return is_floating(t) ? reference_float(t, op, a, b) : reference_int(t, op, a, b);
}

// ---- Inputs -------------------------------------------------------------------------------------

// Floating inputs: a third random bit patterns (every NaN payload, subnormals, huge values), the
// rest values of magnitude <= 256 with full mantissas (so that products rarely overflow float16 and
// roundings are exercised), with specials and NaNs of any payload and sign sprinkled in.
uint64_t random_element(DataType t, std::mt19937_64& rng) {
  const uint64_t bits = rng() & mask_of(t);
  if (!is_floating(t)) {
    switch (rng() % 8) {  // extremes: wraparound and signed comparisons
      case 0: return mask_of(t);
      case 1: return mask_of(t) >> 1;
      case 2: return (mask_of(t) >> 1) + 1;
      default: return bits;
    }
  }
  const uint64_t inf = float_bits(t, INFINITY);
  switch (rng() % 12) {
    case 0:
    case 1:
    case 2:
    case 3: return bits;
    case 4: {
      const double specials[] = {0.0,  -0.0,    INFINITY, -INFINITY, 1.0,
                                 -1.0, 65504.0, 6e-8,     0x1p-130};
      return float_bits(t, specials[rng() % 9]);
    }
    case 5: return inf | (bits & ~inf) | 1;  // NaN: random payload and sign
    default: {
      const double unit = static_cast<double>(rng() >> 11) * 0x1p-52 - 1.0;  // [-1, 1)
      return float_bits(t, std::ldexp(unit, static_cast<int>(rng() % 17) - 8));
    }
  }
}

// ---- The sweep ----------------------------------------------------------------------------------

enum class Placement { kOutOfPlace, kDstIsA, kDstIsB, kAllSame };

// A buffer with canaries on both sides; data() starts `skew` bytes past an aligned address.
struct Buffer {
  Buffer(size_t bytes, size_t skew) : storage(bytes + skew + 2 * kGuard, 0xA5), skew(skew) {}
  unsigned char* data() { return storage.data() + kGuard + skew; }
  bool guards_intact(size_t bytes) const {
    for (size_t i = 0; i < storage.size(); ++i) {
      if ((i < kGuard + skew || i >= kGuard + skew + bytes) && storage[i] != 0xA5) return false;
    }
    return true;
  }
  static constexpr size_t kGuard = 64;
  std::vector<unsigned char> storage;
  size_t skew;
};

void check_reduce(DataType t, RedOp op, size_t count, size_t skew, Placement placement,
                  std::mt19937_64& rng) {
  const size_t es = element_size(t);
  Buffer a(count * es, skew), b(count * es, skew + 3), out(count * es, skew + 5);
  std::vector<uint64_t> va(count), vb(count);
  for (size_t i = 0; i < count; ++i) {
    va[i] = random_element(t, rng);
    vb[i] = placement == Placement::kAllSame ? va[i] : random_element(t, rng);
    store_bits(t, a.data(), i, va[i]);
    store_bits(t, b.data(), i, vb[i]);
  }
  unsigned char* pa = a.data();
  unsigned char* pb = placement == Placement::kAllSame ? a.data() : b.data();
  unsigned char* dst = placement == Placement::kOutOfPlace ? out.data()
                       : placement == Placement::kDstIsB   ? b.data()
                                                           : a.data();
  reduce(t, op, pa, pb, dst, count);
  INFO(data_type_name(t) << " " << red_op_name(op) << " count " << count << " skew " << skew
                         << " placement " << static_cast<int>(placement));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t expect = reference(t, op, va[i], vb[i]);
    const uint64_t got = load_bits(t, dst, i);
    if (got != expect) {
      FAIL("element " << i << ": 0x" << std::hex << va[i] << " op 0x" << vb[i] << " gave 0x" << got
                      << ", expected 0x" << expect);
    }
  }
  REQUIRE(a.guards_intact(count * es));
  REQUIRE(b.guards_intact(count * es));
  REQUIRE(out.guards_intact(count * es));
}

void sweep_all(uint64_t seed) {
  const size_t counts[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4099};
  const Placement placements[] = {Placement::kOutOfPlace, Placement::kDstIsA, Placement::kDstIsB,
                                  Placement::kAllSame};
  std::mt19937_64 rng(seed);
  for (DataType t : kAllTypes) {
    for (RedOp op : kAllOps) {
      for (size_t count : counts) {
        for (size_t skew : {size_t{0}, size_t{1}}) {
          for (Placement p : placements) check_reduce(t, op, count, skew, p, rng);
        }
      }
    }
  }
}

TEST_CASE("reduce matches the reference for every type, op, count and placement", "[reduce]") {
  INFO("dispatching to " << reduce_target_name());
  sweep_all(12345);
}

TEST_CASE("reduce matches the reference on every Highway target", "[reduce]") {
  for_each_target([] { sweep_all(777); });
}

TEST_CASE("every Highway target gives the same bits on a large buffer", "[reduce]") {
  const size_t count = 10007;
  for (DataType t : kAllTypes) {
    for (RedOp op : kAllOps) {
      const size_t bytes = count * element_size(t);
      std::mt19937_64 rng(99);
      std::vector<unsigned char> a(bytes), b(bytes), first;
      for (size_t i = 0; i < count; ++i) {
        store_bits(t, a.data(), i, random_element(t, rng));
        store_bits(t, b.data(), i, random_element(t, rng));
      }
      for_each_target([&] {
        std::vector<unsigned char> out(bytes);
        reduce(t, op, a.data(), b.data(), out.data(), count);
        if (first.empty()) first = out;
        INFO(data_type_name(t) << " " << red_op_name(op));
        REQUIRE(out == first);
      });
    }
  }
}

// ---- Named semantics ----------------------------------------------------------------------------

// Every pair from a list of awkward values, in both orders, through the vector body (count 64).
TEST_CASE("floating ops are symmetric in bits; max/min propagate NaN and order -0 < +0",
          "[reduce]") {
  for_each_target([] {
    for (DataType t : kFloatTypes) {
      const uint64_t m = mask_of(t), sign = (m >> 1) + 1;
      const uint64_t inf = float_bits(t, INFINITY);
      const std::vector<uint64_t> values = {0,
                                            sign,
                                            float_bits(t, 1.0),
                                            float_bits(t, -2.5),
                                            inf,
                                            inf | sign,
                                            inf | 1,  // signalling NaN, payload only in the low bit
                                            (inf | 1 | sign),           // negative one
                                            inf | ((inf >> 1) & ~inf),  // quiet NaN
                                            m,  // negative NaN, all payload bits
                                            1,  // smallest subnormal
                                            float_bits(t, 3.0)};
      for (RedOp op : kAllOps) {
        std::vector<uint64_t> as, bs;
        for (uint64_t x : values) {
          for (uint64_t y : values) {
            as.push_back(x);
            bs.push_back(y);
          }
        }
        const size_t n = as.size();
        const size_t es = element_size(t);
        std::vector<unsigned char> a(n * es), b(n * es), ab(n * es), ba(n * es);
        for (size_t i = 0; i < n; ++i) {
          store_bits(t, a.data(), i, as[i]);
          store_bits(t, b.data(), i, bs[i]);
        }
        reduce(t, op, a.data(), b.data(), ab.data(), n);
        reduce(t, op, b.data(), a.data(), ba.data(), n);
        INFO(data_type_name(t) << " " << red_op_name(op));
        REQUIRE(ab == ba);
        for (size_t i = 0; i < n; ++i) {
          const uint64_t r = load_bits(t, ab.data(), i);
          const bool any_nan =
              std::isnan(float_value(t, as[i])) || std::isnan(float_value(t, bs[i]));
          if (any_nan) REQUIRE(r == canonical_nan(t));
          if ((as[i] == 0 && bs[i] == sign) || (as[i] == sign && bs[i] == 0)) {
            if (op == RedOp::kMax) REQUIRE(r == 0);     // max(+0, -0) = +0
            if (op == RedOp::kMin) REQUIRE(r == sign);  // min(+0, -0) = -0
            if (op == RedOp::kSum) REQUIRE(r == 0);     // +0 + -0 = +0 (round to nearest)
          }
          if (op == RedOp::kMax && as[i] == inf && bs[i] == (inf | sign)) REQUIRE(r == inf);
        }
      }
    }
  });
}

template <typename T>
T reduce_one(DataType t, RedOp op, T a, T b) {
  std::vector<T> va(33, a), vb(33, b), out(33);  // 33: the vector body and the tail
  reduce(t, op, va.data(), vb.data(), out.data(), out.size());
  REQUIRE(out.front() == out.back());
  return out[0];
}

TEST_CASE("integer sum and product wrap around", "[reduce]") {
  constexpr auto i32max = std::numeric_limits<int32_t>::max();
  constexpr auto i32min = std::numeric_limits<int32_t>::min();
  constexpr auto i64min = std::numeric_limits<int64_t>::min();
  CHECK(reduce_one<int8_t>(DataType::kInt8, RedOp::kSum, 127, 1) == -128);
  CHECK(reduce_one<uint8_t>(DataType::kUint8, RedOp::kSum, 255, 1) == 0);
  CHECK(reduce_one<int8_t>(DataType::kInt8, RedOp::kProd, -128, -1) == -128);
  CHECK(reduce_one<uint8_t>(DataType::kUint8, RedOp::kProd, 16, 16) == 0);
  CHECK(reduce_one<int8_t>(DataType::kInt8, RedOp::kProd, -3, 7) == -21);
  CHECK(reduce_one<uint8_t>(DataType::kUint8, RedOp::kProd, 200, 3) == 88);
  CHECK(reduce_one<int32_t>(DataType::kInt32, RedOp::kSum, i32max, 1) == i32min);
  CHECK(reduce_one<int32_t>(DataType::kInt32, RedOp::kProd, i32min, -1) == i32min);
  CHECK(reduce_one<uint32_t>(DataType::kUint32, RedOp::kProd, 0x10001u, 0x10001u) == 0x20001u);
  CHECK(reduce_one<int64_t>(DataType::kInt64, RedOp::kSum, i64min, -1) ==
        std::numeric_limits<int64_t>::max());
  CHECK(reduce_one<uint64_t>(DataType::kUint64, RedOp::kProd, 0x100000001ull, 0x100000001ull) ==
        0x200000001ull);
  CHECK(reduce_one<uint64_t>(DataType::kUint64, RedOp::kProd, ~0ull, ~0ull) == 1);
  CHECK(reduce_one<int64_t>(DataType::kInt64, RedOp::kProd, -3, 5) == -15);
  CHECK(reduce_one<int64_t>(DataType::kInt64, RedOp::kMax, -3, i64min) == -3);
  CHECK(reduce_one<uint64_t>(DataType::kUint64, RedOp::kMax, 1, ~0ull) == ~0ull);
  CHECK(reduce_one<int8_t>(DataType::kInt8, RedOp::kMin, -128, 127) == -128);
  CHECK(reduce_one<uint8_t>(DataType::kUint8, RedOp::kMin, 128, 127) == 127);
}

TEST_CASE("finish_average on integers truncates toward zero", "[reduce][avg]") {
  auto avg = [](DataType t, std::vector<int64_t> values, int n) {
    std::vector<unsigned char> buf(values.size() * element_size(t));
    for (size_t i = 0; i < values.size(); ++i)
      store_bits(t, buf.data(), i, static_cast<uint64_t>(values[i]));
    finish_average(t, buf.data(), values.size(), n);
    std::vector<int64_t> out;
    for (size_t i = 0; i < values.size(); ++i) {
      const uint64_t v = load_bits(t, buf.data(), i);
      out.push_back(is_signed_int(t) ? sign_extend(t, v) : static_cast<int64_t>(v));
    }
    return out;
  };
  using V = std::vector<int64_t>;
  CHECK(avg(DataType::kInt32, {7, -7, -1, 1, 0, 6, -6}, 2) == V{3, -3, 0, 0, 0, 3, -3});
  CHECK(avg(DataType::kInt8, {-128, 127, -5}, 3) == V{-42, 42, -1});
  CHECK(avg(DataType::kUint8, {255, 4}, 3) == V{85, 1});
  CHECK(avg(DataType::kInt64, {std::numeric_limits<int64_t>::min(), -9}, 4) ==
        V{std::numeric_limits<int64_t>::min() / 4, -2});
  CHECK(avg(DataType::kUint32, {0xFFFFFFFF, 10}, 7) == V{0xFFFFFFFF / 7, 1});
  CHECK(avg(DataType::kUint64, {-1}, 1) == V{-1});
  // More ranks than an 8-bit type can count.
  CHECK(avg(DataType::kInt8, {-128, 127, 100}, 100) == V{-1, 1, 1});
  CHECK(avg(DataType::kInt8, {-128, 127}, 200) == V{0, 0});
  CHECK(avg(DataType::kUint8, {255, 200}, 256) == V{0, 0});
  CHECK(avg(DataType::kUint8, {255, 200}, 150) == V{1, 1});
}

// n equal values x sum exactly to n*x when x has few mantissa bits; dividing returns x exactly.
TEST_CASE("finish_average of n equal floating values returns the value exactly", "[reduce][avg]") {
  for_each_target([] {
    std::mt19937_64 rng(5);
    for (DataType t : kFloatTypes) {
      const int mant_bits =
          t == DataType::kBfloat16 ? 3 : 6;  // + 5 bits of n <= 32 fits every type
      for (int n = 1; n <= 32; ++n) {
        const size_t count = 37;
        std::vector<unsigned char> buf(count * element_size(t));
        std::vector<double> x(count);
        for (size_t i = 0; i < count; ++i) {
          const auto m = static_cast<int64_t>(rng() % (1u << mant_bits)) - (1 << (mant_bits - 1));
          x[i] =
              std::ldexp(static_cast<double>(m), static_cast<int>(rng() % 14) - 8);  // n*x < 2^16
          store_bits(t, buf.data(), i, float_bits(t, x[i] * n));
        }
        finish_average(t, buf.data(), count, n);
        for (size_t i = 0; i < count; ++i) {
          INFO(data_type_name(t) << " n " << n << " x " << x[i]);
          REQUIRE(float_value(t, load_bits(t, buf.data(), i)) == x[i]);
        }
      }
    }
  });
}

TEST_CASE("finish_average on floats divides once and rounds once", "[reduce][avg]") {
  for_each_target([] {
    std::mt19937_64 rng(6);
    for (DataType t : kFloatTypes) {
      for (int n : {1, 3, 7, 10}) {
        for (size_t count : {size_t{1}, size_t{13}, size_t{1000}}) {
          std::vector<unsigned char> buf(count * element_size(t) + 1);
          unsigned char* p = buf.data() + 1;  // misaligned
          std::vector<uint64_t> in(count);
          for (size_t i = 0; i < count; ++i) store_bits(t, p, i, in[i] = random_element(t, rng));
          finish_average(t, p, count, n);
          for (size_t i = 0; i < count; ++i) {
            const double v = float_value(t, in[i]);
            // float32 division (correctly rounded: double division of floats rounds innocuously).
            const double q =
                t == DataType::kFloat64 ? v / n : static_cast<double>(static_cast<float>(v / n));
            INFO(data_type_name(t) << " n " << n << " input 0x" << std::hex << in[i]);
            REQUIRE(load_bits(t, p, i) == float_bits(t, q));
          }
        }
      }
    }
  });
}

TEST_CASE("avg reduces as sum", "[reduce][avg]") {
  std::mt19937_64 rng(8);
  for (DataType t : kAllTypes) {
    const size_t count = 301, bytes = count * element_size(t);
    std::vector<unsigned char> a(bytes), b(bytes), sum(bytes), avg(bytes);
    for (size_t i = 0; i < count; ++i) {
      store_bits(t, a.data(), i, random_element(t, rng));
      store_bits(t, b.data(), i, random_element(t, rng));
    }
    reduce(t, RedOp::kSum, a.data(), b.data(), sum.data(), count);
    reduce(t, RedOp::kAvg, a.data(), b.data(), avg.data(), count);
    REQUIRE(sum == avg);
  }
}

}  // namespace
}  // namespace qccl::kernels
