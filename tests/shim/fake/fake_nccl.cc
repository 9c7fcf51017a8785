// A stand-in for the real libnccl.so.2, for the drop-in's device routing on machines without a GPU.
// Like NCCL's, pncclCommInitRank is collective: it returns once all nranks callers of an id have come
// (here: threads of this process), or fails after 10 s where a real NCCL would wait for ever. It
// records the device current at each init and the calls each communicator ran, and refuses, as NCCL
// does, an op that is neither built in nor a live PreMulSum op (counted for the test).
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

extern "C" int cuCtxGetDevice(int* device);  // the fake driver's

namespace {
std::mutex mu;
std::condition_variable arrivals;
std::map<std::string, int> arrived;
char last_error[256] = "";
struct FakeComm {
  int rank = -1, device = -1, calls = 0;
};
FakeComm made[8];
std::set<int> live_ops;  // PreMulSum ops made and not yet destroyed, of any communicator
int next_op = ncclNumOps;
}  // namespace

#define FAKE_API extern "C" __attribute__((visibility("default")))

// For the test: the device current when rank's communicator was made, and the calls it ran.
FAKE_API int fake_nccl_device_of(int rank) { return made[rank].device; }
FAKE_API int fake_nccl_calls_of(int rank) { return made[rank].calls; }
FAKE_API int fake_nccl_live_ops() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<int>(live_ops.size());
}

FAKE_API ncclResult_t pncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
FAKE_API ncclResult_t pncclGetUniqueId(ncclUniqueId* id) {
  static int made_ids = 0;
  std::lock_guard<std::mutex> lock(mu);
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "fake-%d", ++made_ids);
  return ncclSuccess;
}
FAKE_API ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (rank < 0 || rank >= 8) return ncclInvalidArgument;
  std::unique_lock<std::mutex> lock(mu);
  const std::string key(id.internal);
  ++arrived[key];
  arrivals.notify_all();
  if (!arrivals.wait_for(lock, std::chrono::seconds(10), [&] { return arrived[key] >= nranks; })) {
    std::snprintf(last_error, sizeof last_error, "fake NCCL: rank %d waited 10 s for %d ranks, %d came", rank, nranks,
                  arrived[key]);
    return ncclSystemError;
  }
  made[rank].rank = rank;
  if (cuCtxGetDevice(&made[rank].device) != 0) made[rank].device = -1;
  *comm = reinterpret_cast<ncclComm_t>(&made[rank]);
  return ncclSuccess;
}
FAKE_API ncclResult_t pncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t) {
  std::lock_guard<std::mutex> lock(mu);
  if (op >= ncclNumOps && !live_ops.count(op)) {
    std::snprintf(last_error, sizeof last_error, "fake NCCL: op %d is not a live PreMulSum op", static_cast<int>(op));
    return ncclInvalidArgument;
  }
  ++reinterpret_cast<FakeComm*>(comm)->calls;
  return ncclSuccess;
}
FAKE_API ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t,
                                                ncclComm_t) {
  std::lock_guard<std::mutex> lock(mu);
  *op = static_cast<ncclRedOp_t>(next_op++);
  live_ops.insert(*op);
  return ncclSuccess;
}
FAKE_API ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t) {
  std::lock_guard<std::mutex> lock(mu);
  return live_ops.erase(op) ? ncclSuccess : ncclInvalidArgument;
}
FAKE_API ncclResult_t pncclCommDestroy(ncclComm_t) { return ncclSuccess; }
FAKE_API ncclResult_t pncclCommAbort(ncclComm_t) { return ncclSuccess; }
FAKE_API ncclResult_t pncclCommFinalize(ncclComm_t) { return ncclSuccess; }
FAKE_API ncclResult_t pncclCommGetAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = ncclSuccess;
  return ncclSuccess;
}
FAKE_API const char* pncclGetLastError(ncclComm_t) { return last_error; }
FAKE_API ncclResult_t pncclGroupStart() { return ncclSuccess; }
FAKE_API ncclResult_t pncclGroupEnd() { return ncclSuccess; }
