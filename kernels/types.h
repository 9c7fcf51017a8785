// Element types and reduction operators as the kernels see them. The numbering is NCCL's (and so the
// public API's): src/ checks the correspondence with static_asserts, since kernels/ includes nothing
// of ours above it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qccl::kernels {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};
constexpr int kNumDataTypes = 10;

enum class RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
constexpr int kNumRedOps = 5;

constexpr size_t element_size(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

constexpr bool is_floating(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

// Names as nccl-tests prints them ("float", "half", "bfloat16", "int32", ...).
const char* data_type_name(DataType t);
const char* red_op_name(RedOp op);

}  // namespace qccl::kernels
