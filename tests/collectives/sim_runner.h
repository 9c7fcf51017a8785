// Runs one call on every rank of a simulated network with the real host executor: each rank's
// CollArgs becomes the named algorithm's plan and an Execution, and the ranks are advanced round-robin
// until all finish. A pass in which nothing moves anywhere is a deadlock and fails the test. With
// `ordered`, the executors post each peer's transfers in fragment order and the network matches
// payload messages strictly in the order they were sent, ignoring their keys (as NCCL
// point-to-point would).
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "sim/network.h"
#include "src/executor.h"

namespace qccl::test {

using sim::SimNetwork;
using sim::SimTransport;

struct SimRun {
  std::unique_ptr<SimNetwork> net;
  std::unique_ptr<std::vector<std::string>> names;  // on the heap: the executors point at it
  std::vector<std::vector<std::byte>> scratch;
  std::vector<std::unique_ptr<SimTransport>> transports;
  std::vector<std::unique_ptr<HostExecutor>> executors;
  std::vector<std::unique_ptr<Execution>> ops;  // one per rank, finished
  std::vector<uint64_t> plan_bytes;             // each plan's wire_bytes_sent()
  std::vector<uint64_t> raw_bytes;              // each plan's raw_wire_bytes()
};

// Runs `algorithm`, which need not be registered (a test's own plan).
inline SimRun run_algorithm_on_sim(const std::vector<coll::CollArgs>& args, const coll::Algorithm& algorithm_entry,
                                   size_t chunk_bytes, int depth, bool ordered = false) {
  const int n = static_cast<int>(args.size());
  const coll::Algorithm* algorithm = &algorithm_entry;
  SimRun out;
  out.net = std::make_unique<SimNetwork>(n, ordered);
  SimNetwork& net = *out.net;
  out.scratch.assign(n, {});
  out.names = std::make_unique<std::vector<std::string>>();
  for (int r = 0; r < n; ++r) out.names->push_back("rank " + std::to_string(r));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << (algorithm->cannot_run(args[r]) ? algorithm->cannot_run(args[r]) : ""));
    REQUIRE(algorithm->cannot_run(args[r]) == nullptr);
    coll::PlanOptions options;
    options.chunk_bytes = chunk_bytes;
    auto plan = algorithm->make(args[r], options);
    out.plan_bytes.push_back(plan->wire_bytes_sent());
    out.raw_bytes.push_back(plan->raw_wire_bytes());
    out.transports.push_back(std::make_unique<SimTransport>(net, r));
    out.executors.push_back(
        std::make_unique<HostExecutor>(*out.transports[r], HostExecutorOptions{depth, ordered}, out.names.get()));
    out.scratch[r].resize(out.executors[r]->scratch_bytes(*plan));
    OperationIdentity id;
    id.sequence = 7;
    id.header = FrameHeader::for_call(args[r], id.sequence, args[r].codec ? args[r].codec->hash() : 0);
    id.expected = id.header;
    out.ops.push_back(out.executors[r]->launch(*algorithm, std::move(plan), id, out.scratch[r].data()));
  }
  for (;;) {
    bool moved = net.progress(), all = true;
    for (int r = 0; r < n; ++r) {
      if (out.ops[r]->finished()) continue;
      moved |= out.ops[r]->advance();
      all &= out.ops[r]->finished();
    }
    if (all) break;
    if (!moved) FAIL("deadlock: no rank can move");
  }
  CHECK(net.idle());
  return out;
}

inline SimRun run_on_sim(const std::vector<coll::CollArgs>& args, const std::string& algorithm_name,
                         size_t chunk_bytes, int depth, bool ordered = false) {
  const coll::Algorithm* algorithm = coll::find_algorithm(args[0].kind, algorithm_name);
  REQUIRE(algorithm != nullptr);
  return run_algorithm_on_sim(args, *algorithm, chunk_bytes, depth, ordered);
}

}  // namespace qccl::test
