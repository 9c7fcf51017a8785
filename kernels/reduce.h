// Element-wise reduction of two host buffers: the arithmetic of every uncompressed collective.
//
// Numerical promise (the same on every rank, every run, every chunking):
//   - sum/prod on integers wrap modulo 2^bits (two's complement), as unsigned arithmetic does;
//   - float32/float64 follow IEEE 754 with round to nearest even, one operation per element;
//   - float16/bfloat16 are widened to float32, combined, and rounded back to nearest even after
//     every operation (what NCCL does), NaN stays NaN, overflow gives Inf;
//   - max/min on floating types propagate NaN (if either input is NaN the result is NaN), and are
//     symmetric: op(a, b) and op(b, a) give the same bits, so recursive doubling is bit-identical on
//     every rank;
//   - avg is carried as a sum; finish_average() then divides by the rank count (integers: truncation
//     toward zero; floating: multiplication by the correctly rounded 1/n for float32/float64 is NOT
//     used, we divide, so that an average of n equal values returns the value exactly).
// Vectorised with Highway, dispatched at run time to the best target of the CPU (SSE2 .. AVX-512), so
// a build runs on any x86-64. Every target gives identical bits (IEEE operations are exact-rounded
// whatever the vector width, and there is no reassociation across elements).
#pragma once

#include <cstddef>

#include "kernels/types.h"

namespace qccl::kernels {

// dst[i] = a[i] op b[i] for i < count. dst may equal a or b (in place); other overlaps are not
// allowed. RedOp::kAvg reduces as kSum. Blocks; thread-safe; no allocation.
void reduce(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count);

// buf[i] = buf[i] / nranks: the last step of RedOp::kAvg. Integers truncate toward zero; floating
// types divide in float32 (float16/bfloat16 widened, rounded back once) or float64.
void finish_average(DataType type, void* buf, size_t count, int nranks);

// Name of the Highway target reduce() dispatches to on this CPU, e.g. "AVX3" or "AVX2" (for logs).
const char* reduce_target_name();

}  // namespace qccl::kernels
