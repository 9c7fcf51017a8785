// Error feedback's element rule, one source for the host executor's ErrorFeedback step
// (src/executor.cc) and the CUDA launcher (feedback_residual_cuda), so that both keep the same bits.
#pragma once

#include "kernels/hd.h"

namespace qccl::kernels {

// The residual carried to the next call: what the peers missed of the accumulated value, `factor` times
// (acc - decoded), one rounding per operator. It restarts at 0 where that is not finite: a NaN or Inf
// fed back would poison every later call. (x - x is 0 exactly when x is finite; no <cmath> needed.)
QCCL_HD float feedback_miss(float acc, float decoded, float factor) {
  const float miss = factor * (acc - decoded);
  return miss - miss == 0.0f ? miss : 0.0f;
}

}  // namespace qccl::kernels
