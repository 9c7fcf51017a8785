#include "kernels/convert.h"

#include <cstdint>
#include <cstring>

#include "kernels/codec.h"
#include "kernels/half.h"

namespace qccl::kernels {

namespace {

// The float16 and bfloat16 conversions are the fp16 and bf16 codecs' (codec.cc: vectorized with
// Highway, the bits of half.h's float_to_half / half_to_float and bf16 twins, which codec_test
// checks value by value).
const CodecConfig& cast_codec(DataType t) {
  static const CodecConfig fp16 = parse_codec_spec("fp16"), bf16 = parse_codec_spec("bf16");
  return t == DataType::kFloat16 ? fp16 : bf16;
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t bytes) {
  const auto distance = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  if (distance == 0 || distance >= 64 || bytes < 4096) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t i = bytes;
  for (; i >= 64; i -= 64) std::memcpy(d + i - 64, s + i - 64, 64);
  std::memcpy(d, s, i);
}

void load_float(DataType t, const void* in, float* out, size_t n) {
  if (t == DataType::kFloat32) {
    if (in != out) copy_bytes(out, in, n * sizeof(float));
    return;
  }
  decode(cast_codec(t), in, n, out);
}

void load_add_float(DataType t, const void* in, float* acc, size_t n) {
  if (t == DataType::kFloat32) return add_float(static_cast<const float*>(in), acc, n);
  decode_accumulate(cast_codec(t), in, n, acc);
}

void store_float(DataType t, const float* in, void* out, size_t n) {
  if (t == DataType::kFloat32) {
    if (in != out) copy_bytes(out, in, n * sizeof(float));
    return;
  }
  encode(cast_codec(t), in, n, out, PhiloxKey{}, 0);
}

// x may be unaligned (a value in a message's bytes): every value is read with memcpy.
size_t count_nonfinite(DataType t, const void* x, size_t n) {
  size_t count = 0;
  const auto* bytes = static_cast<const unsigned char*>(x);
  if (t == DataType::kFloat32) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, bytes + 4 * i, 4);
      count += (bits & 0x7f800000u) == 0x7f800000u;
    }
    return count;
  }
  const uint16_t exponent = t == DataType::kFloat16 ? 0x7c00 : 0x7f80;
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, 2);
    count += (bits & exponent) == exponent;
  }
  return count;
}

void divide_float(float* x, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) x[i] /= divisor;
}

void add_float(const float* in, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += in[i];
}

}  // namespace qccl::kernels
