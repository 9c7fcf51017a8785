// Every algorithm of the registry (collectives/registry.cc) on real processes, forced by name (STYLE
// rule 16): one test case per registry entry, tagged "[collective=name]" as QCCL_ALGO spells it.
// tests/ranks/CMakeLists.txt runs each case under qcclrun with QCCL_ALGO set to its tag, and
// forced_algorithms_check.cmake fails when a registry entry has no such run. Each case checks that
// the forced algorithm is the one that ran (a forced algorithm that declines falls back silently, by
// size) and checks the results: exactly for the uncompressed ones (small integers in float32, so
// every summation order gives the same bits), within the codec's bound and the same bits on every
// rank for the compressed ones, with the wire bytes of their closed forms.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "kernels/half.h"
#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

// Large enough that selection by size would pick another algorithm than binomial and
// recursive_doubling (so forcing them matters), and not a multiple of any rank count.
constexpr size_t kCount = 30011;

// Small integers: every sum of them is exact in float32.
float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

std::vector<float> values(int rank, size_t count, size_t first = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(rank, first + i);
  return v;
}

float sum_over_ranks(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; ++r) s += value(r, i);
  return s;
}

qcclStats_t last_stats() {
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(World::get().comm(), &stats));
  return stats;
}

// The forced algorithm ran: QCCL_ALGO names it, and the statistics of the last call name it too.
void require_ran(const char* collective, const char* name) {
  const char* algo = std::getenv("QCCL_ALGO");
  INFO("QCCL_ALGO=" << (algo ? algo : "(unset)"));
  REQUIRE(algo != nullptr);
  REQUIRE(std::string(algo) == std::string(collective) + "=" + name);
  CHECK(std::string(last_stats().algorithm) == name);
}

// A proven bound for q4 with rounding to nearest on inputs in [-1, 1] (compressed_ranks_test.cc
// and allreduce_compressed_test.cc derive it): the ring re-encodes partial sums of up to n inputs at
// n hops, each within half a quantization step of its bucket's range.
double q4_sum_bound(int n) { return 0.5 / 15 * n * (n + 1) + 1e-5 * n; }

// The node label of every rank, from QCCL_NODE_MAP (tests/ranks/CMakeLists.txt sets one-digit labels).
std::vector<int> node_labels() {
  const char* map = std::getenv("QCCL_NODE_MAP");
  REQUIRE(map != nullptr);
  std::vector<int> label;
  for (const char* p = map; *p; ++p)
    if (*p != ',') label.push_back(*p - '0');
  return label;
}

double sine(int rank, size_t i) { return std::sin(0.731 * static_cast<double>(i) + 1.37 * rank); }

// A q4 all-reduce through the forced algorithm `name`: within the bound, the same bits on every rank.
// Returns its statistics.
qcclStats_t run_value_codec_call(const char* name, size_t count) {
  World& w = World::get();
  const int n = w.size();
  Codec codec("q4:bucket=512");
  std::vector<float> x(count), y(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(
      qcclAllReduceCompressed(x.data(), y.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()));
  require_ran("allreduce", name);
  const qcclStats_t stats = last_stats();
  require_same_everywhere(y.data(), count * sizeof(float));
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += static_cast<float>(sine(r, i));
    worst = std::max(worst, std::fabs(y[i] - exact));
  }
  CHECK(worst <= q4_sum_bound(n));
  return stats;
}

void run_value_codec(const char* name) {
  const int n = World::get().size();
  const size_t count = 512 * 6 * 10;  // segments of whole 512-value buckets for 2 and 3 ranks
  const qcclStats_t stats = run_value_codec_call(name, count);
  // Both send each rank's segment encoded n-1 times in the reduce-scatter and n-1 times in the
  // allgather: per 512-value bucket, a float minimum and maximum and 512 four-bit codes.
  const uint64_t segment = count / static_cast<size_t>(n);
  CHECK(stats.wireBytesSent == 2ull * (n - 1) * (segment / 512) * (8 + 512 / 2));
}

}  // namespace

TEST_CASE("local: every collective on one rank",
          "[allreduce=local][broadcast=local][reduce=local]"
          "[allgather=local][reducescatter=local][alltoall=local][gather=local][scatter=local]") {
  World& w = World::get();
  REQUIRE(w.size() == 1);
  const char* algo = std::getenv("QCCL_ALGO");
  REQUIRE(algo != nullptr);
  const std::string collective = std::string(algo).substr(0, std::string(algo).find('='));
  const std::vector<float> x = values(0, kCount);
  std::vector<float> y(kCount, -1.0f);
  if (collective == "allreduce")
    QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), kCount, qcclFloat32, qcclSum, w.comm()));
  if (collective == "broadcast") QCCL_REQUIRE_OK(qcclBroadcast(x.data(), y.data(), kCount, qcclFloat32, 0, w.comm()));
  if (collective == "reduce")
    QCCL_REQUIRE_OK(qcclReduce(x.data(), y.data(), kCount, qcclFloat32, qcclSum, 0, w.comm()));
  if (collective == "allgather") QCCL_REQUIRE_OK(qcclAllGather(x.data(), y.data(), kCount, qcclFloat32, w.comm()));
  if (collective == "reducescatter")
    QCCL_REQUIRE_OK(qcclReduceScatter(x.data(), y.data(), kCount, qcclFloat32, qcclSum, w.comm()));
  if (collective == "alltoall") QCCL_REQUIRE_OK(qcclAlltoAll(x.data(), y.data(), kCount, qcclFloat32, w.comm()));
  if (collective == "gather") QCCL_REQUIRE_OK(qcclGather(x.data(), y.data(), kCount, qcclFloat32, 0, w.comm()));
  if (collective == "scatter") QCCL_REQUIRE_OK(qcclScatter(x.data(), y.data(), kCount, qcclFloat32, 0, w.comm()));
  require_ran(collective.c_str(), "local");
  CHECK(y == x);
}

TEST_CASE("AllReduce recursive_doubling and ring: exact sums", "[allreduce=recursive_doubling][allreduce=ring]") {
  World& w = World::get();
  const std::string name = std::string(std::getenv("QCCL_ALGO")).substr(std::string("allreduce=").size());
  const std::vector<float> x = values(w.rank(), kCount);
  std::vector<float> y(kCount, -1.0f);
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), kCount, qcclFloat32, qcclSum, w.comm()));
  require_ran("allreduce", name.c_str());
  for (size_t i = 0; i < kCount; ++i) REQUIRE(y[i] == sum_over_ranks(w.size(), i));
}

TEST_CASE("AllReduce sra_compressed: q4 within its bound, the same bits on every rank", "[allreduce=sra_compressed]") {
  run_value_codec("sra_compressed");
}

TEST_CASE("AllReduce ring_compressed: q4 within its bound, the same bits on every rank",
          "[allreduce=ring_compressed]") {
  run_value_codec("ring_compressed");
}

TEST_CASE("AllReduce hierarchical_compressed: q4 within its bound, the same bits on every rank, members send "
          "their input to their leader and nothing across nodes",
          "[allreduce=hierarchical_compressed]") {
  World& w = World::get();
  const size_t count = 512 * 6 * 10;
  const qcclStats_t stats = run_value_codec_call("hierarchical_compressed", count);
  // QCCL_NODE_MAP (tests/ranks/CMakeLists.txt) gives the node of every rank; a node's leader is its
  // lowest rank.
  const char* map = std::getenv("QCCL_NODE_MAP");
  REQUIRE(map != nullptr);
  std::vector<std::string> labels;
  for (const char* p = map; *p;) {
    const char* comma = std::strchr(p, ',');
    labels.emplace_back(p, comma ? comma : p + std::strlen(p));
    p = comma ? comma + 1 : p + std::strlen(p);
  }
  REQUIRE(static_cast<int>(labels.size()) == w.size());
  const bool leader = std::find(labels.begin(), labels.end(), labels[w.rank()]) - labels.begin() == w.rank();
  if (!leader) {
    CHECK(stats.wireBytesSent == count * sizeof(float));
    CHECK(stats.interNodeBytesSent == 0);
  } else {
    CHECK(stats.interNodeBytesSent > 0);
    CHECK(stats.interNodeBytesSent < count * sizeof(float) / 4);  // 4-bit codes, every other node's share
  }
}

TEST_CASE("AllReduce marsit: a full-precision round, then a sign round, the same bits on every rank",
          "[allreduce=marsit]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 32 * 6 * 100;  // whole 32-bit words in every segment for 2 and 3 ranks
  Codec codec("sign:eta_s=0.05,k=2,seed=4");
  State state(w.comm(), count);
  std::vector<float> u(count), g(count);
  for (size_t i = 0; i < count; ++i) u[i] = static_cast<float>(0.1 * sine(w.rank(), i));
  // Round 0: the average of u (the compensation starts at 0).
  QCCL_REQUIRE_OK(
      qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle, w.comm()));
  require_ran("allreduce", "marsit");
  require_same_everywhere(g.data(), count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    double average = 0;
    for (int r = 0; r < n; ++r) average += static_cast<float>(0.1 * sine(r, i));
    REQUIRE(std::abs(g[i] - average / n) <= 1e-7);
  }
  // Round 1: signs, eta_s in magnitude, one bit per value on the wire.
  QCCL_REQUIRE_OK(
      qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle, w.comm()));
  require_ran("allreduce", "marsit");
  const qcclStats_t stats = last_stats();
  require_same_everywhere(g.data(), count * sizeof(float));
  for (float x : g) REQUIRE(std::abs(x) == 0.05f);
  CHECK(stats.wireBytesSent == 2ull * (n - 1) * (count / static_cast<size_t>(n) / 32) * 4);
}

// IntSGD with a fixed alpha (no state, so no exact first round): every rank sends round(alpha x) as
// int8, the sum is exact, and the average is within 1/alpha of the true one when nothing is clipped.
void run_int_codec(const std::string& spec, const char* name) {
  World& w = World::get();
  const int n = w.size();
  const double alpha = 100;  // |alpha x| <= 30 fits int8's share for n <= 4 (127 / 4 = 31)
  Codec codec(spec);
  std::vector<float> x(kCount), g(kCount);
  for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(0.3 * sine(w.rank(), i));
  QCCL_REQUIRE_OK(
      qcclAllReduceCompressed(x.data(), g.data(), kCount, qcclFloat32, qcclAvg, codec.handle, nullptr, w.comm()));
  require_ran("allreduce", name);
  const qcclStats_t stats = last_stats();
  require_same_everywhere(g.data(), kCount * sizeof(float));
  CHECK(stats.intAlpha == alpha);
  REQUIRE(stats.clippedValues == 0);
  for (size_t i = 0; i < kCount; ++i) {
    double mean = 0;
    for (int r = 0; r < n; ++r) mean += static_cast<float>(0.3 * sine(r, i));
    REQUIRE(std::abs(g[i] - mean / n) <= 1.0 / alpha + 1e-6);
  }
}

TEST_CASE("AllReduce intsgd: integers along a ring, the same bits on every rank", "[allreduce=intsgd]") {
  run_int_codec("int8:alpha=100,seed=3", "intsgd");
}

TEST_CASE("AllReduce intsgd_switch: integers through aggregators, the same bits on every rank",
          "[allreduce=intsgd_switch]") {
  run_int_codec("int8:alpha=100,seed=3,agg=switch", "intsgd_switch");
}

TEST_CASE("Broadcast binomial and chain: every rank gets the root's buffer", "[broadcast=binomial][broadcast=chain]") {
  World& w = World::get();
  const std::string name = std::string(std::getenv("QCCL_ALGO")).substr(std::string("broadcast=").size());
  const int root = w.size() - 1;
  std::vector<float> y = w.rank() == root ? values(root, kCount) : std::vector<float>(kCount, -1.0f);
  QCCL_REQUIRE_OK(qcclBroadcast(y.data(), y.data(), kCount, qcclFloat32, root, w.comm()));
  require_ran("broadcast", name.c_str());
  CHECK(y == values(root, kCount));
}

TEST_CASE("Reduce binomial and chain: the root gets the exact sum", "[reduce=binomial][reduce=chain]") {
  World& w = World::get();
  const std::string name = std::string(std::getenv("QCCL_ALGO")).substr(std::string("reduce=").size());
  const int root = w.size() - 1;
  const std::vector<float> x = values(w.rank(), kCount);
  std::vector<float> y(kCount, -1.0f);
  QCCL_REQUIRE_OK(qcclReduce(x.data(), y.data(), kCount, qcclFloat32, qcclSum, root, w.comm()));
  require_ran("reduce", name.c_str());
  if (w.rank() == root)
    for (size_t i = 0; i < kCount; ++i) REQUIRE(y[i] == sum_over_ranks(w.size(), i));
}

TEST_CASE("AllGather ring: every rank's block in rank order", "[allgather=ring]") {
  World& w = World::get();
  const std::vector<float> x = values(w.rank(), kCount);
  std::vector<float> y(kCount * static_cast<size_t>(w.size()), -1.0f);
  QCCL_REQUIRE_OK(qcclAllGather(x.data(), y.data(), kCount, qcclFloat32, w.comm()));
  require_ran("allgather", "ring");
  for (int r = 0; r < w.size(); ++r)
    CHECK(std::vector<float>(y.begin() + static_cast<long>(r * kCount),
                             y.begin() + static_cast<long>((r + 1) * kCount)) == values(r, kCount));
}

TEST_CASE("ReduceScatter ring: each rank gets the exact sum of its block", "[reducescatter=ring]") {
  World& w = World::get();
  const size_t total = kCount * static_cast<size_t>(w.size());
  const std::vector<float> x = values(w.rank(), total);
  std::vector<float> y(kCount, -1.0f);
  QCCL_REQUIRE_OK(qcclReduceScatter(x.data(), y.data(), kCount, qcclFloat32, qcclSum, w.comm()));
  require_ran("reducescatter", "ring");
  for (size_t i = 0; i < kCount; ++i) REQUIRE(y[i] == sum_over_ranks(w.size(), w.rank() * kCount + i));
}

// q8 with rounding to nearest on inputs in [-1, 1]: a decoded value is within half a step, (max - min)
// / 255 / 2 <= 1 / 255, of the value encoded (plus float32 rounding of the bucket's affine map).
constexpr double kQ8Error = 1.0 / 255 + 1e-6;

TEST_CASE("AllGather compressed_ring: every block decoded from its owner's bytes, the same bits everywhere",
          "[allgather=compressed_ring]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 512 * 7;
  Codec codec("q8:bucket=512");
  std::vector<float> x(count), y(count * static_cast<size_t>(n));
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(x.data(), y.data(), count, qcclFloat32, codec.handle, nullptr, w.comm()));
  require_ran("allgather", "compressed_ring");
  const qcclStats_t stats = last_stats();
  require_same_everywhere(y.data(), y.size() * sizeof(float));
  double worst = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(y[r * count + i]) - static_cast<float>(sine(r, i))));
  CHECK(worst <= kQ8Error);
  // Each rank forwards every block but its successor's: (n - 1) blocks of 7 buckets of 8 + 512 bytes.
  CHECK(stats.wireBytesSent == static_cast<uint64_t>(n - 1) * 7 * (8 + 512));
}

// Whole blocks this rank sends in a hierarchical all-gather over QCCL_NODE_MAP's nodes (the tests force
// one): a member sends its block to its node's leader; a leader sends its members every block but
// theirs, and the next node's leader every block but that node's.
uint64_t hierarchical_blocks_sent(int rank, int n) {
  const std::vector<int> label = node_labels();
  REQUIRE(static_cast<int>(label.size()) == n);
  std::vector<int> leaders;  // the lowest rank of each label, in order of the leaders' ranks
  for (int r = 0; r < n; ++r)
    if (std::find(label.begin(), label.begin() + r, label[r]) == label.begin() + r) leaders.push_back(r);
  auto size_of = [&](int leader) { return static_cast<uint64_t>(std::count(label.begin(), label.end(), label[leader])); };
  const auto me = std::find(leaders.begin(), leaders.end(), rank);
  if (me == leaders.end()) return 1;
  const int next = leaders[static_cast<size_t>((me - leaders.begin() + 1)) % leaders.size()];
  return (size_of(rank) - 1) * static_cast<uint64_t>(n - 1) + static_cast<uint64_t>(n) - size_of(next);
}

TEST_CASE("AllGather hierarchical: every rank's blocks exactly, through the node leaders", "[allgather=hierarchical]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 5000;
  std::vector<float> x(count), y(count * static_cast<size_t>(n));
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(qcclAllGather(x.data(), y.data(), count, qcclFloat32, w.comm()));
  require_ran("allgather", "hierarchical");
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) REQUIRE(y[r * count + i] == static_cast<float>(sine(r, i)));
  CHECK(last_stats().wireBytesSent == hierarchical_blocks_sent(w.rank(), n) * count * sizeof(float));
}

TEST_CASE("AllGather compressed_hierarchical: every block decoded from its owner's bytes, the same bits everywhere",
          "[allgather=compressed_hierarchical]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 512 * 7;
  Codec codec("q8:bucket=512");
  std::vector<float> x(count), y(count * static_cast<size_t>(n));
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(x.data(), y.data(), count, qcclFloat32, codec.handle, nullptr, w.comm()));
  require_ran("allgather", "compressed_hierarchical");
  const uint64_t sent = last_stats().wireBytesSent;
  require_same_everywhere(y.data(), y.size() * sizeof(float));
  double worst = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(y[r * count + i]) - static_cast<float>(sine(r, i))));
  CHECK(worst <= kQ8Error);
  // Blocks of 7 buckets of 8 + 512 bytes.
  CHECK(sent == hierarchical_blocks_sent(w.rank(), n) * 7 * (8 + 512));
}

TEST_CASE("ReduceScatter hierarchical: exact sums through the node leaders", "[reducescatter=hierarchical]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 3000, total = count * static_cast<size_t>(n);
  std::vector<int32_t> x(total), y(count);
  for (size_t i = 0; i < total; ++i) x[i] = static_cast<int32_t>((w.rank() + 1) * (i % 101)) - 50;
  QCCL_REQUIRE_OK(qcclReduceScatter(x.data(), y.data(), count, qcclInt32, qcclSum, w.comm()));
  require_ran("reducescatter", "hierarchical");
  for (size_t i = 0; i < count; ++i) {
    int64_t exact = 0;
    const size_t j = static_cast<size_t>(w.rank()) * count + i;
    for (int r = 0; r < n; ++r) exact += static_cast<int32_t>((r + 1) * (j % 101)) - 50;
    REQUIRE(y[i] == exact);
  }
}

// A q8 ReduceScatter (sum) of 5 buckets of sines per block through the forced hierarchical
// algorithm `name`, with what its tests check: the worst error against the float64 sum, and this
// rank's node (whether it leads it, its size) and the bytes it sent.
struct HierarchicalRun {
  double worst = 0;
  bool leader = false;
  uint64_t local = 0, sent = 0;
};
HierarchicalRun reduce_scatter_hierarchical(const char* name, size_t count) {
  World& w = World::get();
  const int n = w.size();
  const size_t total = count * static_cast<size_t>(n);
  Codec codec("q8:bucket=512");
  std::vector<float> x(total), y(count);
  for (size_t i = 0; i < total; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(
      qcclReduceScatterCompressed(x.data(), y.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()));
  require_ran("reducescatter", name);
  HierarchicalRun run;
  run.sent = last_stats().wireBytesSent;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += static_cast<float>(sine(r, w.rank() * count + i));
    run.worst = std::max(run.worst, std::fabs(y[i] - exact));
  }
  const std::vector<int> label = node_labels();
  run.leader = std::find(label.begin(), label.begin() + w.rank(), label[w.rank()]) == label.begin() + w.rank();
  run.local = static_cast<uint64_t>(std::count(label.begin(), label.end(), label[w.rank()]));
  return run;
}

TEST_CASE("ReduceScatter compressed_hierarchical: node sums encoded once per remote node, within their bound",
          "[reducescatter=compressed_hierarchical]") {
  const int n = World::get().size();
  const size_t count = 512 * 5;
  const HierarchicalRun run = reduce_scatter_hierarchical("compressed_hierarchical", count);
  // One q8 error per remote node, of a sum of up to n - 1 inputs in [-1, 1] (a range up to 2(n-1)).
  CHECK(run.worst <= (n - 1) * (n - 1) * kQ8Error + 1e-5 * n);
  // A member sends the leader its whole input; a leader sends each member its block in float32 and
  // every other node's blocks to that node's leader, 5 q8 buckets each.
  CHECK(run.sent == (run.leader ? (run.local - 1) * count * 4 + (n - run.local) * 5 * (8 + 512)
                                : static_cast<uint64_t>(n) * count * sizeof(float)));
}

TEST_CASE("AllReduce fft_allgather: every rank's payloads decoded in rank order, the reference's bits everywhere",
          "[allreduce=fft_allgather]") {
  World& w = World::get();
  const int n = w.size();
  const std::string spec = "fft:theta=0.8,bits=12,mant=6,max=32,segment=4096";
  const size_t count = 4096 * 3 + 1001;  // three segments and an odd tail
  auto input = [](int rank, size_t i) {  // smooth along the buffer, as the method wants
    return static_cast<float>(0.5 * std::sin(0.01 * static_cast<double>(i) + 1.37 * rank) + 0.1 * std::cos(0.002 * static_cast<double>(i)));
  };
  std::vector<float> x(count), y(count);
  for (size_t i = 0; i < count; ++i) x[i] = input(w.rank(), i);
  Codec codec(spec);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()));
  require_ran("allreduce", "fft_allgather");
  const qcclStats_t stats = last_stats();
  require_same_everywhere(y.data(), count * sizeof(float));
  // The single-process reference (spec P13): every rank's input encoded, the payloads' bins added in
  // rank order, one inverse transform, by the codec's own functions (tested in fft_codec_test).
  const kernels::CodecConfig c = kernels::parse_codec_spec(spec);
  std::vector<float> reference(count, 0.0f), rank_input(count), spectrum(kernels::fft_spectrum_floats(c, count));
  std::vector<uint8_t> wire(c.encoded_bytes(count));
  auto ws = kernels::take_fft_workspace();
  size_t own_bytes = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) rank_input[i] = input(r, i);
    const kernels::EncodeReport report = kernels::encode(c, rank_input.data(), count, wire.data(), kernels::PhiloxKey{}, 0);
    if (r == w.rank()) own_bytes = report.bytes;
    kernels::fft_decode_spectrum(c, wire.data(), report.bytes, count, spectrum.data(), r > 0, *ws);
  }
  kernels::fft_synthesize(c, spectrum.data(), count, reference.data(), *ws);
  CHECK(std::memcmp(y.data(), reference.data(), count * sizeof(float)) == 0);
  CHECK(stats.wireBytesSent == static_cast<uint64_t>(n - 1) * own_bytes);
  // theta = 0.8: a fifth of the bins, 2 x 12 bits each, and a bitmap of a bit per bin: about 1/5.6
  // of float32, whatever underflows sending less.
  CHECK(own_bytes <= count * sizeof(float) / 5);
}

TEST_CASE("AllReduce fft_dense_ring: an fft call that cannot pay runs the exact ring",
          "[allreduce=fft_dense_ring]") {
  World& w = World::get();
  const int n = w.size();
  // Nearly every bin at 16 bits: about 2 bytes a value, more than a float16 ring moves at any rank
  // count (theta=0 itself runs the ring as lossless, whatever it would cost).
  Codec codec("fft:theta=0.001,bits=16,mant=12");
  std::vector<uint16_t> x(kCount), y(kCount);
  for (size_t i = 0; i < kCount; ++i) x[i] = kernels::float_to_half(value(w.rank(), i));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), kCount, qcclFloat16, qcclSum, codec.handle, nullptr, w.comm()));
  require_ran("allreduce", "fft_dense_ring");
  const qcclStats_t stats = last_stats();
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += kernels::half_to_float(y[i]) != sum_over_ranks(n, i);  // exact: small integers
  CHECK(wrong == 0);
  CHECK(stats.wireBytesSent > 0);
  CHECK(stats.wireBytesSent <= 2 * kCount * sizeof(uint16_t));
}

TEST_CASE("ReduceScatter compressed_hierarchical_intra: members' inputs and node sums encoded once, within their bound",
          "[reducescatter=compressed_hierarchical_intra]") {
  const int n = World::get().size();
  const size_t count = 512 * 5;
  const HierarchicalRun run = reduce_scatter_hierarchical("compressed_hierarchical_intra", count);
  // One q8 error per member's input (fewer than n members, each a range up to 2) and per remote node's
  // sum (a range up to 2(n-1), widened by its members' errors: at most 2(n-1) kQ8Error).
  CHECK(run.worst <= (n - 1) * kQ8Error + (n - 1) * (n - 1) * kQ8Error * (1 + kQ8Error) + 1e-5 * n);
  // A member sends the leader its n blocks encoded (5 q8 buckets each); a leader as in
  // compressed_hierarchical.
  const uint64_t block = 5 * (8 + 512);
  CHECK(run.sent == (run.leader ? (run.local - 1) * count * 4 + (n - run.local) * block : static_cast<uint64_t>(n) * block));
}

TEST_CASE("ReduceScatter compressed_two_level: node sums shared by the node's ranks, within their bound",
          "[reducescatter=compressed_two_level]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 512 * 5, total = count * static_cast<size_t>(n);
  Codec codec("q8:bucket=512");
  std::vector<float> x(total), y(count);
  for (size_t i = 0; i < total; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(
      qcclReduceScatterCompressed(x.data(), y.data(), count, qcclFloat32, qcclAvg, codec.handle, nullptr, w.comm()));
  require_ran("reducescatter", "compressed_two_level");
  const qcclStats_t stats = last_stats();
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += static_cast<float>(sine(r, w.rank() * count + i));
    worst = std::max(worst, std::fabs(y[i] - exact / n));
  }
  CHECK(worst <= (n - 1) * kQ8Error + 1e-5);  // one q8 error per remote node's sum, divided by n
  // QCCL_NODE_MAP has nodes of equal size L: N raw blocks to each of L - 1 mates, one encoded block
  // (5 q8 buckets) to each of N - 1 other nodes.
  const std::vector<int> label = node_labels();
  const uint64_t local = static_cast<uint64_t>(std::count(label.begin(), label.end(), label[w.rank()]));
  const uint64_t nodes = static_cast<uint64_t>(n) / local;
  CHECK(stats.wireBytesSent == (local - 1) * nodes * count * sizeof(float) + (nodes - 1) * 5 * (8 + 512));
  CHECK(stats.interNodeBytesSent == (nodes - 1) * 5 * (8 + 512));
}

TEST_CASE("ReduceScatter compressed_pairwise: each contribution encoded once, within its bound",
          "[reducescatter=compressed_pairwise]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 512 * 5, total = count * static_cast<size_t>(n);
  Codec codec("q8:bucket=512");
  std::vector<float> x(total), y(count);
  for (size_t i = 0; i < total; ++i) x[i] = static_cast<float>(sine(w.rank(), i));
  QCCL_REQUIRE_OK(
      qcclReduceScatterCompressed(x.data(), y.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()));
  require_ran("reducescatter", "compressed_pairwise");
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += static_cast<float>(sine(r, w.rank() * count + i));
    worst = std::max(worst, std::fabs(y[i] - exact));
  }
  CHECK(worst <= (n - 1) * kQ8Error + 1e-5 * n);  // the owner's own input is never encoded
  // Each rank sends its contribution to every other block once: (n - 1) blocks of 5 q8 buckets.
  CHECK(last_stats().wireBytesSent == static_cast<uint64_t>(n - 1) * 5 * (8 + 512));
}

TEST_CASE("AlltoAll pairwise: block r of rank q becomes block q of rank r", "[alltoall=pairwise]") {
  World& w = World::get();
  const int n = w.size();
  // Rank q sends values(q, kCount, r * kCount) to rank r.
  const std::vector<float> x = values(w.rank(), kCount * static_cast<size_t>(n));
  std::vector<float> y(kCount * static_cast<size_t>(n), -1.0f);
  QCCL_REQUIRE_OK(qcclAlltoAll(x.data(), y.data(), kCount, qcclFloat32, w.comm()));
  require_ran("alltoall", "pairwise");
  for (int q = 0; q < n; ++q)
    CHECK(std::vector<float>(y.begin() + static_cast<long>(q * kCount),
                             y.begin() + static_cast<long>((q + 1) * kCount)) ==
          values(q, kCount, static_cast<size_t>(w.rank()) * kCount));
}

TEST_CASE("Gather direct: every rank's block on the root, from every root", "[gather=direct]") {
  World& w = World::get();
  const int n = w.size();
  for (int root = 0; root < n; ++root) {
    const std::vector<float> x = values(w.rank() + root, kCount);
    std::vector<float> y(w.rank() == root ? kCount * static_cast<size_t>(n) : 0, -1.0f);
    QCCL_REQUIRE_OK(qcclGather(x.data(), w.rank() == root ? y.data() : nullptr, kCount, qcclFloat32, root, w.comm()));
    require_ran("gather", "direct");
    CHECK(last_stats().wireBytesSent == (w.rank() == root ? 0 : kCount * sizeof(float)));
    if (w.rank() != root) continue;
    for (int q = 0; q < n; ++q)
      CHECK(std::vector<float>(y.begin() + static_cast<long>(q * kCount), y.begin() + static_cast<long>((q + 1) * kCount)) ==
            values(q + root, kCount));
  }
}

TEST_CASE("Scatter direct: block r of the root's buffer on rank r, from every root", "[scatter=direct]") {
  World& w = World::get();
  const int n = w.size();
  for (int root = 0; root < n; ++root) {
    const std::vector<float> x = values(root, kCount * static_cast<size_t>(n));
    std::vector<float> y(kCount, -1.0f);
    QCCL_REQUIRE_OK(qcclScatter(w.rank() == root ? x.data() : nullptr, y.data(), kCount, qcclFloat32, root, w.comm()));
    require_ran("scatter", "direct");
    CHECK(last_stats().wireBytesSent == (w.rank() == root ? (n - 1) * kCount * sizeof(float) : 0));
    CHECK(y == values(root, kCount, static_cast<size_t>(w.rank()) * kCount));
  }
}

TEST_CASE("Send and Recv direct: a message around the ring", "[send=direct][recv=direct]") {
  World& w = World::get();
  const int n = w.size();
  const std::string forced = std::getenv("QCCL_ALGO");
  const std::string collective = forced.substr(0, forced.find('='));
  const int next = (w.rank() + 1) % n, prev = (w.rank() + n - 1) % n;
  const std::vector<float> x = values(w.rank(), kCount);
  std::vector<float> y(kCount, -1.0f);
  // Rank 0 sends first and every other rank receives first, so the blocking calls form a chain.
  auto send = [&] {
    QCCL_REQUIRE_OK(qcclSend(x.data(), kCount, qcclFloat32, next, w.comm()));
    if (collective == "send") require_ran("send", "direct");
  };
  auto recv = [&] {
    QCCL_REQUIRE_OK(qcclRecv(y.data(), kCount, qcclFloat32, prev, w.comm()));
    if (collective == "recv") require_ran("recv", "direct");
  };
  if (w.rank() == 0)
    send(), recv();
  else
    recv(), send();
  CHECK(y == values(prev, kCount));
}

TEST_CASE("Send and Recv compressed: aq4 messages around the ring, chunked at the codec's blocks",
          "[send=compressed][recv=compressed]") {
  World& w = World::get();
  const int n = w.size();
  const std::string forced = std::getenv("QCCL_ALGO");
  const std::string collective = forced.substr(0, forced.find('='));
  const int next = (w.rank() + 1) % n, prev = (w.rank() + n - 1) % n;
  // Blocks of 4 rows of 100 channels: 16 KiB chunks hold 10 blocks, so the call pipelines chunks.
  const std::string spec = "aq4:channels=100,rows=4,round=stochastic,seed=3";
  const kernels::CodecConfig c = kernels::parse_codec_spec(spec);
  Codec codec(spec);
  const size_t count = 400 * 40 + 250;  // 40 whole blocks and a partial one
  const std::vector<float> x = values(w.rank(), count);
  std::vector<float> y(count, -1.0f);
  auto send = [&] {
    QCCL_REQUIRE_OK(qcclSendCompressed(x.data(), count, qcclFloat32, codec.handle, next, w.comm()));
    if (collective == "send") require_ran("send", "compressed");
    CHECK(last_stats().wireBytesSent == c.encoded_bytes(count));
  };
  auto recv = [&] {
    QCCL_REQUIRE_OK(qcclRecvCompressed(y.data(), count, qcclFloat32, codec.handle, prev, w.comm()));
    if (collective == "recv") require_ran("recv", "compressed");
  };
  if (w.rank() == 0)
    send(), recv();
  else
    recv(), send();
  // Within a grid step of each channel's scale (plus the fp16 rounding of the scale) of the sender's
  // values.
  const std::vector<float> sent = values(prev, count);
  for (size_t b = 0; b < count; b += 400)
    for (size_t ch = 0; ch < 100 && b + ch < count; ++ch) {
      double m = 0;
      for (size_t j = b + ch; j < std::min(count, b + 400); j += 100) m = std::max(m, std::fabs(double{sent[j]}));
      for (size_t j = b + ch; j < std::min(count, b + 400); j += 100) {
        INFO("value " << j);
        REQUIRE(std::fabs(double{y[j]} - sent[j]) <= m * (1.0 / 8 + 0x1p-11));
      }
    }
}

TEST_CASE("Send and Recv delta: keyed delta messages around the ring, whole, then as deltas",
          "[send=delta][recv=delta]") {
  World& w = World::get();
  const int n = w.size();
  const std::string forced = std::getenv("QCCL_ALGO");
  const std::string collective = forced.substr(0, forced.find('='));
  const int next = (w.rank() + 1) % n, prev = (w.rank() + n - 1) % n;
  constexpr size_t kRow = 2 * 64, kKeys = 3;  // 3 keys of 2 tokens x 64 channels
  Codec codec("aq4:channels=64");
  qcclDeltaStore_t out = nullptr, in = nullptr;  // one store per direction of a link
  QCCL_REQUIRE_OK(qcclDeltaStoreCreate(codec.handle, kRow, qcclFloat32, 0, 0, 1, &out));
  QCCL_REQUIRE_OK(qcclDeltaStoreCreate(codec.handle, kRow, qcclFloat32, 0, 0, 1, &in));
  const uint64_t keys[kKeys] = {10, 11, 12};
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call << (call ? " (deltas)" : " (whole rows)"));
    std::vector<float> x = values(w.rank() + 10 * call, kKeys * kRow), y(kKeys * kRow, -1.0f);
    auto send = [&] {
      QCCL_REQUIRE_OK(qcclDeltaSend(x.data(), kKeys, keys, qcclFloat32, out, next, w.comm()));
      if (collective == "send") require_ran("send", "delta");
      qcclDeltaStoreInfo_t info;
      QCCL_REQUIRE_OK(qcclDeltaStoreGetInfo(out, &info));
      CHECK(last_stats().wireBytesSent == info.lastMessageBytes + 5 * sizeof(uint64_t));  // and its parts' lengths
      CHECK(info.lastFullRows == (call == 0 ? kKeys : 0));
    };
    auto recv = [&] {
      QCCL_REQUIRE_OK(qcclDeltaRecv(y.data(), kKeys, keys, qcclFloat32, in, prev, w.comm()));
      if (collective == "recv") require_ran("recv", "delta");
    };
    if (w.rank() == 0)
      send(), recv();
    else
      recv(), send();
    // Whole float32 rows arrive exactly; deltas within s / 2^(b-1) + 2^-11 s of the sent values, s the
    // largest delta of their channel over the call's rows (kernels/aq_quant.h, with the fp16 scale).
    const std::vector<float> sent = values(prev + 10 * call, kKeys * kRow);
    const std::vector<float> before = values(prev, kKeys * kRow);
    std::vector<double> scale(64, 0.0);
    for (size_t j = 0; j < sent.size(); ++j)
      scale[j % 64] = std::max(scale[j % 64], std::fabs(double{sent[j]} - before[j]));
    for (size_t j = 0; j < sent.size(); ++j) {
      INFO("value " << j);
      if (call == 0) REQUIRE(y[j] == sent[j]);
      else REQUIRE(std::fabs(double{y[j]} - sent[j]) <= scale[j % 64] * (1.0 / 8 + 0x1p-11) + 1e-6);
    }
  }
  QCCL_REQUIRE_OK(qcclDeltaStoreDestroy(out));
  QCCL_REQUIRE_OK(qcclDeltaStoreDestroy(in));
}

}  // namespace qccl::test
