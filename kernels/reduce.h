// Element-wise reduction of two host buffers: the arithmetic of every uncompressed collective.
//
// Numerical promise (the same on every rank, every run, every chunking, every Highway target):
//   - sum/prod on integers wrap modulo 2^bits (two's complement), as unsigned arithmetic does;
//   - float32/float64 follow IEEE 754 with round to nearest even, one operation per element;
//   - float16/bfloat16 are widened to float32, combined, and rounded back to nearest even after
//     every operation (what NCCL does), overflow gives Inf; the conversions are kernels/half.h's;
//   - every floating result that is NaN is the canonical NaN: positive, quiet, all payload bits set
//     (0x7FFF, 0x7FFFFFFF, 0x7FFF'FFFF'FFFF'FFFF). Inputs' payloads are not propagated, because x86
//     keeps the first operand's payload, which would make sum(NaN1, NaN2) depend on the order;
//   - max/min on floating types propagate NaN (if either input is NaN the result is the canonical
//     NaN) and order -0 < +0 (IEEE 754-2019 maximum/minimum): max(+0, -0) = +0, min(+0, -0) = -0.
//     Every floating op is thus symmetric, op(a, b) and op(b, a) give the same bits, so recursive
//     doubling is bit-identical on every rank;
//   - avg is carried as a sum; finish_average() then divides by the rank count. Integers truncate
//     toward zero. Floating types divide (rather than multiply by a rounded 1/n), so that a sum of n
//     equal values, when it is exact, averages back to exactly that value.
// This assumes the default floating-point environment (round to nearest, no flush-to-zero or
// denormals-are-zero in MXCSR); a thread that sets FTZ/DAZ gets flushed float32/float64 subnormals.
// Vectorised with Highway, dispatched at run time to the best target of the CPU (SSSE3, SSE4, AVX2,
// AVX-512, or a one-lane fallback), so a build runs on any x86-64. Every target gives identical bits:
// each element is one IEEE operation whatever the vector width, and nothing is reassociated.
#pragma once

#include <cstddef>

#include "kernels/types.h"

namespace qccl::kernels {

// dst[i] = a[i] op b[i] for i < count. dst may equal a or b (in place); other overlaps are not
// allowed. RedOp::kAvg reduces as kSum. Blocks; thread-safe; no allocation.
void reduce(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count);

// buf[i] = buf[i] / nranks (nranks >= 1): the last step of RedOp::kAvg. Integers truncate toward
// zero; floating types divide in float32 (float16/bfloat16 widened, rounded back once) or float64.
// Blocks; thread-safe; no allocation.
void finish_average(DataType type, void* buf, size_t count, int nranks);

// Name of the Highway target reduce() dispatches to on this CPU, e.g. "AVX3" or "AVX2" (for logs).
const char* reduce_target_name();

}  // namespace qccl::kernels
