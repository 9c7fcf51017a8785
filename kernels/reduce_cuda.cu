// CUDA launchers of reduce.h's reduce() and finish_average() (declared in codec_cuda.h): one thread
// per element, grid-stride, over the element operations of reduce_ops.h. Built with --fmad=false,
// although no operation here could fuse: each element is one operation.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/codec_cuda.h"
#include "kernels/reduce_ops.h"

namespace qccl::kernels {

namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 15;  // beyond this, threads loop

// dst may equal a or b: each thread reads its element of both before it writes it.
template <class T, class Op>
__global__ void elementwise_kernel(const T* a, const T* b, T* dst, size_t n, Op op) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = op(a[i], b[i]);
}

template <class T, class Op>
cudaError_t launch_elementwise(const void* a, const void* b, void* dst, size_t n, Op op, cudaStream_t stream) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, elementwise_kernel<T, Op>, static_cast<const T*>(a), static_cast<const T*>(b),
                            static_cast<T*>(dst), n, op);
}

// Runs f(Op{}) with the operator of `op` (avg reduces as a sum).
template <class F>
cudaError_t with_op(RedOp op, const F& f) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return f(ReduceSum());
    case RedOp::kProd: return f(ReduceProd());
    case RedOp::kMax: return f(ReduceMaxMin<true>());
    case RedOp::kMin: return f(ReduceMaxMin<false>());
  }
  return cudaErrorInvalidValue;
}

// Runs f(T{}, wrap) for the element type T of `type`, where wrap(op) is the operator on T's
// elements: op itself, or op on widened float16/bfloat16.
template <class F>
cudaError_t with_type(DataType type, const F& f) {
  const auto same = [](auto op) { return op; };
  switch (type) {
    case DataType::kInt8: return f(int8_t{}, same);
    case DataType::kUint8: return f(uint8_t{}, same);
    case DataType::kInt32: return f(int32_t{}, same);
    case DataType::kUint32: return f(uint32_t{}, same);
    case DataType::kInt64: return f(int64_t{}, same);
    case DataType::kUint64: return f(uint64_t{}, same);
    case DataType::kFloat32: return f(float{}, same);
    case DataType::kFloat64: return f(double{}, same);
    case DataType::kFloat16:
      return f(uint16_t{}, [](auto op) { return OnFloat16<true, decltype(op)>{op}; });
    case DataType::kBfloat16:
      return f(uint16_t{}, [](auto op) { return OnFloat16<false, decltype(op)>{op}; });
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t reduce_cuda(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count,
                        cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (a == nullptr || b == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  return with_type(type, [&](auto element, auto wrap) {
    using T = decltype(element);
    return with_op(op, [&](auto o) { return launch_elementwise<T>(a, b, dst, count, wrap(o), stream); });
  });
}

cudaError_t finish_average_cuda(DataType type, void* buf, size_t count, int nranks, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (buf == nullptr || nranks < 1) return cudaErrorInvalidValue;
  return with_type(type, [&](auto element, auto wrap) {
    using T = decltype(element);
    return launch_elementwise<T>(buf, buf, buf, count, wrap(DivideByRanks{nranks}), stream);
  });
}

}  // namespace qccl::kernels
