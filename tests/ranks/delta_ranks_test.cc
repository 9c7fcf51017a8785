// AQ-SGD's keyed delta messages through the C API (qcclDeltaSend / qcclDeltaRecv) on real processes:
// even rank r sends to rank r + 1 (pipeline stage pairs). 300 calls over random keys with a warm-up, a
// 5-key budget and LRU eviction, with the receiver's rows in memory and in a file; the receiver's rows
// within the codec's reach of the sender's activation; and at the end the two stores' checkpoints
// byte-equal (P4 across processes). Then the
// protocol: keys in another order fail on both ends with nothing changed, a NaN delta and the budget
// are refused on both ends, and the next call succeeds. Then the non-blocking calls and groups: the
// same calls made non-blocking (waited for in reverse order) give the bits of the blocking ones; both
// directions at once in a group, beside plain point-to-point calls; warm-up as set at the call; a
// store's settings refused while a call is in flight; a mismatch fails both waits.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

constexpr size_t kRow = 4 * 32;  // 4 tokens x 32 channels per key
constexpr size_t kUniverse = 12;

struct Pair {
  bool sender;
  int peer;
};

Pair pair_of(const World& w) {
  return Pair{w.rank() % 2 == 0, w.rank() % 2 == 0 ? w.rank() + 1 : w.rank() - 1};
}

struct Store {
  qcclDeltaStore_t handle = nullptr;
  Store(const std::string& spec, size_t budget, int evict) {
    Codec codec(spec);
    QCCL_REQUIRE_OK(qcclDeltaStoreCreate(codec.handle, kRow, qcclFloat16, budget, evict, 3, &handle));
  }
  ~Store() { qcclDeltaStoreDestroy(handle); }
  qcclDeltaStoreInfo_t info() const {
    qcclDeltaStoreInfo_t i;
    QCCL_REQUIRE_OK(qcclDeltaStoreGetInfo(handle, &i));
    return i;
  }
  std::vector<uint8_t> checkpoint() const {
    size_t bytes = 0;
    QCCL_REQUIRE_OK(qcclDeltaStoreSize(handle, &bytes));
    std::vector<uint8_t> out(bytes);
    QCCL_REQUIRE_OK(qcclDeltaStoreSave(handle, out.data(), bytes));
    return out;
  }
};

// The activations both ends can compute: per key a row that drifts by a little every call.
struct Activations {
  std::mt19937_64 rng{77};
  std::vector<std::vector<float>> rows;
  Activations() {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    rows.assign(kUniverse, std::vector<float>(kRow));
    for (auto& r : rows)
      for (float& v : r) v = normal(rng);
  }
  void drift(size_t key) {
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& v : rows[key]) v += normal(rng);
  }
};

}  // namespace

TEST_CASE("delta send/recv: 300 calls over random keys, a budget, eviction; stores byte-equal", "[delta]") {
  World& w = World::get();
  if (w.size() % 2) return;  // pairs only
  const Pair p = pair_of(w);
  Store store("aq4:channels=32,round=stochastic,seed=9", 5 * kRow * 2, 1);
  // Once with both stores in memory, once with the receiver's rows in a file (qcclDeltaStoreSetFile):
  // the messages and the stores are the same.
  const bool in_file = GENERATE(false, true);
  const std::string path = "/tmp/qccl_delta_ranks_" + std::to_string(getpid());
  if (in_file && !p.sender) QCCL_REQUIRE_OK(qcclDeltaStoreSetFile(store.handle, path.c_str()));
  INFO((in_file ? "the receiver's rows in a file" : "in memory"));
  Activations act;
  std::mt19937_64 pick(5);
  double worst = 0;
  uint64_t full_rows = 0;
  for (int call = 0; call < 300; ++call) {
    std::vector<size_t> order(kUniverse);
    for (size_t i = 0; i < kUniverse; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), pick);
    const size_t nkeys = 1 + pick() % 3;
    std::vector<uint64_t> keys(nkeys);
    std::vector<float> x(nkeys * kRow), out(nkeys * kRow);
    for (size_t r = 0; r < nkeys; ++r) {
      keys[r] = 5000 + order[r];
      act.drift(order[r]);
      std::copy(act.rows[order[r]].begin(), act.rows[order[r]].end(), x.begin() + static_cast<long>(r * kRow));
    }
    INFO("call " << call);
    if (p.sender) {
      QCCL_REQUIRE_OK(qcclDeltaStoreSetWarmup(store.handle, call < 10));
      QCCL_REQUIRE_OK(qcclDeltaSend(x.data(), nkeys, keys.data(), qcclFloat32, store.handle, p.peer, w.comm()));
    } else {
      QCCL_REQUIRE_OK(qcclDeltaRecv(out.data(), nkeys, keys.data(), qcclFloat32, store.handle, p.peer, w.comm()));
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(double{out[i]} - x[i]));
    }
    full_rows += store.info().lastFullRows;
    REQUIRE(store.info().bytes <= 5 * kRow * 2);
  }
  CHECK(store.info().sequence == 300);
  CHECK(qcclDeltaStoreSetFile(store.handle, path.c_str()) == qcclInvalidUsage);  // it holds keys now
  CHECK(qcclDeltaStoreSetFile(store.handle, nullptr) == qcclInvalidArgument);
  if (!p.sender) CHECK(worst < 0.05);  // deltas of 4 bits over a drift of 0.02 per call, fp16 stores
  CHECK(full_rows > 100);   // the warm-up, first sights and evicted keys
  CHECK(full_rows < 500);   // and deltas for the rest
  // Byte-equal stores: the receiver sends its checkpoint to the sender, which compares.
  const std::vector<uint8_t> mine = store.checkpoint();
  uint64_t size = mine.size();
  if (p.sender) {
    uint64_t theirs_size = 0;
    QCCL_REQUIRE_OK(qcclRecv(&theirs_size, 1, qcclUint64, p.peer, w.comm()));
    REQUIRE(theirs_size == size);
    std::vector<uint8_t> theirs(theirs_size);
    QCCL_REQUIRE_OK(qcclRecv(theirs.data(), theirs.size(), qcclUint8, p.peer, w.comm()));
    CHECK(theirs == mine);
  } else {
    QCCL_REQUIRE_OK(qcclSend(&size, 1, qcclUint64, p.peer, w.comm()));
    QCCL_REQUIRE_OK(qcclSend(mine.data(), mine.size(), qcclUint8, p.peer, w.comm()));
  }
  // The checkpoint's keys take more than a store of a smaller budget holds: qcclInvalidUsage, as
  // qccl.h says (it was qcclInvalidArgument), and that store unchanged.
  Store small("aq4:channels=32,round=stochastic,seed=9", kRow * 2, 1);
  const std::vector<uint8_t> empty = small.checkpoint();
  CHECK(qcclDeltaStoreLoad(small.handle, mine.data(), mine.size()) == qcclInvalidUsage);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("budget"));
  CHECK(small.checkpoint() == empty);
}

TEST_CASE("delta send/recv: protocol errors and refusals fail on both ends, nothing changed", "[delta]") {
  World& w = World::get();
  if (w.size() % 2) return;
  const Pair p = pair_of(w);
  Store store("aq4:channels=32", 2 * kRow * 2, 0);  // two keys, no eviction
  Activations act;
  std::vector<float> x(2 * kRow), out(2 * kRow);
  std::copy(act.rows[0].begin(), act.rows[0].end(), x.begin());
  std::copy(act.rows[1].begin(), act.rows[1].end(), x.begin() + kRow);
  const uint64_t keys[] = {1, 2}, swapped[] = {2, 1}, third[] = {3};
  auto exchange = [&](const uint64_t* sent_keys, const uint64_t* received_keys, size_t nkeys) {
    return p.sender ? qcclDeltaSend(x.data(), nkeys, sent_keys, qcclFloat32, store.handle, p.peer, w.comm())
                    : qcclDeltaRecv(out.data(), nkeys, received_keys, qcclFloat32, store.handle, p.peer, w.comm());
  };
  // Rows sent whole (first sight) that the store's float16 cannot hold, or NaN: refused on both ends,
  // neither store changed. They used to arrive as +-Inf or NaN with qcclSuccess and become the keys'
  // m, which every later delta against it failed on.
  const std::vector<uint8_t> empty = store.checkpoint();
  for (float bad : {1e5f, NAN}) {
    INFO("a row sent whole holds " << bad);
    x[3] = bad;
    CHECK(exchange(keys, keys, 2) == qcclNonFinite);
    CHECK(store.checkpoint() == empty);
    CHECK(store.info().sequence == 0);
  }
  x[3] = act.rows[0][3];
  QCCL_REQUIRE_OK(exchange(keys, keys, 2));  // first sight
  const std::vector<uint8_t> before = store.checkpoint();
  std::fill(out.begin(), out.end(), -7.0f);  // a call refused before any row was sent leaves it alone
  // The receiver names the keys in another order: both fail, neither changes.
  CHECK(exchange(keys, swapped, 2) == qcclMismatch);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("keys"));
  CHECK(store.checkpoint() == before);
  CHECK(out == std::vector<float>(2 * kRow, -7.0f));
  // A NaN in a delta row: the sender refuses and says so; the receiver fails alike.
  x[5] = NAN;
  CHECK(exchange(keys, keys, 2) == qcclNonFinite);
  CHECK(store.checkpoint() == before);
  CHECK(out == std::vector<float>(2 * kRow, -7.0f));
  x[5] = 0.5f;
  // A NaN in the last row: the sender refuses at its section, after sending the first row's section,
  // which the receiver may have applied (to its buffer only): both fail, neither store changes, and
  // the refused row's part of the buffer is left alone.
  x[kRow + 5] = NAN;
  CHECK(exchange(keys, keys, 2) == qcclNonFinite);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("NaN"));
  CHECK(store.checkpoint() == before);
  CHECK(std::vector<float>(out.begin() + kRow, out.end()) == std::vector<float>(kRow, -7.0f));
  x[kRow + 5] = 0.5f;
  // A third key over the two-key budget: refused on both ends.
  CHECK(exchange(third, third, 1) == qcclInvalidUsage);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("budget"));
  CHECK(store.checkpoint() == before);
  // Then a good call goes through: deltas.
  QCCL_REQUIRE_OK(exchange(keys, keys, 2));
  CHECK(store.info().lastFullRows == 0);
  CHECK(store.info().sequence == 2);
  // A receiver whose budget holds fewer keys than its sender's: it refuses what it could not keep,
  // and both fail (it used to grow past its budget).
  {
    Store lopsided("aq4:channels=32", (p.sender ? 2 : 1) * kRow * 2, 0);
    const qcclResult_t result =
        p.sender ? qcclDeltaSend(x.data(), 2, keys, qcclFloat32, lopsided.handle, p.peer, w.comm())
                 : qcclDeltaRecv(out.data(), 2, keys, qcclFloat32, lopsided.handle, p.peer, w.comm());
    CHECK(result == qcclInvalidUsage);
    CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("budget"));
    CHECK(lopsided.info().bytes == 0);
  }
  // Bad arguments, nothing sent.
  CHECK(qcclDeltaSend(x.data(), 0, keys, qcclFloat32, store.handle, p.peer, w.comm()) == qcclInvalidArgument);
  CHECK(qcclDeltaSend(x.data(), 1, keys, qcclInt32, store.handle, p.peer, w.comm()) == qcclInvalidArgument);
  CHECK(qcclDeltaSend(x.data(), 1, keys, qcclFloat32, store.handle, w.rank(), w.comm()) == qcclInvalidArgument);
  CHECK(qcclDeltaSend(x.data(), 1, keys, qcclFloat32, nullptr, p.peer, w.comm()) == qcclInvalidArgument);
  if (w.size() >= 4) {  // another peer: its end holds another state (the receiver failed later, on the id)
    const int other = (p.peer + 2) % w.size();
    CHECK(qcclDeltaSend(x.data(), 2, keys, qcclFloat32, store.handle, other, w.comm()) == qcclInvalidUsage);
    CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("peer = " + std::to_string(other) + ", but the store's calls "
                                                          "on this communicator go to rank " + std::to_string(p.peer)));
  }
  Codec q8("q8");
  qcclDeltaStore_t bad = nullptr;
  CHECK(qcclDeltaStoreCreate(q8.handle, kRow, qcclFloat16, 0, 0, 0, &bad) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("aq2 .. aq8"));
  // Rows, and calls' rows, whose bytes would not fit size_t (the sums made of them wrapped: a crash).
  Codec aq("aq4");
  CHECK(qcclDeltaStoreCreate(aq.handle, size_t{1} << 62, qcclFloat16, 0, 0, 0, &bad) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("rowValues = 4611686018427387904"));
  QCCL_REQUIRE_OK(qcclDeltaStoreCreate(aq.handle, size_t{1} << 40, qcclFloat16, 0, 0, 0, &bad));
  CHECK(qcclDeltaSend(x.data(), size_t{1} << 30, keys, qcclFloat32, bad, p.peer, w.comm()) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("nkeys = 1073741824 rows of 1099511627776 values"));
  QCCL_REQUIRE_OK(qcclDeltaStoreDestroy(bad));
}

namespace {

// Calls `calls` times on `store` with keys drawn from a small universe (so that later calls send
// deltas against what earlier ones left): the rows sent (sender) or received (receiver), per call.
struct Script {
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<float>> rows;
  explicit Script(int calls) {
    Activations act;
    std::mt19937_64 pick(11);
    for (int c = 0; c < calls; ++c) {
      const size_t nkeys = 1 + pick() % 3;
      std::vector<size_t> order = {0, 1, 2, 3};  // 4 keys: every call meets keys of the calls before
      std::shuffle(order.begin(), order.end(), pick);
      keys.emplace_back();
      rows.emplace_back(nkeys * kRow);
      for (size_t r = 0; r < nkeys; ++r) {
        keys.back().push_back(100 + order[r]);
        act.drift(order[r]);
        std::copy(act.rows[order[r]].begin(), act.rows[order[r]].end(), rows.back().begin() + long(r * kRow));
      }
    }
  }
};

}  // namespace

TEST_CASE("delta send/recv: non-blocking calls and groups", "[delta]") {
  World& w = World::get();
  if (w.size() % 2) return;
  const Pair p = pair_of(w);
  const std::string spec = "aq3:channels=32,round=stochastic,seed=4";
  constexpr int kCalls = 6;
  const Script script(kCalls);

  SECTION("non-blocking calls on one store, waited for in reverse order, give the blocking calls' bits") {
    Store blocking(spec, 0, 0), nonblocking(spec, 0, 0);
    std::vector<std::vector<float>> got_blocking(kCalls), got(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      got_blocking[c].assign(script.rows[c].size(), -1.0f);
      const auto& k = script.keys[c];
      QCCL_REQUIRE_OK(p.sender ? qcclDeltaSend(script.rows[c].data(), k.size(), k.data(), qcclFloat32, blocking.handle,
                                               p.peer, w.comm())
                               : qcclDeltaRecv(got_blocking[c].data(), k.size(), k.data(), qcclFloat32,
                                               blocking.handle, p.peer, w.comm()));
    }
    std::vector<qcclRequest_t> requests(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      got[c].assign(script.rows[c].size(), -2.0f);
      std::vector<uint64_t> keys = script.keys[c];  // copied by the call: this copy goes at once
      QCCL_REQUIRE_OK(p.sender ? qcclIDeltaSend(script.rows[c].data(), keys.size(), keys.data(), qcclFloat32,
                                                nonblocking.handle, p.peer, w.comm(), &requests[c])
                               : qcclIDeltaRecv(got[c].data(), keys.size(), keys.data(), qcclFloat32,
                                                nonblocking.handle, p.peer, w.comm(), &requests[c]));
    }
    for (int c = kCalls - 1; c >= 0; --c) QCCL_REQUIRE_OK(qcclWait(&requests[c]));
    CHECK(nonblocking.info().sequence == kCalls);
    CHECK(nonblocking.checkpoint() == blocking.checkpoint());
    if (!p.sender)
      for (int c = 0; c < kCalls; ++c) CHECK(got[c] == got_blocking[c]);
  }

  SECTION("both directions in one group, beside plain point-to-point calls, in another order at each end") {
    Store forward(spec, 0, 0), backward(spec, 0, 0);  // one store per direction, as in a pipeline
    for (int c = 0; c < kCalls; ++c) {
      const auto& k = script.keys[c];
      std::vector<float> in(script.rows[c].size(), -1.0f);
      std::vector<float> back(script.rows[c].size());
      for (size_t i = 0; i < back.size(); ++i) back[i] = 0.5f * script.rows[c][i];  // the "gradients"
      int32_t token = 7 * c + w.rank(), their_token = -1;
      QCCL_REQUIRE_OK(qcclGroupStart());
      if (p.sender) {
        QCCL_REQUIRE_OK(qcclDeltaSend(script.rows[c].data(), k.size(), k.data(), qcclFloat32, forward.handle, p.peer,
                                      w.comm()));
        QCCL_REQUIRE_OK(qcclRecv(&their_token, 1, qcclInt32, p.peer, w.comm()));
        QCCL_REQUIRE_OK(qcclDeltaRecv(in.data(), k.size(), k.data(), qcclFloat32, backward.handle, p.peer, w.comm()));
        QCCL_REQUIRE_OK(qcclSend(&token, 1, qcclInt32, p.peer, w.comm()));
      } else {
        QCCL_REQUIRE_OK(qcclSend(&token, 1, qcclInt32, p.peer, w.comm()));
        QCCL_REQUIRE_OK(qcclDeltaSend(back.data(), k.size(), k.data(), qcclFloat32, backward.handle, p.peer,
                                      w.comm()));
        QCCL_REQUIRE_OK(qcclDeltaRecv(in.data(), k.size(), k.data(), qcclFloat32, forward.handle, p.peer, w.comm()));
        QCCL_REQUIRE_OK(qcclRecv(&their_token, 1, qcclInt32, p.peer, w.comm()));
      }
      QCCL_REQUIRE_OK(qcclGroupEnd());
      INFO("call " << c);
      CHECK(their_token == 7 * c + p.peer);
      // What arrived is what the peer sent, within the codec's reach (3-bit deltas of a small drift).
      double worst = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        const float sent = p.sender ? back[i] : script.rows[c][i];
        worst = std::max(worst, std::fabs(double{in[i]} - sent));
      }
      CHECK(worst < 0.1);
    }
    CHECK(forward.info().sequence == kCalls);
    CHECK(backward.info().sequence == kCalls);
  }

  SECTION("warm-up is the store's setting when the call is made") {
    Store store(spec, 0, 0);
    const auto& k = script.keys[0];
    std::vector<float> out(script.rows[0].size());
    auto exchange = [&] {
      return p.sender ? qcclDeltaSend(script.rows[0].data(), k.size(), k.data(), qcclFloat32, store.handle, p.peer,
                                      w.comm())
                      : qcclDeltaRecv(out.data(), k.size(), k.data(), qcclFloat32, store.handle, p.peer, w.comm());
    };
    QCCL_REQUIRE_OK(exchange());  // first sight: full
    qcclRequest_t request = nullptr;
    int32_t go = 1;
    if (p.sender) {
      QCCL_REQUIRE_OK(qcclDeltaStoreSetWarmup(store.handle, 1));
      QCCL_REQUIRE_OK(qcclIDeltaSend(script.rows[0].data(), k.size(), k.data(), qcclFloat32, store.handle, p.peer,
                                     w.comm(), &request));
      QCCL_REQUIRE_OK(qcclDeltaStoreSetWarmup(store.handle, 0));  // too late for that call
      // The call cannot have completed (the receiver waits for `go`): the store's rows may not change.
      CHECK(qcclDeltaStoreSetLowBits(store.handle, 4) == qcclInvalidUsage);
      CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("in flight"));
      const std::vector<uint8_t> saved = store.checkpoint();
      CHECK(qcclDeltaStoreLoad(store.handle, saved.data(), saved.size()) == qcclInvalidUsage);
      // Nor may a call on another communicator overlap it (the calls on a store are ordered by one).
      qcclComm_t other = nullptr;
      QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), 0, w.rank(), &other, nullptr));
      CHECK(qcclDeltaSend(script.rows[0].data(), k.size(), k.data(), qcclFloat32, store.handle, p.peer, other) ==
            qcclInvalidUsage);
      CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("another communicator"));
      // (`go` on the other communicator: on this one it would meet the delta call, as its next call.)
      QCCL_REQUIRE_OK(qcclSend(&go, 1, qcclInt32, p.peer, other));
      QCCL_REQUIRE_OK(qcclWait(&request));
      QCCL_REQUIRE_OK(qcclCommDestroy(other));
    } else {
      qcclComm_t other = nullptr;
      QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), 0, w.rank(), &other, nullptr));
      QCCL_REQUIRE_OK(qcclRecv(&go, 1, qcclInt32, p.peer, other));
      QCCL_REQUIRE_OK(exchange());
      QCCL_REQUIRE_OK(qcclCommDestroy(other));
    }
    CHECK(store.info().lastFullRows == k.size());  // sent whole: warm-up was on at the call
    QCCL_REQUIRE_OK(exchange());
    CHECK(store.info().lastFullRows == 0);  // and off for the next
  }

  SECTION("a store destroyed while its call is in flight lives until the call completes") {
    qcclDeltaStore_t store = nullptr;
    Codec codec(spec);
    QCCL_REQUIRE_OK(qcclDeltaStoreCreate(codec.handle, kRow, qcclFloat16, 0, 0, 3, &store));
    const auto& k = script.keys[1];
    std::vector<float> out(script.rows[1].size(), -1.0f);
    qcclRequest_t request = nullptr;
    QCCL_REQUIRE_OK(p.sender ? qcclIDeltaSend(script.rows[1].data(), k.size(), k.data(), qcclFloat32, store, p.peer,
                                              w.comm(), &request)
                             : qcclIDeltaRecv(out.data(), k.size(), k.data(), qcclFloat32, store, p.peer, w.comm(),
                                              &request));
    QCCL_REQUIRE_OK(qcclDeltaStoreDestroy(store));
    QCCL_REQUIRE_OK(qcclWait(&request));
    if (!p.sender)  // first sight: sent whole in float16
      for (size_t i = 0; i < out.size(); ++i) REQUIRE(std::fabs(out[i] - script.rows[1][i]) <= 1e-3 * (1 + std::fabs(out[i])));
  }

  SECTION("a message part too long for the receiver's call is dropped: both fail as a mismatch, and go on") {
    Store store(spec, 0, 0);
    // 4096 whole rows against a receiver that names one key: the head's bitmap alone (512 bytes) is
    // over twice the largest head its call could be sent (it used to fail the communicator).
    const size_t many = 4096;
    std::vector<uint64_t> keys(many);
    for (size_t i = 0; i < many; ++i) keys[i] = 700 + i;
    std::vector<float> x(many * kRow, 0.5f), out(kRow, -1.0f);
    const qcclResult_t result = p.sender
                                    ? qcclDeltaSend(x.data(), many, keys.data(), qcclFloat32, store.handle, p.peer, w.comm())
                                    : qcclDeltaRecv(out.data(), 1, keys.data(), qcclFloat32, store.handle, p.peer, w.comm());
    CHECK(result == qcclMismatch);
    CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("message part 0 has 576 bytes, more than this end's room"));
    CHECK(store.info().sequence == 0);
    CHECK(out == std::vector<float>(kRow, -1.0f));
    // The communicator goes on: the same key, named alike at both ends.
    QCCL_REQUIRE_OK(p.sender ? qcclDeltaSend(x.data(), 1, keys.data(), qcclFloat32, store.handle, p.peer, w.comm())
                             : qcclDeltaRecv(out.data(), 1, keys.data(), qcclFloat32, store.handle, p.peer, w.comm()));
    CHECK(store.info().sequence == 1);
    if (!p.sender) CHECK(out == std::vector<float>(kRow, 0.5f));
  }

  SECTION("a mismatch fails both waits, and the next calls go on") {
    Store store(spec, 0, 0);
    const uint64_t keys[] = {1, 2}, other[] = {1, 3};
    std::vector<float> x(2 * kRow, 0.25f), out(2 * kRow);
    qcclRequest_t first = nullptr, second = nullptr;
    auto post = [&](const uint64_t* receiver_keys, qcclRequest_t* request) {
      return p.sender ? qcclIDeltaSend(x.data(), 2, keys, qcclFloat32, store.handle, p.peer, w.comm(), request)
                      : qcclIDeltaRecv(out.data(), 2, receiver_keys, qcclFloat32, store.handle, p.peer, w.comm(),
                                       request);
    };
    QCCL_REQUIRE_OK(post(other, &first));  // the receiver names other keys
    QCCL_REQUIRE_OK(post(keys, &second));  // runs after the first failed, on the unchanged store
    CHECK(qcclWait(&first) == qcclMismatch);
    CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("keys"));
    QCCL_REQUIRE_OK(qcclWait(&second));
    CHECK(store.info().sequence == 1);
    CHECK(store.info().lastFullRows == 2);
    if (!p.sender) CHECK(out == x);  // 0.25 is exact in float16
  }
}

// A store whose communicator is destroyed starts over on the next one, whose ranks may be numbered
// anew: here each pair's ranks swap numbers every round. (The store remembered its communicator by
// address, and a new communicator made where the old one was freed met the old peer: refused.)
TEST_CASE("delta send/recv: a store moves to later communicators that number its peer anew", "[delta]") {
  World& w = World::get();
  const Pair p = pair_of(w);
  if (p.peer >= w.size()) return;  // the odd rank out
  Store store("aq4:channels=32", 0, 0);
  const std::vector<uint64_t> keys = {1, 2};
  std::vector<float> rows(keys.size() * kRow, 0.25f), got(rows.size());
  for (int round = 0; round < 8; ++round) {
    INFO("round " << round);
    qcclComm_t pair = nullptr;
    const int key = round % 2 ? w.rank() : -w.rank();  // the pair's two ranks swap numbers each round
    QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), w.rank() / 2, key, &pair, nullptr));
    int me = -1;
    QCCL_REQUIRE_OK(qcclCommUserRank(pair, &me));
    if (p.sender)
      QCCL_REQUIRE_OK(qcclDeltaSend(rows.data(), keys.size(), keys.data(), qcclFloat32, store.handle, 1 - me, pair));
    else
      QCCL_REQUIRE_OK(qcclDeltaRecv(got.data(), keys.size(), keys.data(), qcclFloat32, store.handle, 1 - me, pair));
    QCCL_REQUIRE_OK(qcclCommDestroy(pair));
  }
  if (!p.sender) CHECK(got[0] == 0.25f);
}

TEST_CASE("delta send/recv: a delta call met by a plain point-to-point call fails as a mismatch", "[delta]") {
  World& w = World::get();
  if (w.size() % 2) return;
  const Pair p = pair_of(w);
  const std::string spec = "aq4:channels=32";
  const uint64_t key = 9;
  std::vector<float> row(kRow, 0.5f), out(kRow, -1.0f);
  // Point-to-point calls meet in call order in each direction, whatever their kind: a plain call
  // that meets a delta call fails on the frame header it receives (before, both waited out
  // QCCL_TIMEOUT). One communicator per pair, broken by each case; the sender is rank 0 of it.
  auto run = [&](bool sender_delta) {
    qcclComm_t pair = nullptr;
    QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), w.rank() / 2, w.rank(), &pair, nullptr));
    const int peer = p.sender ? 1 : 0;
    Store store(spec, 0, 0);
    // One plain call first, so that the calls that meet are number 1 of their direction.
    int32_t token = 5;
    QCCL_REQUIRE_OK(p.sender ? qcclSend(&token, 1, qcclInt32, peer, pair) : qcclRecv(&token, 1, qcclInt32, peer, pair));
    qcclResult_t result;
    if (p.sender == sender_delta)
      result = p.sender ? qcclDeltaSend(row.data(), 1, &key, qcclFloat32, store.handle, peer, pair)
                        : qcclDeltaRecv(out.data(), 1, &key, qcclFloat32, store.handle, peer, pair);
    else
      result = p.sender ? qcclSend(row.data(), kRow, qcclFloat32, peer, pair)
                        : qcclRecv(out.data(), kRow, qcclFloat32, peer, pair);
    const std::string error = qcclGetLastError(nullptr);
    qcclCommDestroy(pair);
    return std::make_pair(result, error);
  };
  SECTION("a delta send met by a plain receive") {
    const auto [result, error] = run(true);
    INFO(error);
    if (p.sender) {
      CHECK((result == qcclMismatch || result == qcclRemoteError));  // told by the receiver
    } else {
      CHECK(result == qcclMismatch);
      CHECK_THAT(error, Catch::Contains("called DeltaSend #1 but this rank called Recv(count=128, float) #1"));
    }
    CHECK(out == std::vector<float>(kRow, -1.0f));
  }
  SECTION("a plain send met by a delta receive") {
    const auto [result, error] = run(false);
    INFO(error);
    if (p.sender) {  // its bytes may have left before the receiver failed
      CHECK((result == qcclSuccess || result == qcclMismatch || result == qcclRemoteError));
    } else {
      CHECK(result == qcclMismatch);
      CHECK_THAT(error, Catch::Contains("called Send(count=128, float) #1 but this rank called DeltaRecv #1") &&
                            Catch::Contains("call order"));
      CHECK(out == std::vector<float>(kRow, -1.0f));
    }
  }
}

}  // namespace qccl::test
