// Plans are ordered (collectives/plan.h): within a fragment, the messages one rank sends another are
// received by that rank in the same order. The executor relies on it (payload keys carry the fragment,
// not a message id, so keys cannot collide at any rank count), and so does its ordered mode for
// transports without tags. This test builds every rank's program of every fragment for every
// algorithm in the registry (compressed ones with their codecs, both kinds of Marsit and IntSGD
// round) and compares, per pair of ranks, the labels of the sends with those of the receives. It also
// runs a ring all-reduce on 1,024 simulated ranks in ordered mode, and checks that every buffer a
// plan's steps read or write as a type is aligned for it, in every slot of the executor's scratch.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "collectives/compressed.h"
#include "collectives/intsgd.h"
#include "collectives/marsit.h"
#include "collectives/plan.h"
#include "kernels/codec.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using kernels::DataType;
using kernels::RedOp;

// One call's arguments on every rank, with what its algorithm needs besides the buffers (which the
// programs only point at: nothing runs).
struct Job {
  std::vector<CollArgs> args;
  std::vector<std::vector<float>> state;  // Marsit's stored compensation values
  std::vector<std::vector<uint32_t>> words;
  std::vector<std::vector<float>> eta;
  coll::IntsgdRound round;
  std::vector<std::unique_ptr<coll::MethodCall>> calls;
};

void fill(Job& job, const coll::Algorithm& a, int n, size_t count, const kernels::CodecConfig* codec) {
  job.args.assign(static_cast<size_t>(n), CollArgs{});
  job.state.assign(static_cast<size_t>(n), std::vector<float>(count));
  job.words.assign(static_cast<size_t>(n), std::vector<uint32_t>((count + 31) / 32));
  job.eta.assign(static_cast<size_t>(n), std::vector<float>((count + 31) / 32));
  for (int r = 0; r < n; ++r) {
    CollArgs& x = job.args[static_cast<size_t>(r)];
    x.kind = a.collective, x.count = count, x.rank = r, x.nranks = n, x.root = n - 1;
    x.dtype = DataType::kFloat32, x.op = codec ? RedOp::kAvg : RedOp::kSum;
    x.peer = (r + 1) % n;
    x.sendbuf = x.recvbuf = reinterpret_cast<void*>(uintptr_t{4096});  // never dereferenced
    x.codec = codec;
    x.aggregators = 2;
    if (codec && codec->kind == kernels::CodecKind::kSign) {
      auto call = std::make_unique<coll::MarsitCall>();
      call->compensation = kernels::Compensation{job.state[r].data(), job.words[r].data(), job.eta[r].data()};
      job.calls.push_back(std::move(call));
    } else if (codec && codec->kind == kernels::CodecKind::kInt) {
      auto call = std::make_unique<coll::IntsgdCall>(x, nullptr, 0.0);
      call->set_round(job.round);
      job.calls.push_back(std::move(call));
    } else {
      job.calls.push_back(std::make_unique<coll::QuantizedCall>());
    }
    x.method_call = job.calls.back().get();
  }
}

// For each fragment: the labels of the messages each ordered pair (from, to) sends and receives.
void require_ordered(const coll::Algorithm& a, const Job& job, size_t chunk_bytes) {
  const int n = static_cast<int>(job.args.size());
  std::vector<std::unique_ptr<coll::Plan>> plans;
  size_t fragments = 0;
  for (const CollArgs& x : job.args) {
    coll::PlanOptions options;
    options.chunk_bytes = chunk_bytes;
    plans.push_back(a.make(x, options));
    fragments = std::max(fragments, plans.back()->fragments());
  }
  for (size_t f = 0; f < fragments; ++f) {
    std::map<std::pair<int, int>, std::vector<uint32_t>> sent, received;
    for (int r = 0; r < n; ++r) {
      if (f >= plans[r]->fragments()) continue;
      std::vector<std::byte> scratch(plans[r]->scratch_bytes());
      coll::Program p;
      p.set_default_codec(job.args[r].codec);
      plans[r]->build(f, scratch.data(), p);
      for (const coll::Step& s : p.steps()) {
        if (const auto* send = std::get_if<coll::step::Send>(&s)) sent[{r, send->peer}].push_back(send->msg);
        if (const auto* recv = std::get_if<coll::step::Recv>(&s)) received[{recv->peer, r}].push_back(recv->msg);
      }
    }
    std::set<std::pair<int, int>> pairs;
    for (const auto& [pair, labels] : sent) pairs.insert(pair);
    for (const auto& [pair, labels] : received) pairs.insert(pair);
    for (const auto& pair : pairs) {
      if (pair.first >= n || pair.second >= n) continue;  // an aggregator: it answers each message alone
      INFO(a.name << " n=" << n << " fragment " << f << ": rank " << pair.first << " -> rank " << pair.second);
      REQUIRE(sent[pair] == received[pair]);
    }
  }
}

// Typed operands of a data step: float32 buffers 4-byte aligned, the call's datatype to its element
// size (a misaligned float load is undefined behaviour on the host and a fault on a GPU). Returns
// what is misaligned, or an empty string.
std::string misaligned(const coll::Step& step, size_t es) {
  std::string what;
  auto need = [&](const void* p, size_t align, const char* name) {
    if (p && reinterpret_cast<uintptr_t>(p) % align != 0) what += std::string(what.empty() ? "" : ", ") + name;
  };
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        namespace st = coll::step;
        if constexpr (std::is_same_v<S, st::Reduce>)
          need(s.dst, es, "Reduce.dst"), need(s.a, es, "Reduce.a"), need(s.b, es, "Reduce.b");
        if constexpr (std::is_same_v<S, st::Average>) need(s.buf, es, "Average.buf");
        if constexpr (std::is_same_v<S, st::Load>) need(s.dst, 4, "Load.dst"), need(s.src, es, "Load.src");
        if constexpr (std::is_same_v<S, st::Store>) need(s.dst, es, "Store.dst"), need(s.src, 4, "Store.src");
        if constexpr (std::is_same_v<S, st::AddFloat>) need(s.dst, 4, "AddFloat.dst"), need(s.src, 4, "AddFloat.src");
        if constexpr (std::is_same_v<S, st::Divide>) need(s.dst, 4, "Divide.dst");
        if constexpr (std::is_same_v<S, st::Encode>) need(s.src, 4, "Encode.src"), need(s.dst, 4, "Encode.dst");
        if constexpr (std::is_same_v<S, st::DecodeAdd>)
          need(s.dst, 4, "DecodeAdd.dst"), need(s.src, 4, "DecodeAdd.src");
        if constexpr (std::is_same_v<S, st::DecodeOut>)
          need(s.dst, es, "DecodeOut.dst"), need(s.scratch, 4, "DecodeOut.scratch"), need(s.src, 4, "DecodeOut.src");
        if constexpr (std::is_same_v<S, st::ErrorFeedback>)
          need(s.residual, 4, "ErrorFeedback.residual"), need(s.acc, 4, "ErrorFeedback.acc"),
              need(s.encoded, 4, "ErrorFeedback.encoded");
      },
      step);
  return what;
}

}  // namespace

TEST_CASE("every registered plan's typed buffers are aligned, in every slot of the executor's scratch",
          "[collectives]") {
  const kernels::CodecConfig none = kernels::parse_codec_spec("none"), fp16 = kernels::parse_codec_spec("fp16");
  const kernels::CodecConfig q8 = kernels::parse_codec_spec("q8:bucket=64"),
                             q3 = kernels::parse_codec_spec("q3:bucket=24");
  const DataType types[] = {DataType::kInt8, DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32,
                            DataType::kFloat64};
  size_t checked = 0;
  for (const coll::Algorithm& a : coll::algorithms()) {
    if (a.collective == CollKind::kSend || a.collective == CollKind::kRecv) continue;
    for (const std::vector<int>& labels :
         {std::vector<int>{0, 0, 1}, std::vector<int>{0, 0, 1, 1, 2, 2}, std::vector<int>{0, 1, 1, 1, 2}})
      for (const kernels::CodecConfig* codec :
           {static_cast<const kernels::CodecConfig*>(nullptr), &none, &fp16, &q8, &q3})
        for (DataType dtype : types)
          for (size_t count : {size_t{7}, size_t{1001}}) {
            const int n = static_cast<int>(labels.size());
            const coll::NodeMap nodes = coll::NodeMap::from_labels(labels);
            Job job;
            fill(job, a, n, count, codec);
            for (CollArgs& x : job.args) {
              x.dtype = dtype, x.nodes = &nodes;
              // The caller's buffers aligned to their element size only (a tensor's view at any offset).
              x.sendbuf = x.recvbuf = reinterpret_cast<void*>(uintptr_t{4096} + kernels::element_size(dtype));
            }
            if (a.cannot_run(job.args[0])) continue;
            for (size_t chunk_bytes : {size_t{256}, size_t{3000}}) {
              for (int r = 0; r < n; ++r) {
                coll::PlanOptions options;
                options.chunk_bytes = chunk_bytes;
                const std::unique_ptr<coll::Plan> plan = a.make(job.args[r], options);
                // Two slots, as the executor lays them out, from a base aligned as new aligns a vector's
                // bytes (16), not more.
                const size_t stride = plan->scratch_stride();
                std::vector<std::byte> buffer(2 * stride + 64);
                std::byte* base = buffer.data() + (64 - reinterpret_cast<uintptr_t>(buffer.data()) % 64) % 64 + 16;
                for (size_t f = 0; f < plan->fragments(); ++f) {
                  coll::Program p;
                  p.set_default_codec(codec);
                  plan->build(f, base + (f % 2) * stride, p);
                  for (const coll::Step& s : p.steps())
                    if (const std::string what = misaligned(s, kernels::element_size(dtype)); !what.empty())
                      FAIL_CHECK(a.name << " map of " << n << " ranks, rank " << r << ", "
                                        << (codec ? codec->canonical() : "no codec") << ", "
                                        << kernels::data_type_name(dtype) << ", count " << count << ", chunk "
                                        << chunk_bytes << " B, fragment " << f << ": " << what << " misaligned");
                }
              }
            }
            ++checked;
          }
  }
  CHECK(checked > 100);
}

TEST_CASE("every registered plan is ordered: each pair's messages are received in the order they are sent",
          "[collectives]") {
  const kernels::CodecConfig q8 = kernels::parse_codec_spec("q8:bucket=64");
  const kernels::CodecConfig sign = kernels::parse_codec_spec("sign:eta_s=0.01,k=2");
  const kernels::CodecConfig torus = kernels::parse_codec_spec("sign:eta_s=0.01,k=2,topology=torus:2x3");
  const kernels::CodecConfig int8 = kernels::parse_codec_spec("int8");
  const kernels::CodecConfig int8_switch = kernels::parse_codec_spec("int8:agg=switch");
  size_t checked = 0;
  for (const coll::Algorithm& a : coll::algorithms()) {
    if (a.collective == CollKind::kSend || a.collective == CollKind::kRecv) continue;  // one message each way
    for (int n : {1, 2, 3, 5, 6}) {
      // The codecs an algorithm may take: none, then each it accepts.
      for (const kernels::CodecConfig* codec :
           {static_cast<const kernels::CodecConfig*>(nullptr), &q8, &sign, &torus, &int8, &int8_switch}) {
        for (uint64_t step : {uint64_t{0}, uint64_t{1}}) {  // Marsit: full precision, then a sign round
          for (bool exact : {true, false}) {                // IntSGD: the exact round, then integers
            Job job;
            job.round.exact = exact;
            job.round.alpha = 100;
            fill(job, a, n, 1000, codec);
            for (CollArgs& x : job.args) x.rng.step = step;
            if (a.cannot_run(job.args[0])) continue;
            for (size_t chunk : {size_t{256}, size_t{4096}}) require_ordered(a, job, chunk);
            if (codec == &sign || codec == &torus) require_ordered(a, job, 16);  // Marsit: a word a piece
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked > 100);  // every algorithm ran at least once (a registry change cannot empty this test)
}

TEST_CASE("1,024 ranks: a ring all-reduce in ordered mode on a network that ignores payload keys",
          "[collectives][scale]") {
  // The sanitizer builds run the same test at 128 ranks: its cost grows as n^2, and 1,024 ranks take
  // minutes there; the Release build checks the full size.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const int n = 128;
#else
  const int n = 1024;
#endif
  const size_t count = 2 * n;  // 2 values per segment, one per fragment: two fragments in flight
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count)), out(n, std::vector<int32_t>(count));
  std::vector<CollArgs> args(n);
  for (int r = 0; r < n; ++r) {
    std::iota(in[r].begin(), in[r].end(), r);
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = count, a.dtype = DataType::kInt32, a.op = RedOp::kSum;
    a.rank = r, a.nranks = n, a.sendbuf = in[r].data(), a.recvbuf = out[r].data();
  }
  const SimRun sim = run_on_sim(args, "ring", /*chunk_bytes=*/4, /*depth=*/2, /*ordered=*/true);
  const int64_t ranks_sum = int64_t{n} * (n - 1) / 2;
  size_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      wrong += out[r][i] != static_cast<int32_t>(ranks_sum + int64_t{n} * static_cast<int64_t>(i));
  CHECK(wrong == 0);
}

}  // namespace qccl::test
