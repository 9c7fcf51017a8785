// Marsit through the C API on real processes (qcclrun, 1..8 ranks): ring and torus rounds give the
// same g on every rank; full-precision rounds every K-th step average u + c; statistics show 1 bit
// per value; a checkpointed state replays a round bit for bit; NaN is reported on every rank with the
// communicator intact; bad arguments are refused before anything is sent.
#include <cmath>
#include <string>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

double update(int rank, size_t i, int step) { return 0.1 * std::sin(0.37 * static_cast<double>(i) + 1.1 * rank + step); }

// The topologies this many ranks can form: the ring, and a torus with two or more rows.
std::vector<std::string> topologies(int n) {
  std::vector<std::string> out = {"ring"};
  for (int rows = 2; rows < n; ++rows)
    if (n % rows == 0) out.push_back("torus:" + std::to_string(rows) + "x" + std::to_string(n / rows));
  return out;
}

}  // namespace

TEST_CASE("Marsit: sign rounds give +-eta_s and full-precision rounds the average, identical on every rank",
          "[marsit]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 32 * 6 * 8 * 20;  // whole words in every segment and cell for n <= 8
  for (const std::string& topology : topologies(n)) {
    INFO(topology);
    Codec codec("sign:eta_s=0.05,k=3,seed=4,topology=" + topology);
    State state(w.comm(), count);
    std::vector<float> u(count), g(count);
    for (int t = 0; t < 5; ++t) {
      INFO("round " << t);
      for (size_t i = 0; i < count; ++i) u[i] = static_cast<float>(update(w.rank(), i, t));
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                              state.handle, w.comm()));
      qcclStats_t stats{};
      stats.size = sizeof(stats);
      QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
      require_same_everywhere(g.data(), g.size() * sizeof(float));
      CHECK(std::string(stats.codec).rfind("sign:eta_s=0.0500000007,k=3,topology=" + topology, 0) == 0);
      if (t % 3 == 0) {
        // Round 0 has c = 0, so it is the plain average; round 3's c is not visible here, but the
        // average is a float32 sum: a few ulps from the exact one.
        if (t == 0)
          for (size_t i = 0; i < count; ++i) {
            double average = 0;
            for (int r = 0; r < n; ++r) average += static_cast<float>(update(r, i, t));
            REQUIRE(std::abs(g[i] - average / n) <= 1e-7);
          }
        if (n > 1) CHECK(stats.compressionRatio == 1.0);
      } else {
        for (float x : g) REQUIRE(std::abs(x) == 0.05f);
        if (n > 1) {
          CHECK(stats.wireBytesSent == 2ull * (n - 1) * (count / 32) * 4 / n);
          CHECK(stats.compressionRatio == 32.0);
        }
      }
    }
  }
}

TEST_CASE("Marsit: a checkpointed state replays a round bit for bit", "[marsit]") {
  World& w = World::get();
  const size_t count = 10007;
  Codec codec("sign:eta_s=0.01,k=0,seed=8");
  State state(w.comm(), count);
  std::vector<float> u(count), g(count), again(count);
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < count; ++i) u[i] = static_cast<float>(update(w.rank(), i, t));
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                            state.handle, w.comm()));
  }
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state.handle, &bytes));
  std::vector<uint8_t> checkpoint(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, checkpoint.data(), bytes));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                          w.comm()));
  QCCL_REQUIRE_OK(qcclCodecStateLoad(state.handle, checkpoint.data(), bytes));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), again.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                          state.handle, w.comm()));
  CHECK(std::memcmp(g.data(), again.data(), count * sizeof(float)) == 0);  // same compensation, same step
  require_same_everywhere(g.data(), g.size() * sizeof(float));
}

TEST_CASE("Marsit: non-blocking rounds on one state run in call order, as blocking ones do", "[marsit]") {
  World& w = World::get();
  const size_t count = 3001;
  Codec codec("sign:eta_s=0.01,k=2,seed=2");
  State state(w.comm(), count);
  std::vector<std::vector<float>> u(4, std::vector<float>(count));  // k = 2: full precision at 0 and 2
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < count; ++i) u[t][i] = static_cast<float>(update(w.rank(), i, t));
  require_nonblocking_in_call_order(codec, state, u);
}

TEST_CASE("Marsit: NaN in one rank's update is qcclNonFinite on every rank, state and communicator intact",
          "[marsit]") {
  World& w = World::get();
  const size_t count = 4000;  // one fragment: the NaN taints every value
  Codec codec("sign:eta_s=0.01,k=0");
  State state(w.comm(), count);
  std::vector<float> u(count), g(count);
  for (size_t i = 0; i < count; ++i) u[i] = static_cast<float>(update(w.rank(), i, 0));
  // A sign round first, so that the compensation has a round pending when the NaN round overwrites it.
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                          w.comm()));
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state.handle, &bytes));
  std::vector<uint8_t> before(bytes), after(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, before.data(), bytes));
  if (w.rank() == w.size() - 1) u[1234] = NAN;
  CHECK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                w.comm()) == qcclNonFinite);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("NaN or Inf"));
  CHECK(std::isnan(g[1234]));
  QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, after.data(), bytes));
  // The compensation (src/codec_state.h, format 3): after the header, before the 8-byte checksum.
  const size_t floats = bytes - 8 - count * sizeof(float);
  CHECK(std::memcmp(before.data() + floats, after.data() + floats, count * sizeof(float)) == 0);
  u[1234] = 0.5f;
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                          w.comm()));
  for (float x : g) REQUIRE(std::abs(x) == 0.01f);
}

TEST_CASE("Marsit: bad arguments are refused before anything is sent", "[marsit]") {
  World& w = World::get();
  auto refused = [](qcclResult_t result, const std::string& needle) {
    CHECK(result == qcclInvalidArgument);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains(needle));
  };
  Codec codec("sign:eta_s=0.01");
  State state(w.comm(), 64);
  std::vector<float> u(64, 1.0f), g(64);
  std::vector<uint16_t> h(64);
  refused(qcclAllReduceCompressed(u.data(), g.data(), 64, qcclFloat32, qcclAvg, codec.handle, nullptr, w.comm()),
          "compensation");
  refused(qcclAllReduceCompressed(u.data(), g.data(), 64, qcclFloat32, qcclSum, codec.handle, state.handle, w.comm()),
          "pass qcclAvg");
  refused(qcclAllReduceCompressed(h.data(), h.data(), 64, qcclFloat16, qcclAvg, codec.handle, state.handle, w.comm()),
          "takes float32");
  Codec torus("sign:eta_s=0.01,topology=torus:3x3");
  refused(qcclAllReduceCompressed(u.data(), g.data(), 64, qcclFloat32, qcclAvg, torus.handle, state.handle, w.comm()),
          "3x3 torus has 9 places but the communicator has " + std::to_string(w.size()) + " ranks");
  qcclCodec_t none = nullptr;
  refused(qcclCodecCreate("sign:k=10", &none), "eta_s");
  // Nothing was sent and no state moved: the next round is everyone's round 0.
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), 64, qcclFloat32, qcclAvg, codec.handle, state.handle,
                                          w.comm()));
  for (float x : g) REQUIRE(x == 1.0f);  // round 0 is full precision: the average of ones
}

}  // namespace qccl::test
