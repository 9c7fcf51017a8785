// Compressed point-to-point through the C API on real processes (qcclrun, 2..4 ranks): every rank
// sends to the next rank of a ring and receives from the previous one, inside a group, for every
// fixed-length codec (AQ-SGD's aq with several channel and block shapes among them) and datatype,
// odd and zero counts. With nearest rounding the receiver's buffer must be, bit for bit, what this
// test computes from the sender's input through the kernels (decode(encode(x)), then the
// datatype's rounding); with stochastic rounding, within the codec's bound of x. Also: the wire
// bytes in the statistics, non-blocking calls, NaN input, refused codecs and arguments, and a
// receiver whose codec differs from its sender's ("[mismatch]", run on its own).
#include <cmath>
#include <string>

#include "kernels/codec.h"
#include "kernels/convert.h"
#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

double input(int rank, size_t i) { return 2.5 * std::sin(0.377 * static_cast<double>(i) + 0.91 * rank) + 0.01 * rank; }

std::vector<uint8_t> make_input(DataType t, int rank, size_t count) {
  std::vector<uint8_t> b(count * kernels::element_size(t));
  for (size_t i = 0; i < count; ++i) store(t, b.data(), i, input(rank, i));
  return b;
}

// What a receiver of `from`'s nearest-rounded message must hold: the input as float32, encoded and
// decoded whole (the plan's chunks hold whole buckets or blocks, so the bits are the same), stored
// in the datatype.
std::vector<uint8_t> expected(const std::string& spec, DataType t, int from, size_t count) {
  const kernels::CodecConfig c = kernels::parse_codec_spec(spec);
  const std::vector<uint8_t> in = make_input(t, from, count);
  std::vector<float> x(count), y(count);
  kernels::load_float(t, in.data(), x.data(), count);
  std::vector<uint8_t> wire(c.encoded_bytes(count));
  kernels::encode(c, x.data(), count, wire.data(), kernels::PhiloxKey{}, 0);
  kernels::decode(c, wire.data(), count, y.data());
  std::vector<uint8_t> out(in.size());
  kernels::store_float(t, y.data(), out.data(), count);
  return out;
}

// A bound for stochastic rounding, for inputs of magnitude at most 2.53 (a range of at most 5.06):
// one step of the q bucket's grid; for aq one step s / 2^(b-1) of the channel's grid, its scale s the
// largest magnitude m rounded up to fp16 (s < (1 + 2^-10) m).
double stochastic_bound(const std::string& spec) {
  const kernels::CodecConfig c = kernels::parse_codec_spec(spec);
  if (c.kind == kernels::CodecKind::kAq) return 2.53 * (1 + 0x1p-10) / (1 << (c.bits - 1)) + 1e-6;
  return 5.06 / ((1 << c.bits) - 1) + 1e-6;
}

const char* const kNearest[] = {"none", "fp16", "bf16", "q8", "q3:bucket=64", "aq4:channels=16",
                                "aq2:channels=7,rows=3", "aq8:channels=1600", "aq5"};
const char* const kStochastic[] = {"q4:round=stochastic,seed=5", "aq3:channels=64,round=stochastic,seed=2",
                                   "aq6:channels=10,rows=5,round=stochastic"};

void ring_exchange(const std::string& spec, DataType t, size_t count, std::vector<uint8_t>* out) {
  World& w = World::get();
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  Codec codec(spec);
  const std::vector<uint8_t> in = make_input(t, w.rank(), count);
  out->assign(in.size() + 8, 0xee);  // 8 sentinel bytes past the end
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclSendCompressed(in.data(), count, to_api(t), codec.handle, next, w.comm()));
  QCCL_REQUIRE_OK(qcclRecvCompressed(out->data(), count, to_api(t), codec.handle, prev, w.comm()));
  QCCL_REQUIRE_OK(qcclGroupEnd());
  for (size_t k = in.size(); k < out->size(); ++k) REQUIRE((*out)[k] == 0xee);
  out->resize(in.size());
}

}  // namespace

TEST_CASE("compressed send/recv: nearest codecs give the receiver decode(encode(x)) bit for bit", "[p2p]") {
  World& w = World::get();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  for (const char* spec : kNearest)
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
      for (size_t count : {size_t{0}, size_t{1}, size_t{1600 * 3 + 5}, size_t{300007}}) {
        INFO(spec << " " << kernels::data_type_name(t) << " count " << count);
        std::vector<uint8_t> out;
        ring_exchange(spec, t, count, &out);
        const std::vector<uint8_t> want = expected(spec, t, prev, count);
        REQUIRE(out.size() == want.size());
        size_t first_bad = count;
        for (size_t i = 0; i < count && first_bad == count; ++i)
          if (std::memcmp(out.data() + i * kernels::element_size(t), want.data() + i * kernels::element_size(t),
                          kernels::element_size(t)) != 0)
            first_bad = i;
        INFO("first difference at value " << first_bad);
        CHECK(first_bad == count);
      }
}

TEST_CASE("compressed send/recv: stochastic codecs within one step of the input", "[p2p]") {
  World& w = World::get();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  for (const char* spec : kStochastic)
    for (size_t count : {size_t{7}, size_t{100000}}) {
      INFO(spec << " count " << count);
      std::vector<uint8_t> out;
      ring_exchange(spec, DataType::kFloat32, count, &out);
      double worst = 0;
      for (size_t i = 0; i < count; ++i)
        worst = std::max(worst, std::fabs(load(DataType::kFloat32, out.data(), i) - static_cast<float>(input(prev, i))));
      CHECK(worst <= stochastic_bound(spec));
      CHECK(worst > 0);  // the codec did round
    }
}

TEST_CASE("compressed send/recv: statistics, non-blocking calls and NaN", "[p2p]") {
  World& w = World::get();
  if (w.size() < 2) return;
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  const std::string spec = "aq4:channels=1600";
  const size_t count = 1600 * 64;
  Codec codec(spec);
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(input(w.rank(), i));
  // Non-blocking: both posted, then waited for.
  qcclRequest_t send = nullptr, recv = nullptr;
  QCCL_REQUIRE_OK(qcclIRecvCompressed(out.data(), count, qcclFloat32, codec.handle, prev, w.comm(), &recv));
  QCCL_REQUIRE_OK(qcclISendCompressed(in.data(), count, qcclFloat32, codec.handle, next, w.comm(), &send));
  QCCL_REQUIRE_OK(qcclWait(&send));
  QCCL_REQUIRE_OK(qcclWait(&recv));
  CHECK(send == nullptr);
  CHECK(recv == nullptr);
  const std::vector<uint8_t> want = expected(spec, DataType::kFloat32, prev, count);
  CHECK(std::memcmp(out.data(), want.data(), want.size()) == 0);

  // Blocking, in rank order around the ring: rank 0 sends first, the others receive first.
  auto blocking_round = [&](const std::vector<float>& x, qcclResult_t* sent, qcclResult_t* received) {
    if (w.rank() == 0) {
      *sent = qcclSendCompressed(x.data(), count, qcclFloat32, codec.handle, next, w.comm());
      *received = qcclRecvCompressed(out.data(), count, qcclFloat32, codec.handle, prev, w.comm());
    } else {
      *received = qcclRecvCompressed(out.data(), count, qcclFloat32, codec.handle, prev, w.comm());
      *sent = qcclSendCompressed(x.data(), count, qcclFloat32, codec.handle, next, w.comm());
    }
  };
  qcclResult_t sent, received;
  blocking_round(in, &sent, &received);
  REQUIRE(sent == qcclSuccess);
  REQUIRE(received == qcclSuccess);
  qcclStats_t stats{};
  stats.size = sizeof stats;
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));  // the last call: a send on ranks other than 0
  if (w.rank() != 0) {
    CHECK(stats.wireBytesSent == 819200 / 16 + 3200);  // 64 rows of 1600 at 4 bits, 1600 fp16 scales
    CHECK(std::string(stats.algorithm) == "compressed");
    CHECK(std::string(stats.codec) == kernels::parse_codec_spec(spec).canonical());
    CHECK(stats.compressionRatio == Approx(count * 4.0 / (819200 / 16 + 3200)));
  }

  // A NaN in channel 5: the receiver's channel 5 is NaN in every row, and its call says so.
  std::vector<float> bad = in;
  bad[1600 * 7 + 5] = NAN;
  blocking_round(bad, &sent, &received);
  CHECK(received == qcclNonFinite);
  CHECK(sent == qcclSuccess);
  for (size_t i = 0; i < count; ++i) {
    INFO("value " << i);
    REQUIRE(std::isnan(out[i]) == (i % 1600 == 5));
  }
}

TEST_CASE("compressed send/recv: refused codecs and arguments, nothing sent", "[p2p]") {
  World& w = World::get();
  float x[8] = {0};
  auto refused = [&](const std::string& spec, qcclDataType_t t, const char* words) {
    Codec codec(spec);
    INFO(spec);
    CHECK(qcclSendCompressed(x, 8, t, codec.handle, 0, w.comm()) == qcclInvalidArgument);
    CHECK_THAT(qcclGetLastError(w.comm()), Catch::Contains(words));
    CHECK(qcclRecvCompressed(x, 8, t, codec.handle, 0, w.comm()) == qcclInvalidArgument);
  };
  refused("q8:ef=on", qcclFloat32, "keeps no residual");
  refused("sign:eta_s=0.1", qcclFloat32, "Send");
  refused("int8", qcclFloat32, "Send");
  refused("fft", qcclFloat32, "Send");
  refused("q8", qcclInt32, "codecs take float, half or bfloat16");
  CHECK(qcclSendCompressed(x, 8, qcclFloat32, nullptr, 0, w.comm()) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(w.comm()), Catch::Contains("codec is NULL"));
  Codec aq("aq4");
  float y[8];
  CHECK(qcclAllReduceCompressed(x, y, 8, qcclFloat32, qcclSum, aq.handle, nullptr, w.comm()) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(w.comm()), Catch::Contains("point-to-point"));
  CHECK(qcclSendCompressed(x, 8, qcclFloat32, aq.handle, w.size(), w.comm()) == qcclInvalidArgument);
  qcclRequest_t* no_request = nullptr;
  CHECK(qcclISendCompressed(x, 8, qcclFloat32, aq.handle, 0, w.comm(), no_request) == qcclInvalidArgument);
  // The communicator still works.
  std::vector<uint8_t> out;
  ring_exchange("aq4", DataType::kFloat32, 8, &out);
}

// Rank 0 sends with q8, rank 1 receives expecting q4: the receiver fails with qcclMismatch.
TEST_CASE("compressed send/recv: a receiver with another codec fails with qcclMismatch", "[mismatch]") {
  World& w = World::get();
  if (w.size() != 2) return;
  std::vector<float> buf(4096, 1.0f);
  if (w.rank() == 0) {
    Codec codec("q8");
    qcclSendCompressed(buf.data(), buf.size(), qcclFloat32, codec.handle, 1, w.comm());  // may fail too: the peer
  } else {
    Codec codec("q4");
    CHECK(qcclRecvCompressed(buf.data(), buf.size(), qcclFloat32, codec.handle, 0, w.comm()) == qcclMismatch);
    CHECK_THAT(qcclGetLastError(w.comm()), Catch::Contains("codec"));
  }
}

}  // namespace qccl::test
