// gather_direct and scatter_direct run by the real executor on a simulated network: every datatype
// (bytes compared exactly), counts 0, 1 and odd, every root, in place and not, 2, 3 and 5 ranks,
// several chunk sizes; wire bytes against the closed forms (gather: count * es from every rank but
// the root; scatter: (n-1) * count * es from the root).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/types.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

}  // namespace

TEST_CASE("gather and scatter: exact bytes for every datatype, root, count and placement", "[gather][scatter]") {
  for (int n : {2, 3, 5})
    for (int dt = 0; dt < kernels::kNumDataTypes; ++dt)
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}})
        for (int root = 0; root < n; ++root)
          for (bool in_place : {false, true})
            for (size_t chunk : {size_t{512}, size_t{1} << 20}) {
              const auto dtype = static_cast<kernels::DataType>(dt);
              const size_t es = kernels::element_size(dtype), block = count * es;
              INFO("n=" << n << " " << kernels::data_type_name(dtype) << " count=" << count << " root=" << root
                        << (in_place ? " in place" : "") << " chunk=" << chunk);
              // Gather: rank r's block lands at r * block of the root's recvbuff.
              {
                std::vector<std::vector<uint8_t>> in(n), out(n, std::vector<uint8_t>(n * block, 0xee));
                std::vector<CollArgs> args(n);
                for (int r = 0; r < n; ++r) {
                  in[r] = random_bytes(block, 100 * r + count);
                  CollArgs& a = args[r];
                  a.kind = CollKind::kGather, a.count = count, a.dtype = dtype, a.rank = r, a.nranks = n, a.root = root;
                  a.recvbuf = out[r].data();
                  a.sendbuf = in[r].data();
                  if (in_place && r == root) {
                    if (block) std::memcpy(out[r].data() + r * block, in[r].data(), block);
                    a.sendbuf = out[r].data() + r * block;
                  }
                }
                const SimRun sim = run_on_sim(args, "direct", chunk, 2);
                for (int q = 0; q < n; ++q)
                  CHECK(std::vector<uint8_t>(out[root].begin() + q * block, out[root].begin() + (q + 1) * block) == in[q]);
                for (int r = 0; r < n; ++r) {
                  if (r != root) CHECK(out[r] == std::vector<uint8_t>(n * block, 0xee));  // untouched
                  CHECK(sim.ops[r]->stats().bytes_sent == (r == root ? 0 : block));
                  CHECK(sim.plan_bytes[r] == (r == root ? 0 : block));
                }
              }
              // Scatter: block r of the root's sendbuff lands in rank r's recvbuff.
              {
                const std::vector<uint8_t> source = random_bytes(n * block, 7 + count);
                std::vector<std::vector<uint8_t>> send(n, source), out(n, std::vector<uint8_t>(block, 0xee));
                std::vector<CollArgs> args(n);
                for (int r = 0; r < n; ++r) {
                  CollArgs& a = args[r];
                  a.kind = CollKind::kScatter, a.count = count, a.dtype = dtype, a.rank = r, a.nranks = n, a.root = root;
                  a.sendbuf = send[r].data();
                  a.recvbuf = in_place && r == root ? send[r].data() + r * block : out[r].data();
                }
                const SimRun sim = run_on_sim(args, "direct", chunk, 2);
                for (int r = 0; r < n; ++r) {
                  const uint8_t* got = static_cast<const uint8_t*>(args[r].recvbuf);
                  CHECK(std::vector<uint8_t>(got, got + block) ==
                        std::vector<uint8_t>(source.begin() + r * block, source.begin() + (r + 1) * block));
                  CHECK(sim.ops[r]->stats().bytes_sent == (r == root ? (n - 1) * block : 0));
                }
                CHECK(send[root] == source);  // the root's sendbuff is only read
              }
            }
}

}  // namespace qccl::test
