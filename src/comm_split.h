// qcclCommSplit: new communicators from the ranks of a parent, NCCL's ncclCommSplit semantics.
#pragma once

#include <memory>

#include "include/qccl.h"
#include "src/comm.h"

namespace qccl {

// Collective over every rank of `parent`. Ranks that pass the same color >= 0 form one new
// communicator, ranked by (key, parent rank); a rank that passes a negative color joins none and gets
// null. The new communicator takes the parent's settings, with the fields of `overrides` that are set
// (overrides may be null), and is independent of the parent once made: both may be used at once,
// from the same or different threads. Throws Error with the parent's failure when the exchange over
// the parent fails, and as Comm::create does when the new communicator cannot be built.
std::shared_ptr<Comm> split_comm(Comm& parent, int color, int key, const qcclConfig_t* overrides);

}  // namespace qccl
