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

// The bytes a validated call reads (its sendbuff's part this rank uses) and writes (its recvbuff's),
// and whether a later call must wait for an earlier one to finish: collectives in flight together
// run side by side, so a later one may read a buffer the earlier one is still writing (in place on
// one buffer, back to back), or write one it is still reading.
struct BufferUse {
  const void* read = nullptr;
  size_t read_bytes = 0;
  const void* written = nullptr;
  size_t written_bytes = 0;
};
BufferUse buffer_use(const coll::CollArgs& args);
bool must_wait_for(const BufferUse& earlier, const BufferUse& later);

}  // namespace qccl
