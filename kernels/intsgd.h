// Host launchers of IntSGD's integer codec (int_codec.h): encode to the wire type, wrapping adds of
// wire integers, decode, and the exact sums of squares that feed the adaptive scale. `bits` is the
// wire type's width: 8, 16 or 32. Thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/int_codec.h"
#include "kernels/philox.h"

namespace qccl::kernels {

struct IntEncodeReport {
  size_t clipped = 0;    // values whose rounded integer fell outside the clip range
  size_t nonfinite = 0;  // NaN or Inf inputs (sent as 0)
};

// out[i] = int_encode_value(x[i], alpha, philox_uniform(key, first + i), stochastic, clip) in the
// wire type, for i < n.
IntEncodeReport int_encode(int bits, const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                           const PhiloxKey& key, uint64_t first, void* out);

// acc[i] += in[i], wrapping modulo 2^bits (in may equal acc).
void int_add(int bits, const void* in, void* acc, size_t n);

// out[i] = int_decode_value(in[i], scale).
void int_decode(int bits, const void* in, size_t n, double scale, float* out);

// The exact sum of S^2 over a sum vector (128 bits: int32 squares reach 2^62), and the largest |S|
// (the paper's "largest integer", Fig. 6). Integer arithmetic, so the order of accumulation cannot
// show: every rank gets the same numbers from the same sums.
struct IntSums {
  uint64_t squares_lo = 0, squares_hi = 0;
  uint32_t max_abs = 0;
  void add(uint64_t v) {
    squares_lo += v;
    squares_hi += squares_lo < v ? 1 : 0;
  }
  void merge(const IntSums& o) {
    add(o.squares_lo);
    squares_hi += o.squares_hi;
    if (o.max_abs > max_abs) max_abs = o.max_abs;
  }
  double squares() const { return static_cast<double>(squares_hi) * 0x1p64 + static_cast<double>(squares_lo); }
};
void int_accumulate_sums(int bits, const void* in, size_t n, IntSums* sums);

}  // namespace qccl::kernels
