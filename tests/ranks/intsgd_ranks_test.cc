// IntSGD through the C API on real processes (qcclrun, 1..8 ranks): the first round is exact, later
// rounds are integers under an alpha that is the same bits on every rank and follows Proposition 2
// through a learning-rate schedule with a 10x drop; results are the same bits everywhere and within
// 1/alpha of the average; non-blocking rounds on one state equal blocking ones (alpha depends on the
// previous result); a checkpoint replays a round; NaN is reported everywhere and teaches alpha
// nothing; bfloat16 data; bad arguments are refused before anything is sent.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "base/wire.h"
#include "kernels/half.h"
#include "kernels/int_codec.h"
#include "src/aggregator.h"
#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

double gradient(int rank, size_t i, int step) {
  return 0.3 * std::sin(0.37 * static_cast<double>(i) + 1.1 * rank + 0.5 * step) / (1.0 + 0.2 * step);
}

qcclStats_t last_stats() {
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(World::get().comm(), &stats));
  return stats;
}

}  // namespace

TEST_CASE("IntSGD: exact first round, then integers under one alpha that follows Proposition 2", "[intsgd]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 20011;
  for (const char* mode : {"lr", "grad"}) {
    for (int bits : {8, 32}) {
      const std::string spec = "int" + std::to_string(bits) + ":alpha=" + mode + ",seed=3";
      INFO(spec);
      Codec codec(spec);
      State state(w.comm(), count);
      std::vector<float> x(count), g(count);
      double r = 0, lr_before = 0;
      for (int step = 0; step < 8; ++step) {
        INFO("step " << step);
        const double lr = step < 5 ? 0.5 : 0.05;  // a 10x drop
        QCCL_REQUIRE_OK(qcclCodecStateSetLearningRate(state.handle, lr));
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(gradient(w.rank(), i, step));
        QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                                state.handle, w.comm()));
        const qcclStats_t stats = last_stats();
        require_same_everywhere(g.data(), count * sizeof(float));
        require_same_everywhere(&stats.intAlpha, sizeof(double));
        require_same_everywhere(&stats.largestInteger, sizeof(uint64_t));
        const double eta = std::string(mode) == "lr" ? lr : 1.0;
        if (step == 0) {
          CHECK(stats.intAlpha == 0);  // exact
          if (n > 1) CHECK(stats.compressionRatio == 1.0);
        } else {
          // alpha from the moving average of the previous steps, rounded to float32.
          const double expect = std::sqrt(static_cast<double>(count)) / std::sqrt(2.0 * n * r / (eta * eta) + 1e-16);
          CHECK(stats.intAlpha == Approx(static_cast<float>(expect)).epsilon(1e-5));
          if (n > 1) CHECK(stats.compressionRatio == Approx(32.0 / bits));
          CHECK(stats.largestInteger > 0);
          const kernels::IntClip clip = kernels::int_clip(bits, n);
          CHECK(stats.largestInteger <= static_cast<uint64_t>(-int64_t{n} * clip.lo));
          if (stats.clippedValues == 0)
            for (size_t i = 0; i < count; ++i) {
              double mean = 0;
              for (int q = 0; q < n; ++q) mean += static_cast<float>(gradient(q, i, step));
              REQUIRE(std::abs(g[i] - mean / n) <= 1.0 / stats.intAlpha + 1e-6);
            }
        }
        // The moving average as Proposition 2 has it, from this round's (shared) average: r_0 = 0, so
        // E[r_k] = (1 - beta) sum over t of beta^t |x^(k-t) - x^(k-t-1)|^2, as its proof unrolls it.
        double squares = 0;
        for (float v : g) squares += static_cast<double>(v) * v;
        const double v = (std::string(mode) == "lr" ? lr * lr : 1.0) * squares;
        r = 0.9 * r + 0.1 * v;
        lr_before = lr;
      }
      (void)lr_before;
    }
  }
}

TEST_CASE("IntSGD: non-blocking rounds on one state equal blocking ones; a checkpoint replays a round", "[intsgd]") {
  World& w = World::get();
  const size_t count = 5003;
  Codec codec("int8:seed=7");
  State state(w.comm(), count);
  std::vector<std::vector<float>> x(4, std::vector<float>(count));
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < count; ++i) x[t][i] = static_cast<float>(gradient(w.rank(), i, t));
  require_nonblocking_in_call_order(codec, state, x);

  // Replay: save after the rounds, run one more, restore, run it again.
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state.handle, &bytes));
  std::vector<uint8_t> checkpoint(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, checkpoint.data(), bytes));
  std::vector<float> g(count), again(count);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x[0].data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                          state.handle, w.comm()));
  const double alpha = last_stats().intAlpha;
  QCCL_REQUIRE_OK(qcclCodecStateLoad(state.handle, checkpoint.data(), bytes));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x[0].data(), again.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                          state.handle, w.comm()));
  CHECK(last_stats().intAlpha == alpha);
  CHECK(std::memcmp(g.data(), again.data(), count * sizeof(float)) == 0);
  // A corrupted checkpoint is refused.
  checkpoint[20] ^= 1;
  CHECK(qcclCodecStateLoad(state.handle, checkpoint.data(), bytes) == qcclInvalidArgument);
}

TEST_CASE("IntSGD: NaN is qcclNonFinite on every rank and leaves alpha's moving average alone", "[intsgd]") {
  World& w = World::get();
  const size_t count = 4000;
  Codec codec("int16:seed=1");
  State state(w.comm(), count);
  std::vector<float> x(count), g(count);
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(gradient(w.rank(), i, step));
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                            state.handle, w.comm()));
  }
  if (w.rank() == w.size() - 1) x[1234] = NAN;
  CHECK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                w.comm()) == qcclNonFinite);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("NaN or Inf"));
  CHECK(std::isnan(g[1234]));
  const double alpha_nan = last_stats().intAlpha;
  x[1234] = 0.1f;
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                          w.comm()));
  CHECK(last_stats().intAlpha == alpha_nan);  // the NaN round did not move r
  for (float v : g) REQUIRE(std::isfinite(v));
}

TEST_CASE("IntSGD: a float16 sum past 65504 in the exact round is reported and keeps the round exact; the "
          "integer rounds' is not",
          "[intsgd]") {
  // The exact round adds float16 partial sums (an average too: it divides the sum) and cannot tell an
  // overflow from an Inf input: it reports both (qcclNonFinite) and learns nothing. Once an exact
  // round that fits has taught alpha, the integer rounds' sums past 65504 are +-Inf, not reported.
  World& w = World::get();
  if (w.size() < 2) return;  // one rank's sum is its input
  const size_t count = 257;
  Codec codec("int32:seed=2");
  State state(w.comm(), count);
  std::vector<uint16_t> x(count, qccl::kernels::float_to_half(40000.0f)), g(count);
  for (int call = 0; call < 2; ++call) {
    CHECK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat16, qcclSum, codec.handle, state.handle,
                                  w.comm()) == qcclNonFinite);
    CHECK(std::isinf(qccl::kernels::half_to_float(g[0])));
    CHECK(last_stats().intAlpha == 0);  // exact, again
  }
  std::vector<uint16_t> ones(count, qccl::kernels::float_to_half(1.0f));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(ones.data(), g.data(), count, qcclFloat16, qcclSum, codec.handle,
                                          state.handle, w.comm()));
  CHECK(last_stats().intAlpha == 0);
  CHECK(qccl::kernels::half_to_float(g[0]) == static_cast<float>(w.size()));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat16, qcclSum, codec.handle,
                                          state.handle, w.comm()));
  CHECK(last_stats().intAlpha > 0);  // integers now
  for (uint16_t v : g) REQUIRE(std::isinf(qccl::kernels::half_to_float(v)));
}

TEST_CASE("IntSGD: bfloat16 and float16 data, sums and fixed alpha without a state", "[intsgd]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 3001;
  Codec codec("int32:alpha=4096,round=nearest");
  std::vector<uint16_t> x(count), g(count);
  std::vector<float> xf(count), gf(count);
  for (qcclDataType_t type : {qcclBfloat16, qcclFloat16}) {
    for (size_t i = 0; i < count; ++i) {
      xf[i] = static_cast<float>(gradient(w.rank(), i, 0));
      x[i] = type == qcclBfloat16 ? qccl::kernels::float_to_bf16(xf[i]) : qccl::kernels::float_to_half(xf[i]);
    }
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, type, qcclSum, codec.handle, nullptr, w.comm()));
    require_same_everywhere(g.data(), count * sizeof(uint16_t));
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) {
        const float v = static_cast<float>(gradient(q, i, 0));
        sum += type == qcclBfloat16 ? qccl::kernels::bf16_to_float(qccl::kernels::float_to_bf16(v))
                                    : qccl::kernels::half_to_float(qccl::kernels::float_to_half(v));
      }
      const float got = type == qcclBfloat16 ? qccl::kernels::bf16_to_float(g[i]) : qccl::kernels::half_to_float(g[i]);
      // n values within 1/(2 alpha) each, then the cast of the result (half an ulp: 2^-9 or 2^-12 relative).
      REQUIRE(std::abs(got - sum) <= n * 0.5 / 4096 + std::abs(sum) * (type == qcclBfloat16 ? 0x1p-8 : 0x1p-11) + 1e-6);
    }
  }
}

TEST_CASE("IntSGD: bad arguments are refused before anything is sent", "[intsgd]") {
  World& w = World::get();
  auto refused = [](qcclResult_t result, qcclResult_t code, const std::string& needle) {
    CHECK(result == code);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains(needle));
  };
  Codec adaptive("int8"), by_lr("int8:alpha=lr");
  State state(w.comm(), 64);
  std::vector<float> x(64, 1.0f), g(64);
  std::vector<int32_t> ints(64);
  refused(qcclAllReduceCompressed(x.data(), g.data(), 64, qcclFloat32, qcclAvg, adaptive.handle, nullptr, w.comm()),
          qcclInvalidArgument, "fixed alpha=A");
  refused(qcclAllReduceCompressed(x.data(), g.data(), 64, qcclFloat32, qcclAvg, by_lr.handle, state.handle, w.comm()),
          qcclInvalidUsage, "qcclCodecStateSetLearningRate");
  refused(qcclCodecStateSetLearningRate(state.handle, -1.0), qcclInvalidArgument, "lr = -1");
  refused(qcclCodecStateSetLearningRate(state.handle, NAN), qcclInvalidArgument, "lr = nan");
  refused(qcclAllReduceCompressed(x.data(), g.data(), 64, qcclFloat32, qcclMax, adaptive.handle, state.handle, w.comm()),
          qcclInvalidArgument, "sums or averages");
  refused(qcclAllReduceCompressed(ints.data(), ints.data(), 64, qcclInt32, qcclSum, adaptive.handle, state.handle,
                                  w.comm()),
          qcclInvalidArgument, "datatype");
  qcclCodec_t none = nullptr;
  refused(qcclCodecCreate("int8:beta=1.5", &none), qcclInvalidArgument, "beta=1.5");
  if (!std::getenv("QCCL_AGGREGATORS")) {
    Codec switched("int8:agg=switch");
    refused(qcclAllReduceCompressed(x.data(), g.data(), 64, qcclFloat32, qcclAvg, switched.handle, state.handle,
                                    w.comm()),
            qcclInvalidUsage, "qcclrun --aggregators K");
  }
  // Nothing was sent and no state moved: the next round is everyone's exact round 0.
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), 64, qcclFloat32, qcclAvg, adaptive.handle, state.handle,
                                          w.comm()));
  for (float v : g) REQUIRE(v == 1.0f);
  CHECK(last_stats().intAlpha == 0);
}

// ---- agg=switch: run under qcclrun --aggregators K ------------------------------------------------

namespace {
// `calls` sums of `count` ones through the aggregators (exact: alpha 1), each checked; rank 1 sleeps
// late_ms(call) milliseconds before each call.
void sum_ones_through_switch(size_t count, int calls, int (*late_ms)(int call)) {
  REQUIRE(std::getenv("QCCL_AGGREGATORS") != nullptr);
  World& w = World::get();
  Codec codec("int8:alpha=1,agg=switch");
  std::vector<float> x(count, 1.0f), g(count);
  for (int call = 0; call < calls; ++call) {
    if (w.rank() == 1 && late_ms(call) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms(call)));
    QCCL_REQUIRE_OK(
        qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()));
    for (float v : g) REQUIRE(v == static_cast<float>(w.size()));
  }
}
}  // namespace

TEST_CASE("IntSGD through an aggregator of one slot: ranks that run ahead queue, and every sum arrives",
          "[switch-queue]") {
  // one_slot_aggregator.sh runs it: 2 ranks, 4 KiB chunks (10 per call), one slot. Rank 1 starts
  // its calls 0-2 ms late, so rank 0's next chunks queue behind a slot that waits for rank 1.
  sum_ones_through_switch(10000, 200, [](int call) { return call % 3; });
}

TEST_CASE("An aggregator lost while plain all-reduces run: they go on", "[switch-lost]") {
  // one_slot_aggregator.sh lost runs it: rank 0 kills the aggregator (ONE_SLOT_AGGREGATOR_PID) while
  // the ranks run all-reduces that never sum through it. Its connection closes while one is in
  // flight: that once broke the whole communicator, and the all-reduces failed.
  const char* pid = std::getenv("ONE_SLOT_AGGREGATOR_PID");
  REQUIRE(pid != nullptr);
  World& w = World::get();
  const size_t count = 100000;
  std::vector<float> x(count, 1.0f), y(count);
  for (int call = 0; call < 300; ++call) {  // ~2 s: the connection closes during them
    if (call == 20 && w.rank() == 0) REQUIRE(kill(static_cast<pid_t>(std::atol(pid)), SIGKILL) == 0);
    QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, w.comm()));
    for (float v : y) REQUIRE(v == static_cast<float>(w.size()));
  }
}

TEST_CASE("IntSGD through one aggregator slot, ranks of different pipeline depths", "[switch-depths]") {
  // one_slot_aggregator.sh mixed-depths runs it: 2 ranks, 4 KiB chunks (98 per call), one slot, rank 0
  // at QCCL_PIPELINE_DEPTH=8 and rank 1 at 1. Rank 0's later chunks arrive while its older ones are
  // still posted at the aggregator: handled before them, one took the slot that rank 1, sending one
  // chunk at a time, waited on (a deadlock).
  sum_ones_through_switch(100000, 20, [](int) { return 0; });
}

TEST_CASE("IntSGD through aggregators: the same bits as the ring, round after round", "[switch]") {
  REQUIRE(std::getenv("QCCL_AGGREGATORS") != nullptr);
  World& w = World::get();
  const size_t count = 300007;  // several chunks per aggregator
  for (const char* base : {"int8:seed=5", "int16:alpha=lr,seed=6", "int32:alpha=2000,round=nearest"}) {
    INFO(base);
    Codec ring(base), switched(std::string(base) + ",agg=switch");
    State ring_state(w.comm(), count), switch_state(w.comm(), count);
    QCCL_REQUIRE_OK(qcclCodecStateSetLearningRate(ring_state.handle, 0.1));
    QCCL_REQUIRE_OK(qcclCodecStateSetLearningRate(switch_state.handle, 0.1));
    std::vector<float> x(count), by_ring(count), by_switch(count);
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(gradient(w.rank(), i, step));
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), by_ring.data(), count, qcclFloat32, qcclAvg, ring.handle,
                                              ring_state.handle, w.comm()));
      const qcclStats_t ring_stats = last_stats();
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), by_switch.data(), count, qcclFloat32, qcclAvg,
                                              switched.handle, switch_state.handle, w.comm()));
      const qcclStats_t switch_stats = last_stats();
      CHECK(std::string(switch_stats.algorithm) == "intsgd_switch");
      CHECK(switch_stats.intAlpha == ring_stats.intAlpha);
      REQUIRE(std::memcmp(by_ring.data(), by_switch.data(), count * sizeof(float)) == 0);
      require_same_everywhere(by_switch.data(), count * sizeof(float));
      if (switch_stats.intAlpha > 0) {  // an integer round: each rank moves S up (and S down)
        CHECK(switch_stats.largestInteger == ring_stats.largestInteger);
        const uint64_t bits = std::string(base).rfind("int8", 0) == 0 ? 8 : std::string(base).rfind("int16", 0) == 0 ? 16 : 32;
        const uint64_t chunks = (count + 65535) / 65536;  // chunk_bytes / 4 values
        CHECK(switch_stats.wireBytesSent == count * bits / 8 + 8 * chunks);
        CHECK(switch_stats.wireBytesReceived == count * bits / 8 + 8 * chunks);
      }
    }
  }
}

TEST_CASE("IntSGD through aggregators: NaN is reported on every rank, and a sum still works after", "[switch]") {
  REQUIRE(std::getenv("QCCL_AGGREGATORS") != nullptr);
  World& w = World::get();
  const size_t count = 200000;
  Codec codec("int8:alpha=50,agg=switch");
  std::vector<float> x(count), g(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(gradient(w.rank(), i, 1));
  if (w.rank() == w.size() - 1) x[150000] = NAN;
  CHECK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr, w.comm()) ==
        qcclNonFinite);
  CHECK(std::isnan(g[150000]));
  CHECK(std::isfinite(g[0]));  // another chunk
  x[150000] = 0;
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclSum, codec.handle, nullptr,
                                          w.comm()));
  for (size_t i = 0; i < count; i += 997) {
    double sum = 0;
    for (int q = 0; q < w.size(); ++q) sum += i == 150000 && q == w.size() - 1 ? 0.0f : static_cast<float>(gradient(q, i, 1));
    REQUIRE(std::abs(g[i] - sum) <= w.size() * 1.0 / 50 + 1e-5);
  }
}

namespace {

// A TCP connection to "host:port" (IPv4), or -1.
int connect_to(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  if (colon == std::string::npos || inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A registration as src/aggregator.cc frames an AggregatorHello (its length, then the hello), for
// `nranks` ranks of job `job`, with any largest message and a UCX address of `address` bytes.
std::vector<uint8_t> hello_frame(uint64_t job, int32_t nranks, uint64_t max_message, const std::string& address) {
  ByteWriter hello;
  hello.put<uint32_t>(kAggregatorMagic), hello.put<uint16_t>(kAggregatorVersion);
  hello.put<uint64_t>(job), hello.put<int32_t>(0), hello.put<int32_t>(nranks), hello.put<int32_t>(0);
  hello.put<uint64_t>(max_message), hello.put_bytes(address.data(), address.size());
  ByteWriter frame;
  frame.put<uint32_t>(static_cast<uint32_t>(hello.bytes().size()));
  frame.bytes().insert(frame.bytes().end(), hello.bytes().begin(), hello.bytes().end());
  return frame.bytes();
}

}  // namespace

// Ranks that list other aggregators would register with different ones and wait for each other until
// QCCL_TIMEOUT: creation refuses it at once on every rank, naming both lists.
TEST_CASE("IntSGD through aggregators: ranks that list other aggregators fail at creation, naming them",
          "[switch]") {
  World& w = World::get();
  if (w.size() < 2) return;
  const char* launched = std::getenv("QCCL_AGGREGATORS");  // qcclrun's
  REQUIRE(launched);
  const std::string aggregators = launched;
  qcclUniqueId id;
  if (w.rank() == 0) REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  QCCL_REQUIRE_OK(qcclBroadcast(&id, &id, sizeof(id), qcclUint8, 0, w.comm()));
  if (w.rank() == 1) ::unsetenv("QCCL_AGGREGATORS");
  const auto start = std::chrono::steady_clock::now();
  qcclComm_t comm = nullptr;
  const qcclResult_t made = qcclCommInitRank(&comm, w.size(), id, w.rank());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::setenv("QCCL_AGGREGATORS", aggregators.c_str(), 1);
  if (comm) qcclCommDestroy(comm);
  CHECK(made == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)),
             Catch::Contains("rank 1") && Catch::Contains("QCCL_AGGREGATORS = ''") &&
                 Catch::Contains("'" + aggregators + "': every rank must set the same"));
  CHECK(seconds < 10);
}

TEST_CASE("IntSGD through aggregators: hellos that would make an unusable job are refused", "[switch]") {
  // One-rank jobs, which would form at once: a largest message of 0 made buffers the 8-byte header was
  // written past, and a 1-byte UCX address made UCX abort the aggregator.
  const char* list = std::getenv("QCCL_AGGREGATORS");
  REQUIRE(list != nullptr);
  World& w = World::get();
  if (w.rank() == 0) {
    std::stringstream entries(list);
    for (std::string address; std::getline(entries, address, ',');) {
      for (const auto& [max_message, address_bytes, why] :
           {std::tuple<uint64_t, size_t, const char*>{0, 64, "largest message"}, {1024, 1, "too short"}}) {
        const int s = connect_to(address);
        REQUIRE(s >= 0);
        const std::vector<uint8_t> frame =
            hello_frame(0x5eed0 + max_message, 1, max_message, std::string(address_bytes, '\0'));  // rank 0 of 1
        REQUIRE(send(s, frame.data(), frame.size(), 0) == static_cast<ssize_t>(frame.size()));
        // The reply: its length, magic, version and status, then the sentence; the refusal closes it.
        std::string reply;
        char chunk[4096];
        for (ssize_t n; (n = recv(s, chunk, sizeof chunk, 0)) > 0;) reply.append(chunk, static_cast<size_t>(n));
        close(s);
        REQUIRE(reply.size() > 14);
        int32_t status = 0;
        std::memcpy(&status, reply.data() + 10, sizeof status);
        CHECK(status != 0);
        CHECK_THAT(reply, Catch::Contains(why));
      }
    }
  }
  // The aggregators still sum.
  Codec codec("int8:alpha=10,agg=switch");
  std::vector<float> x(1000, 0.5f), sum(1000);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), sum.data(), x.size(), qcclFloat32, qcclSum, codec.handle, nullptr,
                                          w.comm()));
  CHECK(sum[0] == 0.5f * static_cast<float>(w.size()));
}

// The aggregator serves every job from one thread: a client that connected and said nothing held it
// for 30 s (jobs registering meanwhile waited; calls in flight timed out), and a hello that claimed
// 2^31 - 1 ranks ended it (bad_alloc). Rank 0 does both to every aggregator; a new communicator then
// registers and sums through them at once.
TEST_CASE("IntSGD through aggregators: a silent client and a malformed hello hold up nothing", "[switch]") {
  const char* list = std::getenv("QCCL_AGGREGATORS");
  REQUIRE(list != nullptr);
  World& w = World::get();
  std::vector<int> held;
  if (w.rank() == 0) {
    std::stringstream entries(list);
    for (std::string address; std::getline(entries, address, ',');) {
      const int silent = connect_to(address), crafted = connect_to(address);
      REQUIRE(silent >= 0);
      REQUIRE(crafted >= 0);
      held.push_back(silent), held.push_back(crafted);
      const std::vector<uint8_t> bytes = hello_frame(0x5eed, INT32_MAX, 1024, "x");  // of INT32_MAX ranks
      REQUIRE(send(crafted, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
    }
  }
  int token = 1;
  QCCL_REQUIRE_OK(qcclAllReduce(&token, &token, 1, qcclInt32, qcclSum, w.comm()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the aggregators have taken them
  const auto begin = std::chrono::steady_clock::now();
  qcclUniqueId id;
  if (w.rank() == 0) QCCL_REQUIRE_OK(qcclGetUniqueId(&id));
  QCCL_REQUIRE_OK(qcclBroadcast(&id, &id, sizeof id, qcclUint8, 0, w.comm()));
  qcclComm_t comm = nullptr;
  QCCL_REQUIRE_OK(qcclCommInitRank(&comm, w.size(), id, w.rank()));  // registers with the aggregators
  Codec codec("int8:alpha=10,agg=switch");
  std::vector<float> x(1000, 0.5f), sum(1000);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), sum.data(), x.size(), qcclFloat32, qcclSum, codec.handle, nullptr,
                                          comm));
  CHECK(sum[0] == 0.5f * static_cast<float>(w.size()));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() < 10);
  QCCL_REQUIRE_OK(qcclCommDestroy(comm));
  for (int fd : held) close(fd);
}

}  // namespace qccl::test
