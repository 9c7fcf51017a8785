// What the shim finds at run time: errors and the last-error line, logging, the CUDA driver, and the
// real NCCL library.
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "shim/shim.h"

namespace qccl_nccl {

// ---- Errors -----------------------------------------------------------------------------------------

namespace {
// One line for the process, as NCCL's ncclLastError: a watchdog thread that sees a communicator's
// asynchronous error reads the words another thread's call failed with (PyTorch's does).
std::mutex g_last_error_mu;
std::string g_last_error;
bool g_last_error_real = false;
bool g_last_error_kept = false;  // a stand-in for a missing real function wrote it
}  // namespace

void fail(ncclResult_t code, const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  throw ShimError{code, buffer};
}

// qccl's blast-radius groups onto NCCL's codes. Mismatched calls are the caller's misuse
// (ncclInvalidUsage); a timeout, an abort and a dead peer all mean the communicator failed under the
// caller (ncclRemoteError: NCCL 2.28 has no timeout code).
ncclResult_t to_nccl(qcclResult_t result) {
  switch (result) {
    case qcclSuccess: return ncclSuccess;
    case qcclInvalidArgument: return ncclInvalidArgument;
    case qcclInvalidUsage: return ncclInvalidUsage;
    case qcclMismatch: return ncclInvalidUsage;
    case qcclRemoteError: return ncclRemoteError;
    case qcclTimeout: return ncclRemoteError;
    case qcclAborted: return ncclRemoteError;
    case qcclSystemError: return ncclSystemError;
    case qcclInternalError: return ncclInternalError;
    case qcclInProgress: return ncclInProgress;
    case qcclNonFinite: return ncclSuccess;  // see the caller: NCCL too returns NaN/Inf silently
    default: return ncclInternalError;
  }
}

// qccl's message names its call, argument and value; `what` adds the context when it says more.
void check_qccl(qcclResult_t result, const char* what) {
  if (result == qcclSuccess) return;
  std::string message = qcclGetLastError(nullptr);
  if (what && message.compare(0, std::strlen(what), what) != 0) message = std::string(what) + ": " + message;
  throw ShimError{to_nccl(result), message};
}

void set_last_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  g_last_error = message;
  g_last_error_real = false;
  g_last_error_kept = false;
}
std::string last_error() {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  return g_last_error;
}
// The real NCCL's own ncclGetLastError has the words, unless the "real" function was the shim's
// stand-in for one the library lacks, whose message names it.
void set_last_error_from_real() {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  if (g_last_error_kept) {
    g_last_error_kept = false;
    return;
  }
  g_last_error_real = true;
}
void keep_last_error() {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  g_last_error_kept = true;
}
bool last_error_is_real() {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  return g_last_error_real;
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "not a datatype";
  }
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// ---- Logging --------------------------------------------------------------------------------------------

namespace {
// The drop-in's own log reads QCCL_DEBUG and QCCL_DEBUG_FILE by the core's rules, mirrored from
// base/log.cc (the shim sees only the public API, which has no logging): NONE or empty is off, WARN,
// INFO or TRACE (here as INFO), anything else WARN with a warning; QCCL_DEBUG_FILE, with %h the short
// host name and %p the process id, opened for appending, the core's lines going to the same file.
struct Log {
  std::mutex mu;               // guards out and the first read; held while a line is written
  std::atomic<int> level{-1};  // -1 unread, 0 none, 1 WARN, 2 INFO and TRACE
  FILE* out = stderr;
};

Log& the_log() {
  static Log* log = new Log;  // never destroyed: logging works during exit
  return *log;
}

// With log.mu held.
void open_log(Log& log) {
  int level = 0;
  if (const char* v = std::getenv("QCCL_DEBUG")) {
    if (!strcasecmp(v, "WARN")) level = 1;
    else if (!strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"))
      level = 2;
    else if (strcasecmp(v, "NONE") && *v)
      std::fprintf(stderr, "qccl_nccl: QCCL_DEBUG = '%s' is not one of NONE, WARN, INFO, TRACE; using WARN\n", v),
          level = 1;
  }
  if (const char* path = std::getenv("QCCL_DEBUG_FILE"); path && *path && level > 0) {
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    if (char* dot = std::strchr(host, '.')) *dot = '\0';
    std::string name;
    for (const char* p = path; *p; ++p) {
      if (p[0] == '%' && p[1] == 'h')
        name += host, ++p;
      else if (p[0] == '%' && p[1] == 'p')
        name += std::to_string(getpid()), ++p;
      else
        name += *p;
    }
    if (FILE* f = std::fopen(name.c_str(), "a")) {
      setvbuf(f, nullptr, _IOLBF, 0);
      log.out = f;
    } else {
      std::fprintf(stderr, "qccl_nccl: QCCL_DEBUG_FILE = '%s': cannot open '%s' (%s); logging to stderr\n", path,
                   name.c_str(), std::strerror(errno));
    }
  }
  log.level.store(level, std::memory_order_release);
}

int log_level() {
  Log& log = the_log();
  const int level = log.level.load(std::memory_order_acquire);
  if (level >= 0) return level;
  std::lock_guard<std::mutex> lock(log.mu);
  if (log.level.load(std::memory_order_relaxed) < 0) open_log(log);
  return log.level.load(std::memory_order_relaxed);
}
}  // namespace

bool log_info() { return log_level() >= 2; }

void log(const char* level, const char* format, ...) {
  const bool info = !std::strcmp(level, "INFO");
  if (log_level() < (info ? 2 : 1)) return;
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  std::fprintf(log.out, "qccl_nccl %s %s\n", level, buffer);
  std::fflush(log.out);
}

// ncclResetDebugInit: the variables are read again at the next line, and a file reopened.
void reset_log() {
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  if (log.out != stderr) std::fclose(log.out);
  log.out = stderr;
  log.level.store(-1, std::memory_order_release);
}

// ---- The CUDA driver --------------------------------------------------------------------------------------

namespace cuda {
namespace {

struct Driver {
  bool ok = false;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*PointerGetAttributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;
  CUresult (*StreamSynchronize)(CUstream) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
  CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode*) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*StreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  int devices = 0;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    // Never unloaded: the driver lives as long as the process.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return out;
    auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(lib, "cuInit"));
    out.DeviceGetCount = reinterpret_cast<decltype(out.DeviceGetCount)>(dlsym(lib, "cuDeviceGetCount"));
    out.PointerGetAttributes = reinterpret_cast<decltype(out.PointerGetAttributes)>(dlsym(lib, "cuPointerGetAttributes"));
    out.StreamSynchronize = reinterpret_cast<decltype(out.StreamSynchronize)>(dlsym(lib, "cuStreamSynchronize"));
    out.StreamIsCapturing = reinterpret_cast<decltype(out.StreamIsCapturing)>(dlsym(lib, "cuStreamIsCapturing"));
    out.ThreadExchangeStreamCaptureMode = reinterpret_cast<decltype(out.ThreadExchangeStreamCaptureMode)>(
        dlsym(lib, "cuThreadExchangeStreamCaptureMode"));
    out.CtxGetDevice = reinterpret_cast<decltype(out.CtxGetDevice)>(dlsym(lib, "cuCtxGetDevice"));
    out.GetErrorString = reinterpret_cast<decltype(out.GetErrorString)>(dlsym(lib, "cuGetErrorString"));
    out.CtxGetCurrent = reinterpret_cast<decltype(out.CtxGetCurrent)>(dlsym(lib, "cuCtxGetCurrent"));
    out.StreamGetCtx = reinterpret_cast<decltype(out.StreamGetCtx)>(dlsym(lib, "cuStreamGetCtx"));
    out.CtxPushCurrent = reinterpret_cast<decltype(out.CtxPushCurrent)>(dlsym(lib, "cuCtxPushCurrent_v2"));
    out.CtxPopCurrent = reinterpret_cast<decltype(out.CtxPopCurrent)>(dlsym(lib, "cuCtxPopCurrent_v2"));
    out.DeviceGet = reinterpret_cast<decltype(out.DeviceGet)>(dlsym(lib, "cuDeviceGet"));
    out.DevicePrimaryCtxRetain =
        reinterpret_cast<decltype(out.DevicePrimaryCtxRetain)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    out.DevicePrimaryCtxRelease =
        reinterpret_cast<decltype(out.DevicePrimaryCtxRelease)>(dlsym(lib, "cuDevicePrimaryCtxRelease_v2"));
    if (!init || !out.DeviceGetCount || !out.PointerGetAttributes || !out.StreamSynchronize ||
        !out.StreamIsCapturing || !out.ThreadExchangeStreamCaptureMode || !out.CtxGetDevice || !out.GetErrorString || !out.CtxGetCurrent ||
        !out.StreamGetCtx || !out.CtxPushCurrent || !out.CtxPopCurrent || !out.DeviceGet ||
        !out.DevicePrimaryCtxRetain || !out.DevicePrimaryCtxRelease)
      return out;
    if (init(0) != CUDA_SUCCESS || out.DeviceGetCount(&out.devices) != CUDA_SUCCESS || out.devices <= 0) return out;
    out.ok = true;
    return out;
  }();
  return d;
}

const char* error_string(CUresult r) {
  const char* s = nullptr;
  if (driver().GetErrorString && driver().GetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

}  // namespace

bool available() { return driver().ok; }

int device_count() { return driver().ok ? driver().devices : 0; }

bool is_device_pointer(const void* p) {
  if (!p || !driver().ok) return false;
  // The plural query answers pageable host memory, which the driver does not know, with a zero type
  // where the singular one fails (an API error that compute-sanitizer reports at every host call).
  unsigned int type = 0;
  CUpointer_attribute attribute = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  void* data = &type;
  if (driver().PointerGetAttributes(1, &attribute, &data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_ARRAY;
}

bool is_capturing(cudaStream_t stream) {
  if (!driver().ok) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver().StreamIsCapturing(reinterpret_cast<CUstream>(stream), &status) != CUDA_SUCCESS) return false;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

RelaxedCapture::RelaxedCapture() {
  if (!driver().ok) return;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (driver().ThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
    previous_ = static_cast<int>(mode);
    exchanged_ = true;
  }
}

RelaxedCapture::~RelaxedCapture() {
  if (!exchanged_) return;
  auto mode = static_cast<CUstreamCaptureMode>(previous_);
  driver().ThreadExchangeStreamCaptureMode(&mode);
}

void synchronize(cudaStream_t stream, const char* call) {
  if (!driver().ok) return;  // without CUDA there is no stream work to wait for
  // A thread without a current context: a stream created elsewhere is waited for in its own context;
  // the default streams of a thread that never used CUDA hold nothing.
  CUcontext context = nullptr;
  const auto handle = reinterpret_cast<uintptr_t>(stream);
  const bool special = handle <= 2;  // 0 and CU_STREAM_LEGACY: the legacy stream; 2: per-thread
  bool pushed = false;
  if (driver().CtxGetCurrent(&context) != CUDA_SUCCESS || !context) {
    if (special || driver().StreamGetCtx(reinterpret_cast<CUstream>(stream), &context) != CUDA_SUCCESS ||
        driver().CtxPushCurrent(context) != CUDA_SUCCESS)
      return;
    pushed = true;
  }
  CUresult r = driver().StreamSynchronize(reinterpret_cast<CUstream>(stream));
  if (pushed) driver().CtxPopCurrent(&context);
  if (r != CUDA_SUCCESS)
    fail(ncclUnhandledCudaError, "waiting for stream %p before running on host buffers: %s (%s)", static_cast<void*>(stream),
         error_string(r), call);
}

OnDevice::OnDevice(int device, const char* call) {
  if (!driver().ok || device < 0) return;
  CUdevice current = -1;
  if (driver().CtxGetDevice(&current) == CUDA_SUCCESS && current == device) return;
  CUdevice d = -1;
  CUcontext context = nullptr;
  CUresult r = driver().DeviceGet(&d, device);
  if (r == CUDA_SUCCESS) r = driver().DevicePrimaryCtxRetain(&context, d);
  if (r == CUDA_SUCCESS && (r = driver().CtxPushCurrent(context)) != CUDA_SUCCESS) driver().DevicePrimaryCtxRelease(d);
  if (r != CUDA_SUCCESS)
    fail(ncclUnhandledCudaError, "making device %d current: %s (%s)", device, error_string(r), call);
  device_ = d;
}

OnDevice::~OnDevice() {
  if (device_ < 0) return;
  CUcontext context = nullptr;
  driver().CtxPopCurrent(&context);
  driver().DevicePrimaryCtxRelease(device_);
}

int current_device() {
  if (!driver().ok) return -1;
  CUdevice d = -1;
  // A thread with no current context is on device 0, as cudaGetDevice (NCCL's question) answers.
  if (driver().CtxGetDevice(&d) != CUDA_SUCCESS) return 0;
  return d;
}

}  // namespace cuda

// ---- The real NCCL ---------------------------------------------------------------------------------------

namespace {

// The [begin, end) of the object loaded at `base`, from its program headers.
struct RangeQuery {
  uintptr_t base, begin = 0, end = 0;
};
int find_range(dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<RangeQuery*>(data);
  if (info->dlpi_addr != q->base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
    if (!q->begin || lo < q->begin) q->begin = lo;
    if (hi > q->end) q->end = hi;
  }
  return 1;
}

// What a function of the 2.28 API does when the real library is older and lacks it: says so, by name.
template <const char* Name, typename R, typename... A>
R missing_impl(A...) {
  set_last_error(std::string(Name) + ": the real NCCL lacks this function (it is older than the NCCL API the drop-in forwards)");
  keep_last_error();
  if constexpr (std::is_same_v<R, ncclResult_t>) return ncclInvalidUsage;
  else if constexpr (std::is_same_v<R, int>) return -1;
  else if constexpr (std::is_same_v<R, const char*>) return "";
  else if constexpr (std::is_void_v<R>) return;
  else return R{};
}
template <const char* Name, typename R, typename... A>
auto missing_for(R (*)(A...)) -> R (*)(A...) {
  return &missing_impl<Name, R, A...>;
}
#define QCCL_NCCL_REAL_FN(ret, name, params) constexpr char kName##name[] = "nccl" #name;
#include "shim/real_functions.inc"
#undef QCCL_NCCL_REAL_FN

// Fills `out` from `handle`. An older NCCL lacks some of 2.28's functions: those answer with
// ncclInvalidUsage naming themselves. False when the handle is the shim itself (libnccl.so.2 may be a
// link to it) or when the basics are missing (not an NCCL library).
bool bind(void* handle, RealNccl* out) {
  std::string missing;
#define QCCL_NCCL_REAL_FN(ret, name, params)                                     \
  out->name = reinterpret_cast<ret(*) params>(dlsym(handle, "pnccl" #name));     \
  if (!out->name) {                                                              \
    missing += std::string(missing.empty() ? "" : ", ") + "pnccl" #name;         \
    out->name = missing_for<kName##name>(static_cast<ret(*) params>(nullptr));   \
  }
#include "shim/real_functions.inc"
#undef QCCL_NCCL_REAL_FN
  for (const char* basic : {"pncclGetVersion", "pncclGetUniqueId", "pncclCommInitRank", "pncclCommDestroy",
                            "pncclCommAbort", "pncclCommGetAsyncError", "pncclGetLastError", "pncclGroupStart",
                            "pncclGroupEnd", "pncclAllReduce"})
    if (!dlsym(handle, basic)) {
      log("WARN", "%s has no %s: not an NCCL library the drop-in can forward to", out->path.c_str(), basic);
      return false;
    }
  if (!missing.empty()) log("INFO", "the real NCCL (%s) lacks %s", out->path.c_str(), missing.c_str());
  out->ResetDebugInitInternal = reinterpret_cast<void (*)()>(dlsym(handle, "ncclResetDebugInitInternal"));
  Dl_info self{}, other{};
  if (!dladdr(reinterpret_cast<void*>(&real), &self) ||
      !dladdr(reinterpret_cast<void*>(out->GetVersion), &other) || self.dli_fbase == other.dli_fbase)
    return false;
  out->path = other.dli_fname ? other.dli_fname : out->path;
  RangeQuery q{reinterpret_cast<uintptr_t>(other.dli_fbase)};
  dl_iterate_phdr(find_range, &q);
  out->text_begin = q.begin;
  out->text_end = q.end;
  int version = 0;
  out->GetVersion(&version);
  log("INFO", "real NCCL %d loaded from %s", version, out->path.c_str());
  return true;
}

std::atomic<const RealNccl*> g_real{nullptr};
std::once_flag g_preloaded_once, g_load_once;

// Preloaded in front of a program that links libnccl.so.2: the next definition after the shim's is the
// real library's, already loaded. No dlopen of a new copy (two NCCL copies in a process do not mix).
void find_preloaded() {
  void* next = dlsym(RTLD_NEXT, "pncclGetVersion");
  if (!next) return;
  Dl_info info{};
  if (!dladdr(next, &info) || !info.dli_fname) return;
  void* handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return;
  auto* r = new RealNccl;
  r->path = info.dli_fname;
  r->preloaded = true;
  if (bind(handle, r)) g_real.store(r);
  else delete r;
}

void load() {
  std::call_once(g_preloaded_once, find_preloaded);
  if (g_real.load()) return;
  std::string path = "libnccl.so.2";
  if (const char* p = std::getenv("QCCL_NCCL_LIB"); p && *p) path = p;
  // RTLD_DEEPBIND: a copy loaded here binds its own calls to its own API (ncclGetUniqueId, ncclBroadcast,
  // ...) inside itself, not to the shim's definitions that come first in the global scope. The
  // sanitizer runtimes refuse RTLD_DEEPBIND (they must interpose every library); there the real
  // library's calls reach the shim's definitions, which hand calls whose return address lies in the
  // real library straight back to it, as for a preloaded shim.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int kBind = 0;
#else
  constexpr int kBind = RTLD_DEEPBIND;
#endif
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kBind);
  if (!handle) {
    log(std::getenv("QCCL_NCCL_LIB") ? "WARN" : "INFO", "no real NCCL: %s", dlerror());
    return;
  }
  auto* r = new RealNccl;
  r->path = path;
  if (bind(handle, r)) {
    g_real.store(r);
  } else {
    log("WARN", "%s is not a usable NCCL library; device buffers cannot be served", path.c_str());
    delete r;
  }
}

}  // namespace

const RealNccl* real() {
  std::call_once(g_load_once, load);
  return g_real.load();
}

const RealNccl* real_if_loaded() {
  std::call_once(g_preloaded_once, find_preloaded);
  return g_real.load();
}

const RealNccl* real_owning_foreign_handles() {
  const RealNccl* r = real_if_loaded();
  return r && r->preloaded ? r : nullptr;
}

bool called_from_real(const void* caller) {
  const RealNccl* r = real_if_loaded();
  auto a = reinterpret_cast<uintptr_t>(caller);
  return r && a >= r->text_begin && a < r->text_end;
}

}  // namespace qccl_nccl
