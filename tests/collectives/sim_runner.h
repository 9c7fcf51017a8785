// Runs one call on every rank of a simulated network with the real executor: each rank's CollArgs
// becomes the named algorithm's plan and an Operation, and the ranks are advanced round-robin until
// all finish. A pass in which nothing moves anywhere is a deadlock and fails the test.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "src/executor.h"
#include "tests/collectives/sim_network.h"

namespace qccl::test {

struct SimRun {
  std::vector<std::unique_ptr<Operation>> ops;  // one per rank, finished
  std::vector<uint64_t> plan_bytes;             // each plan's wire_bytes_sent()
  std::vector<uint64_t> raw_bytes;              // each plan's raw_wire_bytes()
};

inline SimRun run_on_sim(const std::vector<coll::CollArgs>& args, const std::string& algorithm_name,
                         size_t chunk_bytes, int depth) {
  const int n = static_cast<int>(args.size());
  const coll::Algorithm* algorithm = coll::find_algorithm(args[0].kind, algorithm_name);
  REQUIRE(algorithm != nullptr);
  SimNetwork net(n);
  std::vector<std::unique_ptr<SimTransport>> transports;
  static std::vector<std::vector<std::byte>> scratch;  // kept alive with the returned operations
  scratch.assign(n, {});
  static std::vector<std::string> names;
  names.clear();
  for (int r = 0; r < n; ++r) names.push_back("rank " + std::to_string(r));
  SimRun out;
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << (algorithm->cannot_run(args[r]) ? algorithm->cannot_run(args[r]) : ""));
    REQUIRE(algorithm->cannot_run(args[r]) == nullptr);
    coll::PlanOptions options;
    options.chunk_bytes = chunk_bytes;
    auto plan = algorithm->make(args[r], options);
    out.plan_bytes.push_back(plan->wire_bytes_sent());
    out.raw_bytes.push_back(plan->raw_wire_bytes());
    scratch[r].resize(plan->scratch_bytes() * static_cast<size_t>(depth));
    OperationIdentity id;
    id.sequence = 7;
    id.header = FrameHeader::for_call(args[r], id.sequence, args[r].codec ? args[r].codec->hash() : 0);
    id.expected = id.header;
    transports.push_back(std::make_unique<SimTransport>(net, r));
    out.ops.push_back(std::make_unique<Operation>(*algorithm, std::move(plan), id, depth, scratch[r].data(), &names));
  }
  for (;;) {
    bool moved = net.progress(), all = true;
    for (int r = 0; r < n; ++r) {
      if (out.ops[r]->finished()) continue;
      moved |= out.ops[r]->advance(*transports[r]);
      all &= out.ops[r]->finished();
    }
    if (all) break;
    if (!moved) FAIL("deadlock: no rank can move");
  }
  CHECK(net.idle());
  return out;
}

}  // namespace qccl::test
