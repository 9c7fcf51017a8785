#include "kernels/convert.h"

#include <cstring>

#include "kernels/half.h"

namespace qccl::kernels {

namespace {

template <class F>
void for_each_half(DataType t, const void* in, size_t n, F&& f) {
  const auto* h = static_cast<const uint16_t*>(in);
  if (t == DataType::kFloat16)
    for (size_t i = 0; i < n; ++i) f(i, half_to_float(h[i]));
  else
    for (size_t i = 0; i < n; ++i) f(i, bf16_to_float(h[i]));
}

}  // namespace

void load_float(DataType t, const void* in, float* out, size_t n) {
  if (t == DataType::kFloat32) {
    if (in != out) std::memcpy(out, in, n * sizeof(float));
    return;
  }
  for_each_half(t, in, n, [out](size_t i, float v) { out[i] = v; });
}

void load_add_float(DataType t, const void* in, float* acc, size_t n) {
  if (t == DataType::kFloat32) return add_float(static_cast<const float*>(in), acc, n);
  for_each_half(t, in, n, [acc](size_t i, float v) { acc[i] += v; });
}

void store_float(DataType t, const float* in, void* out, size_t n) {
  if (t == DataType::kFloat32) {
    if (in != out) std::memcpy(out, in, n * sizeof(float));
    return;
  }
  auto* h = static_cast<uint16_t*>(out);
  if (t == DataType::kFloat16)
    for (size_t i = 0; i < n; ++i) h[i] = float_to_half(in[i]);
  else
    for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(in[i]);
}

size_t count_nonfinite(DataType t, const void* x, size_t n) {
  size_t count = 0;
  if (t == DataType::kFloat32) {
    const auto* f = static_cast<const float*>(x);
    for (size_t i = 0; i < n; ++i) count += (float_to_bits(f[i]) & 0x7f800000u) == 0x7f800000u;
    return count;
  }
  const auto* h = static_cast<const uint16_t*>(x);
  const uint16_t exponent = t == DataType::kFloat16 ? 0x7c00 : 0x7f80;
  for (size_t i = 0; i < n; ++i) count += (h[i] & exponent) == exponent;
  return count;
}

void divide_float(float* x, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) x[i] /= divisor;
}

void add_float(const float* in, float* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += in[i];
}

}  // namespace qccl::kernels
