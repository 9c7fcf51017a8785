// Every algorithm of the registry, run by the real executor for every rank of a simulated network in
// one thread, against a reference computed in double precision (exact integer arithmetic for integer
// types): all collectives x datatypes x ops, rank counts 1..9, odd counts, in place and out of place,
// several chunk sizes and pipeline depths. Also: wire bytes equal each plan's formula and a closed
// form written out here per algorithm, results are bit-identical on every rank, and neither the chunk
// size nor the depth changes a single bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "base/errors.h"
#include "collectives/plan.h"
#include "kernels/codec.h"
#include "kernels/half.h"
#include "src/executor.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using kernels::DataType;
using kernels::RedOp;

constexpr DataType kAllTypes[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                                  DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                                  DataType::kFloat64, DataType::kBfloat16};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};

bool reduces(CollKind k) { return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter; }

// ---- Running one call on every rank ---------------------------------------------------------------

struct Call {
  CollKind kind = CollKind::kAllReduce;
  std::string algorithm;
  int nranks = 2;
  size_t count = 1;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;
  bool in_place = false;
  size_t chunk_bytes = 1024;
  int depth = 2;
  bool ordered = false;  // the executors' ordered mode on a network that matches payload in send order
};

struct RankBuffers {
  std::vector<uint8_t> send, recv;
  uint64_t bytes_sent = 0, plan_bytes = 0;
};

// Buffer sizes in elements (send, recv) for one rank.
std::pair<size_t, size_t> sizes(const Call& c) {
  const size_t n = static_cast<size_t>(c.nranks);
  switch (c.kind) {
    case CollKind::kAllGather: return {c.count, c.count * n};
    case CollKind::kReduceScatter: return {c.count * n, c.count};
    case CollKind::kAlltoAll: return {c.count * n, c.count * n};
    case CollKind::kGather: return {c.count, c.count * n};    // recv: the root's
    case CollKind::kScatter: return {c.count * n, c.count};   // send: the root's
    default: return {c.count, c.count};
  }
}

// Fills the inputs, runs the call on every rank to completion, and returns the buffers.
std::vector<RankBuffers> run(const Call& c, bool random_floats = false) {
  const size_t es = kernels::element_size(c.dtype);
  const auto [send_n, recv_n] = sizes(c);
  std::vector<RankBuffers> buffers(c.nranks);
  std::vector<CollArgs> args(c.nranks);
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (int r = 0; r < c.nranks; ++r) {
    RankBuffers& b = buffers[r];
    b.send.assign(send_n * es, 0);
    b.recv.assign(recv_n * es, 0xee);  // garbage that a missed write would expose
    for (size_t i = 0; i < send_n; ++i)
      store(c.dtype, b.send.data(), i, random_floats ? uniform(rng) : input_value(c.dtype, c.op, r, i));
    CollArgs& a = args[r];
    a.kind = c.kind;
    a.count = c.count;
    a.dtype = c.dtype;
    a.op = c.op;
    a.root = c.root;
    a.rank = r;
    a.nranks = c.nranks;
    a.sendbuf = b.send.data();
    a.recvbuf = b.recv.data();
    if (c.in_place) {
      b.recv = b.send;
      if (c.kind == CollKind::kGather || c.kind == CollKind::kScatter) {
        // In place on the root only: Gather's sendbuf = recvbuf + root * count, Scatter's recvbuf =
        // sendbuf + root * count; the other ranks run out of place.
        b.recv.assign(recv_n * es, 0xee);
        a.sendbuf = b.send.data(), a.recvbuf = b.recv.data();  // b.recv was reallocated above
        if (r == c.root && c.kind == CollKind::kGather) {
          std::memcpy(b.recv.data() + r * c.count * es, b.send.data(), c.count * es);
          a.sendbuf = b.recv.data() + r * c.count * es;
        }
        if (r == c.root && c.kind == CollKind::kScatter) a.recvbuf = b.send.data() + r * c.count * es;
      } else if (c.kind == CollKind::kAllGather) {  // sendbuf = recvbuf + rank * count
        b.recv.assign(recv_n * es, 0xee);
        std::memcpy(b.recv.data() + r * c.count * es, b.send.data(), c.count * es);
        a.sendbuf = b.recv.data() + r * c.count * es;
      } else if (c.kind == CollKind::kReduceScatter) {  // recvbuf = sendbuf + rank * count
        a.sendbuf = b.recv.data();
        a.recvbuf = b.recv.data() + r * c.count * es;
      } else {
        a.sendbuf = b.recv.data();
      }
    }
  }
  const SimRun sim = run_on_sim(args, c.algorithm, c.chunk_bytes, c.depth, c.ordered);
  for (int r = 0; r < c.nranks; ++r) {
    buffers[r].bytes_sent = sim.ops[r]->stats().bytes_sent;
    buffers[r].plan_bytes = sim.plan_bytes[r];
  }
  if (c.in_place) {
    for (int r = 0; r < c.nranks; ++r) {
      // Move the in-place result to where the checks expect it.
      RankBuffers& b = buffers[r];
      if (c.kind == CollKind::kReduceScatter)
        b.recv = std::vector<uint8_t>(b.recv.begin() + r * c.count * es, b.recv.begin() + (r + 1) * c.count * es);
      else if (c.kind == CollKind::kAllReduce || c.kind == CollKind::kBroadcast || c.kind == CollKind::kReduce)
        b.recv.resize(recv_n * es);
      else if (c.kind == CollKind::kScatter && r == c.root)
        b.recv = std::vector<uint8_t>(b.send.begin() + r * c.count * es, b.send.begin() + (r + 1) * c.count * es);
    }
  }
  return buffers;
}

// Bytes rank r sends, written out per algorithm from its textbook description, independently of the
// plans' wire_bytes_sent() formulas (which check_exact compares with too). S is the message of one
// rank: count elements.
uint64_t closed_form_bytes(const Call& c, int r) {
  const int n = c.nranks;
  const uint64_t es = kernels::element_size(c.dtype), s = c.count * es;
  if (c.algorithm == "local") return 0;
  if (c.kind == CollKind::kAllReduce && c.algorithm == "ring") {
    // count split into n segments, the first count % n of them one element longer. The reduce-scatter
    // sends every segment but the rank's own (which it receives last, fully reduced); the allgather
    // forwards every segment but its successor's (the one it receives last).
    auto segment = [&](int i) { return c.count / n + (static_cast<size_t>(i) < c.count % n ? 1 : 0); };
    return (2 * c.count - segment(r) - segment((r + 1) % n)) * es;
  }
  if (c.kind == CollKind::kAllReduce && c.algorithm == "recursive_doubling") {
    // p = the largest power of two <= n; the first 2(n-p) ranks fold in pairs: the even one sends its
    // buffer once and gets the result back; the odd one does log2(p) exchanges and sends the result.
    int log2p = 0;
    while ((2 << log2p) <= n) ++log2p;
    const int folded = 2 * (n - (1 << log2p));
    if (r < folded) return r % 2 == 0 ? s : (log2p + 1) * s;
    return log2p * s;
  }
  if (c.kind == CollKind::kBroadcast && c.algorithm == "chain") {
    return r == (c.root + n - 1) % n ? 0 : s;  // every rank but the chain's last forwards S
  }
  if (c.kind == CollKind::kBroadcast && c.algorithm == "binomial") {
    // In positions v = rank - root (mod n), the parent of u is u with its lowest set bit cleared: a
    // rank sends S to each position whose parent it is.
    const int v = (r - c.root + n) % n;
    uint64_t children = 0;
    for (int u = 1; u < n; ++u) children += (u & (u - 1)) == v;
    return children * s;
  }
  if (c.kind == CollKind::kReduce) return r == c.root ? 0 : s;  // chain and binomial: S up, once
  if (c.kind == CollKind::kGather) return r == c.root ? 0 : s;   // every block straight to the root
  if (c.kind == CollKind::kScatter) return r == c.root ? (n - 1) * s : 0;
  if (c.kind == CollKind::kAllGather || c.kind == CollKind::kReduceScatter || c.kind == CollKind::kAlltoAll)
    return (n - 1) * s;  // one block of count elements to or through each other rank
  FAIL("no closed form for " << coll::coll_name(c.kind) << "/" << c.algorithm);
  return 0;
}

// The bytes all ranks send together, which needs no convention about who sends what: every
// all-reduce element of S crosses 2(n-1) links in a ring; a broadcast or reduce moves S over n-1 tree
// or chain edges; each of n ranks moves (n-1) blocks in the others. (Recursive doubling depends on
// the folding, and closed_form_bytes covers it.)
uint64_t closed_form_total(const Call& c) {
  const uint64_t n = static_cast<uint64_t>(c.nranks), s = c.count * kernels::element_size(c.dtype);
  if (c.algorithm == "local") return 0;
  if (c.kind == CollKind::kAllReduce) return c.algorithm == "ring" ? 2 * (n - 1) * s : 0;
  if (c.kind == CollKind::kBroadcast || c.kind == CollKind::kReduce || c.kind == CollKind::kGather ||
      c.kind == CollKind::kScatter)
    return (n - 1) * s;
  return n * (n - 1) * s;
}

// Checks every element of every rank's output against the reference.
void check_exact(const Call& c, const std::vector<RankBuffers>& out) {
  const size_t n = static_cast<size_t>(c.nranks);
  const double tolerance_ulps = (c.op == RedOp::kAvg && kernels::is_floating(c.dtype)) ? 1 : 0;
  size_t wrong = 0;
  for (int r = 0; r < c.nranks; ++r) {
    const void* got = out[r].recv.data();
    auto expect = [&](size_t i, double e) {
      const double g = load(c.dtype, got, i);
      const double ulp = tolerance_ulps * (std::fabs(e) * (c.dtype == DataType::kFloat16 ? 1.0 / 1024
                                                         : c.dtype == DataType::kBfloat16 ? 1.0 / 128
                                                                                          : 1.2e-7));
      if (std::fabs(g - e) > ulp) {
        if (wrong < 5) UNSCOPED_INFO("rank " << r << " element " << i << ": got " << g << ", expected " << e);
        ++wrong;
      }
    };
    switch (c.kind) {
      case CollKind::kAllReduce:
        for (size_t i = 0; i < c.count; ++i) expect(i, expected_reduction(c.dtype, c.op, c.nranks, i));
        break;
      case CollKind::kReduce:
        if (r == c.root)
          for (size_t i = 0; i < c.count; ++i) expect(i, expected_reduction(c.dtype, c.op, c.nranks, i));
        break;
      case CollKind::kBroadcast:
        for (size_t i = 0; i < c.count; ++i) expect(i, input_value(c.dtype, c.op, c.root, i));
        break;
      case CollKind::kAllGather:
        for (size_t s = 0; s < n; ++s)
          for (size_t i = 0; i < c.count; ++i) expect(s * c.count + i, input_value(c.dtype, c.op, static_cast<int>(s), i));
        break;
      case CollKind::kReduceScatter:
        for (size_t i = 0; i < c.count; ++i)
          expect(i, expected_reduction(c.dtype, c.op, c.nranks, static_cast<size_t>(r) * c.count + i));
        break;
      case CollKind::kGather:
        if (r == c.root)
          for (size_t s = 0; s < n; ++s)
            for (size_t i = 0; i < c.count; ++i) expect(s * c.count + i, input_value(c.dtype, c.op, static_cast<int>(s), i));
        break;
      case CollKind::kScatter:
        for (size_t i = 0; i < c.count; ++i)
          expect(i, input_value(c.dtype, c.op, c.root, static_cast<size_t>(r) * c.count + i));
        break;
      case CollKind::kAlltoAll:
        for (size_t s = 0; s < n; ++s)
          for (size_t i = 0; i < c.count; ++i)
            expect(s * c.count + i, input_value(c.dtype, c.op, static_cast<int>(s), static_cast<size_t>(r) * c.count + i));
        break;
      default: FAIL("not a collective");
    }
    CHECK(out[r].bytes_sent == out[r].plan_bytes);
    CHECK(out[r].bytes_sent == closed_form_bytes(c, r));
  }
  CHECK(wrong == 0);
  uint64_t total = 0;
  for (const RankBuffers& b : out) total += b.bytes_sent;
  if (c.algorithm != "recursive_doubling") CHECK(total == closed_form_total(c));
}

std::vector<std::pair<CollKind, std::string>> collective_algorithms() {
  std::vector<std::pair<CollKind, std::string>> out;
  for (const coll::Algorithm& a : coll::algorithms()) {
    // Those that decline a plain call of two ranks serve one rank or need a codec (their own tests:
    // allreduce_compressed_test.cc, allreduce_marsit_test.cc).
    coll::CollArgs plain;
    plain.kind = a.collective, plain.count = 1, plain.nranks = 2;
    if (a.collective != CollKind::kSend && a.collective != CollKind::kRecv && !a.cannot_run(plain))
      out.emplace_back(a.collective, a.name);
  }
  return out;
}

std::string describe(const Call& c) {
  return std::string(coll::coll_name(c.kind)) + "/" + c.algorithm + " n=" + std::to_string(c.nranks) +
         " count=" + std::to_string(c.count) + " " + kernels::data_type_name(c.dtype) + " " +
         kernels::red_op_name(c.op) + " root=" + std::to_string(c.root) + (c.in_place ? " in-place" : "") +
         " chunk=" + std::to_string(c.chunk_bytes) + " depth=" + std::to_string(c.depth) +
         (c.ordered ? " ordered" : "");
}

}  // namespace

TEST_CASE("every algorithm: every datatype and op, exact against the reference", "[collectives]") {
  for (const auto& [kind, name] : collective_algorithms()) {
    for (DataType t : kAllTypes) {
      for (RedOp op : kAllOps) {
        if (!reduces(kind) && op != RedOp::kSum) continue;
        for (int n : {2, 3, 5}) {
          Call c;
          c.kind = kind, c.algorithm = name, c.nranks = n, c.count = 37, c.dtype = t, c.op = op;
          c.root = n - 1, c.chunk_bytes = 16 * kernels::element_size(t), c.depth = 2;
          INFO(describe(c));
          check_exact(c, run(c));
        }
      }
    }
  }
}

TEST_CASE("every algorithm: rank counts 2..9, odd counts, chunk sizes, depths, in place", "[collectives]") {
  for (const auto& [kind, name] : collective_algorithms()) {
    for (int n = 2; n <= 9; ++n) {
      for (size_t count : {size_t{1}, size_t{2}, size_t{7}, size_t{8}, size_t{31}, size_t{257}, size_t{1000}}) {
        for (size_t chunk : {size_t{4}, size_t{60}, size_t{1} << 20}) {
          for (bool in_place : {false, true}) {
            if (in_place && kind == CollKind::kAlltoAll) continue;  // AlltoAll has no in-place form
            Call c;
            c.kind = kind, c.algorithm = name, c.nranks = n, c.count = count, c.dtype = DataType::kInt32;
            c.op = RedOp::kSum, c.root = static_cast<int>(count % n), c.in_place = in_place;
            c.chunk_bytes = chunk, c.depth = 1 + static_cast<int>(count % 3);
            INFO(describe(c));
            check_exact(c, run(c));
          }
        }
      }
    }
  }
}

// What a transport without tags (NCCL point-to-point) needs: each pair of ranks posts its payload in one
// agreed order. The network here matches payload strictly in send order and fails a receive that meets
// another fragment's message, so a plan or executor that posts out of order fails the test.
TEST_CASE("every algorithm in ordered mode, on a network that ignores payload keys", "[collectives]") {
  for (const auto& [kind, name] : collective_algorithms()) {
    for (int n : {2, 3, 4, 7}) {
      for (size_t count : {size_t{1}, size_t{257}, size_t{1000}}) {
        for (size_t chunk : {size_t{4}, size_t{60}}) {
          for (int depth : {1, 3}) {
            Call c;
            c.kind = kind, c.algorithm = name, c.nranks = n, c.count = count, c.dtype = DataType::kInt32;
            c.op = RedOp::kSum, c.root = static_cast<int>(count % n), c.chunk_bytes = chunk, c.depth = depth;
            c.ordered = true;
            INFO(describe(c));
            check_exact(c, run(c));
          }
        }
      }
    }
  }
}

TEST_CASE("single rank: the local algorithm copies", "[collectives]") {
  for (CollKind kind : {CollKind::kAllReduce, CollKind::kBroadcast, CollKind::kReduce, CollKind::kAllGather,
                        CollKind::kReduceScatter, CollKind::kAlltoAll}) {
    for (bool in_place : {false, true}) {
      if (in_place && kind == CollKind::kAlltoAll) continue;
      Call c;
      c.kind = kind, c.algorithm = "local", c.nranks = 1, c.count = 33, c.dtype = DataType::kFloat64;
      c.op = RedOp::kAvg, c.in_place = in_place;
      INFO(describe(c));
      check_exact(c, run(c));
    }
  }
}

TEST_CASE("all-reduce: identical bits on every rank, independent of chunk size and depth", "[collectives]") {
  for (const std::string name : {"ring", "recursive_doubling"}) {
    for (int n : {2, 3, 4, 6, 7, 8}) {
      for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16, DataType::kFloat64}) {
        for (RedOp op : {RedOp::kSum, RedOp::kAvg, RedOp::kMax}) {
          Call base;
          base.kind = CollKind::kAllReduce, base.algorithm = name, base.nranks = n, base.count = 1001;
          base.dtype = t, base.op = op, base.chunk_bytes = 1 << 20, base.depth = 1;
          INFO(describe(base));
          const auto reference = run(base, /*random_floats=*/true);
          for (int r = 1; r < n; ++r) REQUIRE(reference[r].recv == reference[0].recv);
          for (size_t chunk : {size_t{8}, size_t{100}, size_t{1024}}) {
            for (int depth : {1, 3, 8}) {
              Call c = base;
              c.chunk_bytes = chunk, c.depth = depth;
              INFO("chunk " << chunk << " depth " << depth);
              const auto out = run(c, true);
              for (int r = 0; r < n; ++r) REQUIRE(out[r].recv == reference[0].recv);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("all-reduce of random floats: within the rounding bound of the double-precision sum", "[collectives]") {
  // Each output element is n-1 rounded additions of values in [-1, 1]; each addition errs by at most
  // half an ulp of a partial sum no larger than n, so |error| <= (n-1) * n * u with u the unit roundoff.
  for (const std::string name : {"ring", "recursive_doubling"}) {
    for (int n : {2, 5, 8}) {
      for (auto [t, u] : {std::pair{DataType::kFloat32, 0x1p-24}, std::pair{DataType::kFloat16, 0x1p-11},
                          std::pair{DataType::kBfloat16, 0x1p-8}, std::pair{DataType::kFloat64, 0x1p-53}}) {
        Call c;
        c.kind = CollKind::kAllReduce, c.algorithm = name, c.nranks = n, c.count = 4099, c.dtype = t;
        c.chunk_bytes = 512, c.depth = 3;
        INFO(describe(c));
        const auto out = run(c, true);
        double worst = 0;
        for (size_t i = 0; i < c.count; ++i) {
          double exact = 0;
          for (int r = 0; r < n; ++r) exact += load(t, out[r].send.data(), i);
          worst = std::max(worst, std::fabs(load(t, out[0].recv.data(), i) - exact));
        }
        // Inputs were rounded to the type before summing, so only the additions contribute.
        CHECK(worst <= (n - 1) * n * u);
      }
    }
  }
}

TEST_CASE("wire bytes: ring all-reduce sends 2(n-1)/n * S when n divides the count", "[collectives]") {
  for (int n : {2, 3, 4, 8}) {
    Call c;
    c.kind = CollKind::kAllReduce, c.algorithm = "ring", c.nranks = n, c.count = 24 * 35, c.dtype = DataType::kFloat32;
    const auto out = run(c);
    const uint64_t s = c.count * 4;
    for (int r = 0; r < n; ++r) CHECK(out[r].bytes_sent == 2 * (n - 1) * s / n);
  }
}

// The executor sizes scratch for the slots an execution makes: a stride per fragment in flight, so a
// call of one fragment (QCCL_CHUNK_BYTES above its size) holds one stride however deep the pipeline,
// and the call runs in it.
TEST_CASE("scratch: one stride per pipeline slot the execution makes, never more than its fragments",
          "[collectives]") {
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  REQUIRE(ring != nullptr);
  constexpr int kDepth = 64;
  SimNetwork net(2);
  SimTransport transport(net, 0);
  std::vector<std::string> names = {"rank 0", "rank 1"};
  const HostExecutor executor(transport, HostExecutorOptions{kDepth, false}, &names);
  std::vector<CollArgs> args(2);
  std::vector<std::vector<float>> data(2, std::vector<float>(size_t{1} << 20, 1.0f));  // 4 MiB, 2 MiB a segment
  for (int r = 0; r < 2; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.rank = r, a.nranks = 2, a.dtype = DataType::kFloat32, a.count = data[r].size();
    a.sendbuf = a.recvbuf = data[r].data();
  }
  const struct {
    size_t chunk_bytes, fragments, slots;
  } cases[] = {{size_t{1} << 30, 1, 1}, {size_t{1} << 16, 32, 32}, {size_t{1} << 12, 512, kDepth}};
  for (const auto& c : cases) {
    INFO("chunk " << c.chunk_bytes);
    coll::PlanOptions options;
    options.chunk_bytes = c.chunk_bytes;
    const auto plan = ring->make(args[0], options);
    REQUIRE(plan->fragments() == c.fragments);
    REQUIRE(plan->scratch_stride() > 0);
    CHECK(executor.scratch_bytes(*plan) == c.slots * plan->scratch_stride());
  }
  const SimRun sim = run_on_sim(args, "ring", size_t{1} << 30, kDepth);
  for (int r = 0; r < 2; ++r) {
    CHECK(sim.scratch[r].size() == ring->make(args[r], {size_t{1} << 30})->scratch_stride());
    CHECK(std::all_of(data[r].begin(), data[r].end(), [](float x) { return x == 2.0f; }));
  }
}

TEST_CASE("point to point: a ring of sends and receives, and a send to self", "[collectives]") {
  const coll::Algorithm* send = coll::find_algorithm(CollKind::kSend, "direct");
  const coll::Algorithm* recv = coll::find_algorithm(CollKind::kRecv, "direct");
  for (int n : {1, 2, 3, 5}) {
    SimNetwork net(n);
    std::vector<std::unique_ptr<SimTransport>> transports;
    std::vector<std::unique_ptr<HostExecutor>> executors;
    std::vector<std::unique_ptr<Execution>> ops;
    std::vector<std::vector<int64_t>> in(n, std::vector<int64_t>(100)), out(n, std::vector<int64_t>(100, -1));
    std::vector<std::string> names(n, "rank");
    for (int r = 0; r < n; ++r) {
      transports.push_back(std::make_unique<SimTransport>(net, r));
      executors.push_back(std::make_unique<HostExecutor>(*transports[r], HostExecutorOptions{1, false}, &names));
      for (int i = 0; i < 100; ++i) in[r][i] = r * 1000 + i;
      for (CollKind kind : {CollKind::kRecv, CollKind::kSend}) {
        CollArgs a;
        a.kind = kind, a.count = 100, a.dtype = DataType::kInt64, a.rank = r, a.nranks = n;
        a.peer = kind == CollKind::kSend ? (r + 1) % n : (r + n - 1) % n;
        a.sendbuf = in[r].data(), a.recvbuf = out[r].data();
        OperationIdentity id;
        id.p2p = true;
        id.header = FrameHeader::for_call(a, 0, 0);
        id.expected = id.header;
        ops.push_back(executors[r]->launch(kind == CollKind::kSend ? *send : *recv,
                                           (kind == CollKind::kSend ? send : recv)->make(a, {}), id, nullptr));
      }
    }
    for (bool all = false; !all;) {
      bool moved = net.progress();
      all = true;
      for (size_t i = 0; i < ops.size(); ++i) {
        moved |= ops[i]->advance();
        all &= ops[i]->finished();
      }
      if (!all && !moved) FAIL("deadlock");
    }
    for (int r = 0; r < n; ++r) CHECK(out[r] == in[(r + n - 1) % n]);
  }
}

// aq with rows=0 encodes its message as one block, whose scales span it all; its bytes still travel in
// messages of a chunk each (one message of the whole showed no progress until it ended), and the
// receiver gets decode(encode(x)) all the same.
TEST_CASE("compressed point-to-point: a whole-run codec's block travels in chunk-sized messages", "[collectives]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("aq8:channels=16");
  const size_t count = 100000, chunk = 4096;
  std::vector<float> x(count), y(count, -1.0f);
  for (size_t i = 0; i < count; ++i) x[i] = std::sin(0.001f * static_cast<float>(i)) * static_cast<float>(1 + i % 16);
  std::vector<CollArgs> args(2);
  for (int r = 0; r < 2; ++r) {
    CollArgs& a = args[r];
    a.kind = r == 0 ? CollKind::kSend : CollKind::kRecv, a.count = count, a.dtype = DataType::kFloat32;
    a.rank = r, a.nranks = 2, a.peer = 1 - r, a.codec = &codec;
    a.sendbuf = x.data(), a.recvbuf = y.data();
  }
  const size_t encoded = codec.encoded_bytes(count);
  // The sender's messages: ceil(E / chunk), none longer than a chunk, together the whole block.
  const coll::Algorithm* send = coll::find_algorithm(CollKind::kSend, "compressed");
  REQUIRE(send != nullptr);
  coll::PlanOptions options;
  options.chunk_bytes = chunk;
  auto plan = send->make(args[0], options);
  REQUIRE(plan->fragments() == 1);
  std::vector<std::byte> scratch(plan->scratch_bytes());
  coll::Program p;
  p.set_default_codec(&codec);
  plan->build(0, scratch.data(), p);
  size_t messages = 0, bytes = 0;
  for (const coll::Step& s : p.steps()) {
    if (const auto* m = std::get_if<coll::step::Send>(&s)) {
      ++messages, bytes += m->bytes;
      CHECK(m->bytes <= chunk);
    }
  }
  CHECK(messages == (encoded + chunk - 1) / chunk);
  CHECK(bytes == encoded);
  run_on_sim(args, "compressed", chunk, 2);
  std::vector<std::byte> wire(encoded);
  std::vector<float> want(count);
  kernels::encode(codec, x.data(), count, wire.data(), kernels::PhiloxKey{}, 0);
  kernels::decode(codec, wire.data(), count, want.data());
  CHECK(y == want);
}

TEST_CASE("mismatched collectives fail with a message that names both calls", "[collectives]") {
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  SimNetwork net(2);
  std::vector<float> a(100), b(100), c(200), d(200);
  std::vector<std::string> names = {"rank 0", "rank 1"};
  std::vector<std::unique_ptr<SimTransport>> transports;
  std::vector<std::unique_ptr<HostExecutor>> executors;
  std::vector<std::unique_ptr<Execution>> ops;
  std::vector<std::vector<std::byte>> scratch(2, std::vector<std::byte>(1 << 20));
  for (int r = 0; r < 2; ++r) {
    CollArgs args;
    args.kind = CollKind::kAllReduce, args.rank = r, args.nranks = 2, args.dtype = DataType::kFloat32;
    args.count = r == 0 ? 100 : 200;  // rank 1 disagrees
    args.sendbuf = r == 0 ? a.data() : c.data();
    args.recvbuf = r == 0 ? b.data() : d.data();
    OperationIdentity id;
    id.sequence = 3;
    id.header = FrameHeader::for_call(args, 3, 0);
    id.expected = id.header;
    transports.push_back(std::make_unique<SimTransport>(net, r));
    executors.push_back(std::make_unique<HostExecutor>(*transports[r], HostExecutorOptions{2, false}, &names));
    ops.push_back(executors[r]->launch(*ring, ring->make(args, {}), id, scratch[r].data()));
  }
  int failures = 0;
  for (int pass = 0; pass < 100 && failures < 2; ++pass) {
    net.progress();
    for (int r = 0; r < 2; ++r) {
      try {
        ops[r]->advance();
      } catch (const Error& e) {
        ++failures;
        CHECK(e.code() == qcclMismatch);
        CHECK_THAT(e.message(), Catch::Contains("AllReduce(count=100") && Catch::Contains("AllReduce(count=200"));
      }
    }
  }
  CHECK(failures == 2);  // both ends see the other's header
}

}  // namespace qccl::test
