// CudaDevice and NcclWire: src/device.h on the CUDA runtime and NCCL. The thin layer only: a step
// becomes the launch of its codec_cuda.h kernel (the same bits as the host's numerics), tickets are
// events on one non-blocking stream, staging is cudaHostAlloc'd memory, wire A is ncclSend/ncclRecv
// on that stream (libnccl.so.2 loaded at run time, so that libqccl needs no NCCL to load). Everything
// that decides what to launch and when is the device executor's (executor.cc), tested on CPUs
// against the stand-in.
#include <memory>
#include <string>

#include "base/errors.h"
#include "src/device.h"

#ifdef QCCL_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/socket.h"
#include "kernels/codec_cuda.h"
#include "kernels/fft_cuda.h"
#include "kernels/fft_sparse.h"

namespace qccl {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail(qcclSystemError, "CUDA: %s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

// Whether the calling thread has a CUDA context current (the driver's cuCtxGetCurrent, from the driver
// the runtime loaded). cudaGetDevice answers 0 on a thread that never chose a device, and making
// device 0 current there "again" creates its context (cudaSetDevice does since CUDA 12): every rank's
// progress thread would hold a context on GPU 0, hundreds of MiB each, refused under exclusive mode.
bool thread_has_context() {
  using GetCurrent = int (*)(void** context);
  static const GetCurrent get = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return driver ? reinterpret_cast<GetCurrent>(dlsym(driver, "cuCtxGetCurrent")) : nullptr;
  }();
  void* context = nullptr;
  return !get || (get(&context) == 0 && context != nullptr);  // (no answer: as before, assume one)
}

// The device current on the calling thread, -1 where it has none to give back.
int current_device() {
  int device = -1;
  if (!thread_has_context() || cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

// Makes a device current for a scope and gives the calling thread its own back, if it had one: the
// thread may be the application's (which may drive several GPUs) or the communicator's progress
// thread.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    previous_ = current_device();
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    else previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int device, bool cufft) : device_(device), cufft_(cufft) {
    const DeviceScope scope(device_);
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, device_), "cudaGetDeviceProperties");
    name_ = format("CUDA device %d (%s, sm_%d%d)", device_, props.name, props.major, props.minor);
    uuid_.assign(props.uuid.bytes, props.uuid.bytes + sizeof props.uuid.bytes);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~CudaDevice() override {
    // Never throws (DeviceScope would): the thread's device is set and given back by hand.
    const int previous = current_device();
    cudaSetDevice(device_);
    // Nothing may still use the events and the stream, nor a wake-up still write to the descriptor
    // (a stream that cannot drain keeps it open rather than let a reused number be written).
    const bool drained = cudaStreamSynchronize(stream_) == cudaSuccess;
    if (drained) kernels::fft_cuda_release(fft_workspace_);
    for (const Point& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    cudaEventDestroy(join_);
    cudaStreamDestroy(stream_);
    if (wake_fd_ >= 0 && drained) close(wake_fd_);
    if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  }

  std::string describe() const override { return name_; }

  void* allocate(Memory kind, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    void* p = nullptr;
    const cudaError_t e =
        kind == Memory::kDevice ? cudaMalloc(&p, bytes) : cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess)
      fail(qcclSystemError, "CUDA: %s of %zu bytes on %s failed: %s", kind == Memory::kDevice ? "cudaMalloc" : "cudaHostAlloc",
           bytes, name_.c_str(), cudaGetErrorString(e));
    return p;
  }
  void release(Memory kind, void* p) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    check(kind == Memory::kDevice ? cudaFree(p) : cudaFreeHost(p), kind == Memory::kDevice ? "cudaFree" : "cudaFreeHost");
  }

  void launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) override;

  // The step kernels' device form (collectives/device_kernels.h): codec_cuda.h's launchers.
  void int_encode(int bits, const float* x, size_t n, float alpha, bool stochastic, kernels::IntClip clip,
                  const kernels::PhiloxKey& key, uint64_t first, void* out, unsigned long long* clipped,
                  unsigned long long* nonfinite) override {
    enqueue("int_encode_cuda", [&] {
      return kernels::int_encode_cuda(bits, x, n, alpha, stochastic, clip, key, first, out, clipped, nonfinite, stream_);
    });
  }
  void int_add(int bits, const void* in, void* acc, size_t n) override {
    enqueue("int_add_cuda", [&] { return kernels::int_add_cuda(bits, in, acc, n, stream_); });
  }
  void int_decode(int bits, const void* in, size_t n, double scale, float* out, const unsigned long long* taint,
                  bool tainted, coll::DeviceCounters* counters) override {
    enqueue("int_decode_sums_cuda", [&] {
      return kernels::int_decode_sums_cuda(bits, in, n, scale, out, taint, tainted, &counters->squares_lo,
                                           &counters->max_abs, &counters->nonfinite, stream_);
    });
  }
  void pack_signs(const float* u, kernels::Compensation c, size_t first, size_t n, uint32_t* words, float* backup,
                  unsigned long long* nonfinite) override {
    enqueue("pack_signs_cuda",
            [&] { return kernels::pack_signs_cuda(u, c, first, n, words, backup, nonfinite, stream_); });
  }
  void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                   const kernels::PhiloxKey& key, uint64_t first_word) override {
    enqueue("merge_signs_cuda",
            [&] { return kernels::merge_signs_cuda(a, s, out, nwords, k, key, first_word, stream_); });
  }
  void decode_signs(const uint32_t* words, size_t n, float eta, float* g, kernels::Compensation c, size_t first,
                    const float* backup, const unsigned long long* taint, bool tainted,
                    unsigned long long* nonfinite) override {
    enqueue("decode_signs_checked_cuda", [&] {
      return kernels::decode_signs_checked_cuda(words, n, eta, g, c, first, backup, taint, tainted, nonfinite, stream_);
    });
  }
  void add_compensation(const float* x, kernels::Compensation c, size_t first, size_t n, float* out) override {
    enqueue("add_compensation_cuda", [&] { return kernels::add_compensation_cuda(x, c, first, n, out, stream_); });
  }
  void reset_compensation(const float* g, kernels::Compensation c, size_t first, size_t n,
                          unsigned long long* nonfinite) override {
    enqueue("reset_compensation_cuda",
            [&] { return kernels::reset_compensation_cuda(g, c, first, n, nonfinite, stream_); });
  }
  // The fft codec with cuFFT (fft_cuda.h), where QCCL_GPU_FFT=cufft asked for it; otherwise the
  // runtime runs fft calls through the host's codec on staged copies. The payloads' headers carry
  // the hash of the codec on cuFFT (frame headers too: comm.cc), so that a rank decoding them with
  // another library's rounding fails instead. The values of non-finite segments are counted where
  // the result is stored, as on the host.
  bool runs_fft() const override { return cufft_; }
  const char* fft_library() const override { return cufft_ ? kernels::fft_cuda_library() : kernels::fft_backend(); }
  void fft_encode(const kernels::CodecConfig& c, const float* in, size_t count, void* out, size_t* length,
                  float* residual, coll::DeviceCounters* counters) override {
    enqueue_fft("fft_encode_cuda", [&](kernels::FftCudaWorkspace* ws) {
      return kernels::fft_encode_cuda(c, fft_hash(c), in, count, out, length, residual, nullptr, &counters->clamped,
                                      ws, stream_);
    });
  }
  void fft_add_spectrum(const kernels::CodecConfig& c, const void* in, const size_t* length, size_t count,
                        float* spectrum, bool accumulate) override {
    enqueue_fft("fft_decode_spectrum_cuda", [&](kernels::FftCudaWorkspace* ws) {
      return kernels::fft_decode_spectrum_cuda(c, fft_hash(c), in, length, count, spectrum, accumulate, nullptr, ws,
                                               stream_);
    });
  }
  void fft_synthesize(const kernels::CodecConfig& c, const float* spectrum, size_t count, float* out) override {
    enqueue_fft("fft_synthesize_cuda", [&](kernels::FftCudaWorkspace* ws) {
      return kernels::fft_synthesize_cuda(c, spectrum, count, out, ws, stream_);
    });
  }
  void fft_restore_residual(const kernels::CodecConfig& c, const float* saved, const float* sum, size_t count,
                            float* residual) override {
    enqueue("fft_restore_residual_cuda",
            [&] { return kernels::fft_restore_residual_cuda(c, saved, sum, count, residual, stream_); });
  }
  void store_float(kernels::DataType type, const float* in, void* out, size_t n) override {
    enqueue("store_float_cuda", [&] { return kernels::store_float_cuda(type, in, out, n, nullptr, stream_); });
  }
  void write_bytes(void* dst, const void* bytes, size_t n) override {
    enqueue("write_bytes_cuda", [&] { return kernels::write_bytes_cuda(dst, bytes, n, stream_); });
  }
  void add_counter(unsigned long long* acc, const unsigned long long* add) override {
    enqueue("add_counter_cuda", [&] { return kernels::add_counter_cuda(acc, add, stream_); });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void zero(void* dst, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }
  Ticket record() override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    cudaEvent_t event = spare_event();
    check(cudaEventRecord(event, stream_), "cudaEventRecord");
    pending_.push_back({++recorded_, event});
    return recorded_;
  }
  bool reached(Ticket ticket) override {
    const std::lock_guard<std::mutex> lock(mu_);
    poll();
    return reached_ >= ticket;
  }
  void synchronize() override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    poll();
  }
  bool busy() override {
    const std::lock_guard<std::mutex> lock(mu_);
    poll();
    return !pending_.empty();
  }
  int event_fd() override { return wake_fd_; }
  // A host function after the last recorded point writes the descriptor (one per point armed for:
  // it holds the stream only for a write).
  bool arm() override {
    const std::lock_guard<std::mutex> lock(mu_);
    try {
      poll();
    } catch (const Error&) {
      return false;  // a fault of the stream's work: the executions' own polls report it, and fail
    }
    if (pending_.empty()) return true;
    if (wake_fd_ < 0) return false;
    if (armed_for_ == recorded_) return true;
    const DeviceScope scope(device_);
    if (cudaLaunchHostFunc(stream_, wake, &wake_fd_) != cudaSuccess) {
      cudaGetLastError();
      return false;  // poll instead
    }
    armed_for_ = recorded_;
    return true;
  }
  Mark mark(void* stream) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    cudaEvent_t event = spare_event();
    check(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord (the caller's stream)");
    return reinterpret_cast<Mark>(event);
  }
  void wait(Mark mark) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    auto event = reinterpret_cast<cudaEvent_t>(mark);
    // The wait takes the event's record as it is now: the event may be recorded again at once.
    check(cudaStreamWaitEvent(stream_, event, 0), "cudaStreamWaitEvent");
    spare_.push_back(event);
  }
  void forget(Mark mark) override {
    const std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back(reinterpret_cast<cudaEvent_t>(mark));
  }
  bool capturing(void* stream) override {
    const DeviceScope scope(device_);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (e == cudaErrorStreamCaptureImplicit) {  // the legacy stream, while another captures in global mode
      cudaGetLastError();
      return true;
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(qcclInvalidArgument, "the communicator's stream %p cannot be used on %s: %s", stream, name_.c_str(),
           cudaGetErrorString(e));
    }
    // Asked here, before the call takes its sequence number: a stream of another device would fail
    // later, at the join, with the call numbered on this rank and not sent (the peers waiting).
    int stream_device = -1;
    if (cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &stream_device) != cudaSuccess) {
      cudaGetLastError();  // (a driver too old to answer: the join reports it)
    } else if (stream_device != device_) {
      fail(qcclInvalidArgument, "the communicator's stream %p belongs to CUDA device %d, not to %s, whose memory the "
           "buffers are", stream, stream_device, name_.c_str());
    }
    return status != cudaStreamCaptureStatusNone;
  }
  void* native_stream() override { return stream_; }
  std::string uuid() override { return uuid_; }
  int ordinal() const override { return device_; }
  void signal(void* stream) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    check(cudaEventRecord(join_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), join_, 0), "cudaStreamWaitEvent (the caller's stream)");
  }

 private:
  struct Point {
    Ticket ticket;
    cudaEvent_t event;
  };
  // A launcher of codec_cuda.h on the stream; its error names it.
  template <typename Launch>
  void enqueue(const char* what, Launch&& launch) {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    const cudaError_t e = launch();
    if (e != cudaSuccess) fail(qcclSystemError, "CUDA: %s failed on %s: %s", what, name_.c_str(), cudaGetErrorString(e));
  }
  static uint32_t fft_hash(const kernels::CodecConfig& c) {
    return static_cast<uint32_t>(c.hash(kernels::fft_cuda_library()));
  }
  // enqueue() for the fft launchers: cuFFT loaded (else the call fails saying why), the workspace
  // of plans and scratch made at the first use, and a cuFFT failure named.
  template <class Launch>
  void enqueue_fft(const char* what, Launch&& launch) {
    const std::lock_guard<std::mutex> lock(mu_);
    const DeviceScope scope(device_);
    std::string why;
    if (!kernels::fft_cuda_available(&why))
      fail(qcclSystemError, "QCCL_GPU_FFT=cufft: the fft codec on %s needs cuFFT: %s", name_.c_str(), why.c_str());
    if (!fft_workspace_) fft_workspace_ = kernels::fft_cuda_workspace();
    const cudaError_t e = launch(fft_workspace_);
    const char* cufft = kernels::fft_cuda_error();
    if (e != cudaSuccess)
      fail(qcclSystemError, "CUDA: %s failed on %s: %s", what, name_.c_str(), *cufft ? cufft : cudaGetErrorString(e));
  }
  static void CUDART_CB wake(void* fd) {
    const uint64_t one = 1;
    ssize_t rc = ::write(*static_cast<int*>(fd), &one, sizeof one);
    (void)rc;  // a full counter already means "wake up"
  }
  cudaEvent_t spare_event() {
    cudaEvent_t event = nullptr;
    if (spare_.empty()) {
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } else {
      event = spare_.back();
      spare_.pop_back();
    }
    return event;
  }
  // Retires the recorded points the stream has passed, in order.
  void poll() {
    while (!pending_.empty()) {
      const cudaError_t e = cudaEventQuery(pending_.front().event);
      if (e == cudaErrorNotReady) return;
      check(e, "cudaEventQuery");  // a fault of earlier work on the stream
      reached_ = pending_.front().ticket;
      spare_.push_back(pending_.front().event);
      pending_.pop_front();
    }
  }

  // The communicator's calling thread joins streams while its progress thread launches: one at a time.
  std::mutex mu_;
  int device_;
  bool cufft_;  // QCCL_GPU_FFT=cufft
  kernels::FftCudaWorkspace* fft_workspace_ = nullptr;  // cuFFT plans and scratch, for this stream
  std::string name_;
  std::string uuid_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t join_ = nullptr;  // signal's, re-recorded every time: a wait takes the record it sees then
  std::deque<Point> pending_;
  std::vector<cudaEvent_t> spare_;
  Ticket recorded_ = 0, reached_ = 0;
  int wake_fd_ = -1;     // arm(): written when the stream reaches armed_for_
  Ticket armed_for_ = 0;
};

void CudaDevice::launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) {
  namespace st = coll::step;
  const std::lock_guard<std::mutex> lock(mu_);
  const DeviceScope scope(device_);
  cudaError_t e = cudaSuccess;
  const char* what = "";
  auto run = [&](const auto& s) {
    using S = std::decay_t<decltype(s)>;
    if constexpr (std::is_same_v<S, st::Reduce>) {
      what = "reduce_cuda";
      e = kernels::reduce_cuda(args.dtype, args.op, s.a, s.b, s.dst, s.count, stream_);
    } else if constexpr (std::is_same_v<S, st::Copy>) {
      what = "cudaMemcpyAsync";
      e = cudaMemcpyAsync(s.dst, s.src, s.bytes, cudaMemcpyDefault, stream_);
    } else if constexpr (std::is_same_v<S, st::Average>) {
      what = "finish_average_cuda";
      if (args.op == kernels::RedOp::kAvg) e = kernels::finish_average_cuda(args.dtype, s.buf, s.count, args.nranks, stream_);
    } else if constexpr (std::is_same_v<S, st::Load>) {
      what = "load_float_cuda";
      e = s.add ? kernels::load_add_float_cuda(args.dtype, s.src, s.dst, s.count, stream_)
                : kernels::load_float_cuda(args.dtype, s.src, s.dst, s.count, stream_);
    } else if constexpr (std::is_same_v<S, st::Store>) {
      what = "store_float_cuda";
      e = kernels::store_float_cuda(args.dtype, s.src, s.dst, s.count, nonfinite, stream_);
    } else if constexpr (std::is_same_v<S, st::AddFloat>) {
      what = "add_float_cuda";
      e = kernels::add_float_cuda(s.src, s.dst, s.count, stream_);
    } else if constexpr (std::is_same_v<S, st::Divide>) {
      what = "divide_float_cuda";
      e = kernels::divide_float_cuda(s.dst, s.count, static_cast<float>(args.nranks), stream_);
    } else if constexpr (std::is_same_v<S, st::Encode>) {
      what = "encode_cuda";
      if (s.length && s.codec->variable_length())
        fail(qcclInvalidUsage, "codec '%s' writes variable lengths, which the device path does not take yet",
             s.codec->canonical().c_str());
      kernels::PhiloxKey key = args.rng;
      key.stream = s.stream;
      e = kernels::encode_cuda(*s.codec, s.src, s.count, s.dst, key, s.first, nullptr, stream_);
      if (s.length) *s.length = s.codec->encoded_bytes(s.count);
    } else if constexpr (std::is_same_v<S, st::DecodeAdd>) {
      what = "decode_accumulate_cuda";
      e = kernels::decode_accumulate_cuda(*s.codec, s.src, s.count, s.dst, nullptr, stream_);
    } else if constexpr (std::is_same_v<S, st::DecodeOut>) {
      what = "decode_cuda";
      if (args.dtype == kernels::DataType::kFloat32) {
        e = kernels::decode_cuda(*s.codec, s.src, s.count, static_cast<float*>(s.dst), nonfinite, stream_);
      } else {
        // Counted in the datatype written, where a finite float32 sum may round to +-Inf (as the host).
        e = kernels::decode_cuda(*s.codec, s.src, s.count, s.scratch, nullptr, stream_);
        if (e == cudaSuccess) e = kernels::store_float_cuda(args.dtype, s.scratch, s.dst, s.count, nonfinite, stream_);
      }
    } else if constexpr (std::is_same_v<S, st::ErrorFeedback>) {
      what = "decode_cuda + feedback_residual_cuda";
      e = kernels::decode_cuda(*s.codec, s.encoded, s.count, s.residual, nullptr, stream_);
      if (e == cudaSuccess) e = kernels::feedback_residual_cuda(s.acc, s.residual, s.count, s.factor, stream_);
    } else {
      fail(qcclInternalError, "CudaDevice::launch: step %zu is not a data step", step.index());
    }
  };
  std::visit(run, step);
  if (e != cudaSuccess)
    fail(qcclSystemError, "CUDA: %s (%s, %s) failed on %s: %s", what, args.codec ? args.codec->canonical().c_str() : "no codec",
         kernels::data_type_name(args.dtype), name_.c_str(), cudaGetErrorString(e));
}

// ---- Wire A: NCCL point-to-point ----------------------------------------------------------------------

// The functions of libnccl.so.2 the wire uses, loaded once.
struct Nccl {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  std::string error;  // why it could not be loaded (then the pointers are null)

  static const Nccl& get() {
    static const Nccl nccl = load();
    return nccl;
  }

 private:
  static Nccl load() {
    Nccl n;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.error = format("cannot load libnccl.so.2: %s", dlerror());
      return n;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && ok) n.error = format("libnccl.so.2 has no %s", name), ok = false;
    };
    sym(n.get_unique_id, "ncclGetUniqueId");
    sym(n.comm_init_rank_config, "ncclCommInitRankConfig");
    sym(n.comm_get_async_error, "ncclCommGetAsyncError");
    sym(n.comm_destroy, "ncclCommDestroy");
    sym(n.comm_abort, "ncclCommAbort");
    sym(n.send, "ncclSend");
    sym(n.recv, "ncclRecv");
    sym(n.group_start, "ncclGroupStart");
    sym(n.group_end, "ncclGroupEnd");
    sym(n.error_string, "ncclGetErrorString");
    sym(n.get_version, "ncclGetVersion");
    // Where qccl's NCCL drop-in is installed as libnccl.so.2, this would be qccl over qccl.
    Dl_info info{};
    if (ok && dladdr(reinterpret_cast<void*>(n.get_unique_id), &info) && info.dli_fname &&
        std::strstr(info.dli_fname, "qccl")) {
      n.error = format("libnccl.so.2 is qccl's NCCL drop-in (%s), not NCCL", info.dli_fname);
      ok = false;
    }
    if (!ok) n.get_unique_id = nullptr;  // the marker of a usable library
    return n;
  }
};

// A non-blocking communicator's calls return ncclInProgress while NCCL still works on them (making
// the communicator, connecting to a peer at the first transfer with it): this waits until it is
// done, failed, or past the deadline. A launch settles in microseconds, so the first looks only
// yield; a connection or a communicator being made takes milliseconds, so later ones sleep.
ncclResult_t settle(const Nccl& nccl, ncclComm_t comm, ncclResult_t r, const net::Deadline& deadline) {
  for (int looks = 0; r == ncclInProgress; ++looks) {
    if (deadline.expired()) return ncclInProgress;
    if (looks < 200) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (nccl.comm_get_async_error(comm, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

class NcclWire final : public PeerWire {
 public:
  NcclWire(ncclComm_t comm, cudaStream_t stream, double timeout_seconds, std::string name)
      : nccl_(Nccl::get()), comm_(comm), stream_(stream), timeout_seconds_(timeout_seconds), name_(std::move(name)) {}
  ~NcclWire() override {
    if (!comm_) return;
    // ncclCommDestroy frees nothing while the communicator is failed or still busy (a check() that
    // failed or timed out): abort it then.
    ncclResult_t state = ncclSuccess;
    if (nccl_.comm_get_async_error(comm_, &state) == ncclSuccess && state == ncclSuccess)
      nccl_.comm_destroy(comm_);
    else
      nccl_.comm_abort(comm_);
  }
  std::string describe() const override { return name_; }
  void group_start() override { check(nccl_.group_start(), "ncclGroupStart"); }
  void group_end() override { check(nccl_.group_end(), "ncclGroupEnd"); }
  void send(int peer, const void* src, size_t bytes) override {
    check(nccl_.send(src, bytes, ncclUint8, peer, live(), stream_), "ncclSend");
  }
  void recv(int peer, void* dst, size_t bytes) override {
    check(nccl_.recv(dst, bytes, ncclUint8, peer, live(), stream_), "ncclRecv");
  }
  void abort() override {
    if (comm_) nccl_.comm_abort(comm_);
    comm_ = nullptr;
  }
  bool aborted() const override { return comm_ == nullptr; }

 private:
  ncclComm_t live() const {
    if (!comm_) fail(qcclSystemError, "NCCL: the communicator was aborted after a failure");
    return comm_;
  }
  void check(ncclResult_t r, const char* call) {
    r = settle(nccl_, live(), r, net::Deadline::after(timeout_seconds_));
    if (r == ncclInProgress)
      fail(qcclTimeout, "NCCL: %s did not complete within %g s (a peer that never posts its side?)", call,
           timeout_seconds_);
    if (r != ncclSuccess) fail(qcclSystemError, "NCCL: %s failed: %s", call, nccl_.error_string(r));
  }
  const Nccl& nccl_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  double timeout_seconds_;
  std::string name_;
};

}  // namespace

std::string nccl_unique_id(std::string* why) {
  const Nccl& nccl = Nccl::get();
  if (!nccl.get_unique_id) {
    if (why) *why = nccl.error;
    return {};
  }
  ncclUniqueId id;
  const ncclResult_t r = nccl.get_unique_id(&id);
  if (r != ncclSuccess) {
    if (why) *why = format("ncclGetUniqueId failed: %s", nccl.error_string(r));
    return {};
  }
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<PeerWire> make_nccl_wire(Device& device, int nranks, int rank, const std::string& unique_id,
                                         double timeout_seconds, std::string* why) {
  const Nccl& nccl = Nccl::get();
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda || !nccl.get_unique_id || unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    if (why) *why = !cuda ? "not a CUDA device" : !nccl.get_unique_id ? nccl.error : "a malformed NCCL unique id";
    return nullptr;
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  const DeviceScope scope(cuda->ordinal());
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = nccl.comm_init_rank_config(&comm, nranks, id, rank, &config);
  // Half the timeout: a rank whose making failed at once waits in the caller's agreement on the
  // outcome, and must not time out there before the others give up on NCCL and join it.
  const double init_seconds = timeout_seconds / 2;
  if (comm) r = settle(nccl, comm, r, net::Deadline::after(init_seconds));
  if (r != ncclSuccess) {
    if (comm) nccl.comm_abort(comm);
    if (why)
      *why = r == ncclInProgress
                 ? format("ncclCommInitRankConfig did not finish within %g s (a rank that never joined?)", init_seconds)
                 : format("ncclCommInitRankConfig failed: %s", nccl.error_string(r));
    return nullptr;
  }
  int version = 0;
  nccl.get_version(&version);
  return std::make_unique<NcclWire>(comm, static_cast<cudaStream_t>(device.native_stream()), timeout_seconds,
                                    format("NCCL %d.%d.%d point-to-point", version / 10000, version / 100 % 100,
                                           version % 100));
}

std::unique_ptr<Device> make_cuda_device(int ordinal, bool cufft, std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || ordinal < 0 || ordinal >= count) {
    cudaGetLastError();
    if (why)
      *why = e != cudaSuccess ? format("no CUDA device: %s", cudaGetErrorString(e))
                              : format("CUDA device %d is not one of this process's %d", ordinal, count);
    return nullptr;
  }
  return std::make_unique<CudaDevice>(ordinal, cufft);
}

bool nccl_available(std::string* why) {
  const Nccl& nccl = Nccl::get();
  if (!nccl.get_unique_id && why) *why = nccl.error;
  return nccl.get_unique_id != nullptr;
}

std::vector<std::string> describe_gpu_support() {
  std::vector<std::string> lines;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    lines.push_back(format("CUDA: no device (%s)", cudaGetErrorString(e)));
  } else {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime), cudaDriverGetVersion(&driver);
    std::string text = format("CUDA: runtime %d.%d, driver %d.%d, %d device%s", runtime / 1000, runtime % 1000 / 10,
                              driver / 1000, driver % 1000 / 10, count, count == 1 ? "" : "s");
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp props{};
      if (cudaGetDeviceProperties(&props, d) == cudaSuccess)
        text += format("%s#%d %s (sm_%d%d)", d ? ", " : ": ", d, props.name, props.major, props.minor);
    }
    lines.push_back(text);
  }
  const Nccl& nccl = Nccl::get();
  int version = 0;
  if (nccl.get_unique_id && nccl.get_version && nccl.get_version(&version) == ncclSuccess)
    lines.push_back(format("NCCL (QCCL_GPU_WIRE=nccl): libnccl.so.2, %d.%d.%d", version / 10000, version / 100 % 100,
                           version % 100));
  else
    lines.push_back("NCCL (QCCL_GPU_WIRE=nccl): " +
                    (nccl.error.empty() ? std::string("no ncclGetVersion") : nccl.error));
  std::string why;
  const std::string library = kernels::fft_cuda_library();  // "cufft12": libcufft.so.12
  lines.push_back(kernels::fft_cuda_available(&why)
                      ? "cuFFT (QCCL_GPU_FFT=cufft): libcufft.so." + library.substr(5) + ", hashed as " + library
                      : "cuFFT (QCCL_GPU_FFT=cufft): " + why);
  return lines;
}

}  // namespace qccl

#else  // a build without CUDA

namespace qccl {
namespace {
constexpr const char kNoCuda[] = "qccl was built without CUDA (QCCL_CUDA=OFF, or nvcc and NCCL were not found)";
}
std::unique_ptr<Device> make_cuda_device(int, bool, std::string* why) {
  if (why) *why = kNoCuda;
  return nullptr;
}
bool nccl_available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}
std::string nccl_unique_id(std::string* why) {
  if (why) *why = kNoCuda;
  return {};
}
std::unique_ptr<PeerWire> make_nccl_wire(Device&, int, int, const std::string&, double, std::string* why) {
  if (why) *why = kNoCuda;
  return nullptr;
}
std::vector<std::string> describe_gpu_support() { return {std::string("CUDA: ") + kNoCuda}; }
}  // namespace qccl

#endif
