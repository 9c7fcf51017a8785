// One NCCL call on a shim communicator: validated, then run on qccl (host buffers, and device buffers
// with QCCL_NCCL_DEVICE=qccl) or forwarded to the real NCCL (device buffers, graph capture), now or at
// the outermost ncclGroupEnd.
#pragma once

#include <optional>

#include "shim/shim.h"

namespace qccl_nccl {

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kGather, kScatter, kSend, kRecv };

struct Call {
  Kind kind;
  const char* name;  // "ncclAllReduce", ...
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // NCCL's count argument (per rank for AllGather/ReduceScatter/AlltoAll/Gather/Scatter)
  ncclDataType_t datatype;
  ncclRedOp_t op;  // reductions only
  int root;        // root, or peer for Send/Recv
  ncclComm_t handle;
  cudaStream_t stream;
  CommRef comm;
  bool device = false;       // forwarded to the real NCCL
  bool qccl_device = false;  // device buffers run on qccl's device path (QCCL_NCCL_DEVICE=qccl)
  // Moves no elements on this rank (count 0): its buffers say nothing of where it runs, so it runs
  // with whichever side its group takes (validate leaves it host unless a graph is being captured).
  bool empty = false;
  // A PreMulSum op's copy, taken when the call was validated: NCCL lets the op be destroyed as soon
  // as the call returns, also between a grouped call and its ncclGroupEnd.
  std::optional<PreMulSumOp> custom = std::nullopt;
};

// QCCL_NCCL_DEVICE: whether device buffers run on qccl's device path (qccl) or go to the real NCCL (nccl,
// unset or empty). Read once per process; another value fails with ncclInvalidArgument naming it.
bool device_on_qccl();

// Validates and runs (or queues, inside a group) a call whose comm is a shim communicator.
void dispatch(Call call);

// ncclGroupSimulateEnd: the real NCCL's estimate for a group of device calls.
ncclResult_t simulate_group_end(ncclSimInfo_t* info);

// Custom reduction ops (ncclRedOpCreatePreMulSum).
void create_premulsum(Comm& c, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence);
void destroy_op(Comm& c, ncclRedOp_t op);

}  // namespace qccl_nccl
