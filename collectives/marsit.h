// What Marsit's two kinds of round share (Wu et al., "Sign Bit is Enough", DAC 2022, Alg. 1 and 2;
// ../shared/specs/marsit.md). Each call is round t = the codec state's step; the caller passes u (its
// learning-rate-scaled update) and the state holds the compensation c. Every rank contributes
// w = u + c and receives the same g:
//
//   sign round (allreduce_marsit.cc):   g = eta_s (2 b - 1), b the multi-hop merged signs of w;
//                                       c <- w - g
//   full precision, t mod K = 0 (here): g = the average of w over the ranks; c <- 0
//
// so that on every rank the updates sent so far plus c equal the updates given so far.
#pragma once

#include <memory>
#include <vector>

#include "collectives/plan.h"

namespace qccl::coll {

// The full-precision round: a ring all-reduce (average) of w = u + c into recvbuf, then c = 0 where
// the average is finite (where it is not, c is kept and the value is reported as non-finite).
std::unique_ptr<Plan> make_marsit_full_precision(const CollArgs& args, const PlanOptions& options);

// The links of both rounds: the ring in rank order, and on a torus the row and column rings too. Both
// rounds announce the same frame headers on the same links, so that ranks whose states are at
// different steps (one in a sign round, one in a full-precision round) meet a header that says so.
void marsit_links(const CollArgs& args, std::vector<int>* send_to, std::vector<int>* recv_from);

// Why Marsit cannot run these arguments, or nullptr.
const char* marsit_cannot_run(const CollArgs& args);

}  // namespace qccl::coll
