// qcclCommSplit on real processes (src/comm_split.cc), run by qcclrun with 1 to 8 ranks: membership
// and ranks by color and key, ranks without a color, settings inherited or overridden, nested splits,
// a child and its parent used at the same time from one thread and from two, and refusals that send
// nothing.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

// A communicator for the length of a scope (null for a rank without a color).
struct Split {
  qcclComm_t comm = nullptr;
  Split(qcclComm_t parent, int color, int key, const qcclConfig_t* config = nullptr) {
    QCCL_REQUIRE_OK(qcclCommSplit(parent, color, key, &comm, config));
  }
  ~Split() {
    if (comm && qcclCommDestroy(comm) != qcclSuccess)
      std::fprintf(stderr, "qcclCommDestroy failed: %s\n", qcclGetLastError(nullptr));
  }
};

int rank_of(qcclComm_t comm) {
  int r = -1;
  QCCL_REQUIRE_OK(qcclCommUserRank(comm, &r));
  return r;
}

int size_of(qcclComm_t comm) {
  int n = -1;
  QCCL_REQUIRE_OK(qcclCommCount(comm, &n));
  return n;
}

// The parent ranks of each member of `comm`, in its rank order, gathered over it.
std::vector<int64_t> members_of(qcclComm_t comm, int parent_rank) {
  const int64_t mine = parent_rank;
  std::vector<int64_t> all(static_cast<size_t>(size_of(comm)));
  QCCL_REQUIRE_OK(qcclAllGather(&mine, all.data(), 1, qcclInt64, comm));
  return all;
}

TEST_CASE("ranks of one color form a communicator ranked by key, then by parent rank", "[split]") {
  World& w = World::get();
  // Two colors (even and odd ranks), keys that reverse the order inside each.
  const int color = w.rank() % 2;
  Split child(w.comm(), color, -w.rank());
  REQUIRE(child.comm != nullptr);
  std::vector<int64_t> expected;
  for (int r = w.size() - 1; r >= 0; --r)
    if (r % 2 == color) expected.push_back(r);
  REQUIRE(size_of(child.comm) == static_cast<int>(expected.size()));
  CHECK(members_of(child.comm, w.rank()) == expected);

  // Equal keys: the parent's order decides.
  Split same_key(w.comm(), 7, 0);
  std::vector<int64_t> everyone(static_cast<size_t>(w.size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  CHECK(rank_of(same_key.comm) == w.rank());
  CHECK(members_of(same_key.comm, w.rank()) == everyone);

  // Collectives on the child see only its members: the sum of their parent ranks.
  int64_t sum = 0, mine = w.rank();
  QCCL_REQUIRE_OK(qcclAllReduce(&mine, &sum, 1, qcclInt64, qcclSum, child.comm));
  CHECK(sum == std::accumulate(expected.begin(), expected.end(), int64_t{0}));
}

TEST_CASE("a rank without a color gets NULL and the others carry on", "[split]") {
  World& w = World::get();
  const bool out = w.size() > 1 && w.rank() % 3 == 2;
  Split child(w.comm(), out ? QCCL_SPLIT_NOCOLOR : 0, w.rank());
  Split negative(w.comm(), out ? -5 : 0, w.rank());  // any negative color means none
  if (out) {
    CHECK(child.comm == nullptr);
    CHECK(negative.comm == nullptr);
    return;
  }
  REQUIRE(child.comm != nullptr);
  REQUIRE(negative.comm != nullptr);
  int expected_size = 0;
  for (int r = 0; r < w.size(); ++r) expected_size += (w.size() > 1 && r % 3 == 2) ? 0 : 1;
  CHECK(size_of(child.comm) == expected_size);
  std::vector<float> data(1000, 1.0f);
  QCCL_REQUIRE_OK(qcclAllReduce(data.data(), data.data(), data.size(), qcclFloat32, qcclSum, child.comm));
  for (float v : data) REQUIRE(v == static_cast<float>(expected_size));
}

TEST_CASE("a split of a split, and settings overridden per child", "[split]") {
  World& w = World::get();
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.chunkBytes = 1000;  // many fragments, not a multiple of the element size
  config.pipelineDepth = 3;
  Split half(w.comm(), w.rank() < (w.size() + 1) / 2 ? 0 : 1, w.rank(), &config);
  Split quarter(half.comm, rank_of(half.comm) % 2, 0);  // inherits half's settings
  // Every member of `quarter` holds one element per member; the gather must put them in rank order.
  const size_t count = 12345;
  const int n = size_of(quarter.comm), r = rank_of(quarter.comm);
  std::vector<int32_t> mine(count, r * 1000 + 1), all(count * static_cast<size_t>(n));
  QCCL_REQUIRE_OK(qcclAllGather(mine.data(), all.data(), count, qcclInt32, quarter.comm));
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < count; ++i) REQUIRE(all[static_cast<size_t>(k) * count + i] == k * 1000 + 1);
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(quarter.comm, &stats));
  // The ring sends every block but the receiver's own once: (n - 1) count int32, whatever the chunking.
  CHECK(stats.wireBytesSent == static_cast<uint64_t>(n - 1) * count * sizeof(int32_t));
  // The split's own exchanges over a parent leave the parent's statistics of its last collective.
  const uint64_t before = stats.sequence;
  {
    Split again(quarter.comm, 0, 0);
  }
  qcclStats_t after{};
  after.size = sizeof(after);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(quarter.comm, &after));
  CHECK(after.sequence == before);
  CHECK(after.wireBytesSent == stats.wireBytesSent);
  CHECK(std::string(after.algorithm) == stats.algorithm);
}

TEST_CASE("a child and its parent run collectives at the same time", "[split]") {
  World& w = World::get();
  Split child(w.comm(), w.rank() % 2, w.rank());
  const int64_t child_size = size_of(child.comm);
  const size_t count = 300000;  // several fragments on each
  std::vector<int32_t> a(count, 1), b(count, 2);
  // Non-blocking on both, in flight together, from one thread.
  qcclRequest_t on_parent = nullptr, on_child = nullptr;
  QCCL_REQUIRE_OK(qcclIAllReduce(a.data(), a.data(), count, qcclInt32, qcclSum, w.comm(), &on_parent));
  QCCL_REQUIRE_OK(qcclIAllReduce(b.data(), b.data(), count, qcclInt32, qcclSum, child.comm, &on_child));
  QCCL_REQUIRE_OK(qcclWait(&on_child));
  QCCL_REQUIRE_OK(qcclWait(&on_parent));
  for (size_t i = 0; i < count; ++i) REQUIRE(a[i] == w.size());
  for (size_t i = 0; i < count; ++i) REQUIRE(b[i] == 2 * child_size);

  // Blocking calls from two threads, one per communicator.
  std::vector<int64_t> parent_sums, child_sums;
  std::thread other([&] {
    for (int round = 0; round < 20; ++round) {
      int64_t v = round, s = 0;
      if (qcclAllReduce(&v, &s, 1, qcclInt64, qcclSum, child.comm) != qcclSuccess) return;
      child_sums.push_back(s);
    }
  });
  for (int round = 0; round < 20; ++round) {
    int64_t v = round, s = 0;
    QCCL_REQUIRE_OK(qcclAllReduce(&v, &s, 1, qcclInt64, qcclSum, w.comm()));
    parent_sums.push_back(s);
  }
  other.join();
  REQUIRE(parent_sums.size() == 20);
  REQUIRE(child_sums.size() == 20);
  for (int round = 0; round < 20; ++round) {
    CHECK(parent_sums[round] == round * int64_t{w.size()});
    CHECK(child_sums[round] == round * child_size);
  }
}

TEST_CASE("bad splits are refused on every rank before anything is sent", "[split]") {
  World& w = World::get();
  CHECK(qcclCommSplit(w.comm(), 0, 0, nullptr, nullptr) == qcclInvalidArgument);
  CHECK(std::string(qcclGetLastError(nullptr)).find("newcomm") != std::string::npos);
  CHECK(qcclCommSplit(nullptr, 0, 0, nullptr, nullptr) == qcclInvalidArgument);

  qcclComm_t newcomm = reinterpret_cast<qcclComm_t>(&newcomm);  // must stay as it is on failure
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.chunkBytes = 10;
  CHECK(qcclCommSplit(w.comm(), 0, 0, &newcomm, &config) == qcclInvalidArgument);
  CHECK(std::string(qcclGetLastError(nullptr)).find("chunkBytes = 10") != std::string::npos);
  CHECK(newcomm == reinterpret_cast<qcclComm_t>(&newcomm));

  // Refused inside a group, it fails the group as any refused call does: its end runs none of the
  // calls queued in it (it returned success and ran them).
  std::vector<float> x(100, 1.0f), y(x.size(), -1.0f);
  qcclRequest_t request = nullptr;
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, w.comm(), &request));
  CHECK(qcclCommSplit(w.comm(), 0, 0, &newcomm, nullptr) == qcclInvalidUsage);
  CHECK(qcclGroupEnd() == qcclInvalidUsage);
  CHECK(std::string(qcclGetLastError(nullptr)).find("qcclCommSplit: ") != std::string::npos);
  CHECK(qcclWait(&request) == qcclInvalidUsage);
  CHECK(std::count(y.begin(), y.end(), -1.0f) == static_cast<long>(y.size()));
  CHECK(newcomm == reinterpret_cast<qcclComm_t>(&newcomm));

  // Settings only the child parses, on rank 0; the others refuse chunkBytes at once. (They were parsed
  // once the child was made, after both exchanges: rank 0 waited in the first, alone, until
  // QCCL_TIMEOUT, and the parent was broken.)
  for (const char* bad : {"codec", "algorithms"}) {
    config = QCCL_CONFIG_INITIALIZER;
    if (w.rank() != 0) config.chunkBytes = 10;
    else if (bad == std::string("codec")) config.codec = "q9";
    else config.algorithms = "allreduce=no_such_algorithm";
    CHECK(qcclCommSplit(w.comm(), 0, 0, &newcomm, &config) == qcclInvalidArgument);
    const std::string error = qcclGetLastError(nullptr);
    INFO(error);
    CHECK(error.find(w.rank() != 0 ? "chunkBytes" : bad == std::string("codec") ? "q9" : "no_such_algorithm") !=
          std::string::npos);
    CHECK(newcomm == reinterpret_cast<qcclComm_t>(&newcomm));
  }

  // The parent's next collective is matched on every rank.
  int64_t one = 1, sum = 0;
  QCCL_REQUIRE_OK(qcclAllReduce(&one, &sum, 1, qcclInt64, qcclSum, w.comm()));
  CHECK(sum == w.size());
}

TEST_CASE("a config refused on one rank fails the split on every rank at once, the parent intact", "[split]") {
  // The refusing rank still takes part in the split's exchange, saying so: the others used to wait for
  // it until QCCL_TIMEOUT (the job runs with a long one), and the parent was broken.
  World& w = World::get();
  if (w.size() < 2) return;
  const int refusing = w.size() - 1;
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  if (w.rank() == refusing) config.chunkBytes = 10;
  qcclComm_t newcomm = reinterpret_cast<qcclComm_t>(&newcomm);
  const auto begin = std::chrono::steady_clock::now();
  CHECK(qcclCommSplit(w.comm(), w.rank() % 2, 0, &newcomm, &config) == qcclInvalidArgument);
  const std::string error = qcclGetLastError(nullptr);
  INFO(error);
  CHECK(error.find(w.rank() == refusing ? "chunkBytes = 10" : "rank " + std::to_string(refusing) + "'s config") !=
        std::string::npos);
  CHECK(newcomm == reinterpret_cast<qcclComm_t>(&newcomm));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() < 30.0);
  int64_t one = 1, sum = 0;
  QCCL_REQUIRE_OK(qcclAllReduce(&one, &sum, 1, qcclInt64, qcclSum, w.comm()));
  CHECK(sum == w.size());
}

}  // namespace
}  // namespace qccl::test
