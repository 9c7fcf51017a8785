// What FFT sparsification's method (fft_method.cc) and its plan (allreduce_fft_allgather.cc) share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/method.h"

namespace qccl::coll {

// One call of the fft codec: the error-feedback residual of its state (null without ef=on), and what
// its encodings saw, for the call's statistics.
struct FftCall final : MethodCall {
  float* residual = nullptr;
  void use_device_arrays(const std::vector<void*>& arrays) override {
    if (residual && !arrays.empty()) residual = static_cast<float*>(arrays[0]);
  }
  uint64_t clamped = 0;  // real or imaginary parts clamped to the range's largest magnitude
  MethodStats stats(const Plan&) const override {
    MethodStats s;
    s.clipped = clamped;
    return s;
  }
};

}  // namespace qccl::coll
