// Argument checks for every call, before anything is sent (bad input gets a clear error and loses
// nothing). Each failure throws Error(qcclInvalidArgument) naming the argument and its value.
#pragma once

#include <cstddef>

#include "collectives/plan.h"

namespace qccl {

// Raw arguments of a collective or point-to-point call, as the C API received them.
struct RawCall {
  coll::CollKind kind;
  const void* sendbuf;
  void* recvbuf;
  size_t count;
  int datatype;
  int op;    // ignored by collectives that do not reduce
  int root;  // Broadcast, Reduce; the peer for Send and Recv
};

coll::CollArgs validate_call(const RawCall& call, int rank, int nranks);

}  // namespace qccl
