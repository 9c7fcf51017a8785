// What FFT sparsification's method (fft_method.cc) and its plan (allreduce_fft_allgather.cc) share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/method.h"
#include "collectives/plan.h"
#include "kernels/convert.h"

namespace qccl::coll {

// One call of the fft codec: the error-feedback residual of its state (null without ef=on), and what
// its encodings saw, for the call's statistics.
struct FftCall final : MethodCall {
  float* residual = nullptr;
  void use_device_arrays(const std::vector<void*>& arrays) override {
    if (residual && !arrays.empty()) residual = static_cast<float*>(arrays[0]);
  }
  uint64_t clamped = 0;  // real or imaginary parts clamped to the range's largest magnitude
  // The dense ring that a call falls back to (fallback=auto) sums exactly and counts nothing: its
  // NaN and Inf are counted here, as the codec's own plan counts its decoded outputs. It is the fixed-
  // length plan of several ranks (the codec's own sends variable lengths).
  static bool dense(const CollArgs& args, const Plan& plan) { return args.nranks > 1 && !plan.variable_length(); }
  bool reads_output(const Plan& plan) const override { return dense(plan.args(), plan); }
  void complete(const CollArgs& args, const Plan& plan, size_t* nonfinite) override {
    if (dense(args, plan)) *nonfinite += kernels::count_nonfinite(args.dtype, args.recvbuf, args.count);
  }
  MethodStats stats(const Plan&) const override {
    MethodStats s;
    s.clipped = clamped;
    return s;
  }
};

}  // namespace qccl::coll
