// Moving between a collective's datatype and the float32 that codecs and their accumulators work in
// (compressed collectives accept float32, float16 and bfloat16). float16/bfloat16 round to nearest
// even on the way back (half.h), so host and device agree bit for bit.
#pragma once

#include <cstddef>

#include "kernels/types.h"

namespace qccl::kernels {

// True for the datatypes codecs accept.
constexpr bool codec_input_type(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBfloat16;
}

// memcpy for the collectives' buffers (no overlap), safe from a slow case of this machine's: on AMD Zen 3
// (and other cores that match loads to earlier stores by the low 12 address bits), a forward copy whose
// destination lies a few bytes after its source modulo 4 KiB makes every load wait for a store it only
// seems to alias. glibc's memcpy ran at 1.4-2.7 GB/s there against 8-12 GB/s otherwise (a user buffer
// on a page boundary, a scratch buffer 16 bytes into its allocation: docs/PERF.md); those copies run
// backwards, 64 bytes at a time, and keep the usual rate.
void copy_bytes(void* dst, const void* src, size_t bytes);
void load_float(DataType t, const void* in, float* out, size_t n);      // out = float(in)
void load_add_float(DataType t, const void* in, float* acc, size_t n);  // acc += float(in)
void store_float(DataType t, const float* in, void* out, size_t n);     // out = round(in)
// The NaN and Inf values among n values of type t (float32, float16 or bfloat16): an exponent of all ones.
size_t count_nonfinite(DataType t, const void* x, size_t n);
void divide_float(float* x, size_t n, float divisor);                    // x /= divisor (an average of
                                                                        // equal values stays exact)
void add_float(const float* in, float* acc, size_t n);                  // acc += in

}  // namespace qccl::kernels
