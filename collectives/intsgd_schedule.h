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

namespace qccl::coll {

// IntSGD's round, fixed when the call starts to run: its scale depends on the results of the earlier
// calls on the same codec state.
struct IntsgdRound {
  bool exact = false;  // a float all-reduce (the paper's exact first communication), not integers
  float alpha = 0;     // the scale every rank shares: m = Int(alpha * x), decoded as S / (n alpha)
};

// IntSGD's replicated memory (its codec state): identical on every rank, since it changes only through
// results every rank shares. r is the moving average of ||x^k - x^(k-1)||^2 = eta_(k-1)^2 ||g~||^2
// (alpha=lr) or of ||g~||^2 (alpha=grad), g~ the decoded average.
struct IntsgdMemory {
  double r = 0;
  bool has_r = false;  // false until a round completed with finite values: the next round is exact
};

// The round of the next call. Fixed alpha: always integers with it. Adaptive: while the memory has
// no observation, an exact round (or integers with alpha0 when the codec sets one); then
// alpha = sqrt(d) / sqrt(2 n r / eta^2 + eps^2), eta = lr (alpha=lr) or 1 (alpha=grad), rounded to
// float32 (the scale encode multiplies by; at most FLT_MAX). memory may be null (fixed alpha only).
IntsgdRound intsgd_round(const kernels::CodecConfig& codec, const IntsgdMemory* memory, double lr, size_t count,
                               int nranks);

// After a round that completed with finite values: r <- beta r + (1 - beta) v from r_0 = 0,
// v = lr^2 * mean_squares (alpha=lr) or mean_squares (alpha=grad), mean_squares = ||g~||^2 of the
// decoded average g~. A fixed alpha keeps no memory. r_0 = 0 is what Proposition 2's proof unrolls
// (E[r_k] = (1 - beta) sum_t beta^t ||x^(k-t) - x^(k-t-1)||^2), so that alpha meets Assumption 1's
// bound from the first integer round; the authors' code starts r at the first observation instead,
// which makes that round's alpha sqrt(1 / (1 - beta)) times smaller (its rounding variance 1 / (1 -
// beta) times the bound's) and decays over some 1 / (1 - beta) rounds.
void intsgd_observe(const kernels::CodecConfig& codec, IntsgdMemory* memory, double lr, double mean_squares);

// ||g~||^2 of an integer round: the exact sum of S^2 times (1 / (n alpha))^2.
double intsgd_integer_norm(double sum_of_squares, float alpha, int nranks);

// ||g~||^2 of an exact round's output (count values of dtype; a sum is divided by n first), summed in
// index order in double; NaN or Inf values are counted into *nonfinite (and make the norm useless).
double intsgd_exact_norm(const void* out, size_t count, kernels::DataType dtype, kernels::RedOp op, int nranks,
                         size_t* nonfinite);

}  // namespace qccl::coll
