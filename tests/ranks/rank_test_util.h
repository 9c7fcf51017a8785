// Shared by the multi-rank tests, which run as real processes under qcclrun (one Catch2 process per
// rank, every rank running the same test cases in the same order).
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "include/qccl.h"
#include "tests/common/reference.h"

namespace qccl::test {

// Fails the test with qccl's last error when a call does not succeed.
#define QCCL_REQUIRE_OK(call)                                                                         \
  do {                                                                                                \
    qcclResult_t result_ = (call);                                                                    \
    INFO(#call << " -> " << qcclGetErrorString(result_) << ": " << qcclGetLastError(nullptr));        \
    REQUIRE(result_ == qcclSuccess);                                                                  \
  } while (0)

// The job's communicator, made from qcclrun's environment on first use, destroyed at exit.
class World {
 public:
  static World& get() {
    static World world;
    return world;
  }
  qcclComm_t comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  World() {
    qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
    if (qcclCommInitEnv(&comm_, &config) != qcclSuccess) {
      std::fprintf(stderr, "qcclCommInitEnv failed: %s\n", qcclGetLastError(nullptr));
      std::abort();
    }
    qcclCommUserRank(comm_, &rank_);
    qcclCommCount(comm_, &size_);
  }
  ~World() {
    if (qcclCommDestroy(comm_) != qcclSuccess)
      std::fprintf(stderr, "qcclCommDestroy failed: %s\n", qcclGetLastError(nullptr));
  }
  qcclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

inline qcclDataType_t to_api(DataType t) { return static_cast<qcclDataType_t>(t); }
inline qcclRedOp_t to_api(RedOp op) { return static_cast<qcclRedOp_t>(op); }

// Buffer of `count` elements of `t` filled with this rank's reference inputs, starting at element
// `first` of the rank's input sequence.
inline std::vector<uint8_t> inputs(DataType t, RedOp op, int rank, size_t count, size_t first = 0) {
  std::vector<uint8_t> b(count * kernels::element_size(t));
  for (size_t i = 0; i < count; ++i) store(t, b.data(), i, input_value(t, op, rank, first + i));
  return b;
}

// FNV-1a of a byte range, to compare results across ranks through a collective.
inline uint64_t hash_bytes(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

// A codec and a codec state for the length of a scope.
struct Codec {
  qcclCodec_t handle = nullptr;
  explicit Codec(const std::string& spec) { QCCL_REQUIRE_OK(qcclCodecCreate(spec.c_str(), &handle)); }
  ~Codec() { qcclCodecDestroy(handle); }
};

struct State {
  qcclCodecState_t handle = nullptr;
  State(qcclComm_t comm, size_t count) { QCCL_REQUIRE_OK(qcclCodecStateCreate(comm, count, &handle)); }
  ~State() { qcclCodecStateDestroy(handle); }
};

// Requires that every rank of the world holds the same bytes (a collective).
inline void require_same_everywhere(const void* data, size_t bytes) {
  World& w = World::get();
  uint64_t h = hash_bytes(data, bytes);
  std::vector<uint64_t> all(w.size());
  QCCL_REQUIRE_OK(qcclAllGather(&h, all.data(), 1, qcclUint64, w.comm()));
  for (uint64_t other : all) REQUIRE(other == h);
}

// Calls on one codec state run in call order: the rounds `inputs` (float32 averages), run blocking
// from the state as it is, then again from the same start as non-blocking calls all in flight at
// once, give the same results bit for bit. The state ends after the non-blocking rounds.
inline void require_nonblocking_in_call_order(const Codec& codec, const State& state,
                                              const std::vector<std::vector<float>>& inputs) {
  World& w = World::get();
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state.handle, &bytes));
  std::vector<uint8_t> start(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, start.data(), bytes));
  std::vector<std::vector<float>> blocking(inputs.size()), overlapped(inputs.size());
  for (size_t t = 0; t < inputs.size(); ++t) {
    blocking[t].resize(inputs[t].size());
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(inputs[t].data(), blocking[t].data(), inputs[t].size(), qcclFloat32,
                                            qcclAvg, codec.handle, state.handle, w.comm()));
  }
  QCCL_REQUIRE_OK(qcclCodecStateLoad(state.handle, start.data(), bytes));
  std::vector<qcclRequest_t> requests(inputs.size());
  for (size_t t = 0; t < inputs.size(); ++t) {
    overlapped[t].resize(inputs[t].size());
    QCCL_REQUIRE_OK(qcclIAllReduceCompressed(inputs[t].data(), overlapped[t].data(), inputs[t].size(), qcclFloat32,
                                             qcclAvg, codec.handle, state.handle, w.comm(), &requests[t]));
  }
  for (qcclRequest_t& r : requests) QCCL_REQUIRE_OK(qcclWait(&r));
  for (size_t t = 0; t < inputs.size(); ++t) CHECK(overlapped[t] == blocking[t]);
}

}  // namespace qccl::test
