// Runs a test body once per Highway target: the host launchers must agree with the element functions
// (and so with the CUDA kernels) whichever target the machine dispatches to.
#pragma once

#include <catch2/catch.hpp>
#include <hwy/targets.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/reduce.h"

namespace qccl::kernels {

// Runs body once per Highway target that the kernels were compiled for and this CPU supports, with
// dispatch pinned to that target (the scalar target runs the element functions themselves).
template <class Body>
void for_each_target(Body body) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(targets.size() >= 2);  // at least the scalar fallback and one SIMD target on x86-64
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    INFO("Highway target " << hwy::TargetName(target));
    REQUIRE(std::string(reduce_target_name()) == hwy::TargetName(target));  // the pin took
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace qccl::kernels
