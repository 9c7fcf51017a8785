// The drop-in's dispatch on stand-ins for the CUDA driver and the real NCCL (fake_cuda.c, fake_nccl.cc):
// where empty calls run (their buffers say nothing), and what a call keeps of a PreMulSum op that is
// destroyed before its group ends. One process; several ranks are driven from one thread in groups.
#include <dlfcn.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

#define NCCL_RESULT_IS_OK(CHECKER, call)                                             \
  do {                                                                               \
    const ncclResult_t result_ = (call);                                             \
    INFO(#call << " -> " << result_ << ": " << ncclGetLastError(nullptr));           \
    CHECKER(result_ == ncclSuccess);                                                 \
  } while (0)
#define NCCL_CHECK_OK(call) NCCL_RESULT_IS_OK(REQUIRE, call)
// Between ncclGroupStart and ncclGroupEnd: a failure must not leave the thread's group open for the
// test cases that follow.
#define NCCL_GROUPED_OK(call) NCCL_RESULT_IS_OK(CHECK, call)

// The stand-ins' hooks: which memory is "device memory", and what the fake NCCL ran.
struct Fakes {
  void (*set_device_memory)(const void*, size_t) = nullptr;
  int (*calls_of)(int) = nullptr;
  int (*live_ops)() = nullptr;

  static const Fakes& get() {
    static const Fakes fakes = [] {
      Fakes f;
      void* cuda = dlopen("libcuda.so.1", RTLD_NOW);  // the stand-in, first on LD_LIBRARY_PATH
      const char* nccl_path = std::getenv("QCCL_NCCL_LIB");
      void* nccl = nccl_path ? dlopen(nccl_path, RTLD_NOW) : nullptr;
      if (cuda) f.set_device_memory = reinterpret_cast<void (*)(const void*, size_t)>(dlsym(cuda, "fake_cuda_set_device_memory"));
      if (nccl) {
        f.calls_of = reinterpret_cast<int (*)(int)>(dlsym(nccl, "fake_nccl_calls_of"));
        f.live_ops = reinterpret_cast<int (*)()>(dlsym(nccl, "fake_nccl_live_ops"));
      }
      return f;
    }();
    REQUIRE(fakes.set_device_memory != nullptr);
    REQUIRE(fakes.calls_of != nullptr);
    REQUIRE(fakes.live_ops != nullptr);
    return fakes;
  }
};

// "Device memory" for the stand-in driver: two ranks' buffers of 1024 floats.
std::vector<float>& device_memory() {
  static std::vector<float> memory(2048);
  Fakes::get().set_device_memory(memory.data(), memory.size() * sizeof(float));
  return memory;
}

// ncclCommInitAll's communicators, destroyed at the end of the scope.
struct Comms {
  std::vector<ncclComm_t> comms;
  explicit Comms(int n) : comms(n) { NCCL_CHECK_OK(ncclCommInitAll(comms.data(), n, nullptr)); }
  ~Comms() {
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
  ncclComm_t operator[](int r) const { return comms[r]; }
};

TEST_CASE("an empty call on device or NULL buffers runs with a group of device calls", "[empty]") {
  float* memory = device_memory().data();
  const Fakes& fakes = Fakes::get();
  Comms comms(2);
  int calls_before[2];
  for (int r = 0; r < 2; ++r) calls_before[r] = fakes.calls_of(r);
  NCCL_CHECK_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) {
    float* buffer = memory + 1024 * r;
    NCCL_GROUPED_OK(ncclAllReduce(buffer, buffer, 16, ncclFloat32, ncclSum, comms[r], nullptr));
    NCCL_GROUPED_OK(ncclAllReduce(buffer, buffer, 0, ncclFloat32, ncclSum, comms[r], nullptr));
    NCCL_GROUPED_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat32, comms[r], nullptr));
  }
  NCCL_CHECK_OK(ncclGroupEnd());  // was refused: "mixes calls qccl runs ... with calls for the real NCCL"
  // The empty calls are dropped, as the real NCCL discards an empty collective.
  for (int r = 0; r < 2; ++r) CHECK(fakes.calls_of(r) - calls_before[r] == 1);
}

TEST_CASE("an empty fp8 call completes at once, as in NCCL; one that moves values is refused", "[empty]") {
  device_memory();
  Comms comms(1);
  NCCL_CHECK_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat8e4m3, ncclSum, comms[0], nullptr));
  NCCL_CHECK_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat8e5m2, comms[0], nullptr));
  std::vector<float> host(16, 1.0f);
  NCCL_CHECK_OK(ncclGroupStart());
  NCCL_GROUPED_OK(ncclAllReduce(host.data(), host.data(), host.size(), ncclFloat32, ncclSum, comms[0], nullptr));
  NCCL_GROUPED_OK(ncclBroadcast(nullptr, nullptr, 0, ncclFloat8e5m2, 0, comms[0], nullptr));
  NCCL_CHECK_OK(ncclGroupEnd());
  CHECK(host[0] == 1.0f);
  std::vector<uint8_t> bytes(16);
  CHECK(ncclAllReduce(bytes.data(), bytes.data(), bytes.size(), ncclFloat8e4m3, ncclSum, comms[0], nullptr) ==
        ncclInvalidArgument);
  CHECK_THAT(std::string(ncclGetLastError(nullptr)), Catch::Contains("qccl has no fp8 types"));
}

TEST_CASE("QCCL_NCCL_CODEC from 0 bytes: empty calls run exact", "[empty]") {
  device_memory();
  setenv("QCCL_NCCL_CODEC", "q8", 1);  // read when a communicator is made
  setenv("QCCL_NCCL_CODEC_MIN_BYTES", "0", 1);
  Comms comms(1);
  unsetenv("QCCL_NCCL_CODEC");
  unsetenv("QCCL_NCCL_CODEC_MIN_BYTES");
  // (A codec state holds at least one value: these failed in qcclCodecStoreGet.)
  NCCL_CHECK_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comms[0], nullptr));
  NCCL_CHECK_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat32, comms[0], nullptr));
  NCCL_CHECK_OK(ncclReduceScatter(nullptr, nullptr, 0, ncclFloat32, ncclSum, comms[0], nullptr));
  std::vector<float> host(64, 1.0f);
  NCCL_CHECK_OK(ncclAllReduce(host.data(), host.data(), host.size(), ncclFloat32, ncclSum, comms[0], nullptr));
  CHECK(host[0] == Approx(1.0f).epsilon(0.02));
}

// NCCL lets an op be destroyed as soon as the last call given it has returned: a grouped call's
// included, before its ncclGroupEnd.
TEST_CASE("a PreMulSum op destroyed before its grouped call's ncclGroupEnd: host buffers", "[premulsum]") {
  device_memory();
  Comms comms(1);
  float scalar = 2.0f;
  std::vector<float> host(4, 1.0f);
  ncclRedOp_t op;
  NCCL_CHECK_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comms[0]));
  NCCL_CHECK_OK(ncclGroupStart());
  NCCL_GROUPED_OK(ncclAllReduce(host.data(), host.data(), host.size(), ncclFloat32, op, comms[0], nullptr));
  NCCL_GROUPED_OK(ncclRedOpDestroy(op, comms[0]));
  NCCL_CHECK_OK(ncclGroupEnd());
  CHECK(host[0] == 2.0f);
}

TEST_CASE("a PreMulSum op destroyed before its grouped call's ncclGroupEnd: device buffers", "[premulsum]") {
  float* memory = device_memory().data();
  const Fakes& fakes = Fakes::get();
  Comms comms(2);
  const int ops_before = fakes.live_ops();
  int calls_before[2];
  for (int r = 0; r < 2; ++r) calls_before[r] = fakes.calls_of(r);
  float scalar = 0.5f;
  ncclRedOp_t ops[2];
  for (int r = 0; r < 2; ++r)
    NCCL_CHECK_OK(ncclRedOpCreatePreMulSum(&ops[r], &scalar, ncclFloat32, ncclScalarHostImmediate, comms[r]));
  NCCL_CHECK_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) {
    float* buffer = memory + 1024 * r;
    NCCL_GROUPED_OK(ncclAllReduce(buffer, buffer, 16, ncclFloat32, ops[r], comms[r], nullptr));
  }
  for (int r = 0; r < 2; ++r) NCCL_GROUPED_OK(ncclRedOpDestroy(ops[r], comms[r]));
  NCCL_CHECK_OK(ncclGroupEnd());  // the fake NCCL refuses an op that is not live
  for (int r = 0; r < 2; ++r) CHECK(fakes.calls_of(r) - calls_before[r] == 1);
  CHECK(fakes.live_ops() == ops_before);  // the real ops made for the calls were destroyed after them
}

}  // namespace
