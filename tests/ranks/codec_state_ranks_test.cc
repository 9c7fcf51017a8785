// Keyed codec states through the C API on real processes (src/codec_state.h, qcclCodecStore*): many
// tensors' error-feedback states in one store, their calls in flight together (per key in call order),
// a checkpoint of the whole store that replays the same bits, a random stream per key, erased keys, a
// store's own budget, and handles that refuse to be destroyed outside their store.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

constexpr uint64_t kKeys[] = {11, 12, uint64_t{1} << 50, 7};
constexpr size_t kCounts[] = {1000, 4096, 33, 70000};

struct Store {
  qcclCodecStore_t handle = nullptr;
  Store(qcclComm_t comm, size_t budget) { QCCL_REQUIRE_OK(qcclCodecStoreCreate(comm, budget, &handle)); }
  ~Store() { qcclCodecStoreDestroy(handle); }
};

float input(int rank, size_t key_index, int round, size_t i) {
  return static_cast<float>(
      std::sin(0.37 * static_cast<double>(i) + rank + 3.1 * static_cast<double>(key_index) + round));
}

// Round `round` of every key: all calls in flight at once (non-blocking), or one after the other.
std::vector<std::vector<float>> run_round(qcclCodecStore_t store, const Codec& codec, int round, bool overlapped) {
  World& w = World::get();
  std::vector<std::vector<float>> in(std::size(kKeys)), out(std::size(kKeys));
  std::vector<qcclRequest_t> requests;
  for (size_t k = 0; k < std::size(kKeys); ++k) {
    in[k].resize(kCounts[k]);
    out[k].assign(kCounts[k], -1.0f);
    for (size_t i = 0; i < kCounts[k]; ++i) in[k][i] = input(w.rank(), k, round, i);
    qcclCodecState_t state = nullptr;
    QCCL_REQUIRE_OK(qcclCodecStoreGet(store, kKeys[k], kCounts[k], &state));
    if (overlapped) {
      requests.emplace_back();
      QCCL_REQUIRE_OK(qcclIAllReduceCompressed(in[k].data(), out[k].data(), kCounts[k], qcclFloat32, qcclAvg,
                                               codec.handle, state, w.comm(), &requests.back()));
    } else {
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(in[k].data(), out[k].data(), kCounts[k], qcclFloat32, qcclAvg,
                                              codec.handle, state, w.comm()));
    }
  }
  for (qcclRequest_t& r : requests) QCCL_REQUIRE_OK(qcclWait(&r));
  return out;
}

std::vector<uint8_t> save(qcclCodecStore_t store) {
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStoreSize(store, &bytes));
  std::vector<uint8_t> buffer(bytes);
  QCCL_REQUIRE_OK(qcclCodecStoreSave(store, buffer.data(), bytes));
  return buffer;
}

}  // namespace

TEST_CASE("keyed states: calls on different keys in flight together give the bits of calls one by one",
          "[codec_state]") {
  World& w = World::get();
  Codec codec("q4:ef=on,round=stochastic,seed=5");
  Store overlapped(w.comm(), 0), sequential(w.comm(), 0);
  for (int round = 0; round < 3; ++round) {
    const auto a = run_round(overlapped.handle, codec, round, true);
    const auto b = run_round(sequential.handle, codec, round, false);
    for (size_t k = 0; k < std::size(kKeys); ++k) {
      INFO("round " << round << " key " << kKeys[k]);
      REQUIRE(a[k] == b[k]);
      require_same_everywhere(a[k].data(), a[k].size() * sizeof(float));
    }
  }
  // The residuals evolved identically too.
  CHECK(save(overlapped.handle) == save(sequential.handle));
}

TEST_CASE("keyed states: a store checkpoint replays a round bit for bit", "[codec_state]") {
  World& w = World::get();
  Codec codec("q2:ef=on,round=stochastic");
  Store store(w.comm(), 0);
  run_round(store.handle, codec, 0, true);
  const std::vector<uint8_t> checkpoint = save(store.handle);
  const auto first = run_round(store.handle, codec, 1, true);
  run_round(store.handle, codec, 2, true);
  QCCL_REQUIRE_OK(qcclCodecStoreLoad(store.handle, checkpoint.data(), checkpoint.size()));
  const auto replay = run_round(store.handle, codec, 1, true);  // same steps, same residuals: same bits
  for (size_t k = 0; k < std::size(kKeys); ++k) CHECK(replay[k] == first[k]);

  // Into a fresh store too, whose handles are made by the gets after the load.
  Store other(w.comm(), 0);
  QCCL_REQUIRE_OK(qcclCodecStoreLoad(other.handle, checkpoint.data(), checkpoint.size()));
  CHECK(run_round(other.handle, codec, 1, false) == first);
}

// Two tensors rounded at the same step with the same numbers would have correlated errors
// (shared/specs/qsdp.md F6): each key draws from its own stream, the same in every store.
TEST_CASE("keyed states: each key rounds with its own random stream, the same in every store", "[codec_state]") {
  World& w = World::get();
  if (w.size() == 1) return;  // one rank encodes nothing
  Codec codec("q2:round=stochastic,seed=9");
  Store store(w.comm(), 0), other(w.comm(), 0);
  std::vector<float> in(5000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = input(w.rank(), 0, 0, i);
  auto reduce = [&](qcclCodecStore_t s, uint64_t key) {
    qcclCodecState_t state = nullptr;
    QCCL_REQUIRE_OK(qcclCodecStoreGet(s, key, in.size(), &state));
    std::vector<float> out(in.size());
    QCCL_REQUIRE_OK(
        qcclAllReduceCompressed(in.data(), out.data(), in.size(), qcclFloat32, qcclAvg, codec.handle, state, w.comm()));
    return out;
  };
  const std::vector<float> first = reduce(store.handle, 1), second = reduce(store.handle, 2);
  CHECK(first != second);  // the same inputs at step 0: only the stream differs
  CHECK(reduce(other.handle, 1) == first);
}

// A store is thread-safe: a Load on one thread repoints the handles another thread is calling with.
// The call read its handle's state without the store's lock (the Load freed it under the call: heap
// corruption within seconds), and began after the Load's check for calls in flight. One rank: a
// Load moves this rank's step alone, which other ranks would refuse as a mismatch.
TEST_CASE("keyed states: a store's loads on one thread while another calls on its key", "[codec_state]") {
  World& w = World::get();
  if (w.size() != 1) return;
  Codec codec("q8:ef=on");
  Store store(w.comm(), 0);
  qcclCodecState_t state = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, 1, 64, &state));
  std::vector<float> x(64, 1.0f), y(64);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), 64, qcclFloat32, qcclSum, codec.handle, state, w.comm()));
  const std::vector<uint8_t> checkpoint = save(store.handle);
  std::atomic<bool> stop{false};
  std::atomic<int> loaded{0}, refused{0}, wrong{0};
  std::thread loader([&] {
    while (!stop.load()) {
      const qcclResult_t r = qcclCodecStoreLoad(store.handle, checkpoint.data(), checkpoint.size());
      (r == qcclSuccess ? loaded : r == qcclInvalidUsage ? refused : wrong).fetch_add(1);
    }
  });
  int calls = 0, failed = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (; std::chrono::steady_clock::now() < end; ++calls)
    failed += qcclAllReduceCompressed(x.data(), y.data(), 64, qcclFloat32, qcclSum, codec.handle, state, w.comm()) !=
              qcclSuccess;
  stop = true;
  loader.join();
  INFO(calls << " calls, " << loaded << " loads, " << refused << " refused");
  CHECK(failed == 0);
  CHECK(wrong == 0);     // a load either happens or is refused while a call is in flight
  CHECK(loaded > 0);
  CHECK(save(store.handle).size() == checkpoint.size());
}

// A store's Size reads each state's method and its state, which a key's first call makes on the
// calling thread (bind): read under the state's lock (TSan found the race, a torn read of a
// "thread-safe" store). One rank, as above.
TEST_CASE("keyed states: a store's size on one thread while another makes its keys' first calls", "[codec_state]") {
  World& w = World::get();
  if (w.size() != 1) return;
  Codec codec("q8:ef=on");
  Store store(w.comm(), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> sized{0}, failed{0};
  std::thread sizer([&] {
    while (!stop.load()) {
      size_t bytes = 0;
      (qcclCodecStoreSize(store.handle, &bytes) == qcclSuccess && bytes > 0 ? sized : failed).fetch_add(1);
    }
  });
  std::vector<float> x(256, 1.0f), y(256);
  uint64_t key = 0;
  for (; key < 300 || (sized.load() < 100 && key < 20000); ++key) {  // until the sizer has run a while
    qcclCodecState_t state = nullptr;
    QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, key, x.size(), &state));
    QCCL_REQUIRE_OK(
        qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, codec.handle, state, w.comm()));
  }
  stop = true;
  sizer.join();
  CHECK(failed == 0);
  CHECK(sized >= 100);
  // Every key's residual (256 floats) is in the checkpoint the size is now for.
  CHECK(save(store.handle).size() > key * 256 * sizeof(float));
}

TEST_CASE("keyed states: handles, erased keys, and a store's own budget", "[codec_state]") {
  World& w = World::get();
  Store store(w.comm(), 100000);
  qcclCodecState_t a = nullptr, again = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, 5, 1000, &a));
  QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, 5, 1000, &again));
  CHECK(a == again);
  CHECK(qcclCodecStoreGet(store.handle, 5, 999, &again) == qcclInvalidArgument);
  CHECK(qcclCodecStateDestroy(a) == qcclInvalidUsage);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("belongs to a codec store"));

  Codec ef("q8:ef=on");
  std::vector<float> x(30000, 0.5f), y(x.size());
  QCCL_REQUIRE_OK(qcclCodecStoreErase(store.handle, 5));
  CHECK(qcclAllReduceCompressed(x.data(), y.data(), 1000, qcclFloat32, qcclSum, ef.handle, a, w.comm()) ==
        qcclInvalidUsage);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("key 5 was erased"));
  CHECK(qcclCodecStoreErase(store.handle, 5) == qcclInvalidArgument);

  // 30,000 values of residual (120 kB) exceed the store's 100 kB: refused before anything is sent.
  qcclCodecState_t big = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, 6, x.size(), &big));
  CHECK(qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, ef.handle, big, w.comm()) ==
        qcclInvalidUsage);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("the store's budget"));
  QCCL_REQUIRE_OK(qcclCodecStoreGet(store.handle, 5, 1000, &again));  // the key made anew
  CHECK(again == a);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), 1000, qcclFloat32, qcclSum, ef.handle, a, w.comm()));
  for (size_t i = 0; i < 1000; ++i) REQUIRE(std::fabs(y[i] - 0.5f * w.size()) <= 0.5f * w.size() / 255 + 1e-5f);
}

TEST_CASE("keyed states: checkpoints wait for no call, and a store's save never outgrows its buffer",
          "[codec_state]") {
  World& w = World::get();
  Codec ef("q4:ef=on");
  constexpr size_t kCount = 5000;
  qcclCodecState_t state = nullptr, fresh = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStateCreate(w.comm(), kCount, &state));
  QCCL_REQUIRE_OK(qcclCodecStateCreate(w.comm(), kCount, &fresh));
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(fresh, &bytes));
  std::vector<uint8_t> checkpoint(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(fresh, checkpoint.data(), bytes));
  std::vector<float> x(kCount, 0.25f), y(kCount);
  QCCL_REQUIRE_OK(
      qcclAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state, w.comm()));
  // A call queued in a group is on the state until it ends: a load would free the residual it uses
  // (fresh's checkpoint has none), a save would read it while the call writes it.
  qcclRequest_t request = nullptr;
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclIAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state,
                                           w.comm(), &request));
  CHECK(qcclCodecStateLoad(state, checkpoint.data(), bytes) == qcclInvalidUsage);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("1 calls on the state are in flight"));
  std::vector<uint8_t> saved(checkpoint.size() * 4 + (size_t{1} << 16));
  CHECK(qcclCodecStateSave(state, saved.data(), saved.size()) == qcclInvalidUsage);
  QCCL_REQUIRE_OK(qcclGroupEnd());
  QCCL_REQUIRE_OK(qcclWait(&request));
  for (size_t i = 0; i < kCount; ++i) REQUIRE(std::fabs(y[i] - 0.25f * w.size()) <= 0.25f * w.size() / 15 + 1e-5f);
  QCCL_REQUIRE_OK(qcclCodecStateLoad(state, checkpoint.data(), bytes));  // done: allowed
  QCCL_REQUIRE_OK(qcclCodecStateDestroy(state));
  QCCL_REQUIRE_OK(qcclCodecStateDestroy(fresh));
  {
    // The same for a store's load (it went through: the call updated a state the store had dropped).
    Store keyed(w.comm(), 0);
    qcclCodecState_t on_key = nullptr;
    QCCL_REQUIRE_OK(qcclCodecStoreGet(keyed.handle, 7, kCount, &on_key));
    size_t store_bytes = 0;
    QCCL_REQUIRE_OK(qcclCodecStoreSize(keyed.handle, &store_bytes));
    std::vector<uint8_t> empty_store(store_bytes);
    QCCL_REQUIRE_OK(qcclCodecStoreSave(keyed.handle, empty_store.data(), store_bytes));
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclIAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, on_key,
                                             w.comm(), &request));
    CHECK(qcclCodecStoreLoad(keyed.handle, empty_store.data(), store_bytes) == qcclInvalidUsage);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("key 7: a checkpoint's load while 1 calls"));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    QCCL_REQUIRE_OK(qcclWait(&request));
    QCCL_REQUIRE_OK(qcclCodecStoreLoad(keyed.handle, empty_store.data(), store_bytes));  // done: allowed
  }

  // One thread adds (and erases) keys while another sizes the store and saves into exactly that
  // many bytes: the save fits, or is refused naming the size; the bytes after the buffer are untouched.
  // (Local to a process: rank 0 alone, so that the ranks do not crowd the cores with adders.)
  if (w.rank() != 0) return;
  Store store(w.comm(), 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> added{0};
  std::thread adder([&] {
    for (uint64_t key = 0; !stop.load(); ++key) {
      qcclCodecState_t s = nullptr;
      qcclCodecStoreGet(store.handle, key, 1, &s);
      if (key % 1000 == 999)
        for (uint64_t old = key - 999; old < key - 100; ++old) qcclCodecStoreErase(store.handle, old);
      added.store(key + 1);
      std::this_thread::yield();  // the store's mutex is not fair: let the saves in
    }
  });
  while (added.load() < 500) std::this_thread::yield();  // saves while the adder runs
  constexpr int kSaves = 300;
  int saves = 0, fitted = 0, refused = 0, overflowed = 0;
  for (; saves < kSaves && !overflowed; ++saves) {
    size_t need = 0;
    QCCL_REQUIRE_OK(qcclCodecStoreSize(store.handle, &need));
    std::vector<uint8_t> buffer(need + 64, 0xAB);
    const qcclResult_t r = qcclCodecStoreSave(store.handle, buffer.data(), need);
    if (r == qcclSuccess) ++fitted;
    if (r == qcclInvalidArgument && std::string(qcclGetLastError(nullptr)).find("smaller than the store's") !=
                                        std::string::npos)
      ++refused;
    for (size_t b = need; b < buffer.size(); ++b) overflowed += buffer[b] != 0xAB;
  }
  stop = true;
  adder.join();
  CHECK(overflowed == 0);
  CHECK(fitted + refused == saves);
}

TEST_CASE("keyed states: a state's calls in flight on one communicator refuse a call on another", "[codec_state]") {
  World& w = World::get();
  if (w.size() < 2) return;
  // A split child beside its parent: two communicators' progress, which nothing orders, would run the
  // state's calls (its residual's read-modify-write) at once.
  qcclComm_t child = nullptr;
  QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), 0, w.rank(), &child, nullptr));
  Codec ef("q4:ef=on");
  constexpr size_t kCount = 1000;
  qcclCodecState_t state = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStateCreate(w.comm(), kCount, &state));
  std::vector<float> x(kCount, 0.5f), y(kCount);
  int32_t token = 1;
  if (w.rank() == 0) {
    // In flight on the parent until the others call theirs, which they do after the token.
    qcclRequest_t request = nullptr;
    QCCL_REQUIRE_OK(qcclIAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state,
                                             w.comm(), &request));
    CHECK(qcclAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state, child) ==
          qcclInvalidUsage);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("1 calls on it are in flight on another "
                                                                       "communicator"));
    for (int peer = 1; peer < w.size(); ++peer) QCCL_REQUIRE_OK(qcclSend(&token, 1, qcclInt32, peer, child));
    QCCL_REQUIRE_OK(qcclWait(&request));
  } else {
    QCCL_REQUIRE_OK(qcclRecv(&token, 1, qcclInt32, 0, child));
    QCCL_REQUIRE_OK(
        qcclAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state, w.comm()));
  }
  // Done on the parent: the child may take the state now.
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat32, qcclSum, ef.handle, state, child));
  for (size_t i = 0; i < kCount; ++i) REQUIRE(std::fabs(y[i] - 0.5f * w.size()) <= 0.5f * w.size() / 15 + 1e-5f);
  QCCL_REQUIRE_OK(qcclCodecStateDestroy(state));
  QCCL_REQUIRE_OK(qcclCommDestroy(child));
}

}  // namespace qccl::test
