// Reference values for collective tests: element access in every datatype through double, inputs
// that every rank can regenerate from (rank, index), and the exact expected reductions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/half.h"
#include "kernels/types.h"

namespace qccl::test {

using kernels::DataType;
using kernels::RedOp;

// ---- Element access in any datatype, through double ---------------------------------------------

inline double load(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUint8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kUint32: return static_cast<const uint32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUint64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kFloat16: return kernels::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kBfloat16: return kernels::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

// Integers go through int64_t, so that a reference product that overflows a narrow type wraps as the
// library's unsigned arithmetic does (a double-to-int8 conversion out of range would be undefined).
inline void store(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DataType::kUint64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = kernels::float_to_half(static_cast<float>(v)); break;
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kBfloat16: static_cast<uint16_t*>(p)[i] = kernels::float_to_bf16(static_cast<float>(v)); break;
  }
}

inline bool is_signed(DataType t) { return t != DataType::kUint8 && t != DataType::kUint32 && t != DataType::kUint64; }

// Small integers make every reduction exact in every datatype (sums of 9 values in [-4, 4], products
// of 9 values in {-1, 1, 2}), so results compare with equality. Unsigned types get [0, 8] / {1, 2}.
inline double input_value(DataType t, RedOp op, int rank, size_t i) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  const uint64_t x = (h ^ (h >> 31)) * 0x94D049BB133111EBull >> 40;
  if (op == RedOp::kProd) return is_signed(t) ? static_cast<double>(static_cast<int>(x % 3) - 1 == 0 ? 2 : static_cast<int>(x % 3) - 1) : 1.0 + x % 2;
  return is_signed(t) ? static_cast<double>(static_cast<int>(x % 9) - 4) : static_cast<double>(x % 9);
}

inline double combine(RedOp op, double a, double b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return a + b;
    case RedOp::kProd: return a * b;
    case RedOp::kMax: return std::max(a, b);
    case RedOp::kMin: return std::min(a, b);
  }
  return 0;
}

// The exact reduction over ranks of element i, rounded as the datatype stores it.
inline double expected_reduction(DataType t, RedOp op, int nranks, size_t i) {
  double acc = input_value(t, op, 0, i);
  for (int r = 1; r < nranks; ++r) acc = combine(op, acc, input_value(t, op, r, i));
  if (op == RedOp::kAvg) acc = kernels::is_floating(t) ? acc / nranks : std::trunc(acc / nranks);
  // Round through the datatype (unsigned sums cannot go negative here; signed ones stay in range).
  std::vector<uint8_t> cell(8);
  store(t, cell.data(), 0, acc);
  return load(t, cell.data(), 0);
}

}  // namespace qccl::test
