// The NCCL drop-in's internals: errors, the real NCCL library, the CUDA driver probe, communicators.
// libqccl_nccl.so is built on qccl's public API (include/qccl.h) and NCCL's header only.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "qccl.h"

// NCCL 2.29's functions beyond the toolkit's 2.28 header that nccl-tests and PyTorch reference, with
// 2.29's signatures (NVIDIA/nccl src/nccl.h.in and nccl_device/core.h at v2.29). ncclCommProperties_t
// stays opaque: the drop-in only forwards it.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)
extern "C" {
typedef struct ncclCommProperties ncclCommProperties_t;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
}
#endif

namespace qccl_nccl {

// ---- Errors -----------------------------------------------------------------------------------------
// Every entry point runs inside `entry` (api.cc), which turns a ShimError into its result code and the
// thread's last-error line "ncclX: message" (ncclGetLastError). Nothing throws across the C boundary.
struct ShimError {
  ncclResult_t code;
  std::string message;
};
[[noreturn]] void fail(ncclResult_t code, const char* format, ...) __attribute__((format(printf, 2, 3)));
// Maps a qccl result onto NCCL's codes and throws with qccl's message; does nothing on success.
void check_qccl(qcclResult_t result, const char* what);
ncclResult_t to_nccl(qcclResult_t result);
// The process's last-error line (NCCL's is one for the process too, not one per thread).
void set_last_error(const std::string& message);
std::string last_error();
// A failure of the real NCCL: its message is its own ncclGetLastError's.
void set_last_error_from_real();
void keep_last_error();
bool last_error_is_real();

const char* type_name(ncclDataType_t t);
size_t type_size(ncclDataType_t t);  // 0 for a value that is not a datatype

// ---- Logging (QCCL_DEBUG and QCCL_DEBUG_FILE, as qccl reads them) ---------------------------------------
bool log_info();
void log(const char* level, const char* format, ...) __attribute__((format(printf, 2, 3)));
void reset_log();

// ---- The CUDA driver, loaded at run time ----------------------------------------------------------------
// The shim asks the driver (libcuda.so.1), not a CUDA runtime, where a pointer lives: the driver is the
// one copy every runtime in the process shares (a program may link cudart statically), and without it
// (a CPU-only machine) every buffer is host memory.
namespace cuda {
bool available();                     // a driver and at least one device
bool is_device_pointer(const void* p);  // device or managed memory (false without CUDA)
bool is_capturing(cudaStream_t stream);
// While it lives, this thread may allocate and initialise although a stream of the process captures a
// graph (cuThreadExchangeStreamCaptureMode to relaxed): the real NCCL's communicator, made at the first
// device call, may be made in the middle of a capture, and the global mode forbids its cudaMalloc.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int previous_ = 0;
  bool exchanged_ = false;
};
// While it lives, `device` (none: -1) is this thread's current device, as cudaSetDevice makes it: its
// primary context is pushed where another device's, or none, was current.
class OnDevice {
 public:
  OnDevice(int device, const char* call);
  ~OnDevice();
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int device_ = -1;  // pushed, to pop and release
};
void synchronize(cudaStream_t stream, const char* call);
int current_device();                 // -1 without CUDA
int device_count();
}  // namespace cuda

// ---- The real NCCL ------------------------------------------------------------------------------------
// Loaded on first need: dlopen of QCCL_NCCL_LIB, else the next libnccl.so.2 (RTLD_NEXT when the shim is
// preloaded in front of it). Its entry points are taken by their pncclX names, so that a call to the real
// library reaches its own code even when the shim interposes every ncclX and pncclX of the process.
struct RealNccl {
#define QCCL_NCCL_REAL_FN(ret, name, params) ret(*name) params = nullptr;
#include "shim/real_functions.inc"
#undef QCCL_NCCL_REAL_FN
  void (*ResetDebugInitInternal)() = nullptr;  // exported without a pncclX twin
  uintptr_t text_begin = 0, text_end = 0;  // the library's mapped range, to recognise its own calls
  std::string path;
  bool preloaded = false;  // found in the process (the drop-in preloaded in front of it), not dlopen'ed
};
const RealNccl* real();  // loads it on first use; nullptr when no real NCCL could be loaded
const RealNccl* real_if_loaded();  // without loading
// The real NCCL when the drop-in is preloaded in front of it: the owner of communicator handles the drop-in
// did not make. (A library the drop-in loaded itself makes no handle the program could hold.)
const RealNccl* real_owning_foreign_handles();
// True when `caller` (a return address) lies in the real library: its internal calls to its own API,
// which the dynamic linker binds to the shim when it is preloaded, go straight back to it.
bool called_from_real(const void* caller);

// ---- Communicators --------------------------------------------------------------------------------------
struct PreMulSumOp {
  ncclDataType_t datatype;
  ncclScalarResidence_t residence;
  const void* scalar_pointer;  // ncclScalarDevice: read when a call runs
  unsigned char immediate[8];  // ncclScalarHostImmediate: the value's bytes, read at creation
  ncclRedOp_t real_op;         // the real NCCL's twin, once the real communicator exists
  bool has_real = false;
};

struct Stats {
  std::atomic<uint64_t> host_calls{0}, device_calls{0}, compressed_calls{0};
  std::atomic<uint64_t> host_bytes{0}, device_bytes{0}, compressed_wire_bytes{0}, compressed_plain_bytes{0};
};

class CodecPolicy;
struct Clique;

struct Comm {
  // qccl's communicator: null while a non-blocking or grouped init runs, and after finalize or abort.
  // Atomic: ncclCommAbort may clear it from another thread while a call runs.
  std::atomic<qcclComm_t> q{nullptr};
  int nranks = 0, rank = 0;
  int device = -1;                 // the CUDA device current at init, or InitAll's (-1 without CUDA)
  bool blocking = true;
  std::atomic<bool> finalized{false};  // read by calls on any thread

  // Initialisation that has not finished (non-blocking config, or InitRank inside a group).
  std::thread init_thread;         // holds a reference to the Comm while it runs
  std::atomic<bool> abandoned{false};  // ncclCommAbort during the init: its result is aborted at once
  std::atomic<int> init_state{0};  // 0 done, 1 running; the result is init_result
  ncclResult_t init_result = ncclSuccess;
  std::string init_error;
  // Non-blocking splits of this communicator still to be settled: as in NCCL, which runs a split as a
  // job of its parent, this communicator reports ncclInProgress until they end and refuses calls
  // meanwhile (they would meet the split's own exchanges). A split this rank joins with
  // NCCL_SPLIT_NOCOLOR gives no handle to poll: its failure is reported here, once; a joined one's
  // on its own handle.
  struct PendingSplit {
    std::shared_ptr<Comm> child;
    bool joined;
  };
  std::mutex splits_mutex;
  std::vector<PendingSplit> pending_splits;
  // ncclCommFinalize of a non-blocking communicator runs as a job, as NCCL's: ncclCommGetAsyncError
  // reports ncclInProgress until it ends (then its result), and ncclCommDestroy refuses it meanwhile.
  std::thread finalize_thread;  // holds a reference to the Comm while it runs
  std::mutex jobs_mutex;        // the two threads' join and detach: ncclCommAbort may come from another
  std::atomic<bool> finalizing{false};
  ncclResult_t finalize_result = ncclSuccess;  // written before finalizing is cleared
  std::string finalize_error;

  // The real NCCL communicator, made at the first device-buffer call.
  std::atomic<ncclComm_t> real{nullptr};  // atomic: ncclCommGetAsyncError reads it from any thread
  std::mutex real_mutex;

  std::mutex ops_mutex;
  std::map<int, PreMulSumOp> ops;  // ncclNumOps, ncclNumOps + 1, ...
  int next_op = ncclNumOps;
  std::set<void*> registrations;   // host-memory ncclCommRegister handles

  // Which communicator this is, the same at each of its ranks: its unique id's bytes and how many
  // communicators this rank made from them before in this process, or its parent's identity with the
  // split's number and color. `splits` counts this one's ncclCommSplit calls, which
  // every rank makes in the same order.
  std::string identity;
  uint64_t splits = 0;
  // The ranks of one communicator that this process holds, however they were made (ncclCommInitAll,
  // InitRank or Split on several threads, in a group, or non-blocking): qccl's destroy is collective,
  // so theirs run together once the last of them is finalized or destroyed; one thread may then
  // finalize or destroy them one after the other, as NCCL allows (it reclaims them together too).
  std::shared_ptr<Clique> clique;
  // Handed to qcclCommDestroy (now or with its clique): claimed once, by a destroy or finalize or by
  // an abort from another thread (a watchdog's).
  std::atomic<bool> closed{false};

  std::unique_ptr<CodecPolicy> codec;
  qcclCodecStore_t store = nullptr;

  Stats stats;
  std::mutex logged_mutex;
  std::set<std::pair<std::string, int>> logged;  // (decision, size class) logged once at INFO

  ~Comm();
};

// The registry of live shim communicators: a handle not in it belongs to the real NCCL (or is bad).
// A call holds a reference for its duration, so that ncclCommAbort from another thread (which drops
// the registry's) never frees a communicator under a running call.
using CommRef = std::shared_ptr<Comm>;
ncclComm_t register_comm(CommRef c);
CommRef unregister_comm(ncclComm_t comm);
CommRef find_comm(ncclComm_t comm);
// The shim communicator behind `comm`, initialised: ncclInvalidArgument when it is none,
// ncclInvalidUsage while its initialisation runs or after it failed or was finalized.
CommRef usable(ncclComm_t comm, const char* arg = "comm");
// The state of c's non-blocking splits (Comm::pending_splits): true with *out = ncclInProgress while
// one runs, or a NOCOLOR one's failure (once); false once all ended. splitting: whether one runs.
bool pending_split_state(Comm& c, ncclResult_t* out);
bool splitting(Comm& c);

// Creation (comm.cc).
struct InitRequest {
  int nranks;
  int rank;
  qcclUniqueId id;
  bool blocking;
};
ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config);
void init_all(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t split(const CommRef& parent, int color, int key, ncclComm_t* newcomm, const ncclConfig_t* config);
// ncclInProgress where c is non-blocking: its finalize then runs as a job (Comm::finalizing).
ncclResult_t finalize(const CommRef& c);
void destroy(ncclComm_t comm);
void abort_comm(ncclComm_t comm);
void async_error(Comm& c, ncclResult_t* out);
// Runs a deferred or non-blocking initialisation (on whatever thread calls it).
void run_init(Comm& c, const InitRequest& request);
// The real NCCL communicator of c, made collectively over qccl the first time it is needed.
ncclComm_t ensure_real(Comm& c, const char* call);
// Reads the configuration fields the shim uses; checks size, magic and version as NCCL does.
bool config_blocking(const ncclConfig_t* config, const char* call);

// ---- Groups (dispatch.cc) ------------------------------------------------------------------------------
bool in_group();
void group_start();
ncclResult_t group_end();
// A call refused inside the open group (none outside one): as in NCCL, the group then fails as a
// whole, its outermost ncclGroupEnd running none of its calls (its communicators' creations still run).
void group_refuse(const char* name, const ShimError& error);
// A communicator's creation (InitRank or Split) called inside a group, run at the outermost
// ncclGroupEnd beside the group's others: `run` makes c (its init_result, then init_state 0). The
// splits of one parent run in the order called, on one thread; everything else on its own thread, as
// the ranks one process holds must all take part at once.
struct DeferredInit {
  CommRef c;
  std::function<void(Comm&)> run;
  const Comm* parent;  // the communicator split, or null
  int rank;            // in the parent or the new communicator, for messages
};
void defer_init(DeferredInit init);

}  // namespace qccl_nccl
