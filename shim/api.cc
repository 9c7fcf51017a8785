// The exported NCCL API: every function of NCCL 2.28's nccl.h and the host functions of its device API
// (nccl_device.h), each defined as pncclX with ncclX a weak alias of it, as NCCL itself exports them
// (PROFAPI), without an ELF version node (libqccl_nccl.map).
//
// Every entry point goes through `entry`, which turns errors into result codes and the last-error line.
// Two kinds of call are handed to the real NCCL unchanged: calls that the real library makes to its own
// API (when the shim is preloaded, the dynamic linker binds them to the shim; they are recognised by
// their return address), and calls on communicators the shim did not make (the real library's own).
#include <cstdlib>
#include <cstring>
#include <new>

#include "shim/dispatch.h"

namespace qccl_nccl {
namespace {

template <typename F>
ncclResult_t entry(const char* name, F&& body) {
  try {
    return body();
  } catch (const ShimError& e) {
    // An empty message means the real NCCL failed, and the last-error line already has the words
    // (its own ncclGetLastError, or the stand-in's for a function it lacks).
    if (!e.message.empty()) set_last_error(std::string(name) + ": " + e.message);
    return e.code;
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(name) + ": out of memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    set_last_error(std::string(name) + ": internal error: " + e.what());
    return ncclInternalError;
  } catch (...) {
    set_last_error(std::string(name) + ": internal error");
    return ncclInternalError;
  }
}

// An entry point whose call a group holds (a collective, point-to-point, InitRank, Split): refused
// inside a group, it fails the whole group, as NCCL's ncclGroupErrCheck makes it.
template <typename F>
ncclResult_t grouped_entry(const char* name, F&& body) {
  return entry(name, [&] {
    try {
      return body();
    } catch (const ShimError& e) {
      group_refuse(name, e);
      throw;
    }
  });
}

[[noreturn]] void no_real(const char* what) {
  fail(ncclInvalidUsage, "%s, and no real NCCL is loaded (QCCL_NCCL_LIB names its path)", what);
}

const RealNccl& need_real(const char* what) {
  const RealNccl* r = real();
  if (!r) no_real(what);
  return *r;
}

// The communicator's state for calls that need it initialised but not necessarily still open.
CommRef initialized(ncclComm_t comm) {
  CommRef c = find_comm(comm);
  if (!c) fail(ncclInvalidArgument, "comm = %p is not a communicator of this library", static_cast<void*>(comm));
  if (c->init_state.load() != 0)  // as usable()
    fail(ncclInvalidArgument, "comm = %p is still being initialised (ncclCommGetAsyncError reports ncclInProgress)",
         static_cast<void*>(comm));
  if (c->init_result != ncclSuccess)
    fail(c->init_result, "comm = %p failed to initialise: %s", static_cast<void*>(comm), c->init_error.c_str());
  return c;
}

ncclResult_t checked_real(ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress) set_last_error_from_real();
  return r;
}

ncclResult_t run(Kind kind, const char* name, const void* sendbuff, void* recvbuff, size_t count,
                 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  CommRef c = usable(comm);
  dispatch(Call{kind, name, sendbuff, recvbuff, count, datatype, op, root, comm, stream, std::move(c)});
  return ncclSuccess;
}

}  // namespace
}  // namespace qccl_nccl

using namespace qccl_nccl;

// pncclX is the definition; ncclX a weak alias of it, both exported.
#define NCCL_SHIM_API(ret, name, params)                                                                 \
  extern "C" __attribute__((visibility("default"))) ret p##name params;                                  \
  extern "C" __attribute__((visibility("default"), weak, alias("p" #name))) ret name params;             \
  extern "C" __attribute__((visibility("default"))) ret p##name params

// The real library calling its own API: straight back to it.
#define FROM_REAL(name, ...)                                                                             \
  if (called_from_real(__builtin_return_address(0))) return real_if_loaded()->name(__VA_ARGS__)

// A communicator the shim did not make: the real NCCL's, when one is loaded.
#define FOREIGN(comm, name, ...)                                                                         \
  if (!find_comm(comm) && (comm) && real_owning_foreign_handles())                                         \
  return checked_real(real_owning_foreign_handles()->name(__VA_ARGS__))

// ---- Version, ids, errors ------------------------------------------------------------------------------

// The version of the header the shim implements (2.28's API), so that version-gated callers (nccl-tests,
// PyTorch) take the paths the shim serves.
NCCL_SHIM_API(ncclResult_t, ncclGetVersion, (int* version)) {
  FROM_REAL(GetVersion, version);
  return entry("ncclGetVersion", [&] {
    if (!version) fail(ncclInvalidArgument, "version = NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId)) {
  FROM_REAL(GetUniqueId, uniqueId);
  return entry("ncclGetUniqueId", [&] {
    if (!uniqueId) fail(ncclInvalidArgument, "uniqueId = NULL");
    qcclUniqueId id;
    // NCCL_COMM_ID, as NCCL: every process makes the same id from the address, none starts a root
    // here, and rank 0's init starts it there.
    if (const char* address = std::getenv("NCCL_COMM_ID")) {  // set but empty: refused, as NCCL
      if (const qcclResult_t r = qcclGetUniqueIdFromAddress(address, &id); r != qcclSuccess)
        fail(to_nccl(r), "NCCL_COMM_ID = '%s' (<ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>): %s", address,
             qcclGetLastError(nullptr));
    } else {
      check_qccl(qcclGetUniqueId(&id), "qcclGetUniqueId");
    }
    static_assert(sizeof(id) <= sizeof(*uniqueId), "qccl's id fits NCCL's");
    std::memset(uniqueId, 0, sizeof(*uniqueId));
    std::memcpy(uniqueId, &id, sizeof(id));
    return ncclSuccess;
  });
}

NCCL_SHIM_API(const char*, ncclGetErrorString, (ncclResult_t result)) {
  FROM_REAL(GetErrorString, result);
  switch (result) {  // NCCL's own words (init.cc), which callers print and some match
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

NCCL_SHIM_API(const char*, ncclGetLastError, (ncclComm_t comm)) {
  FROM_REAL(GetLastError, comm);
  if (last_error_is_real() && real_if_loaded()) return real_if_loaded()->GetLastError(nullptr);
  thread_local std::string line;  // a copy: valid until this thread's next call, whatever others do
  line = last_error();
  return line.c_str();
}

NCCL_SHIM_API(void, ncclResetDebugInit, ()) {
  FROM_REAL(ResetDebugInit);
  reset_log();
  if (const RealNccl* r = real_if_loaded()) r->ResetDebugInit();
}

// Exported by NCCL without a pncclX twin (and called by it through the dynamic linker).
extern "C" __attribute__((visibility("default"))) void ncclResetDebugInitInternal() {
  const RealNccl* r = real_if_loaded();
  if (r && r->ResetDebugInitInternal) r->ResetDebugInitInternal();
  if (!called_from_real(__builtin_return_address(0))) reset_log();
}

// ---- Communicators -------------------------------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclCommInitRankConfig,
              (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config)) {
  FROM_REAL(CommInitRankConfig, comm, nranks, commId, rank, config);
  return grouped_entry("ncclCommInitRankConfig", [&] { return init_rank(comm, nranks, commId, rank, config); });
}

NCCL_SHIM_API(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank)) {
  FROM_REAL(CommInitRank, comm, nranks, commId, rank);
  return grouped_entry("ncclCommInitRank", [&] { return init_rank(comm, nranks, commId, rank, nullptr); });
}

// Several ids spread NCCL's bootstrap over several roots; qccl's bootstrap has one root, and every rank
// holds every id, so all join through the first.
NCCL_SHIM_API(ncclResult_t, ncclCommInitRankScalable,
              (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config)) {
  FROM_REAL(CommInitRankScalable, newcomm, nranks, myrank, nId, commIds, config);
  return grouped_entry("ncclCommInitRankScalable", [&] {
    if (nId < 1 || nId > nranks) fail(ncclInvalidArgument, "nId = %d is outside [1, nranks = %d]", nId, nranks);
    if (!commIds) fail(ncclInvalidArgument, "commIds = NULL");
    return init_rank(newcomm, nranks, commIds[0], myrank, config);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist)) {
  FROM_REAL(CommInitAll, comm, ndev, devlist);
  return entry("ncclCommInitAll", [&] {
    init_all(comm, ndev, devlist);
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommFinalize, (ncclComm_t comm)) {
  FROM_REAL(CommFinalize, comm);
  FOREIGN(comm, CommFinalize, comm);
  return entry("ncclCommFinalize", [&] {
    if (!comm) return ncclSuccess;  // as NCCL 2.28
    // A second finalize is NCCL's ncclInvalidArgument (other calls on a finalized one: usable()'s).
    if (const CommRef c = find_comm(comm); c && c->finalized)
      fail(ncclInvalidArgument, "comm = %p was finalized already (ncclCommFinalize)", static_cast<void*>(comm));
    return finalize(usable(comm));
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm)) {
  FROM_REAL(CommDestroy, comm);
  FOREIGN(comm, CommDestroy, comm);
  return entry("ncclCommDestroy", [&] {
    if (comm) destroy(comm);  // NULL: nothing to do, as in NCCL
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm)) {
  FROM_REAL(CommAbort, comm);
  FOREIGN(comm, CommAbort, comm);
  return entry("ncclCommAbort", [&] {
    if (comm) abort_comm(comm);
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags)) {
  FROM_REAL(CommRevoke, comm, revokeFlags);
  FOREIGN(comm, CommRevoke, comm, revokeFlags);
  return entry("ncclCommRevoke", [&] {
    initialized(comm);
    return fail(ncclInvalidUsage,
                "qccl cannot stop a communicator's calls and keep it (revokeFlags = %d); ncclCommAbort stops and "
                "frees it", revokeFlags), ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommSplit,
              (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config)) {
  FROM_REAL(CommSplit, comm, color, key, newcomm, config);
  FOREIGN(comm, CommSplit, comm, color, key, newcomm, config);
  return grouped_entry("ncclCommSplit", [&] { return split(usable(comm), color, key, newcomm, config); });
}

NCCL_SHIM_API(ncclResult_t, ncclCommShrink,
              (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
               ncclConfig_t* config, int shrinkFlags)) {
  FROM_REAL(CommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  FOREIGN(comm, CommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  return entry("ncclCommShrink", [&] {
    initialized(comm);
    return fail(ncclInvalidUsage,
                "qccl builds a smaller communicator only with every rank taking part, which the %d excluded ranks "
                "do not; while they are alive, ncclCommSplit with NCCL_SPLIT_NOCOLOR on them does the same",
                excludeRanksCount), ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError)) {
  FROM_REAL(CommGetAsyncError, comm, asyncError);
  FOREIGN(comm, CommGetAsyncError, comm, asyncError);
  return entry("ncclCommGetAsyncError", [&] {
    CommRef c = find_comm(comm);
    if (!c) fail(ncclInvalidArgument, "comm = %p is not a communicator of this library", static_cast<void*>(comm));
    if (!asyncError) fail(ncclInvalidArgument, "asyncError = NULL");
    async_error(*c, asyncError);
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count)) {
  FOREIGN(comm, CommCount, comm, count);
  return entry("ncclCommCount", [&] {
    CommRef c = initialized(comm);
    if (!count) fail(ncclInvalidArgument, "count = NULL");
    *count = c->nranks;
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank)) {
  FOREIGN(comm, CommUserRank, comm, rank);
  return entry("ncclCommUserRank", [&] {
    CommRef c = initialized(comm);
    if (!rank) fail(ncclInvalidArgument, "rank = NULL");
    *rank = c->rank;
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device)) {
  FOREIGN(comm, CommCuDevice, comm, device);
  return entry("ncclCommCuDevice", [&] {
    CommRef c = initialized(comm);
    if (!device) fail(ncclInvalidArgument, "device = NULL");
    if (c->device < 0)
      fail(ncclInvalidUsage, "comm = %p has no CUDA device: the CUDA driver reported none when it was made, and "
           "qccl runs it on host memory", static_cast<void*>(comm));
    *device = c->device;
    return ncclSuccess;
  });
}

// ---- Memory and registration ------------------------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size)) {
  FROM_REAL(MemAlloc, ptr, size);
  return entry("ncclMemAlloc", [&] {
    return checked_real(need_real("ncclMemAlloc allocates device memory through the real NCCL").MemAlloc(ptr, size));
  });
}

NCCL_SHIM_API(ncclResult_t, ncclMemFree, (void* ptr)) {
  FROM_REAL(MemFree, ptr);
  return entry("ncclMemFree", [&] {
    return checked_real(need_real("ncclMemFree frees device memory through the real NCCL").MemFree(ptr));
  });
}

// Host memory needs no registration on qccl: the handle only marks the registration. Device memory is
// registered with the real communicator.
NCCL_SHIM_API(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle)) {
  FROM_REAL(CommRegister, comm, buff, size, handle);
  FOREIGN(comm, CommRegister, comm, buff, size, handle);
  return entry("ncclCommRegister", [&] {
    CommRef c = usable(comm);
    if (!handle) fail(ncclInvalidArgument, "handle = NULL");
    if (!buff && size) fail(ncclInvalidArgument, "buff = NULL with size = %zu", size);
    if (cuda::is_device_pointer(buff)) {
      ncclComm_t rc = ensure_real(*c, "ncclCommRegister");
      return checked_real(real()->CommRegister(rc, buff, size, handle));
    }
    void* token = new char;
    {
      std::lock_guard<std::mutex> lock(c->ops_mutex);
      c->registrations.insert(token);
    }
    *handle = token;
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle)) {
  FROM_REAL(CommDeregister, comm, handle);
  FOREIGN(comm, CommDeregister, comm, handle);
  return entry("ncclCommDeregister", [&] {
    CommRef c = initialized(comm);
    if (!handle) return ncclSuccess;  // as NCCL (register.cc)
    {
      std::lock_guard<std::mutex> lock(c->ops_mutex);
      if (c->registrations.erase(handle)) {
        delete static_cast<char*>(handle);
        return ncclSuccess;
      }
    }
    if (c->real) return checked_real(real()->CommDeregister(c->real, handle));
    return fail(ncclInvalidUsage, "handle = %p was not made by ncclCommRegister on comm %p", handle,
                static_cast<void*>(comm)), ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommWindowRegister,
              (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags)) {
  FROM_REAL(CommWindowRegister, comm, buff, size, win, winFlags);
  FOREIGN(comm, CommWindowRegister, comm, buff, size, win, winFlags);
  return entry("ncclCommWindowRegister", [&] {
    CommRef c = usable(comm);
    if (!buff || size == 0) return ncclSuccess;  // as NCCL (dev_runtime.cc): nothing to register, no window
    if (!cuda::is_device_pointer(buff))
      fail(ncclInvalidUsage, "buff = %p is host memory; qccl has no symmetric windows, which are device memory", buff);
    ncclComm_t rc = ensure_real(*c, "ncclCommWindowRegister");
    return checked_real(real()->CommWindowRegister(rc, buff, size, win, winFlags));
  });
}

NCCL_SHIM_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win)) {
  FROM_REAL(CommWindowDeregister, comm, win);
  FOREIGN(comm, CommWindowDeregister, comm, win);
  return entry("ncclCommWindowDeregister", [&] {
    CommRef c = initialized(comm);
    if (!win) return ncclSuccess;  // as NCCL (dev_runtime.cc)
    if (!c->real) fail(ncclInvalidUsage, "win = %p: comm %p has registered no window", static_cast<void*>(win),
                       static_cast<void*>(comm));
    return checked_real(real()->CommWindowDeregister(c->real, win));
  });
}

// ---- Reduction ops -------------------------------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclRedOpCreatePreMulSum,
              (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
               ncclComm_t comm)) {
  FROM_REAL(RedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  FOREIGN(comm, RedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  return entry("ncclRedOpCreatePreMulSum", [&] {
    create_premulsum(*usable(comm), op, scalar, datatype, residence);
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm)) {
  FROM_REAL(RedOpDestroy, op, comm);
  FOREIGN(comm, RedOpDestroy, op, comm);
  return entry("ncclRedOpDestroy", [&] {
    destroy_op(*initialized(comm), op);
    return ncclSuccess;
  });
}

// ---- Collectives and point to point --------------------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclReduce,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
               ncclComm_t comm, cudaStream_t stream)) {
  FROM_REAL(Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  FOREIGN(comm, Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  return grouped_entry("ncclReduce", [&] {
    return run(Kind::kReduce, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclBcast,
              (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)) {
  FROM_REAL(Bcast, buff, count, datatype, root, comm, stream);
  FOREIGN(comm, Bcast, buff, count, datatype, root, comm, stream);
  return grouped_entry("ncclBcast", [&] {
    return run(Kind::kBroadcast, "ncclBcast", buff, buff, count, datatype, ncclSum, root, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclBroadcast,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(Broadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
  FOREIGN(comm, Broadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return grouped_entry("ncclBroadcast", [&] {
    return run(Kind::kBroadcast, "ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclAllReduce,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
               ncclComm_t comm, cudaStream_t stream)) {
  FROM_REAL(AllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  FOREIGN(comm, AllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  return grouped_entry("ncclAllReduce", [&] {
    return run(Kind::kAllReduce, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclReduceScatter,
              (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
               ncclComm_t comm, cudaStream_t stream)) {
  FROM_REAL(ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  FOREIGN(comm, ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  return grouped_entry("ncclReduceScatter", [&] {
    return run(Kind::kReduceScatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclAllGather,
              (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
  FOREIGN(comm, AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
  return grouped_entry("ncclAllGather", [&] {
    return run(Kind::kAllGather, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclAlltoAll,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(AlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  FOREIGN(comm, AlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  return grouped_entry("ncclAlltoAll", [&] {
    return run(Kind::kAlltoAll, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclGather,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(Gather, sendbuff, recvbuff, count, datatype, root, comm, stream);
  FOREIGN(comm, Gather, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return grouped_entry("ncclGather", [&] {
    return run(Kind::kGather, "ncclGather", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclScatter,
              (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(Scatter, sendbuff, recvbuff, count, datatype, root, comm, stream);
  FOREIGN(comm, Scatter, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return grouped_entry("ncclScatter", [&] {
    return run(Kind::kScatter, "ncclScatter", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclSend,
              (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
               cudaStream_t stream)) {
  FROM_REAL(Send, sendbuff, count, datatype, peer, comm, stream);
  FOREIGN(comm, Send, sendbuff, count, datatype, peer, comm, stream);
  return grouped_entry("ncclSend", [&] {
    return run(Kind::kSend, "ncclSend", sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream);
  });
}

NCCL_SHIM_API(ncclResult_t, ncclRecv,
              (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)) {
  FROM_REAL(Recv, recvbuff, count, datatype, peer, comm, stream);
  FOREIGN(comm, Recv, recvbuff, count, datatype, peer, comm, stream);
  return grouped_entry("ncclRecv", [&] {
    return run(Kind::kRecv, "ncclRecv", nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream);
  });
}

// ---- Groups ------------------------------------------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclGroupStart, ()) {
  FROM_REAL(GroupStart);
  return entry("ncclGroupStart", [&] {
    group_start();
    return ncclSuccess;
  });
}

NCCL_SHIM_API(ncclResult_t, ncclGroupEnd, ()) {
  FROM_REAL(GroupEnd);
  return entry("ncclGroupEnd", [&] { return group_end(); });
}

// The real NCCL's cost model serves groups of device calls; qccl has none for host calls.
NCCL_SHIM_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo)) {
  FROM_REAL(GroupSimulateEnd, simInfo);
  return entry("ncclGroupSimulateEnd", [&] { return simulate_group_end(simInfo); });
}

// ---- Device API host functions (nccl_device.h) ----------------------------------------------------------------

NCCL_SHIM_API(ncclResult_t, ncclDevCommCreate,
              (ncclComm_t comm, ncclDevCommRequirements_t const* reqs, ncclDevComm_t* outDevComm)) {
  FROM_REAL(DevCommCreate, comm, reqs, outDevComm);
  FOREIGN(comm, DevCommCreate, comm, reqs, outDevComm);
  return entry("ncclDevCommCreate", [&] {
    CommRef c = usable(comm);
    ncclComm_t rc = ensure_real(*c, "ncclDevCommCreate (device communicators live in the real NCCL)");
    return checked_real(real()->DevCommCreate(rc, reqs, outDevComm));
  });
}

NCCL_SHIM_API(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, ncclDevComm_t const* devComm)) {
  FROM_REAL(DevCommDestroy, comm, devComm);
  FOREIGN(comm, DevCommDestroy, comm, devComm);
  return entry("ncclDevCommDestroy", [&] {
    CommRef c = initialized(comm);
    if (!c->real) fail(ncclInvalidArgument, "devComm = %p: comm %p has made no device communicator",
                       static_cast<const void*>(devComm), static_cast<void*>(comm));
    return checked_real(real()->DevCommDestroy(c->real, devComm));
  });
}

// Teams describe ranks; they cannot fail. Without the real communicator, a host communicator's world is
// itself, and no two of its ranks share device memory: each rank's LSA team is itself alone, and the
// rail (the ranks of one LSA index across LSA teams) is the world.
namespace {
ncclTeam_t host_team(ncclComm_t comm, bool self_only) {
  CommRef c = find_comm(comm);
  if (!c) {
    set_last_error("ncclTeam*: comm is not a communicator of this library");
    return ncclTeam_t{0, 0, 1};
  }
  return self_only ? ncclTeam_t{1, 0, 1} : ncclTeam_t{c->nranks, c->rank, 1};
}
}  // namespace

#define TEAM_FN(name, self_only)                                                                   \
  NCCL_SHIM_API(ncclTeam_t, ncclTeam##name, (ncclComm_t comm)) {                                   \
    FROM_REAL(Team##name, comm);                                                                   \
    if (!find_comm(comm) && comm && real_owning_foreign_handles())                                 \
      return real_owning_foreign_handles()->Team##name(comm);                                      \
    if (CommRef c = find_comm(comm); c && c->real) return real()->Team##name(c->real);             \
    return host_team(comm, self_only);                                                             \
  }
TEAM_FN(World, false)
TEAM_FN(Lsa, true)
TEAM_FN(Rail, false)
#undef TEAM_FN

NCCL_SHIM_API(int, ncclTeamRankToWorld, (ncclComm_t comm, ncclTeam_t team, int rank)) {
  FROM_REAL(TeamRankToWorld, comm, team, rank);
  if (!find_comm(comm) && comm && real_owning_foreign_handles())
    return real_owning_foreign_handles()->TeamRankToWorld(comm, team, rank);
  CommRef c = find_comm(comm);
  if (c && c->real) return real()->TeamRankToWorld(c->real, team, rank);
  if (!c) return -1;
  return c->rank + (rank - team.rank) * team.stride;
}

NCCL_SHIM_API(int, ncclTeamRankToLsa, (ncclComm_t comm, ncclTeam_t team, int rank)) {
  FROM_REAL(TeamRankToLsa, comm, team, rank);
  if (!find_comm(comm) && comm && real_owning_foreign_handles())
    return real_owning_foreign_handles()->TeamRankToLsa(comm, team, rank);
  CommRef c = find_comm(comm);
  if (c && c->real) return real()->TeamRankToLsa(c->real, team, rank);
  if (!c) return -1;
  return c->rank + (rank - team.rank) * team.stride == c->rank ? 0 : -1;  // the LSA team is this rank alone
}

NCCL_SHIM_API(ncclResult_t, ncclLsaBarrierCreateRequirement,
              (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)) {
  FROM_REAL(LsaBarrierCreateRequirement, team, nBarriers, outHandle, outReq);
  return entry("ncclLsaBarrierCreateRequirement", [&] {
    return checked_real(need_real("device barriers are the real NCCL's")
                            .LsaBarrierCreateRequirement(team, nBarriers, outHandle, outReq));
  });
}

NCCL_SHIM_API(ncclResult_t, ncclGinBarrierCreateRequirement,
              (ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle,
               ncclDevResourceRequirements_t* outReq)) {
  FROM_REAL(GinBarrierCreateRequirement, comm, team, nBarriers, outHandle, outReq);
  FOREIGN(comm, GinBarrierCreateRequirement, comm, team, nBarriers, outHandle, outReq);
  return entry("ncclGinBarrierCreateRequirement", [&] {
    CommRef c = usable(comm);
    ncclComm_t rc = ensure_real(*c, "ncclGinBarrierCreateRequirement (device barriers are the real NCCL's)");
    return checked_real(real()->GinBarrierCreateRequirement(rc, team, nBarriers, outHandle, outReq));
  });
}

// A size computation with no error channel: -1 (and the last-error line) without the real NCCL.
NCCL_SHIM_API(int, ncclLLA2ACalcSlots, (int maxElts, int maxEltSize)) {
  FROM_REAL(LLA2ACalcSlots, maxElts, maxEltSize);
  if (const RealNccl* r = real()) return r->LLA2ACalcSlots(maxElts, maxEltSize);
  set_last_error("ncclLLA2ACalcSlots: device all-to-all slots are the real NCCL's, and no real NCCL is loaded");
  return -1;
}

NCCL_SHIM_API(ncclResult_t, ncclLLA2ACreateRequirement,
              (int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)) {
  FROM_REAL(LLA2ACreateRequirement, nBlocks, nSlots, outHandle, outReq);
  return entry("ncclLLA2ACreateRequirement", [&] {
    return checked_real(need_real("device all-to-all resources are the real NCCL's")
                            .LLA2ACreateRequirement(nBlocks, nSlots, outHandle, outReq));
  });
}

// ---- NCCL 2.29's host functions (declared in shim.h) --------------------------------------------------------
// Properties and window pointers describe the real NCCL's device state: forwarded, or refused naming
// themselves when no real communicator or library serves them.

NCCL_SHIM_API(ncclResult_t, ncclCommQueryProperties, (ncclComm_t comm, ncclCommProperties_t * props)) {
  FROM_REAL(CommQueryProperties, comm, props);
  FOREIGN(comm, CommQueryProperties, comm, props);
  return entry("ncclCommQueryProperties", [&] {
    CommRef c = usable(comm);
    if (!c->real)
      fail(ncclInvalidUsage, "comm = %p has no real NCCL communicator (it is made by the first device-buffer call), "
           "whose properties these are", static_cast<void*>(comm));
    return checked_real(real()->CommQueryProperties(c->real, props));
  });
}

#define WINDOW_FN(name, params, ...)                                                                     \
  NCCL_SHIM_API(ncclResult_t, nccl##name, params) {                                                      \
    FROM_REAL(name, __VA_ARGS__);                                                                        \
    return entry("nccl" #name, [&] {                                                                     \
      return checked_real(need_real("windows are the real NCCL's (ncclCommWindowRegister)").name(__VA_ARGS__)); \
    });                                                                                                  \
  }
WINDOW_FN(GetLsaMultimemDevicePointer, (ncclWindow_t window, size_t offset, void** outPtr), window, offset, outPtr)
WINDOW_FN(GetLsaDevicePointer, (ncclWindow_t window, size_t offset, int lsaRank, void** outPtr), window, offset,
          lsaRank, outPtr)
WINDOW_FN(GetPeerDevicePointer, (ncclWindow_t window, size_t offset, int peer, void** outPtr), window, offset, peer,
          outPtr)
#undef WINDOW_FN
