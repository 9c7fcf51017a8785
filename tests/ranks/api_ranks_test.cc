// The C API on real processes over UCX, run by qcclrun with 2, 3, 4 and 8 ranks: every collective x
// datatype x op, odd and zero counts, in place and out of place, every root, point-to-point in
// groups, non-blocking calls that progress in the background, two communicators at once, wire
// bytes, and bad input that must be refused before anything is sent.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

enum class Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll };
const char* name(Coll k) {
  static const char* names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AlltoAll"};
  return names[static_cast<int>(k)];
}

constexpr DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                               DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                               DataType::kFloat64, DataType::kBfloat16};
constexpr RedOp kOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};

// A second communicator of the same ranks with small chunks, so that calls span many fragments.
// Made from a unique id that rank 0 broadcasts over the world communicator; destroyed at exit,
// before the world (statics die in reverse order of construction).
class SmallChunkComm {
 public:
  static qcclComm_t get() {
    static SmallChunkComm instance;
    return instance.comm_;
  }

 private:
  SmallChunkComm() {
    World& w = World::get();
    qcclUniqueId id;
    if (w.rank() == 0) REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
    QCCL_REQUIRE_OK(qcclBroadcast(&id, &id, sizeof(id), qcclUint8, 0, w.comm()));
    qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
    config.chunkBytes = 1000;  // not a multiple of any element size
    config.pipelineDepth = 3;
    QCCL_REQUIRE_OK(qcclCommInitRankConfig(&comm_, w.size(), id, w.rank(), &config));
  }
  ~SmallChunkComm() {
    if (qcclCommDestroy(comm_) != qcclSuccess)
      std::fprintf(stderr, "qcclCommDestroy failed: %s\n", qcclGetLastError(nullptr));
  }
  qcclComm_t comm_ = nullptr;
};

qcclComm_t small_chunk_comm() { return SmallChunkComm::get(); }

double tolerance(DataType t, RedOp op, double expected) {
  if (op != RedOp::kAvg || !kernels::is_floating(t)) return 0;
  const double ulp = t == DataType::kFloat16 ? 0x1p-10 : t == DataType::kBfloat16 ? 0x1p-7 : 0x1p-23;
  return std::fabs(expected) * ulp;
}

// Runs `kind` once and checks every element on this rank.
void check_collective(qcclComm_t comm, Coll kind, DataType t, RedOp op, size_t count, bool in_place,
                      int root) {
  World& w = World::get();
  const int n = w.size(), r = w.rank();
  const size_t es = kernels::element_size(t), un = static_cast<size_t>(n);
  INFO(name(kind) << " " << kernels::data_type_name(t) << " " << kernels::red_op_name(op) << " count "
                             << count << (in_place ? " in place" : "") << " root " << root);
  std::vector<uint8_t> send, recv;
  void* out = nullptr;
  const void* in = nullptr;
  size_t wrong = 0;
  auto expect = [&](const void* buf, size_t i, double e) {
    const double g = load(t, buf, i);
    if (std::fabs(g - e) > tolerance(t, op, e)) {
      if (wrong++ < 3) UNSCOPED_INFO("element " << i << ": got " << g << ", expected " << e);
    }
  };
  switch (kind) {
    case Coll::kAllReduce:
    case Coll::kReduce: {
      send = inputs(t, op, r, count);
      recv.assign(count * es, 0xee);
      in = send.data();
      out = recv.data();
      if (in_place) out = const_cast<void*>(in = send.data());
      if (kind == Coll::kAllReduce)
        QCCL_REQUIRE_OK(qcclAllReduce(in, out, count, to_api(t), to_api(op), comm));
      else
        QCCL_REQUIRE_OK(qcclReduce(in, out, count, to_api(t), to_api(op), root, comm));
      if (kind == Coll::kAllReduce || r == root)
        for (size_t i = 0; i < count; ++i) expect(out, i, expected_reduction(t, op, n, i));
      break;
    }
    case Coll::kBroadcast:
      send = inputs(t, op, r, count);
      recv.assign(count * es, 0xee);
      out = in_place && r == root ? send.data() : recv.data();
      QCCL_REQUIRE_OK(qcclBroadcast(send.data(), out, count, to_api(t), root, comm));
      for (size_t i = 0; i < count; ++i) expect(out, i, input_value(t, op, root, i));
      break;
    case Coll::kAllGather:
      recv.assign(count * es * un, 0xee);
      send = inputs(t, op, r, count);
      in = send.data();
      if (in_place) {
        std::memcpy(recv.data() + r * count * es, send.data(), count * es);
        in = recv.data() + r * count * es;
      }
      QCCL_REQUIRE_OK(qcclAllGather(in, recv.data(), count, to_api(t), comm));
      for (size_t s = 0; s < un; ++s)
        for (size_t i = 0; i < count; ++i) expect(recv.data(), s * count + i, input_value(t, op, static_cast<int>(s), i));
      break;
    case Coll::kReduceScatter:
      send = inputs(t, op, r, count * un);
      recv.assign(count * es, 0xee);
      out = in_place ? send.data() + r * count * es : recv.data();
      QCCL_REQUIRE_OK(qcclReduceScatter(send.data(), out, count, to_api(t), to_api(op), comm));
      for (size_t i = 0; i < count; ++i) expect(out, i, expected_reduction(t, op, n, r * count + i));
      break;
    case Coll::kAlltoAll:
      send = inputs(t, op, r, count * un);
      recv.assign(count * es * un, 0xee);
      QCCL_REQUIRE_OK(qcclAlltoAll(send.data(), recv.data(), count, to_api(t), comm));
      for (size_t s = 0; s < un; ++s)
        for (size_t i = 0; i < count; ++i)
          expect(recv.data(), s * count + i, input_value(t, op, static_cast<int>(s), r * count + i));
      break;
    default: FAIL("not a collective");
  }
  CHECK(wrong == 0);
}

bool reduces(Coll k) {
  return k == Coll::kAllReduce || k == Coll::kReduce || k == Coll::kReduceScatter;
}

constexpr Coll kCollectives[] = {Coll::kAllReduce, Coll::kBroadcast,
                                           Coll::kReduce,    Coll::kAllGather,
                                           Coll::kReduceScatter, Coll::kAlltoAll};

}  // namespace

TEST_CASE("ranks that take different chunks are refused when the communicator is made", "[api]") {
  // The chunk decides every message's length: a rank with another one would fail its first call, or
  // hang. The bootstrap compares the settings, and every rank fails alike, naming them.
  World& w = World::get();
  if (w.size() < 2) return;
  qcclUniqueId id;
  if (w.rank() == 0) REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  QCCL_REQUIRE_OK(qcclBroadcast(&id, &id, sizeof(id), qcclUint8, 0, w.comm()));
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.chunkBytes = w.rank() == w.size() - 1 ? 65536 : 131072;
  qcclComm_t comm = nullptr;
  CHECK(qcclCommInitRankConfig(&comm, w.size(), id, w.rank(), &config) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("chunk of 65536 bytes") && Catch::Contains("every rank"));
  CHECK(comm == nullptr);
}

TEST_CASE("every collective x datatype x op, out of place and in place", "[ranks]") {
  World& w = World::get();
  for (Coll kind : kCollectives)
    for (DataType t : kTypes)
      for (RedOp op : kOps) {
        if (!reduces(kind) && op != RedOp::kSum) continue;
        for (bool in_place : {false, true}) {
          if (in_place && kind == Coll::kAlltoAll) continue;
          check_collective(w.comm(), kind, t, op, 1 + 2 * static_cast<size_t>(t) + static_cast<size_t>(op), in_place,
                           (static_cast<int>(t) + static_cast<int>(op)) % w.size());
        }
      }
}

TEST_CASE("odd counts across many fragments (1000-byte chunks, depth 3)", "[ranks]") {
  qcclComm_t comm = small_chunk_comm();
  for (Coll kind : kCollectives)
    for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{97}, size_t{1021}, size_t{65537}})
      for (DataType t : {DataType::kFloat32, DataType::kInt8, DataType::kFloat16, DataType::kFloat64})
        check_collective(comm, kind, t, reduces(kind) ? RedOp::kSum : RedOp::kSum, count, count % 2 == 1,
                         static_cast<int>(count % World::get().size()));
}

TEST_CASE("broadcast and reduce from every root", "[ranks]") {
  World& w = World::get();
  for (int root = 0; root < w.size(); ++root) {
    check_collective(w.comm(), Coll::kBroadcast, DataType::kInt32, RedOp::kSum, 100003, false, root);
    check_collective(w.comm(), Coll::kReduce, DataType::kFloat32, RedOp::kMax, 100003, root % 2 == 0, root);
    check_collective(w.comm(), Coll::kBroadcast, DataType::kUint8, RedOp::kSum, 5, true, root);
    check_collective(w.comm(), Coll::kReduce, DataType::kInt64, RedOp::kAvg, 5, false, root);
  }
}

TEST_CASE("large all-reduce (several MiB) is exact and bit-identical on every rank", "[ranks]") {
  World& w = World::get();
  const size_t count = (3u << 20) + 7;
  check_collective(w.comm(), Coll::kAllReduce, DataType::kFloat32, RedOp::kSum, count, false, 0);
  // Random floats: compare every rank's result hash.
  std::vector<float> x(count), y(count);
  for (size_t i = 0; i < count; ++i) x[i] = std::sin(static_cast<double>(i) * 0.001 + w.rank());
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, w.comm()));
  uint64_t h = hash_bytes(y.data(), y.size() * 4);
  std::vector<uint64_t> all(w.size());
  QCCL_REQUIRE_OK(qcclAllGather(&h, all.data(), 1, qcclUint64, w.comm()));
  for (uint64_t other : all) CHECK(other == h);
}

// Run alone in a process (hidden, its own tag): the world communicator has made no collective yet,
// and the library's own exchanges at creation (a link probe's transfers, QCCL_LINK_RATE=probe on
// several nodes) leave no statistics (link_probe_ranks_node_map runs it so).
TEST_CASE("a new communicator has no statistics of a last collective", "[.][fresh]") {
  World& w = World::get();
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
  CHECK(stats.sequence == 0);
  CHECK(stats.wireBytesSent == 0);
  CHECK(stats.wireBytesReceived == 0);
  CHECK(std::string(stats.algorithm).empty());
}

TEST_CASE("zero counts return at once, with NULL buffers", "[ranks]") {
  World& w = World::get();
  QCCL_REQUIRE_OK(qcclAllReduce(nullptr, nullptr, 0, qcclFloat32, qcclSum, w.comm()));
  QCCL_REQUIRE_OK(qcclBroadcast(nullptr, nullptr, 0, qcclFloat32, 0, w.comm()));
  QCCL_REQUIRE_OK(qcclReduce(nullptr, nullptr, 0, qcclFloat32, qcclSum, 0, w.comm()));
  QCCL_REQUIRE_OK(qcclAllGather(nullptr, nullptr, 0, qcclFloat32, w.comm()));
  QCCL_REQUIRE_OK(qcclReduceScatter(nullptr, nullptr, 0, qcclFloat32, qcclSum, w.comm()));
  QCCL_REQUIRE_OK(qcclAlltoAll(nullptr, nullptr, 0, qcclFloat32, w.comm()));
  QCCL_REQUIRE_OK(qcclSend(nullptr, 0, qcclFloat32, 0, w.comm()));
  QCCL_REQUIRE_OK(qcclRecv(nullptr, 0, qcclFloat32, 0, w.comm()));
  // The communicator is still in step afterwards.
  check_collective(w.comm(), Coll::kAllReduce, DataType::kInt32, RedOp::kSum, 10, false, 0);
}

TEST_CASE("send and receive: a ring in a group, to self, and large messages", "[ranks]") {
  World& w = World::get();
  const int n = w.size(), r = w.rank();
  for (size_t count : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
    std::vector<int32_t> out(count), in(count, -1), self(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(r * 1000003 + i);
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclSend(out.data(), count, qcclInt32, (r + 1) % n, w.comm()));
    QCCL_REQUIRE_OK(qcclRecv(in.data(), count, qcclInt32, (r + n - 1) % n, w.comm()));
    QCCL_REQUIRE_OK(qcclSend(out.data(), count, qcclInt32, r, w.comm()));
    QCCL_REQUIRE_OK(qcclRecv(self.data(), count, qcclInt32, r, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      wrong += in[i] != static_cast<int32_t>(((r + n - 1) % n) * 1000003 + i);
      wrong += self[i] != out[i];
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("non-blocking: several calls in flight progress in the background", "[ranks]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 1 << 18;
  std::vector<std::vector<float>> in(4, std::vector<float>(count)), out(4, std::vector<float>(count));
  std::vector<qcclRequest_t> requests(4, nullptr);
  for (int k = 0; k < 4; ++k) {
    for (size_t i = 0; i < count; ++i) in[k][i] = static_cast<float>(k + w.rank() + (i % 5));
    QCCL_REQUIRE_OK(qcclIAllReduce(in[k].data(), out[k].data(), count, qcclFloat32, qcclSum, w.comm(), &requests[k]));
  }
  // Never drive: the progress thread alone must finish all four. The last-stats record shows the
  // sequence number of the last completed call without driving anything.
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int done_in_background = 0;
  for (int k = 3; k >= 0; --k) {  // waited in reverse order of issue
    int done = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // "compute"
      QCCL_REQUIRE_OK(qcclTest(&requests[k], &done));
      if (done) break;
    }
    REQUIRE(done == 1);
    CHECK(requests[k] == nullptr);
    ++done_in_background;
  }
  CHECK(done_in_background == 4);
  for (int k = 0; k < 4; ++k) {
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      double e = 0;
      for (int q = 0; q < n; ++q) e += k + q + (i % 5);
      wrong += out[k][i] != static_cast<float>(e);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("statistics: where the time went, within the call's time", "[ranks]") {
  World& w = World::get();
  const int n = w.size();
  if (n == 1) return;  // a single rank copies: nothing to account for
  const size_t count = 1 << 20;
  std::vector<float> in(count, 1.0f), out(count);
  auto last = [&] {
    qcclStats_t s{};
    s.size = sizeof(s);
    REQUIRE(qcclCommGetLastStats(w.comm(), &s) == qcclSuccess);
    INFO("seconds " << s.seconds << " reduce " << s.reduceSeconds << " transport " << s.transportSeconds
                    << " wait " << s.waitSeconds << " wakeups " << s.wakeups);
    CHECK(s.encodeSeconds == 0);  // uncompressed
    CHECK(s.decodeSeconds == 0);
    CHECK(s.reduceSeconds > 0);     // every all-reduce of several ranks sums what it receives
    CHECK(s.transportSeconds > 0);  // ...and posted its transfers
    CHECK(s.waitSeconds >= 0);
    CHECK(s.reduceSeconds + s.transportSeconds + s.waitSeconds <= s.seconds);  // disjoint intervals of it
    return s;
  };
  QCCL_REQUIRE_OK(qcclAllReduce(in.data(), out.data(), count, qcclFloat32, qcclSum, w.comm()));
  last();
  // A late rank: the others wait for it, and say so (asleep on the transport, or polling in vain).
  // Late by far more than a rank can lag behind another leaving the barrier (8 ranks on 2 cores under
  // a sanitizer on a loaded machine: 50 ms seen), so that over half of the lateness is theirs to wait.
  const double late = 0.3;
  QCCL_REQUIRE_OK(qcclAllReduce(in.data(), out.data(), 1, qcclFloat32, qcclSum, w.comm()));  // a barrier
  if (w.rank() == 0) std::this_thread::sleep_for(std::chrono::duration<double>(late));
  QCCL_REQUIRE_OK(qcclAllReduce(in.data(), out.data(), count, qcclFloat32, qcclSum, w.comm()));
  const qcclStats_t s = last();
  if (w.rank() != 0) {
    CHECK(s.seconds > late / 2);
    CHECK(s.waitSeconds > late / 2);
    CHECK(s.wakeups >= 1);
    // Asleep, not spinning through its sleeps: about one pause a millisecond, as they grow to 1 ms
    // (comm.cc, kLongestBusyPause), or a few sleeps when the transport can be armed.
    CHECK(s.wakeups < 5 * late * 1000);
  }
  CHECK(out[count - 1] == static_cast<float>(n));
}

TEST_CASE("non-blocking: many mixed collectives back to back, waited in any order, all exact", "[ranks]") {
  // Collectives of a communicator run in call order (qccl.h): every result must be exact whatever the
  // order of the waits.
  World& w = World::get();
  const int n = w.size();
  constexpr int kCalls = 24;
  const size_t sizes[] = {1, 1000, 70000, 333333};
  std::vector<std::vector<int32_t>> in(kCalls), out(kCalls);
  std::vector<qcclRequest_t> requests(kCalls, nullptr);
  auto kind_of = [](int k) { return k % 4; };  // all-reduce, all-gather, broadcast from k % n, reduce-scatter
  for (int k = 0; k < kCalls; ++k) {
    const size_t count = sizes[k % 4 == 0 ? (k / 4) % 4 : k % 4];
    in[k].resize(kind_of(k) == 3 ? count * n : count);
    for (size_t i = 0; i < in[k].size(); ++i) in[k][i] = static_cast<int32_t>(k * 7 + w.rank() * 3 + i % 11);
    out[k].assign(kind_of(k) == 1 ? count * n : count, -1);
    switch (kind_of(k)) {
      case 0: QCCL_REQUIRE_OK(qcclIAllReduce(in[k].data(), out[k].data(), count, qcclInt32, qcclSum, w.comm(), &requests[k])); break;
      case 1: QCCL_REQUIRE_OK(qcclIAllGather(in[k].data(), out[k].data(), count, qcclInt32, w.comm(), &requests[k])); break;
      case 2: QCCL_REQUIRE_OK(qcclIBroadcast(in[k].data(), out[k].data(), count, qcclInt32, k % n, w.comm(), &requests[k])); break;
      case 3: QCCL_REQUIRE_OK(qcclIReduceScatter(in[k].data(), out[k].data(), count, qcclInt32, qcclSum, w.comm(), &requests[k])); break;
    }
  }
  for (int k = kCalls - 1; k >= 0; k -= 2) QCCL_REQUIRE_OK(qcclWait(&requests[k]));  // odd ones first, last first
  for (int k = 0; k < kCalls; k += 2) QCCL_REQUIRE_OK(qcclWait(&requests[k]));
  size_t wrong = 0;
  for (int k = 0; k < kCalls; ++k) {
    const size_t count = kind_of(k) == 3 ? in[k].size() / n : in[k].size();
    auto value = [&](int rank, size_t i) { return static_cast<int32_t>(k * 7 + rank * 3 + i % 11); };
    for (size_t i = 0; i < out[k].size(); ++i) {
      int64_t e = 0;
      switch (kind_of(k)) {
        case 0: for (int q = 0; q < n; ++q) e += value(q, i); break;
        case 1: e = value(static_cast<int>(i / count), i % count); break;
        case 2: e = value(k % n, i); break;
        case 3: for (int q = 0; q < n; ++q) e += value(q, w.rank() * count + i); break;
      }
      wrong += out[k][i] != static_cast<int32_t>(e);
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("non-blocking: a request completes with no test or wait call at all", "[ranks]") {
  World& w = World::get();
  const size_t count = 1 << 16;
  std::vector<double> in(count, 1.0), out(count, 0.0);
  qcclStats_t before{};
  before.size = sizeof(before);
  QCCL_REQUIRE_OK(qcclAllReduce(in.data(), out.data(), 1, qcclFloat64, qcclSum, w.comm()));
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &before));
  qcclRequest_t request = nullptr;
  QCCL_REQUIRE_OK(qcclIAllReduce(in.data(), out.data(), count, qcclFloat64, qcclSum, w.comm(), &request));
  qcclStats_t now{};
  now.size = sizeof(now);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &now));
  } while (now.sequence == before.sequence && std::chrono::steady_clock::now() < deadline);
  CHECK(now.sequence == before.sequence + 1);  // finished by the progress thread alone
  QCCL_REQUIRE_OK(qcclWait(&request));
  CHECK(request == nullptr);
  CHECK(out[count - 1] == static_cast<double>(w.size()));
}

TEST_CASE("non-blocking: a completion thread waits on requests while the caller issues more", "[ranks]") {
  // The Python package's torch layer does this: DDP's futures are completed by a thread that waits
  // on each request in turn while the training thread issues the next buckets' all-reduces.
  World& w = World::get();
  constexpr int kCalls = 24;
  const size_t count = 50000;
  std::vector<std::vector<float>> bufs(kCalls);
  std::vector<qcclRequest_t> queue;
  std::mutex mu;
  std::condition_variable ready;
  std::vector<qcclResult_t> results;
  std::thread completer([&] {
    for (int k = 0; k < kCalls; ++k) {
      qcclRequest_t request;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [&] { return static_cast<int>(queue.size()) > k; });
        request = queue[k];
      }
      qcclResult_t r = qcclWait(&request);
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(r);
    }
  });
  for (int k = 0; k < kCalls; ++k) {
    bufs[k].assign(count, static_cast<float>(w.rank() + k));
    qcclRequest_t request = nullptr;
    REQUIRE(qcclIAllReduce(bufs[k].data(), bufs[k].data(), count, qcclFloat32, qcclSum, w.comm(), &request) ==
            qcclSuccess);
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(request);
    ready.notify_one();
  }
  completer.join();
  REQUIRE(results.size() == static_cast<size_t>(kCalls));
  const int n = w.size();
  for (int k = 0; k < kCalls; ++k) {
    CHECK(results[k] == qcclSuccess);
    CHECK(bufs[k][count - 1] == static_cast<float>(n * (n - 1) / 2 + n * k));
  }
}

TEST_CASE("non-blocking: back-to-back calls on one buffer wait for each other, as on a stream", "[ranks]") {
  World& w = World::get();
  qcclComm_t comm = small_chunk_comm();  // many fragments: the next call would start while one runs
  const int64_t n = w.size();
  const size_t count = 20011;
  std::vector<int64_t> x(count), y(count, -1);
  for (size_t i = 0; i < count; ++i) x[i] = w.rank() + static_cast<int64_t>(i % 5);
  // Four in place on x, then one that reads x into y and one that writes x again from y: each must
  // see the one before complete (they read garbage, and ranks disagreed, when they overlapped).
  std::vector<qcclRequest_t> requests(6, nullptr);
  for (int k = 0; k < 4; ++k)
    QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), x.data(), count, qcclInt64, qcclSum, comm, &requests[k]));
  QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), y.data(), count, qcclInt64, qcclSum, comm, &requests[4]));
  QCCL_REQUIRE_OK(qcclIBroadcast(y.data(), x.data(), count, qcclInt64, 0, comm, &requests[5]));
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) QCCL_REQUIRE_OK(qcclWait(&*it));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t first = n * (n - 1) / 2 + n * static_cast<int64_t>(i % 5);  // the first sum
    const int64_t expected = first * n * n * n * n;                             // four more
    wrong += y[i] != expected || x[i] != expected;
  }
  CHECK(wrong == 0);
}

TEST_CASE("two communicators used at once", "[ranks]") {
  World& w = World::get();
  qcclComm_t other = small_chunk_comm();
  const size_t count = 100000;
  std::vector<int64_t> a(count, w.rank()), b(count), c(count, 2 * w.rank()), d(count);
  qcclRequest_t ra = nullptr, rb = nullptr;
  QCCL_REQUIRE_OK(qcclIAllReduce(a.data(), b.data(), count, qcclInt64, qcclSum, w.comm(), &ra));
  QCCL_REQUIRE_OK(qcclIAllReduce(c.data(), d.data(), count, qcclInt64, qcclSum, other, &rb));
  QCCL_REQUIRE_OK(qcclWait(&rb));
  QCCL_REQUIRE_OK(qcclWait(&ra));
  const int64_t s = static_cast<int64_t>(w.size()) * (w.size() - 1) / 2;
  CHECK(b[count - 1] == s);
  CHECK(d[0] == 2 * s);
  // And blocking calls on both, interleaved.
  for (int i = 0; i < 5; ++i) {
    QCCL_REQUIRE_OK(qcclAllReduce(a.data(), b.data(), count, qcclInt64, qcclMax, other));
    QCCL_REQUIRE_OK(qcclAllReduce(c.data(), d.data(), count, qcclInt64, qcclMin, w.comm()));
  }
  CHECK(b[0] == w.size() - 1);
  CHECK(d[0] == 0);
}

TEST_CASE("wire bytes reported for a ring all-reduce equal the closed form", "[ranks]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 840 * 1024;  // divisible by 2, 3, 4 and 8
  std::vector<float> x(count, 1.0f), y(count);
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, w.comm()));
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
  if (n > 1) {
    CHECK(std::string(stats.algorithm) == "ring");
    CHECK(stats.wireBytesSent == 2ull * (n - 1) * count * 4 / n);
    CHECK(stats.wireBytesReceived == stats.wireBytesSent);
  } else {
    CHECK(stats.wireBytesSent == 0);
  }
  CHECK(stats.seconds > 0);
}

TEST_CASE("bad arguments are refused before anything is sent, naming the argument", "[ranks]") {
  World& w = World::get();
  qcclComm_t comm = w.comm();
  std::vector<float> a(16), b(64);
  auto refused = [](qcclResult_t result, const char* needle) {
    CHECK(result == qcclInvalidArgument);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains(needle));
  };
  refused(qcclAllReduce(nullptr, b.data(), 4, qcclFloat32, qcclSum, comm), "sendbuff is NULL");
  refused(qcclAllReduce(a.data(), nullptr, 4, qcclFloat32, qcclSum, comm), "recvbuff is NULL");
  refused(qcclAllReduce(a.data(), b.data(), 4, static_cast<qcclDataType_t>(42), qcclSum, comm), "datatype = 42");
  refused(qcclAllReduce(a.data(), b.data(), 4, qcclFloat32, static_cast<qcclRedOp_t>(-1), comm), "op = -1");
  refused(qcclBroadcast(a.data(), b.data(), 4, qcclFloat32, w.size(), comm), "root = ");
  refused(qcclReduce(a.data(), b.data(), 4, qcclFloat32, qcclSum, -3, comm), "root = -3");
  refused(qcclSend(a.data(), 4, qcclFloat32, w.size() + 5, comm), "peer = ");
  refused(qcclRecv(a.data(), 4, qcclFloat32, -1, comm), "peer = -1");
  refused(qcclAllReduce(a.data(), a.data() + 1, 4, qcclFloat32, qcclSum, comm), "overlaps");
  refused(qcclAlltoAll(b.data(), b.data(), 1, qcclFloat32, comm), "cannot run in place");
  refused(qcclAllReduce(a.data(), b.data(), SIZE_MAX / 2, qcclFloat64, qcclSum, comm), "address space");
  refused(qcclAllReduce(a.data(), b.data(), 4, qcclFloat32, qcclSum, nullptr), "comm is NULL");
  refused(qcclIAllReduce(a.data(), b.data(), 4, qcclFloat32, qcclSum, comm, nullptr), "request is NULL");
  qcclStats_t stats{};
  refused(qcclCommGetLastStats(comm, &stats), "stats->size = 0");
  CHECK(qcclGroupEnd() == qcclInvalidUsage);
  // Nothing was sent: the communicator is still in step.
  check_collective(comm, Coll::kAllReduce, DataType::kFloat32, RedOp::kSum, 4, false, 0);
  int async = -1;
  QCCL_REQUIRE_OK(qcclCommGetAsyncError(comm, reinterpret_cast<qcclResult_t*>(&async)));
  CHECK(async == qcclSuccess);
}

TEST_CASE("a call refused inside a group fails the group: its end runs none of the group's calls", "[ranks]") {
  World& w = World::get();
  qcclComm_t comm = w.comm();
  const size_t count = 1000;
  std::vector<float> x(count, static_cast<float>(w.rank() + 1)), y(count, -1.0f), z(count, -1.0f);
  qcclCodec_t q8 = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("q8", &q8));
  qcclRequest_t request = nullptr;
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, comm, &request));
  QCCL_REQUIRE_OK(qcclGroupStart());  // refused in a nested group: the outermost end fails
  CHECK(qcclAllReduceCompressed(x.data(), z.data(), count, qcclInt32, qcclSum, q8, nullptr, comm) ==
        qcclInvalidArgument);
  const std::string refusal = qcclGetLastError(nullptr);
  CHECK_THAT(refusal, Catch::StartsWith("qcclAllReduceCompressed: ") && Catch::Contains("int32"));
  QCCL_REQUIRE_OK(qcclGroupEnd());
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), z.data(), count, qcclFloat32, qcclSum, comm));  // queued after it
  CHECK(qcclGroupEnd() == qcclInvalidArgument);
  CHECK(std::string(qcclGetLastError(nullptr)) ==
        "qcclGroupEnd: the group ran none of its 2 queued calls: a call in it was refused: " + refusal);
  CHECK(qcclWait(&request) == qcclInvalidArgument);
  CHECK(std::count(y.begin(), y.end(), -1.0f) == static_cast<long>(count));
  CHECK(std::count(z.begin(), z.end(), -1.0f) == static_cast<long>(count));
  // Nothing was sent (every rank refused alike): the communicator is in step, and the next group runs.
  int async = -1;
  QCCL_REQUIRE_OK(qcclCommGetAsyncError(comm, reinterpret_cast<qcclResult_t*>(&async)));
  CHECK(async == qcclSuccess);
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, comm));
  QCCL_REQUIRE_OK(qcclGroupEnd());
  const float sum = w.size() * (w.size() + 1) / 2.0f;
  CHECK(std::count(y.begin(), y.end(), sum) == static_cast<long>(count));
  check_collective(comm, Coll::kAllGather, DataType::kInt32, RedOp::kSum, 5, false, 0);
  QCCL_REQUIRE_OK(qcclCodecDestroy(q8));
}

TEST_CASE("every collective entry point names itself in its errors and sets *request only on success",
          "[ranks]") {
  float a[4] = {}, b[4] = {};
  auto named = [](qcclResult_t result, const std::string& call, const char* what) {
    CHECK(result == qcclInvalidArgument);
    CHECK(std::string(qcclGetLastError(nullptr)) == call + ": " + what);
  };
  named(qcclAllReduce(a, b, 4, qcclFloat32, qcclSum, nullptr), "qcclAllReduce", "comm is NULL");
  named(qcclBroadcast(a, b, 4, qcclFloat32, 0, nullptr), "qcclBroadcast", "comm is NULL");
  named(qcclReduce(a, b, 4, qcclFloat32, qcclSum, 0, nullptr), "qcclReduce", "comm is NULL");
  named(qcclAllGather(a, b, 1, qcclFloat32, nullptr), "qcclAllGather", "comm is NULL");
  named(qcclReduceScatter(a, b, 1, qcclFloat32, qcclSum, nullptr), "qcclReduceScatter", "comm is NULL");
  named(qcclAlltoAll(a, b, 1, qcclFloat32, nullptr), "qcclAlltoAll", "comm is NULL");
  named(qcclSend(a, 4, qcclFloat32, 0, nullptr), "qcclSend", "comm is NULL");
  named(qcclRecv(b, 4, qcclFloat32, 0, nullptr), "qcclRecv", "comm is NULL");
  qcclRequest_t untouched = reinterpret_cast<qcclRequest_t>(&a);
  qcclRequest_t req = untouched;
  named(qcclIAllReduce(a, b, 4, qcclFloat32, qcclSum, nullptr, &req), "qcclIAllReduce", "comm is NULL");
  named(qcclIBroadcast(a, b, 4, qcclFloat32, 0, nullptr, &req), "qcclIBroadcast", "comm is NULL");
  named(qcclIReduce(a, b, 4, qcclFloat32, qcclSum, 0, nullptr, &req), "qcclIReduce", "comm is NULL");
  named(qcclIAllGather(a, b, 1, qcclFloat32, nullptr, &req), "qcclIAllGather", "comm is NULL");
  named(qcclIReduceScatter(a, b, 1, qcclFloat32, qcclSum, nullptr, &req), "qcclIReduceScatter", "comm is NULL");
  named(qcclIAlltoAll(a, b, 1, qcclFloat32, nullptr, &req), "qcclIAlltoAll", "comm is NULL");
  named(qcclISend(a, 4, qcclFloat32, 0, nullptr, &req), "qcclISend", "comm is NULL");
  named(qcclIRecv(b, 4, qcclFloat32, 0, nullptr, &req), "qcclIRecv", "comm is NULL");
  CHECK(req == untouched);
  qcclComm_t comm = World::get().comm();
  named(qcclIBroadcast(a, b, 4, qcclFloat32, 0, comm, nullptr), "qcclIBroadcast", "request is NULL");
  named(qcclIRecv(b, 4, qcclFloat32, 0, comm, nullptr), "qcclIRecv", "request is NULL");
}

// A communicator of this rank alone, independent of the world's (each rank makes its own).
qcclComm_t private_comm() {
  qcclUniqueId id;
  QCCL_REQUIRE_OK(qcclGetUniqueId(&id));
  qcclComm_t comm = nullptr;
  QCCL_REQUIRE_OK(qcclCommInitRank(&comm, 1, id, 0));
  return comm;
}

bool names_dead_handle(const std::string& error) {
  return error.find("is not a live communicator: destroyed or aborted, or never made") != std::string::npos;
}

TEST_CASE("a call with a destroyed communicator's handle fails cleanly, naming the handle", "[ranks]") {
  qcclComm_t comm = private_comm();
  QCCL_REQUIRE_OK(qcclCommDestroy(comm));
  std::vector<float> a(16, 1.0f);
  CHECK(qcclAllReduce(a.data(), a.data(), a.size(), qcclFloat32, qcclSum, comm) == qcclInvalidArgument);
  const std::string error = qcclGetLastError(nullptr);
  CHECK(names_dead_handle(error));
  char value[32];
  std::snprintf(value, sizeof(value), "comm = %p", static_cast<void*>(comm));
  CHECK_THAT(error, Catch::Contains(value));
  int rank = -1;
  CHECK(qcclCommUserRank(comm, &rank) == qcclInvalidArgument);
  CHECK(qcclCommDestroy(comm) == qcclInvalidArgument);
  CHECK(qcclCommAbort(comm) == qcclInvalidArgument);
}

// PyTorch's watchdog: one thread aborts while another keeps calling with the same handle, which it
// loaded before the abort. Every call after the abort must fail cleanly (the handle's memory is freed
// by then); a call the abort catches in flight fails with qcclAborted. Before the live-handle
// registry (src/api.cc) the caller read the freed handle: the test crashed, or failed, in every run.
TEST_CASE("qcclCommAbort from another thread while a thread keeps calling on the communicator", "[ranks]") {
  constexpr int kTrials = 40;
  std::vector<float> a(256, 1.0f);
  int in_flight = 0, after = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    qcclComm_t comm = private_comm();
    std::atomic<bool> calling{false};
    qcclResult_t last = qcclSuccess;
    std::string error;
    std::thread caller([&] {
      for (int i = 0;; ++i) {
        qcclResult_t async = qcclSuccess;
        last = i % 2 ? qcclAllReduce(a.data(), a.data(), a.size(), qcclFloat32, qcclSum, comm)
                     : qcclCommGetAsyncError(comm, &async);
        calling = true;
        if (last != qcclSuccess) break;
      }
      error = qcclGetLastError(nullptr);
    });
    while (!calling) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (trial % 20)));  // spread over the calls
    QCCL_REQUIRE_OK(qcclCommAbort(comm));
    caller.join();
    INFO("trial " << trial << ": " << qcclGetErrorString(last) << ": " << error);
    if (last == qcclInvalidArgument) {
      CHECK(names_dead_handle(error));
      ++after;
    } else {
      CHECK(last == qcclAborted);
      ++in_flight;
    }
  }
  // Both endings happen in practice; the one the test is about, a call after the abort, must.
  CHECK(after > 0);
  INFO(in_flight << " calls caught in flight");
}

// The blocked call holds the communicator: the abort frees the handle, not what the call is using.
TEST_CASE("qcclCommAbort from another thread releases a call blocked on the communicator", "[ranks]") {
  qcclComm_t comm = private_comm();
  std::vector<float> a(16);
  std::atomic<bool> entering{false};
  qcclResult_t result = qcclSuccess;
  std::thread blocked([&] {
    entering = true;
    result = qcclRecv(a.data(), a.size(), qcclFloat32, 0, comm);  // from itself, with no send: waits
  });
  while (!entering) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  QCCL_REQUIRE_OK(qcclCommAbort(comm));
  blocked.join();
  // Aborted in flight, or refused as dead when the abort came before the call looked its handle up.
  CHECK((result == qcclAborted || result == qcclInvalidArgument));
}

TEST_CASE("version and error strings", "[ranks]") {
  int version = 0;
  QCCL_REQUIRE_OK(qcclGetVersion(&version));
  CHECK(version == QCCL_VERSION_CODE);
  for (int r = 0; r <= qcclNumResults; ++r) CHECK(std::strlen(qcclGetErrorString(static_cast<qcclResult_t>(r))) > 0);
}

}  // namespace qccl::test
