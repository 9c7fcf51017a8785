// The device executor's scheduling (src/executor.h, DeviceExecutor), run on a CPU against the strict
// stand-in device (tests/common/stand_in_device.h): every registered algorithm that needs no method
// kernels, on device buffers, gives the host executor's bits exactly (outputs, error-feedback
// residuals, wire bytes, non-finite counts), for several rank counts, datatypes, ops, chunk sizes,
// pipeline depths, in place and out of place, with the stream lagging behind the host by a random
// amount; it joins the caller's stream once each way, reuses its pool from call to call, and refuses
// plans whose method has no device kernels. IntSGD's ring runs its step kernels' device form: the
// host's bits, clip counts and integer sums, and a NaN's taint reaching every rank on both wires.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "base/errors.h"
#include "collectives/compressed.h"
#include "collectives/fft.h"
#include "collectives/intsgd.h"
#include "collectives/marsit.h"
#include "kernels/codec.h"
#include "kernels/intsgd.h"
#include "kernels/sign.h"
#include "src/message_key.h"
#include "tests/collectives/sim_runner.h"
#include "tests/common/reference.h"
#include "tests/common/stand_in_device.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;

// The bytes of a call's send and receive buffers on one rank (NCCL's meaning of count).
void buffer_bytes(const CollArgs& a, size_t* send, size_t* recv) {
  const size_t block = a.count * a.element_size(), all = block * static_cast<size_t>(a.nranks);
  switch (a.kind) {
    case CollKind::kAllReduce: case CollKind::kBroadcast: case CollKind::kReduce:
      *send = *recv = block;
      return;
    case CollKind::kAllGather: case CollKind::kGather:
      *send = block, *recv = all;
      return;
    case CollKind::kReduceScatter: case CollKind::kScatter:
      *send = all, *recv = block;
      return;
    case CollKind::kAlltoAll:
      *send = *recv = all;
      return;
    case CollKind::kSend:
      *send = block, *recv = 0;
      return;
    case CollKind::kRecv:
      *send = 0, *recv = block;
      return;
  }
}

// One rank's buffers in host memory: the call's arguments point into them.
struct HostRank {
  std::vector<uint8_t> send, recv;
  std::vector<float> residual;  // error feedback (empty: none)
  coll::QuantizedCall call;
  // IntSGD: the round its call runs (set: the call is an IntsgdCall, made afresh for every run).
  std::optional<coll::IntsgdRound> intsgd_round;
  std::shared_ptr<coll::IntsgdCall> intsgd;
  // Marsit: the compensation its call works on (kernels/marsit.h: stored values, words, eta; empty:
  // not a Marsit call), copied to the device for a device run.
  std::vector<float> stored, eta;
  std::vector<uint32_t> words;
  std::shared_ptr<coll::MarsitCall> marsit;
  std::shared_ptr<coll::FftCall> fft;  // the fft codec's call (made afresh for every run)
};

struct Outcome {
  std::vector<std::vector<uint8_t>> recv;      // per rank
  std::vector<std::vector<float>> residual;    // per rank (error feedback)
  std::vector<ExecutionStats> stats;
  std::vector<size_t> clipped;                 // per rank (IntSGD)
  std::vector<kernels::IntSums> sums;          // per rank (IntSGD)
  std::vector<std::vector<float>> stored, eta;  // per rank (Marsit's compensation)
  std::vector<std::vector<uint32_t>> words;
};

void record_method(const HostRank& h, Outcome* out) {
  if (h.intsgd) {
    out->clipped.push_back(*h.intsgd->clipped());
    out->sums.push_back(*h.intsgd->sums());
  }
  if (h.fft) {  // its clamps where IntSGD's clips go
    out->clipped.push_back(h.fft->clamped);
    out->sums.push_back(kernels::IntSums{});
  }
  if (h.marsit) {
    out->stored.push_back(h.stored);
    out->words.push_back(h.words);
    out->eta.push_back(h.eta);
  }
}

// The ranks' arguments bound to their host buffers (in place: the send block inside recv, at
// `in_place_offset` bytes; for AllReduce 0).
std::vector<CollArgs> bind(std::vector<HostRank>& ranks, const std::vector<CollArgs>& shape, bool in_place,
                           const std::vector<size_t>& in_place_offset) {
  std::vector<CollArgs> args = shape;
  for (size_t r = 0; r < ranks.size(); ++r) {
    CollArgs& a = args[r];
    a.sendbuf = in_place ? ranks[r].recv.data() + in_place_offset[r] : ranks[r].send.data();
    a.recvbuf = ranks[r].recv.data();
    if (ranks[r].send.empty() && !in_place) a.sendbuf = nullptr;
    if (ranks[r].recv.empty()) a.recvbuf = nullptr;
    ranks[r].call.residual = ranks[r].residual.empty() ? nullptr : ranks[r].residual.data();
    if (a.codec) a.method_call = &ranks[r].call;
    if (a.codec && a.codec->kind == kernels::CodecKind::kFft) {
      ranks[r].fft = std::make_shared<coll::FftCall>();
      ranks[r].fft->residual = ranks[r].call.residual;
      a.method_call = ranks[r].fft.get();
    }
    if (ranks[r].intsgd_round) {
      ranks[r].intsgd = std::make_shared<coll::IntsgdCall>(a, nullptr, 0.0);
      ranks[r].intsgd->set_round(*ranks[r].intsgd_round);
      a.method_call = ranks[r].intsgd.get();
    }
    if (!ranks[r].stored.empty()) {
      HostRank& h = ranks[r];
      h.marsit = std::make_shared<coll::MarsitCall>();
      h.marsit->compensation = kernels::Compensation{h.stored.data(), h.words.data(), h.eta.data()};
      a.method_call = h.marsit.get();
    }
  }
  return args;
}

Outcome run_host(std::vector<HostRank> ranks, const std::vector<CollArgs>& shape, bool in_place,
                 const std::vector<size_t>& offset, const coll::Algorithm& algorithm, size_t chunk, int depth) {
  SimRun sim = run_algorithm_on_sim(bind(ranks, shape, in_place, offset), algorithm, chunk, depth);
  Outcome out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    out.recv.push_back(ranks[r].recv);
    out.residual.push_back(ranks[r].residual);
    out.stats.push_back(sim.ops[r]->stats());
    record_method(ranks[r], &out);
  }
  return out;
}

// The same call with every buffer copied into the rank's stand-in device.
enum class Wire { kStaged, kPeer };

// An IntSGD aggregator process (agg=switch) on the simulated network, as src/aggregator_daemon.cc
// serves one: it takes every rank's chunk of a message, adds their integers (wrapping), and sends the
// sum back to every rank with the key's taint bit if any contribution had it.
class TestAggregator {
 public:
  TestAggregator(sim::SimNetwork& net, int index, int nranks) : transport_(net, nranks + index), n_(nranks) {
    posted_.resize(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) post(r);
  }
  bool progress() {
    bool moved = false;
    for (int r = 0; r < n_; ++r) {
      Posted& p = posted_[static_cast<size_t>(r)];
      transport::Completion done;
      std::string error;
      if (transport_.test(p.handle, &done, &error) != transport::Poll::kDone) continue;
      moved = true;
      const transport::Key id = done.key & ~message_key::kTaintBit;
      Chunk& c = chunks_[id];
      c.taint |= done.key & message_key::kTaintBit;
      coll::SwitchChunkHeader header;
      REQUIRE(header.decode(p.buffer.data()));
      if (c.sum.empty()) {
        c.sum.assign(p.buffer.begin(), p.buffer.begin() + static_cast<std::ptrdiff_t>(done.bytes));
      } else {
        kernels::int_add(header.bits, p.buffer.data() + coll::SwitchChunkHeader::kBytes,
                         c.sum.data() + coll::SwitchChunkHeader::kBytes, header.count);
      }
      if (++c.contributions == n_)
        for (int to = 0; to < n_; ++to) c.sends.push_back(transport_.isend(to, id | c.taint, c.sum.data(), c.sum.size()));
      post(r);
    }
    return moved;
  }
  // The job is over: the receives it keeps posted go.
  void stop() {
    for (Posted& p : posted_) transport_.cancel(p.handle);
  }

 private:
  struct Posted {
    transport::Handle handle;
    std::vector<uint8_t> buffer = std::vector<uint8_t>(1 << 20);
  };
  struct Chunk {
    std::vector<uint8_t> sum;
    transport::Key taint = 0;
    int contributions = 0;
    std::vector<transport::Handle> sends;
  };
  void post(int r) {
    Posted& p = posted_[static_cast<size_t>(r)];
    p.handle = transport_.irecv(r, 0, transport::kKeyMask, p.buffer.data(), p.buffer.size());
  }
  sim::SimTransport transport_;
  int n_;
  std::vector<Posted> posted_;
  std::map<transport::Key, Chunk> chunks_;  // (chunks stay: a test sends few)
};

Outcome run_device(std::vector<HostRank> ranks, const std::vector<CollArgs>& shape, bool in_place,
                   const std::vector<size_t>& offset, const coll::Algorithm& algorithm, size_t chunk, int depth,
                   uint64_t seed, int calls = 1, Wire wire = Wire::kStaged,
                   std::vector<std::shared_ptr<StandInWire>>* wires_out = nullptr, int aggregators = 0) {
  const int n = static_cast<int>(ranks.size());
  REQUIRE((aggregators == 0 || calls == 1));  // the test's aggregators serve one call
  sim::SimNetwork net(n + aggregators, false);
  std::vector<std::unique_ptr<TestAggregator>> switches;
  for (int k = 0; k < aggregators; ++k) switches.push_back(std::make_unique<TestAggregator>(net, k, n));
  StandInFabric fabric(n);
  std::vector<std::shared_ptr<StandInWire>> wires;
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank " + std::to_string(r));
  std::vector<std::shared_ptr<StandInDevice>> devices;
  std::vector<std::unique_ptr<sim::SimTransport>> transports;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  std::vector<CollArgs> args = bind(ranks, shape, in_place, offset);
  std::vector<void*> send(n, nullptr), recv(n, nullptr), residual(n, nullptr);
  std::vector<std::array<void*, 3>> compensation(n, {nullptr, nullptr, nullptr});  // Marsit's, on the device
  for (int r = 0; r < n; ++r) {
    devices.push_back(std::make_shared<StandInDevice>(seed + static_cast<uint64_t>(r)));
    StandInDevice& d = *devices[r];
    transports.push_back(std::make_unique<sim::SimTransport>(net, r));
    if (wire == Wire::kPeer) wires.push_back(std::make_shared<StandInWire>(fabric, d, r));
    if (wires_out) *wires_out = wires;
    executors.push_back(std::make_unique<DeviceExecutor>(*transports[r], devices[r],
                                                         wire == Wire::kPeer ? wires[r] : nullptr,
                                                         HostExecutorOptions{depth, false}, &names));
    HostRank& h = ranks[r];
    if (!h.recv.empty()) {
      recv[r] = d.allocate(Device::Memory::kDevice, h.recv.size());
      d.upload(recv[r], h.recv.data(), h.recv.size());
    }
    if (in_place) {
      send[r] = static_cast<uint8_t*>(recv[r]) + offset[r];
    } else if (!h.send.empty()) {
      send[r] = d.allocate(Device::Memory::kDevice, h.send.size());
      d.upload(send[r], h.send.data(), h.send.size());
    }
    if (!h.residual.empty()) {
      residual[r] = d.allocate(Device::Memory::kDevice, h.residual.size() * sizeof(float));
      d.upload(residual[r], h.residual.data(), h.residual.size() * sizeof(float));
      h.call.residual = static_cast<float*>(residual[r]);
      if (h.fft) h.fft->use_device_arrays({residual[r]});
    }
    if (h.marsit) {  // as CodecState::arrays_on_device: the call takes the device copies
      const std::array<std::pair<void*, size_t>, 3> arrays = {
          {{h.stored.data(), h.stored.size() * sizeof(float)},
           {h.words.data(), h.words.size() * sizeof(uint32_t)},
           {h.eta.data(), h.eta.size() * sizeof(float)}}};
      std::vector<void*> on_device;
      for (size_t i = 0; i < 3; ++i) {
        compensation[r][i] = d.allocate(Device::Memory::kDevice, arrays[i].second);
        d.upload(compensation[r][i], arrays[i].first, arrays[i].second);
        on_device.push_back(compensation[r][i]);
      }
      h.marsit->use_device_arrays(on_device);
    }
    args[r].sendbuf = send[r];
    args[r].recvbuf = recv[r];
    args[r].stream = reinterpret_cast<void*>(uintptr_t{0x1000} + static_cast<uintptr_t>(r));
    args[r].aggregators = aggregators;
  }
  Outcome out;
  out.stats.resize(n);
  size_t allocations_after_first = 0;
  for (int call = 0; call < calls; ++call) {
    std::vector<std::unique_ptr<Execution>> ops;
    for (int r = 0; r < n; ++r) {
      coll::PlanOptions options;
      options.chunk_bytes = chunk;
      OperationIdentity id;
      id.p2p = args[r].kind == CollKind::kSend || args[r].kind == CollKind::kRecv;
      id.sequence = 7 + static_cast<uint64_t>(call);
      id.header = FrameHeader::for_call(args[r], id.sequence, args[r].codec ? args[r].codec->hash() : 0);
      id.expected = id.header;
      ops.push_back(executors[r]->launch(algorithm, algorithm.make(args[r], options), id, nullptr));
    }
    // A pass where nothing moves can still be followed by one where a device runs work (it runs a
    // random number of items per pass, 0 included): a deadlock is many passes without a move.
    // A rank whose call fails stops there, as it would in a job, and the others go on until they
    // finish or wait on it (in a job the control plane would tell them); then the first error is
    // thrown.
    std::vector<std::unique_ptr<Error>> failed(n);
    for (int idle = 0;;) {
      bool moved = net.progress(), all = true;
      for (auto& s : switches) moved |= s->progress();
      for (int r = 0; r < n; ++r) {
        moved |= devices[r]->run_some();
        if (failed[r] || ops[r]->finished()) continue;
        try {
          moved |= ops[r]->advance();
        } catch (const Error& e) {
          failed[r] = std::make_unique<Error>(e);
          moved = true;
        }
        all &= ops[r]->finished();
      }
      if (all && std::none_of(failed.begin(), failed.end(), [](auto& e) { return e != nullptr; })) break;
      idle = moved ? 0 : idle + 1;
      const auto first_failure = std::find_if(failed.begin(), failed.end(), [](auto& e) { return e != nullptr; });
      if (idle == 1000 && first_failure != failed.end()) {
        for (int r = 0; r < n; ++r) ops[r]->cancel();
        throw **first_failure;
      }
      if (idle == 1000) {
        std::string waiting;
        for (int r = 0; r < n; ++r) waiting += "; rank " + std::to_string(r) + " waits for " + ops[r]->waiting_for();
        FAIL("deadlock: no rank and no device can move" << waiting);
      }
    }
    for (auto& s : switches) s->stop();
    CHECK(net.idle());
    CHECK(fabric.idle());
    for (int r = 0; r < n; ++r) {
      out.stats[r] = ops[r]->stats();
      INFO("rank " << r);
      CHECK_FALSE(devices[r]->busy());  // finished means the device reached the last step
      CHECK(devices[r]->waits() == call + 1);   // the caller's stream joined once each way
      CHECK(devices[r]->open_marks() == 0);
      CHECK(devices[r]->signals() == call + 1);
      CHECK(devices[r]->last_stream() == args[r].stream);
    }
    if (call == 0) {
      for (auto& d : devices) allocations_after_first += d->allocations();
    }
  }
  if (calls > 1) {  // later calls of the same shape take everything from the pool
    size_t allocations = 0;
    for (auto& d : devices) allocations += d->allocations();
    CHECK(allocations == allocations_after_first);
  }
  for (int r = 0; r < n; ++r) {
    HostRank& h = ranks[r];
    if (recv[r]) devices[r]->download(h.recv.data(), recv[r], h.recv.size());
    if (residual[r]) devices[r]->download(h.residual.data(), residual[r], h.residual.size() * sizeof(float));
    if (h.marsit) {
      devices[r]->download(h.stored.data(), compensation[r][0], h.stored.size() * sizeof(float));
      devices[r]->download(h.words.data(), compensation[r][1], h.words.size() * sizeof(uint32_t));
      devices[r]->download(h.eta.data(), compensation[r][2], h.eta.size() * sizeof(float));
    }
    out.recv.push_back(h.recv);
    out.residual.push_back(h.residual);
    record_method(h, &out);
  }
  for (int r = 0; r < n; ++r) {  // buffers of the test's own
    if (recv[r]) devices[r]->release(Device::Memory::kDevice, recv[r]);
    if (send[r] && !in_place) devices[r]->release(Device::Memory::kDevice, send[r]);
    if (residual[r]) devices[r]->release(Device::Memory::kDevice, residual[r]);
    for (void* p : compensation[r])
      if (p) devices[r]->release(Device::Memory::kDevice, p);
  }
  executors.clear();  // the pool goes with the last owner of the device: its releases are checked
  for (auto& d : devices) CHECK(d->live_allocations() == 0);
  return out;
}

void require_same(const Outcome& host, const Outcome& device) {
  for (size_t r = 0; r < host.recv.size(); ++r) {
    INFO("rank " << r);
    CHECK(host.recv[r] == device.recv[r]);
    CHECK(host.residual[r] == device.residual[r]);
    CHECK(host.stats[r].bytes_sent == device.stats[r].bytes_sent);
    CHECK(host.stats[r].bytes_received == device.stats[r].bytes_received);
    CHECK(host.stats[r].nonfinite == device.stats[r].nonfinite);
  }
  REQUIRE(host.clipped.size() == device.clipped.size());
  for (size_t r = 0; r < host.clipped.size(); ++r) {
    INFO("rank " << r);
    CHECK(host.clipped[r] == device.clipped[r]);
    CHECK(host.sums[r].squares_lo == device.sums[r].squares_lo);
    CHECK(host.sums[r].squares_hi == device.sums[r].squares_hi);
    CHECK(host.sums[r].max_abs == device.sums[r].max_abs);
  }
  REQUIRE(host.stored.size() == device.stored.size());
  for (size_t r = 0; r < host.stored.size(); ++r) {
    INFO("rank " << r << "'s compensation");
    CHECK(std::memcmp(host.stored[r].data(), device.stored[r].data(), host.stored[r].size() * sizeof(float)) == 0);
    CHECK(host.words[r] == device.words[r]);
    CHECK(std::memcmp(host.eta[r].data(), device.eta[r].data(), host.eta[r].size() * sizeof(float)) == 0);
  }
}

// Every rank's buffers for `shape`, filled from a fixed seed (values in [-4, 4], integers too);
// receive buffers start as 0xee bytes, so that what a plan leaves alone is compared as well.
std::vector<HostRank> make_ranks(const std::vector<CollArgs>& shape, uint64_t seed, bool in_place,
                                 std::vector<size_t>* offset, size_t residual_count = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<HostRank> ranks(shape.size());
  offset->assign(shape.size(), 0);
  for (size_t r = 0; r < shape.size(); ++r) {
    const CollArgs& a = shape[r];
    size_t send = 0, recv = 0;
    buffer_bytes(a, &send, &recv);
    HostRank& h = ranks[r];
    h.recv.assign(recv, 0xee);
    std::vector<uint8_t> input(send);
    const size_t es = a.element_size();
    for (size_t i = 0; i < send / es; ++i) store(a.dtype, input.data(), i, value(rng) * 0.5 + 0.125 * (i % 3));
    if (in_place) {  // the input where the call's in-place form reads it
      if (a.kind == CollKind::kAllGather) (*offset)[r] = r * a.count * es;
      std::memcpy(h.recv.data() + (*offset)[r], input.data(), send);
    } else {
      h.send = std::move(input);
    }
    if (residual_count) {
      h.residual.resize(residual_count);
      std::uniform_real_distribution<float> small(-0.01f, 0.01f);
      for (float& x : h.residual) x = small(rng);
    }
  }
  return ranks;
}

std::vector<CollArgs> make_shape(CollKind kind, int n, size_t count, DataType dtype, RedOp op, int root = 0) {
  std::vector<CollArgs> shape(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = shape[r];
    a.kind = kind, a.count = count, a.dtype = dtype, a.op = op, a.root = root, a.rank = r, a.nranks = n;
  }
  return shape;
}

// Every rank's call compresses with `codec`, its rounding keyed by (seed, step, rank).
void set_codec(std::vector<CollArgs>& shape, const kernels::CodecConfig& codec, uint64_t step) {
  for (size_t r = 0; r < shape.size(); ++r) {
    shape[r].codec = &codec;
    shape[r].rng = kernels::PhiloxKey{codec.seed, step, static_cast<uint32_t>(r), 0};
  }
}

bool in_place_allowed(CollKind kind) {
  return kind == CollKind::kAllReduce || kind == CollKind::kBroadcast || kind == CollKind::kReduce ||
         kind == CollKind::kAllGather;
}

TEST_CASE("device executor: every uncompressed algorithm gives the host executor's bits", "[device]") {
  const CollKind kinds[] = {CollKind::kAllReduce, CollKind::kBroadcast, CollKind::kReduce,  CollKind::kAllGather,
                            CollKind::kReduceScatter, CollKind::kAlltoAll, CollKind::kGather, CollKind::kScatter};
  struct Case {
    int n;
    size_t count;
    DataType dtype;
    RedOp op;
    size_t chunk;
    int depth;
  };
  const Case cases[] = {{2, 1, DataType::kFloat32, RedOp::kSum, 256, 1},
                        {3, 1000, DataType::kFloat32, RedOp::kAvg, 512, 2},
                        {4, 777, DataType::kFloat16, RedOp::kMax, 256, 3},
                        {3, 333, DataType::kInt32, RedOp::kSum, 4096, 2},
                        {1, 100, DataType::kBfloat16, RedOp::kSum, 256, 2}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    for (CollKind kind : kinds) {
      for (bool in_place : {false, true}) {
        if (in_place && !in_place_allowed(kind)) continue;
        const std::vector<CollArgs> shape = make_shape(kind, c.n, c.count, c.dtype, c.op, c.n - 1);
        for (const coll::Algorithm& algorithm : coll::algorithms()) {
          if (algorithm.collective != kind || algorithm.cannot_run(shape[0])) continue;
          INFO(coll::coll_name(kind) << " via " << algorithm.name << ", " << c.n << " ranks, " << c.count
                                     << " values, chunk " << c.chunk << ", depth " << c.depth
                                     << (in_place ? ", in place" : ""));
          std::vector<size_t> offset;
          const auto ranks = make_ranks(shape, ++seed, in_place, &offset);
          const Outcome host = run_host(ranks, shape, in_place, offset, algorithm, c.chunk, c.depth);
          for (Wire wire : {Wire::kStaged, Wire::kPeer}) {
            INFO((wire == Wire::kPeer ? "wire A (peer)" : "wire B (staged)"));
            require_same(host, run_device(ranks, shape, in_place, offset, algorithm, c.chunk, c.depth, seed, 1, wire));
          }
        }
      }
    }
  }
}

TEST_CASE("device executor: Send and Recv give the host executor's bits", "[device]") {
  std::vector<CollArgs> shape = make_shape(CollKind::kSend, 2, 1001, DataType::kFloat32, RedOp::kSum);
  shape[0].peer = 1;
  shape[1].kind = CollKind::kRecv, shape[1].peer = 0;
  const coll::Algorithm* send = coll::find_algorithm(CollKind::kSend, "direct");
  REQUIRE(send);
  // Both ranks' plans come from their own kind's entry: run them through one Algorithm whose make
  // dispatches on the arguments.
  static const coll::Algorithm kSendRecv = {
      "direct", CollKind::kSend, "", "", 0, [](const CollArgs&) -> const char* { return nullptr; },
      [](const CollArgs& a, const coll::PlanOptions& o) {
        return coll::find_algorithm(a.kind, "direct")->make(a, o);
      }};
  std::vector<size_t> offset;
  const auto ranks = make_ranks(shape, 99, false, &offset);
  const Outcome host = run_host(ranks, shape, false, offset, kSendRecv, 1024, 2);
  require_same(host, run_device(ranks, shape, false, offset, kSendRecv, 1024, 2, 5));
  // Point-to-point calls take the staged wire even where a peer wire exists.
  require_same(host, run_device(ranks, shape, false, offset, kSendRecv, 1024, 2, 5, 1, Wire::kPeer));
}

TEST_CASE("device executor: compressed Send and Recv (q, aq) give the host executor's bits", "[device]") {
  static const coll::Algorithm kSendRecv = {
      "compressed", CollKind::kSend, "", "", 0, [](const CollArgs&) -> const char* { return nullptr; },
      [](const CollArgs& a, const coll::PlanOptions& o) {
        return coll::find_algorithm(a.kind, "compressed")->make(a, o);
      }};
  struct Case {
    const char* codec;
    size_t count;
    DataType dtype;
  };
  const Case cases[] = {{"q4", 5001, DataType::kFloat32},
                        {"aq4:channels=32", 32 * 70, DataType::kFloat32},
                        {"aq8:channels=100,rows=0", 100 * 13, DataType::kBfloat16},
                        {"aq2:channels=7", 7 * 300, DataType::kFloat16}};
  uint64_t seed = 4000;
  for (const Case& c : cases) {
    INFO(c.codec);
    const kernels::CodecConfig codec = kernels::parse_codec_spec(c.codec);
    std::vector<CollArgs> shape = make_shape(CollKind::kSend, 2, c.count, c.dtype, RedOp::kSum);
    shape[0].peer = 1;
    shape[1].kind = CollKind::kRecv, shape[1].peer = 0;
    set_codec(shape, codec, 2);
    std::vector<size_t> offset;
    const auto ranks = make_ranks(shape, ++seed, false, &offset);
    const Outcome host = run_host(ranks, shape, false, offset, kSendRecv, 2048, 2);
    CHECK(host.recv[1] != ranks[1].recv);  // something arrived
    require_same(host, run_device(ranks, shape, false, offset, kSendRecv, 2048, 2, seed));
  }
}

TEST_CASE("device executor: compressed all-reduce, allgather and reduce-scatter give the host's bits", "[device]") {
  struct Case {
    CollKind kind;
    const char* algorithm;
    const char* codec;
    int n;
    size_t count;
    DataType dtype;
    bool error_feedback;
  };
  const Case cases[] = {
      {CollKind::kAllReduce, "ring_compressed", "q8", 3, 1000, DataType::kFloat32, false},
      {CollKind::kAllReduce, "ring_compressed", "q4:round=stochastic", 4, 999, DataType::kBfloat16, true},
      {CollKind::kAllReduce, "sra_compressed", "q8", 4, 4097, DataType::kFloat32, true},
      {CollKind::kAllReduce, "sra_compressed", "fp16", 2, 300, DataType::kFloat16, false},
      {CollKind::kAllGather, "compressed_ring", "q8", 3, 500, DataType::kFloat32, false},
      {CollKind::kReduceScatter, "compressed_pairwise", "q6", 3, 400, DataType::kFloat32, false},
      // QSDP's learned levels (levels.h)
      {CollKind::kAllGather, "compressed_ring", "q2:bucket=64,levels=0/0.125/0.6/1,round=shift", 3, 500,
       DataType::kFloat32, false},
      {CollKind::kReduceScatter, "compressed_pairwise", "q3:levels=0/0.01/0.05/0.2/0.5/0.7/0.95/1,round=stochastic", 4,
       700, DataType::kBfloat16, false},
      {CollKind::kAllReduce, "ring_compressed", "q2:levels=0/0.3/0.4/1", 3, 999, DataType::kFloat32, true},
  };
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    const kernels::CodecConfig codec = kernels::parse_codec_spec(c.codec);
    std::vector<CollArgs> shape = make_shape(c.kind, c.n, c.count, c.dtype, RedOp::kSum);
    set_codec(shape, codec, 3);
    const coll::Algorithm* algorithm = coll::find_algorithm(c.kind, c.algorithm);
    REQUIRE(algorithm);
    INFO(c.algorithm << " " << c.codec << ", " << c.n << " ranks" << (c.error_feedback ? ", error feedback" : ""));
    REQUIRE(algorithm->cannot_run(shape[0]) == nullptr);
    size_t send = 0, recv = 0;
    buffer_bytes(shape[0], &send, &recv);
    std::vector<size_t> offset;
    const auto ranks = make_ranks(shape, ++seed, false, &offset, c.error_feedback ? send / shape[0].element_size() : 0);
    for (int depth : {1, 3}) {
      const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 1024, depth);
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed));
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed, 1, Wire::kPeer));
      if (c.error_feedback) CHECK(host.residual[0] != ranks[0].residual);  // the feedback ran
    }
  }
}

TEST_CASE("device executor: non-finite values are counted on the device, once per collective", "[device]") {
  const kernels::CodecConfig codec = kernels::parse_codec_spec("q8");
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 3, 600, DataType::kFloat32, RedOp::kSum);
  for (int r = 0; r < 3; ++r) shape[r].codec = &codec;
  std::vector<size_t> offset;
  auto ranks = make_ranks(shape, 7, false, &offset);
  const float inf = INFINITY, nan = NAN;
  std::memcpy(ranks[1].send.data() + 10 * sizeof(float), &inf, sizeof inf);
  std::memcpy(ranks[2].send.data() + 500 * sizeof(float), &nan, sizeof nan);
  const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "sra_compressed");
  const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 512, 2);
  const Outcome device = run_device(ranks, shape, false, offset, *algorithm, 512, 2, 11);
  REQUIRE(host.stats[0].nonfinite > 0);
  require_same(host, device);
}

TEST_CASE("device executor: the pool serves later calls without allocating", "[device]") {
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 3, 5000, DataType::kFloat32, RedOp::kSum);
  std::vector<size_t> offset;
  const auto ranks = make_ranks(shape, 3, false, &offset);
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  run_device(ranks, shape, false, offset, *ring, 1024, 2, 1, /*calls=*/3);
}

TEST_CASE("device executor: wire A posts nothing before every rank agrees on the call", "[device]") {
  // Rank 2 calls with another count: the agreement rounds fail the call before a transfer that the
  // tagless wire could never withdraw is posted anywhere.
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 3, 1000, DataType::kFloat32, RedOp::kSum);
  std::vector<size_t> offset;
  const auto ranks = make_ranks(shape, 5, false, &offset);
  shape[2].count = 999;
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  std::vector<std::shared_ptr<StandInWire>> wires;
  try {
    run_device(ranks, shape, false, offset, *ring, 512, 1, 3, 1, Wire::kPeer, &wires);
    FAIL("ranks that disagree completed a collective");
  } catch (const Error& e) {
    CHECK(e.code() == qcclMismatch);
  }
  REQUIRE(wires.size() == 3);
  for (const auto& w : wires) CHECK(w->groups() == 0);
}

TEST_CASE("device executor: wire A posts two collectives in call order on every rank", "[device]") {
  // The communicator starts collective k+1 once k has started its last fragment. On the tagless
  // wire that must mean "posted": here the even ranks leave k alone for a while once it started (a
  // driver busy elsewhere, a slow peer), so k+1 (of another size) would reach the wire first there,
  // and k first on the odd ranks, if it could start before k posted.
  const int n = 4;
  sim::SimNetwork net(n, false);
  StandInFabric fabric(n);
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank " + std::to_string(r));
  std::vector<std::shared_ptr<StandInDevice>> devices;
  std::vector<std::unique_ptr<sim::SimTransport>> transports;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  std::vector<std::array<std::unique_ptr<Execution>, 2>> ops(n);
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  const size_t counts[2] = {1000, 600};
  std::vector<std::array<void*, 2>> buffers(n);
  for (int r = 0; r < n; ++r) {
    devices.push_back(std::make_shared<StandInDevice>(31 + static_cast<uint64_t>(r)));
    transports.push_back(std::make_unique<sim::SimTransport>(net, r));
    executors.push_back(std::make_unique<DeviceExecutor>(*transports[r], devices[r],
                                                         std::make_shared<StandInWire>(fabric, *devices[r], r),
                                                         HostExecutorOptions{2, false}, &names));
    for (int k = 0; k < 2; ++k) {
      std::vector<float> ones(counts[k], static_cast<float>(r + 1));
      buffers[r][k] = devices[r]->allocate(Device::Memory::kDevice, counts[k] * sizeof(float));
      devices[r]->upload(buffers[r][k], ones.data(), counts[k] * sizeof(float));
      CollArgs a = make_shape(CollKind::kAllReduce, n, counts[k], DataType::kFloat32, RedOp::kSum)[r];
      a.sendbuf = a.recvbuf = buffers[r][k];
      OperationIdentity id;
      id.sequence = 7 + static_cast<uint64_t>(k);
      id.header = FrameHeader::for_call(a, id.sequence, 0);
      id.expected = id.header;
      ops[r][k] = executors[r]->launch(*ring, ring->make(a, coll::PlanOptions{1 << 20}), id, nullptr);
    }
  }
  for (int idle = 0, pass = 0;; ++pass) {
    bool moved = net.progress(), all = true;
    for (int r = 0; r < n; ++r) {
      moved |= devices[r]->run_some();
      for (int k = 0; k < 2; ++k) {
        if (ops[r][k]->finished() || (k == 1 && !ops[r][0]->started_every_fragment())) continue;
        if (k == 0 && r % 2 == 0 && ops[r][0]->started() && pass < 200) continue;
        moved |= ops[r][k]->advance();
      }
      all &= ops[r][0]->finished() && ops[r][1]->finished();
    }
    if (all) break;
    idle = moved || pass < 200 ? 0 : idle + 1;
    REQUIRE(idle < 1000);
  }
  CHECK(fabric.idle());
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 2; ++k) {
      std::vector<float> out(counts[k]);
      devices[r]->download(out.data(), buffers[r][k], counts[k] * sizeof(float));
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 10.0f; }));  // 1 + 2 + 3 + 4
      devices[r]->release(Device::Memory::kDevice, buffers[r][k]);
    }
}

TEST_CASE("device executor: a call on an older one's buffers may start once the older queued all its steps",
          "[device]") {
  // Two in-place all-reduces of one buffer on the staged wire, each one fragment, driven as the
  // communicator drives them (Comm::drive_until: a pipeline slot, the older started every fragment;
  // Comm::waits_for_its_buffers: the older queued all its steps). A started fragment queues its
  // steps after a receive only when the message arrives, so the second call's first copy of the
  // buffer would be queued before the first call's sum was written into it (every value wrong when
  // the second call started on the started fragment alone).
  const int n = 2;
  const size_t count = 4096;
  sim::SimNetwork net(n, false);
  std::vector<std::string> names = {"rank 0", "rank 1"};
  std::vector<std::shared_ptr<StandInDevice>> devices;
  std::vector<std::unique_ptr<sim::SimTransport>> transports;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  std::vector<void*> buffers(n);
  std::vector<std::array<std::unique_ptr<Execution>, 2>> ops(n);
  const coll::Algorithm* ring = coll::find_algorithm(CollKind::kAllReduce, "ring");
  for (int r = 0; r < n; ++r) {
    devices.push_back(std::make_shared<StandInDevice>(41 + static_cast<uint64_t>(r)));
    transports.push_back(std::make_unique<sim::SimTransport>(net, r));
    executors.push_back(
        std::make_unique<DeviceExecutor>(*transports[r], devices[r], nullptr, HostExecutorOptions{2, false}, &names));
    std::vector<float> x(count, static_cast<float>(r + 1));
    buffers[r] = devices[r]->allocate(Device::Memory::kDevice, count * sizeof(float));
    devices[r]->upload(buffers[r], x.data(), count * sizeof(float));
    for (int k = 0; k < 2; ++k) {
      CollArgs a = make_shape(CollKind::kAllReduce, n, count, DataType::kFloat32, RedOp::kSum)[r];
      a.sendbuf = a.recvbuf = buffers[r];
      OperationIdentity id;
      id.sequence = 7 + static_cast<uint64_t>(k);
      id.header = FrameHeader::for_call(a, id.sequence, 0);
      id.expected = id.header;
      ops[r][k] = executors[r]->launch(*ring, ring->make(a, coll::PlanOptions{count * sizeof(float)}), id, nullptr);
    }
  }
  bool window = false;  // the first call had started every fragment and not queued all its steps
  for (int idle = 0;;) {
    bool moved = net.progress(), all = true;
    for (int r = 0; r < n; ++r) {
      moved |= devices[r]->run_some();
      Execution& first = *ops[r][0];
      window |= first.started_every_fragment() && !first.queued_all();
      if (!first.finished()) moved |= first.advance();
      if (!ops[r][1]->finished() && first.started_every_fragment() && first.queued_all())
        moved |= ops[r][1]->advance();
      all &= first.finished() && ops[r][1]->finished();
    }
    if (all) break;
    idle = moved ? 0 : idle + 1;
    REQUIRE(idle < 1000);
  }
  CHECK(window);
  for (int r = 0; r < n; ++r) {
    std::vector<float> out(count);
    devices[r]->download(out.data(), buffers[r], count * sizeof(float));
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 6.0f; }));  // (1 + 2) twice
    devices[r]->release(Device::Memory::kDevice, buffers[r]);
  }
}

TEST_CASE("device executor: IntSGD's ring gives the host's bits, clips and sums on both wires", "[device]") {
  struct Case {
    const char* codec;
    int n;
    size_t count;
    DataType dtype;
    RedOp op;
    float alpha;  // large enough that some values clip
    bool exact;   // the state's first round: a float ring all-reduce, no integers
  };
  const Case cases[] = {
      {"int8:alpha=1", 3, 1000, DataType::kFloat32, RedOp::kAvg, 40.0f, false},
      {"int8:alpha=1,round=stochastic", 4, 777, DataType::kBfloat16, RedOp::kSum, 10.0f, false},
      {"int16:alpha=1", 2, 1500, DataType::kFloat16, RedOp::kAvg, 6000.0f, false},
      {"int32:alpha=1,round=stochastic", 3, 999, DataType::kFloat32, RedOp::kSum, 3e8f, false},
      {"int8:alpha=1", 1, 300, DataType::kFloat32, RedOp::kAvg, 20.0f, false},
      {"int16:alpha=1", 3, 800, DataType::kFloat32, RedOp::kAvg, 1.0f, true},
  };
  uint64_t seed = 2000;
  for (const Case& c : cases) {
    const kernels::CodecConfig codec = kernels::parse_codec_spec(c.codec);
    std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, c.n, c.count, c.dtype, c.op);
    set_codec(shape, codec, 5);
    std::vector<size_t> offset;
    auto ranks = make_ranks(shape, ++seed, false, &offset);
    for (HostRank& h : ranks) h.intsgd_round = coll::IntsgdRound{c.exact, c.alpha};
    const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "intsgd");
    REQUIRE(algorithm);
    for (int depth : {1, 3}) {
      INFO(c.codec << ", " << c.n << " ranks, " << c.count << " values, alpha " << c.alpha << ", depth " << depth
                   << (c.exact ? ", exact round" : ""));
      const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 1024, depth);
      if (!c.exact && c.n > 1) {  // the sums were decoded, and the test clips some values
        CHECK(host.sums[0].squares_lo + host.sums[0].squares_hi > 0);
        CHECK(host.clipped[0] + host.clipped[c.n - 1] > 0);
      }
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed));
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed, 1, Wire::kPeer));
    }
  }
}

TEST_CASE("device executor: IntSGD's taint reaches every rank's decode on both wires", "[device]") {
  // A NaN and an Inf on two ranks, in two different fragments: those fragments decode to NaN on every
  // rank (the taint found by the device's encode, carried by the staged key or wire A's taint word),
  // the others decode normally; the host executor's bits and counts exactly.
  const kernels::CodecConfig codec = kernels::parse_codec_spec("int16:alpha=1");
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 4, 2000, DataType::kFloat32, RedOp::kAvg);
  set_codec(shape, codec, 1);
  std::vector<size_t> offset;
  auto ranks = make_ranks(shape, 77, false, &offset);
  for (HostRank& h : ranks) h.intsgd_round = coll::IntsgdRound{false, 100.0f};
  const float nan = NAN, inf = INFINITY;
  std::memcpy(ranks[1].send.data() + 10 * sizeof(float), &nan, sizeof nan);
  std::memcpy(ranks[3].send.data() + 1700 * sizeof(float), &inf, sizeof inf);
  const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "intsgd");
  const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 256, 2);
  REQUIRE(host.stats[0].nonfinite > 0);
  REQUIRE(host.stats[0].nonfinite < 2000);  // only the tainted fragments
  for (int r = 1; r < 4; ++r) CHECK(host.stats[r].nonfinite == host.stats[0].nonfinite);
  require_same(host, run_device(ranks, shape, false, offset, *algorithm, 256, 2, 9));
  require_same(host, run_device(ranks, shape, false, offset, *algorithm, 256, 1, 9, 1, Wire::kPeer));
}

TEST_CASE("device executor: IntSGD through aggregators (agg=switch) gives the ring's bits, staged on both wires",
          "[device]") {
  // The switch's sums are the ring's (allreduce_intsgd_switch.cc): its output, clips, sums and
  // non-finite counts on device buffers equal the host ring's; with a peer wire attached, its
  // aggregator traffic is still staged (the aggregators are no NCCL ranks). A NaN on rank 1 taints
  // its chunk through the aggregator's answer.
  const kernels::CodecConfig codec = kernels::parse_codec_spec("int8:alpha=1,agg=switch");
  const kernels::CodecConfig ring_codec = kernels::parse_codec_spec("int8:alpha=1");
  for (bool with_nan : {false, true}) {
    INFO((with_nan ? "a NaN on rank 1" : "finite"));
    std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 3, 5000, DataType::kBfloat16, RedOp::kAvg);
    std::vector<CollArgs> ring_shape = shape;
    for (int r = 0; r < 3; ++r) {
      shape[r].codec = &codec, ring_shape[r].codec = &ring_codec;
      shape[r].rng = ring_shape[r].rng = kernels::PhiloxKey{codec.seed, 4, static_cast<uint32_t>(r), 0};
    }
    std::vector<size_t> offset;
    auto ranks = make_ranks(shape, 91, false, &offset);
    for (HostRank& h : ranks) h.intsgd_round = coll::IntsgdRound{false, 40.0f};
    if (with_nan) store(DataType::kBfloat16, ranks[1].send.data(), 4000, NAN);
    const Outcome host = run_host(ranks, ring_shape, false, offset, *coll::find_algorithm(CollKind::kAllReduce, "intsgd"),
                                  2048, 2);
    CHECK(host.clipped[0] > 0);
    CHECK((host.stats[0].nonfinite > 0) == with_nan);
    const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "intsgd_switch");
    REQUIRE(algorithm);
    for (Wire wire : {Wire::kStaged, Wire::kPeer}) {
      const Outcome device = run_device(ranks, shape, false, offset, *algorithm, 2048, 2, 3, 1, wire, nullptr, 2);
      for (int r = 0; r < 3; ++r) {
        INFO("rank " << r << (wire == Wire::kPeer ? ", peer wire attached" : ""));
        CHECK(device.clipped[r] == host.clipped[r]);
        if (!with_nan) {
          CHECK(device.recv[r] == host.recv[r]);
          CHECK(device.stats[r].nonfinite == 0);
          CHECK(device.sums[r].squares_lo == host.sums[r].squares_lo);
          CHECK(device.sums[r].max_abs == host.sums[r].max_abs);
          continue;
        }
        // The switch's fragment is one chunk of 512 values (the ring's, a piece of every segment):
        // the chunk of value 4000 is NaN on every rank, the rest is the ring's wherever the ring's is
        // finite.
        CHECK(device.recv[r] == device.recv[0]);
        CHECK(device.stats[r].nonfinite == 512);
        for (size_t i = 0; i < 5000; ++i) {
          const double got = load(DataType::kBfloat16, device.recv[r].data(), i);
          const double ring = load(DataType::kBfloat16, host.recv[r].data(), i);
          if (i / 512 == 4000 / 512) REQUIRE(std::isnan(got));
          else if (!std::isnan(ring)) REQUIRE(got == ring);
          else REQUIRE(std::isfinite(got));
        }
      }
    }
  }
}

TEST_CASE("device executor: the fft all-reduce gives the host's bits, its messages of variable length staged",
          "[device]") {
  // On a device whose DeviceKernels run the fft codec (the stand-in's are the host's): payloads whose
  // lengths only the device knows, staged with their lengths, received into device buffers whose
  // lengths follow them; error feedback's residual on the device; a peer wire attached changes
  // nothing (variable lengths stay staged). The host executor's bits, clamps and wire bytes.
  struct Case {
    const char* codec;
    int n;
    size_t count;
    DataType dtype;
    RedOp op;
    bool error_feedback;
  };
  const Case cases[] = {
      {"fft:theta=0.9,bits=10,segment=1024,fallback=off", 3, 5000, DataType::kFloat32, RedOp::kAvg, false},
      {"fft:theta=0.5,bits=8,segment=777,index=coo,max=auto,fallback=off", 4, 3000, DataType::kBfloat16, RedOp::kSum,
       false},
      {"fft:theta=0.85,bits=12,segment=2048,ef=on", 2, 4099, DataType::kFloat32, RedOp::kSum, true},
      // 9 ranks: 16 transfers per fragment, more than the words a slot starts with
      {"fft:theta=0.9,bits=10,segment=512,fallback=off", 9, 2000, DataType::kFloat32, RedOp::kAvg, false},
  };
  uint64_t seed = 5000;
  bool shorter = false;  // some payloads below the codec's capacity: the lengths matter
  for (const Case& c : cases) {
    const kernels::CodecConfig codec = kernels::parse_codec_spec(c.codec);
    std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, c.n, c.count, c.dtype, c.op);
    for (int r = 0; r < c.n; ++r) shape[r].codec = &codec;
    std::vector<size_t> offset;
    auto ranks = make_ranks(shape, ++seed, false, &offset, c.error_feedback ? c.count : 0);
    const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "fft_allgather");
    REQUIRE(algorithm);
    for (int depth : {1, 3}) {
      INFO(c.codec << ", " << c.n << " ranks, depth " << depth);
      const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 1024, depth);
      CHECK(host.stats[0].bytes_sent > 0);
      shorter |= host.stats[0].bytes_sent < (c.n - 1) * codec.encoded_bytes(c.count);
      if (c.error_feedback) CHECK(host.residual[0] != ranks[0].residual);
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed));
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 1024, depth, seed, 1, Wire::kPeer));
    }
    // A NaN on the last rank: its segment is NaN on every rank, every rank's residual left alone there
    // and only there, with a segment to a fragment and with several (a 16 KiB chunk).
    store(c.dtype, ranks[c.n - 1].send.data(), c.count / 2, NAN);
    for (size_t chunk : {size_t{1024}, size_t{16384}}) {
      INFO(c.codec << ", a NaN, chunk " << chunk);
      const Outcome host = run_host(ranks, shape, false, offset, *algorithm, chunk, 2);
      REQUIRE(host.stats[0].nonfinite > 0);
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, chunk, 2, seed));
      if (!c.error_feedback) continue;
      const size_t nan_segment = c.count / 2 / codec.segment;
      for (int r = 0; r < c.n; ++r) {
        size_t kept = 0, updated = 0;
        for (size_t i = 0; i < c.count; ++i) {
          const bool same = host.residual[r][i] == ranks[r].residual[i];
          if (i / codec.segment == nan_segment) kept += same;
          else updated += !same;
        }
        CHECK(kept == codec.segment);
        CHECK(updated == c.count - codec.segment);
      }
    }
  }
  CHECK(shorter);
}

// Every rank's Marsit inputs (float32 updates, average) and a compensation with a round pending.
std::vector<HostRank> marsit_ranks(const std::vector<CollArgs>& shape, uint64_t seed, std::vector<size_t>* offset) {
  auto ranks = make_ranks(shape, seed, false, offset);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (HostRank& h : ranks) {
    const size_t count = shape[0].count, words = kernels::sign_words(count);
    h.stored.resize(count);
    for (float& x : h.stored) x = small(rng);
    h.words.resize(words);
    for (uint32_t& w : h.words) w = static_cast<uint32_t>(rng());
    h.eta.assign(words, 0.02f);
  }
  return ranks;
}

TEST_CASE("device executor: Marsit gives the host's bits and compensation on both wires", "[device]") {
  struct Case {
    const char* codec;
    int n;
    size_t count;
    uint64_t step;  // t: a multiple of k is the full-precision round
  };
  const Case cases[] = {
      {"sign:eta_s=0.25,k=4", 3, 1000, 1},         // a sign round on a ring
      {"sign:eta_s=0.25,k=4", 4, 4099, 2},         // odd words
      {"sign:eta_s=0.1,k=4,topology=torus:2x2", 4, 3000, 3},  // row and column rings
      {"sign:eta_s=0.25,k=4", 3, 1000, 4},         // the full-precision round
      {"sign:eta_s=0.25,k=4", 1, 300, 1},
  };
  uint64_t seed = 3000;
  for (const Case& c : cases) {
    const kernels::CodecConfig codec = kernels::parse_codec_spec(c.codec);
    std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, c.n, c.count, DataType::kFloat32, RedOp::kAvg);
    set_codec(shape, codec, c.step);
    std::vector<size_t> offset;
    const auto ranks = marsit_ranks(shape, ++seed, &offset);
    const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "marsit");
    REQUIRE(algorithm);
    for (int depth : {1, 3}) {
      INFO(c.codec << ", " << c.n << " ranks, " << c.count << " values, step " << c.step << ", depth " << depth);
      const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 512, depth);
      CHECK(host.stored[0] != ranks[0].stored);  // the round moved the compensation
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 512, depth, seed));
      require_same(host, run_device(ranks, shape, false, offset, *algorithm, 512, depth, seed, 1, Wire::kPeer));
    }
    // In place: the update is overwritten by the estimate.
    std::vector<HostRank> in_place = ranks;
    for (HostRank& h : in_place) h.recv = h.send, h.send.clear();
    const Outcome host = run_host(in_place, shape, true, offset, *algorithm, 512, 2);
    require_same(host, run_device(in_place, shape, true, offset, *algorithm, 512, 2, seed));
  }
}

TEST_CASE("device executor: Marsit's taint reaches every rank's decode, and its compensation is kept", "[device]") {
  // Rank 2's NaN taints its fragment on every rank (NaN out, the compensation's values put back from
  // the backup); the other fragments decode and record their round. The host executor's bits.
  const kernels::CodecConfig codec = kernels::parse_codec_spec("sign:eta_s=0.25,k=4");
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 3, 3000, DataType::kFloat32, RedOp::kAvg);
  set_codec(shape, codec, 1);
  std::vector<size_t> offset;
  auto ranks = marsit_ranks(shape, 55, &offset);
  const float nan = NAN;
  std::memcpy(ranks[2].send.data() + 2500 * sizeof(float), &nan, sizeof nan);
  const coll::Algorithm* algorithm = coll::find_algorithm(CollKind::kAllReduce, "marsit");
  // 16-byte chunks: one word (32 values) a piece, the least Marsit cuts (marsit_chunk_words): many fragments
  const Outcome host = run_host(ranks, shape, false, offset, *algorithm, 16, 2);
  REQUIRE(host.stats[0].nonfinite > 0);
  REQUIRE(host.stats[0].nonfinite < 3000);
  require_same(host, run_device(ranks, shape, false, offset, *algorithm, 16, 2, 4));
  require_same(host, run_device(ranks, shape, false, offset, *algorithm, 16, 1, 4, 1, Wire::kPeer));
}

// A method's kernel and a plan of one Compute step, as Marsit's and IntSGD's plans have.
class HostOnlyKernel final : public coll::StepKernel {
 public:
  Phase phase() const override { return Phase::kEncode; }
  const char* name() const override { return "pack"; }
  void run(const coll::step::Compute&, coll::StepContext&) const override {}
};

class ComputePlan final : public coll::Plan {
 public:
  using Plan::Plan;
  size_t fragments() const override { return 1; }
  void build(size_t, std::byte*, coll::Program& out) const override {
    out.clear();
    coll::step::Compute c{};
    c.kernel = &kernel_;
    c.count = 1;
    out.compute(c);
  }
  void links(std::vector<int>*, std::vector<int>*) const override {}
  uint64_t wire_bytes_sent() const override { return 0; }

 private:
  HostOnlyKernel kernel_;
};

TEST_CASE("device executor: a plan with a method's step kernels is refused, naming the kernel", "[device]") {
  static const coll::Algorithm kCompute = {
      "compute", CollKind::kAllReduce, "", "", 0, [](const CollArgs&) -> const char* { return nullptr; },
      [](const CollArgs& a, const coll::PlanOptions&) -> std::unique_ptr<coll::Plan> {
        return std::make_unique<ComputePlan>(a);
      }};
  std::vector<CollArgs> shape = make_shape(CollKind::kAllReduce, 1, 256, DataType::kFloat32, RedOp::kSum);
  std::vector<size_t> offset;
  const auto ranks = make_ranks(shape, 3, false, &offset);
  try {
    run_device(ranks, shape, false, offset, kCompute, 1024, 2, 1);
    FAIL("the device executor ran a host-only step kernel");
  } catch (const Error& e) {
    CHECK(e.code() == qcclInvalidUsage);
    CHECK_THAT(e.what(), Catch::Contains("step kernel 'pack' has no device implementation"));
  }
}

}  // namespace
}  // namespace qccl::test
