// IntSGD's schedule (Algorithm 1 and Proposition 2 of Mishchenko et al., ICLR 2022): which kind of
// round a call is and the scale alpha it uses, from the codec and the state's replicated memory; and
// how a completed round's result moves the memory on. Everything here reads only what every rank
// holds identically (the codec, the count, the rank count, the shared results, the learning rate all
// ranks pass), in double arithmetic in a fixed order, so every rank computes the same alpha bits;
// the frame headers carry alpha and check that (FrameHeader::codec_scale).
#pragma once

#include <cstddef>

#include "collectives/plan.h"
#include "kernels/codec.h"
#include "src/codec_state.h"

namespace qccl {

// The round of the next call. Fixed alpha: always integers with it. Adaptive: while the memory has
// no observation, an exact round (or integers with alpha0 when the codec sets one); then
// alpha = sqrt(d) / sqrt(2 n r / eta^2 + eps^2), eta = lr (alpha=lr) or 1 (alpha=grad), rounded to
// float32 (the scale encode multiplies by; at most FLT_MAX). memory may be null (fixed alpha only).
coll::IntsgdRound intsgd_round(const kernels::CodecConfig& codec, const IntsgdMemory* memory, double lr, size_t count,
                               int nranks);

// After a round that completed with finite values: r <- beta r + (1 - beta) v (r <- v the first time),
// v = lr^2 * mean_squares (alpha=lr) or mean_squares (alpha=grad), mean_squares = ||g~||^2 of the
// decoded average g~. A fixed alpha keeps no memory.
void intsgd_observe(const kernels::CodecConfig& codec, IntsgdMemory* memory, double lr, double mean_squares);

// ||g~||^2 of an integer round: the exact sum of S^2 times (1 / (n alpha))^2.
double intsgd_integer_norm(double sum_of_squares, float alpha, int nranks);

// ||g~||^2 of an exact round's output (count values of dtype; a sum is divided by n first), summed in
// index order in double; NaN or Inf values are counted into *nonfinite (and make the norm useless).
double intsgd_exact_norm(const void* out, size_t count, kernels::DataType dtype, kernels::RedOp op, int nranks,
                         size_t* nonfinite);

}  // namespace qccl
