// For the GPU-labelled Catch2 programs (include it in one source file of the program): without a
// usable CUDA device (cudaGetDeviceCount fails or finds none) the program exits with kSkipCode (77)
// before the first test runs; CMake registers that code as the test's SKIP_RETURN_CODE, so CTest
// reports it as Skipped, neither Passed nor Failed. Listing tests (--list-tests) needs no device.
#pragma once

#define CATCH_CONFIG_EXTERNAL_INTERFACES  // TestEventListenerBase
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace qccl::test {

constexpr int kSkipCode = 77;

struct RequireCudaDevice : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo& info) override {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      std::printf("%s: SKIPPED, no CUDA device (%s)\n", info.name.c_str(),
                  e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
      std::fflush(stdout);
      std::_Exit(kSkipCode);  // not exit(): Catch's session is still live on main's stack
    }
    TestEventListenerBase::testRunStarting(info);
  }
};
CATCH_REGISTER_LISTENER(RequireCudaDevice)

}  // namespace qccl::test
