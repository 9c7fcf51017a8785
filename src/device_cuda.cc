// CudaDevice: src/device.h on the CUDA runtime. The thin layer only: a step becomes the launch of
// its codec_cuda.h kernel (the same bits as the host's numerics), tickets are events on one
// non-blocking stream, staging is cudaHostAlloc'd memory. Everything that decides what to launch and
// when is the device executor's (executor.cc), tested on CPUs against the stand-in.
#include <memory>
#include <string>

#include "base/errors.h"
#include "src/device.h"

#ifdef QCCL_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <deque>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/codec_cuda.h"

namespace qccl {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail(qcclSystemError, "CUDA: %s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device) : device_(device) {
    use();
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, device_), "cudaGetDeviceProperties");
    name_ = format("CUDA device %d (%s, sm_%d%d)", device_, props.name, props.major, props.minor);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~CudaDevice() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // nothing may still use the events and the stream
    for (const Point& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    cudaEventDestroy(join_);
    cudaStreamDestroy(stream_);
  }

  std::string describe() const override { return name_; }

  bool is_device_pointer(const void* p) override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();  // not a pointer CUDA knows: host memory; clear the error it left
      return false;
    }
    return (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) &&
           attributes.device == device_;
  }

  void* allocate(Memory kind, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
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
    use();
    check(kind == Memory::kDevice ? cudaFree(p) : cudaFreeHost(p), kind == Memory::kDevice ? "cudaFree" : "cudaFreeHost");
  }

  void launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) override;

  void copy(void* dst, const void* src, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void zero(void* dst, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }
  Ticket record() override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
    cudaEvent_t event = nullptr;
    if (spare_.empty()) {
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } else {
      event = spare_.back();
      spare_.pop_back();
    }
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
    use();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    poll();
  }
  bool busy() override {
    const std::lock_guard<std::mutex> lock(mu_);
    poll();
    return !pending_.empty();
  }
  void wait_for(void* stream) override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
    check(cudaEventRecord(join_, static_cast<cudaStream_t>(stream)), "cudaEventRecord (the caller's stream)");
    check(cudaStreamWaitEvent(stream_, join_, 0), "cudaStreamWaitEvent");
  }
  void signal(void* stream) override {
    const std::lock_guard<std::mutex> lock(mu_);
    use();
    check(cudaEventRecord(join_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), join_, 0), "cudaStreamWaitEvent (the caller's stream)");
  }

 private:
  struct Point {
    Ticket ticket;
    cudaEvent_t event;
  };
  // The calling thread may be the application's or the communicator's progress thread: make this
  // device current for it (cheap when it already is).
  void use() { check(cudaSetDevice(device_), "cudaSetDevice"); }
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
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t join_ = nullptr;  // re-recorded for every join: a wait takes the record it sees then
  std::deque<Point> pending_;
  std::vector<cudaEvent_t> spare_;
  Ticket recorded_ = 0, reached_ = 0;
};

void CudaDevice::launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) {
  namespace st = coll::step;
  const std::lock_guard<std::mutex> lock(mu_);
  use();
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
        e = kernels::decode_cuda(*s.codec, s.src, s.count, s.scratch, nonfinite, stream_);
        if (e == cudaSuccess) e = kernels::store_float_cuda(args.dtype, s.scratch, s.dst, s.count, nullptr, stream_);
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

}  // namespace

std::unique_ptr<Device> make_cuda_device(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (why) *why = e != cudaSuccess ? format("no CUDA device: %s", cudaGetErrorString(e)) : "no CUDA device";
    return nullptr;
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return std::make_unique<CudaDevice>(device);
}

}  // namespace qccl

#else  // a build without CUDA

namespace qccl {
std::unique_ptr<Device> make_cuda_device(std::string* why) {
  if (why) *why = "qccl was built without CUDA (QCCL_CUDA=OFF, or nvcc and NCCL were not found)";
  return nullptr;
}
}  // namespace qccl

#endif
