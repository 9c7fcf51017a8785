// Compressed AllGather and ReduceScatter through the C API on real processes (qcclrun, 1..8 ranks):
// blocking and non-blocking, in place, every value codec within its bound, all-gather bits identical
// on every rank, error feedback in a state in call order, closed-form wire bytes, and bad arguments
// refused before anything is sent.
#include <cmath>
#include <string>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

// Inputs in [-1, 1] that every rank can compute for every rank.
double input(int rank, size_t i) { return std::sin(0.731 * static_cast<double>(i) + 1.37 * rank); }

// Half a bucket step (nearest) or a whole one (stochastic) of a bucket whose range is at most 2, or
// half an ulp of the casts, plus quant.h's float32 term; a 16-bit output rounds once more.
double codec_bound(const std::string& spec, DataType t) {
  double b = 1e-6;
  if (spec == "fp16") b += 0x1p-11;
  else if (spec == "bf16") b += 0x1p-8;
  else if (spec != "none") b += (spec.find("stochastic") != std::string::npos ? 2.0 : 1.0) / ((1 << (spec[1] - '0')) - 1);
  if (t == DataType::kFloat16) b += 0x1p-11;
  if (t == DataType::kBfloat16) b += 0x1p-8;
  return b;
}

// The codec's encoded size from the wire format (quant.h; the casts 2 bytes per value).
uint64_t encoded_size(const std::string& spec, size_t count, size_t bucket) {
  if (spec == "none") return 4 * count;
  if (spec == "fp16" || spec == "bf16") return 2 * count;
  const uint64_t bits = static_cast<uint64_t>(spec[1] - '0');
  uint64_t bytes = 0;
  for (size_t b = 0; b < count; b += bucket) bytes += 8 + (std::min(bucket, count - b) + 7) / 8 * bits;
  return bytes;
}

void refused(qcclResult_t result, const std::string& needle) {
  CHECK(result == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains(needle));
}

}  // namespace

TEST_CASE("compressed all-gather: every value codec and datatype, blocking and not, in place, identical bits",
          "[compressed]") {
  World& w = World::get();
  const int n = w.size(), me = w.rank();
  for (const std::string spec : {"q8", "q4:round=stochastic,seed=5", "q1:bucket=64", "fp16", "bf16", "none"})
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{70001}})
        for (int mode = 0; mode < 3; ++mode) {  // blocking, non-blocking, in place
          INFO(spec << " " << kernels::data_type_name(t) << " sendcount " << count << " mode " << mode);
          Codec codec(spec);
          const size_t es = kernels::element_size(t);
          std::vector<uint8_t> in(count * es), out(n * count * es, 0xee);
          for (size_t i = 0; i < count; ++i) store(t, in.data(), i, input(me, i));
          const void* send = in.data();
          if (mode == 2) {
            std::copy(in.begin(), in.end(), out.begin() + static_cast<ptrdiff_t>(me * count * es));
            send = out.data() + me * count * es;
          }
          if (mode == 1) {
            qcclRequest_t request = nullptr;
            QCCL_REQUIRE_OK(qcclIAllGatherCompressed(send, out.data(), count, to_api(t), codec.handle, nullptr,
                                                     w.comm(), &request));
            QCCL_REQUIRE_OK(qcclWait(&request));
          } else {
            QCCL_REQUIRE_OK(qcclAllGatherCompressed(send, out.data(), count, to_api(t), codec.handle, nullptr, w.comm()));
          }
          double worst = 0;
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i) {
              std::vector<uint8_t> cell(8);
              store(t, cell.data(), 0, input(q, i));
              worst = std::max(worst, std::fabs(load(t, out.data(), q * count + i) - load(t, cell.data(), 0)));
            }
          CHECK(worst <= codec_bound(spec, t));
          if (spec.rfind("q1", 0) == 0 && count > 1000) CHECK(worst > 0.1);  // lossy: a single rank decodes too
          require_same_everywhere(out.data(), out.size());
        }
}

TEST_CASE("compressed reduce-scatter: every value codec and datatype, sum and avg, blocking and not, in place",
          "[compressed]") {
  World& w = World::get();
  const int n = w.size(), me = w.rank();
  for (const std::string spec : {"q8", "q4:round=stochastic,seed=5", "q1:bucket=64", "fp16", "bf16", "none"})
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16})
      for (RedOp op : {RedOp::kSum, RedOp::kAvg})
        for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{70001}})
          for (int mode = 0; mode < 3; ++mode) {
            INFO(spec << " " << kernels::data_type_name(t) << " " << kernels::red_op_name(op) << " recvcount " << count
                      << " mode " << mode);
            Codec codec(spec);
            const size_t es = kernels::element_size(t);
            std::vector<uint8_t> in(n * count * es), out(count * es, 0xee);
            for (size_t i = 0; i < n * count; ++i) store(t, in.data(), i, input(me, i));
            void* recv = mode == 2 ? in.data() + me * count * es : out.data();
            if (mode == 1) {
              qcclRequest_t request = nullptr;
              QCCL_REQUIRE_OK(qcclIReduceScatterCompressed(in.data(), recv, count, to_api(t), to_api(op), codec.handle,
                                                           nullptr, w.comm(), &request));
              QCCL_REQUIRE_OK(qcclWait(&request));
            } else {
              QCCL_REQUIRE_OK(qcclReduceScatterCompressed(in.data(), recv, count, to_api(t), to_api(op), codec.handle,
                                                          nullptr, w.comm()));
            }
            // The other n-1 contributions err by at most the codec's bound each; float32 sums of n values;
            // a 16-bit output rounds the result (at most n, or 1 for an average) once more: half an ulp.
            double bound = (n - 1) * codec_bound(spec, DataType::kFloat32) + n * n * 0x1p-23;
            if (op == RedOp::kAvg) bound /= n;
            const double largest = op == RedOp::kAvg ? 1.0 : n;
            if (t == DataType::kFloat16) bound += largest * 0x1p-11;
            if (t == DataType::kBfloat16) bound += largest * 0x1p-8;
            double worst = 0;
            for (size_t i = 0; i < count; ++i) {
              double exact = 0;
              for (int q = 0; q < n; ++q) {
                std::vector<uint8_t> cell(8);
                store(t, cell.data(), 0, input(q, me * count + i));  // what rank q sent
                exact += load(t, cell.data(), 0);
              }
              if (op == RedOp::kAvg) exact /= n;
              worst = std::max(worst, std::fabs(load(t, recv, i) - exact));
            }
            CHECK(worst <= bound);
            if (n == 1) CHECK(worst == 0);  // one rank: nothing is encoded
          }
}

TEST_CASE("compressed all-gather and reduce-scatter: statistics report the closed-form bytes", "[compressed]") {
  World& w = World::get();
  const int n = w.size();
  const size_t count = 5003, bucket = 512;
  Codec codec("q4:bucket=512");
  std::vector<float> in(n * count, 0.5f), out(n * count);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(input(w.rank(), i));
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(in.data(), out.data(), count, qcclFloat32, codec.handle, nullptr, w.comm()));
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
  CHECK(stats.wireBytesSent == (n - 1) * encoded_size("q4", count, bucket));
  CHECK(std::string(stats.algorithm) == "compressed_ring");
  if (n > 1) CHECK(stats.compressionRatio > 7.0);
  QCCL_REQUIRE_OK(qcclReduceScatterCompressed(in.data(), out.data(), count, qcclFloat32, qcclSum, codec.handle,
                                              nullptr, w.comm()));
  QCCL_REQUIRE_OK(qcclCommGetLastStats(w.comm(), &stats));
  CHECK(stats.wireBytesSent == (n - 1) * encoded_size("q4", count, bucket));
  CHECK(std::string(stats.algorithm) == (n == 1 ? "local" : "compressed_pairwise"));
}

TEST_CASE("compressed all-gather and reduce-scatter: error feedback in a state, calls in call order", "[compressed]") {
  World& w = World::get();
  const int n = w.size(), me = w.rank();
  const size_t count = 2049;
  Codec codec("q2:bucket=64,round=stochastic,ef=on,seed=4");
  std::vector<float> in(n * count), blocking(n * count), overlapped(n * count * 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(input(me, i));
  for (int kind = 0; kind < 2; ++kind) {  // all-gather (state: sendcount), reduce-scatter (n * recvcount)
    INFO((kind ? "reduce-scatter" : "all-gather"));
    State state(w.comm(), kind ? n * count : count);
    size_t bytes = 0;
    QCCL_REQUIRE_OK(qcclCodecStateSize(state.handle, &bytes));
    std::vector<uint8_t> start(bytes);
    QCCL_REQUIRE_OK(qcclCodecStateSave(state.handle, start.data(), bytes));
    const size_t out_count = kind ? count : n * count;
    std::vector<std::vector<float>> first(3, std::vector<float>(out_count));
    for (int t = 0; t < 3; ++t) {
      if (kind) QCCL_REQUIRE_OK(qcclReduceScatterCompressed(in.data(), first[t].data(), count, qcclFloat32, qcclAvg,
                                                            codec.handle, state.handle, w.comm()));
      else QCCL_REQUIRE_OK(qcclAllGatherCompressed(in.data(), first[t].data(), count, qcclFloat32, codec.handle,
                                                   state.handle, w.comm()));
    }
    if (n > 1) CHECK(first[0] != first[1]);  // the residual and the step change the rounding
    QCCL_REQUIRE_OK(qcclCodecStateLoad(state.handle, start.data(), bytes));
    std::vector<std::vector<float>> again(3, std::vector<float>(out_count));
    std::vector<qcclRequest_t> requests(3);
    for (int t = 0; t < 3; ++t) {
      if (kind) QCCL_REQUIRE_OK(qcclIReduceScatterCompressed(in.data(), again[t].data(), count, qcclFloat32, qcclAvg,
                                                             codec.handle, state.handle, w.comm(), &requests[t]));
      else QCCL_REQUIRE_OK(qcclIAllGatherCompressed(in.data(), again[t].data(), count, qcclFloat32, codec.handle,
                                                    state.handle, w.comm(), &requests[t]));
    }
    for (qcclRequest_t& r : requests) QCCL_REQUIRE_OK(qcclWait(&r));
    for (int t = 0; t < 3; ++t) CHECK(again[t] == first[t]);
    if (!kind) require_same_everywhere(again[2].data(), again[2].size() * sizeof(float));
  }
}

TEST_CASE("compressed all-gather and reduce-scatter: bad arguments refused before anything is sent", "[compressed]") {
  World& w = World::get();
  const int n = w.size();
  Codec q8("q8"), ef("q8:ef=on"), sign("sign:eta_s=0.1"), int8("int8:alpha=100");
  std::vector<float> a(64 * n), b(64 * n);
  std::vector<int32_t> ia(64 * n), ib(64 * n);
  refused(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, nullptr, nullptr, w.comm()), "codec is NULL");
  refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclSum, nullptr, nullptr, w.comm()),
          "codec is NULL");
  refused(qcclAllGatherCompressed(ia.data(), ib.data(), 64, qcclInt32, q8.handle, nullptr, w.comm()),
          "codecs take float, half or bfloat16");
  refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclProd, q8.handle, nullptr, w.comm()),
          "reduce-scatter sums or averages");
  refused(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, sign.handle, nullptr, w.comm()),
          "Marsit is an all-reduce");
  refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclAvg, sign.handle, nullptr, w.comm()),
          "Marsit is an all-reduce");
  refused(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, int8.handle, nullptr, w.comm()),
          "IntSGD's integer sums are an all-reduce in this release");
  refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclSum, int8.handle, nullptr, w.comm()),
          "IntSGD's integer sums are an all-reduce in this release");
  refused(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, ef.handle, nullptr, w.comm()), "ef=on");
  {
    State wrong(w.comm(), 63);
    refused(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, ef.handle, wrong.handle, w.comm()),
            "state holds 63 values but sendcount = 64");
    refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclSum, ef.handle, wrong.handle,
                                        w.comm()),
            "state holds 63 values but nranks * recvcount");
  }
  if (n > 1) {
    State one_block(w.comm(), 64);  // a reduce-scatter's residual covers the whole input
    refused(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclSum, ef.handle, one_block.handle,
                                        w.comm()),
            "state holds 64 values but nranks * recvcount");
  }
  qcclRequest_t request = nullptr;
  refused(qcclIAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, nullptr, nullptr, w.comm(), &request),
          "codec is NULL");
  CHECK(request == nullptr);
  // Nothing was sent: the communicator is still in step.
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(a.data(), b.data(), 64, qcclFloat32, q8.handle, nullptr, w.comm()));
  QCCL_REQUIRE_OK(qcclReduceScatterCompressed(a.data(), b.data(), 64, qcclFloat32, qcclSum, q8.handle, nullptr, w.comm()));
}

}  // namespace qccl::test
