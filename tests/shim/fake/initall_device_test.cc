// The drop-in's device routing, run on stand-ins for the CUDA driver and the real NCCL (fake_cuda.c,
// fake_nccl.cc) so that it is tested where there is no GPU: NCCL's one process, one thread, several
// GPUs pattern, ncclCommInitAll and then one group of device calls. Each rank's real communicator is
// collective over the qccl communicator, and one thread drives both ranks: made one after the other,
// the first waited for the second until QCCL_TIMEOUT.
#include <dlfcn.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <vector>

TEST_CASE("ncclCommInitAll, then a group of device calls from one thread: each real communicator on its device") {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);  // the stand-in, first on LD_LIBRARY_PATH
  REQUIRE(cuda != nullptr);
  auto set_device_memory = reinterpret_cast<void (*)(const void*, size_t)>(dlsym(cuda, "fake_cuda_set_device_memory"));
  REQUIRE(set_device_memory != nullptr);
  const char* nccl_path = std::getenv("QCCL_NCCL_LIB");
  REQUIRE(nccl_path != nullptr);
  void* nccl = dlopen(nccl_path, RTLD_NOW);
  REQUIRE(nccl != nullptr);
  auto device_of = reinterpret_cast<int (*)(int)>(dlsym(nccl, "fake_nccl_device_of"));
  auto calls_of = reinterpret_cast<int (*)(int)>(dlsym(nccl, "fake_nccl_calls_of"));
  REQUIRE(device_of != nullptr);
  REQUIRE(calls_of != nullptr);

  std::vector<float> memory(2048);  // "device memory" for the stand-in driver
  set_device_memory(memory.data(), memory.size() * sizeof(float));
  constexpr int kRanks = 2;
  const int devlist[kRanks] = {1, 0};  // reversed: a rank's device is not its number
  ncclComm_t comms[kRanks];
  REQUIRE(ncclCommInitAll(comms, kRanks, devlist) == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    int device = -1;
    REQUIRE(ncclCommCuDevice(comms[r], &device) == ncclSuccess);
    CHECK(device == devlist[r]);
  }

  const auto begin = std::chrono::steady_clock::now();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    float* buffer = memory.data() + 1024 * r;
    REQUIRE(ncclAllReduce(buffer, buffer, 16, ncclFloat32, ncclSum, comms[r], nullptr) == ncclSuccess);
  }
  const ncclResult_t ended = ncclGroupEnd();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  CHECK(ended == ncclSuccess);
  INFO(ncclGetLastError(nullptr));
  CHECK(seconds < 5);  // QCCL_TIMEOUT is 20 s here
  for (int r = 0; r < kRanks; ++r) {
    CHECK(device_of(r) == devlist[r]);  // made on its own device, as NCCL binds it at init
    CHECK(calls_of(r) == 1);
  }
  for (int r = 0; r < kRanks; ++r) CHECK(ncclCommDestroy(comms[r]) == ncclSuccess);
}
