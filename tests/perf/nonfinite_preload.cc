// Preloaded into all_reduce_perf (LD_PRELOAD) by perf_all_reduce_nonfinite_check_2_ranks:
// qcclAllReduceCompressed runs as usual and then returns qcclNonFinite, as it does on every rank when a
// codec's outputs hold NaN or Inf. The benchmark's checks feed it small integers, on which no codec
// can produce that, so only a stand-in shows whether a check fails on it.
#include <dlfcn.h>

#include "qccl.h"

extern "C" QCCL_API qcclResult_t qcclAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                                         qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                         qcclCodecState_t state, qcclComm_t comm) {
  using AllReduceCompressed = decltype(&qcclAllReduceCompressed);
  static const auto real = reinterpret_cast<AllReduceCompressed>(dlsym(RTLD_NEXT, "qcclAllReduceCompressed"));
  if (!real) return qcclInternalError;
  const qcclResult_t result = real(sendbuff, recvbuff, count, datatype, op, codec, state, comm);
  return result == qcclSuccess ? qcclNonFinite : result;
}
