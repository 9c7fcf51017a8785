// QCCL_HD marks element-level numerics that both host launchers and CUDA kernels call, so that the
// two paths compute the same bits from one source (as cutlass's CUTLASS_HOST_DEVICE does).
#pragma once

#if defined(__CUDACC__)
#define QCCL_HD __host__ __device__ __forceinline__
#else
#define QCCL_HD inline
#endif
