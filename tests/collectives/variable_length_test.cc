// Variable-length messages and many transfers per fragment (collectives/plan.h, src/executor.cc): a
// test-only plan in which every rank sends every other rank, in each fragment, a message whose
// length an earlier step computes (zero included) and receives each into a buffer of fixed capacity
// that learns the actual length, with 2(n-1) transfers in flight per fragment. Checked: every byte
// and length arrives, the wire accounting follows the actual lengths, and the same holds in ordered
// mode on a network that matches payload in send order.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "sim/network.h"
#include "src/executor.h"

namespace qccl::test {
namespace {

using sim::SimNetwork;
using sim::SimTransport;

constexpr size_t kCapacity = 40;

// The length rank `from` sends rank `to` in fragment f: 0 .. 39 bytes, zero for some.
size_t length_of(int from, int to, size_t f) {
  return (static_cast<size_t>(from) * 7 + static_cast<size_t>(to) * 3 + f * 5) % kCapacity;
}
uint8_t byte_of(int from, int to, size_t f, size_t i) { return static_cast<uint8_t>(from * 31 + to * 17 + f * 13 + i); }

// Writes the message for peer `aux` of fragment `index` into dst and its length into *src2.
struct Fill final : coll::StepKernel {
  int rank;
  Phase phase() const override { return Phase::kEncode; }
  const char* name() const override { return "fill"; }
  void run(const coll::step::Compute& s, coll::StepContext&) const override {
    const int to = static_cast<int>(s.aux);
    const size_t n = length_of(rank, to, s.index);
    for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(s.dst)[i] = byte_of(rank, to, s.index, i);
    *static_cast<size_t*>(const_cast<void*>(s.src2)) = n;
  }
};

// Checks the message from peer `aux` of fragment `index` (src, length *src2); counts what is wrong.
struct Check final : coll::StepKernel {
  int rank;
  mutable size_t wrong = 0, checked = 0;
  Phase phase() const override { return Phase::kDecode; }
  const char* name() const override { return "check"; }
  void run(const coll::step::Compute& s, coll::StepContext&) const override {
    const int from = static_cast<int>(s.aux);
    const size_t n = *static_cast<const size_t*>(s.src2);
    ++checked;
    if (n != length_of(from, rank, s.index)) {
      ++wrong;
      return;
    }
    for (size_t i = 0; i < n; ++i) wrong += static_cast<const uint8_t*>(s.src)[i] != byte_of(from, rank, s.index, i);
  }
};

class VariableExchange final : public coll::Plan {
 public:
  VariableExchange(const coll::CollArgs& args, size_t fragments) : Plan(args), fragments_(fragments) {
    fill_.rank = check_.rank = args.rank;
  }
  size_t fragments() const override { return fragments_; }
  // Per peer: an outgoing and an incoming buffer and their lengths.
  size_t scratch_bytes() const override {
    return static_cast<size_t>(args_.nranks) * (2 * kCapacity + 2 * sizeof(size_t));
  }

  void build(size_t f, std::byte* scratch, coll::Program& p) const override {
    p.clear();
    const int n = args_.nranks, r = args_.rank;
    auto out = [&](int q) { return scratch + static_cast<size_t>(q) * 2 * kCapacity; };
    auto in = [&](int q) { return out(q) + kCapacity; };
    auto* lengths = reinterpret_cast<size_t*>(scratch + static_cast<size_t>(n) * 2 * kCapacity);
    auto sent = [&](int q) { return &lengths[2 * q]; };
    auto received = [&](int q) { return &lengths[2 * q + 1]; };
    int slot = 0;
    for (int q = 0; q < n; ++q) {  // every receive first, then every send: 2(n-1) transfers in flight
      if (q == r) continue;
      p.recv_upto(slot++, q, 0, in(q), kCapacity, received(q));
    }
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      p.compute(coll::step::Compute{&fill_, out(q), nullptr, sent(q), 1, f, static_cast<uint32_t>(q), 0, 0});
      p.send_length(slot++, q, 0, out(q), kCapacity, sent(q));
    }
    for (int s = 0; s < slot; ++s) p.wait(s);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      p.compute(coll::step::Compute{&check_, nullptr, in(q), received(q), 1, f, static_cast<uint32_t>(q), 0, 0});
    }
  }
  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.rank) send_to->push_back(q), recv_from->push_back(q);
  }
  uint64_t wire_bytes_sent() const override {
    uint64_t total = 0;
    for (size_t f = 0; f < fragments_; ++f)
      for (int q = 0; q < args_.nranks; ++q)
        if (q != args_.rank) total += length_of(args_.rank, q, f);
    return total;
  }
  const Check& check() const { return check_; }

 private:
  size_t fragments_;
  Fill fill_;
  Check check_;
};

const char* never_declines(const coll::CollArgs&) { return nullptr; }

}  // namespace

TEST_CASE(
    "variable-length messages: actual lengths arrive and are what the wire counts, with many transfers "
    "per fragment",
    "[collectives]") {
  const coll::Algorithm algorithm{
      "variable_test", coll::CollKind::kAllGather, "test only", "sum of lengths", 0, never_declines, nullptr};
  for (int n : {2, 5, 7}) {
    for (int depth : {1, 3}) {
      for (bool ordered : {false, true}) {
        INFO("n=" << n << " depth=" << depth << (ordered ? " ordered" : ""));
        SimNetwork net(n, ordered);
        std::vector<std::string> names;
        for (int r = 0; r < n; ++r) names.push_back("rank " + std::to_string(r));
        std::vector<std::unique_ptr<SimTransport>> transports;
        std::vector<std::unique_ptr<HostExecutor>> executors;
        std::vector<std::vector<std::byte>> scratch(n);
        std::vector<const VariableExchange*> plans;
        std::vector<std::unique_ptr<Execution>> runs;
        for (int r = 0; r < n; ++r) {
          coll::CollArgs args;
          args.kind = coll::CollKind::kAllGather, args.count = 1, args.rank = r, args.nranks = n;
          auto plan = std::make_unique<VariableExchange>(args, 6);
          plans.push_back(plan.get());
          transports.push_back(std::make_unique<SimTransport>(net, r));
          executors.push_back(
              std::make_unique<HostExecutor>(*transports[r], HostExecutorOptions{depth, ordered}, &names));
          scratch[r].resize(executors[r]->scratch_bytes(*plan));
          OperationIdentity id;
          id.header = FrameHeader::for_call(args, 1, 0);
          id.expected = id.header;
          runs.push_back(executors[r]->launch(algorithm, std::move(plan), id, scratch[r].data()));
        }
        for (bool all = false; !all;) {
          bool moved = net.progress();
          all = true;
          for (auto& run : runs) {
            if (run->finished()) continue;
            moved |= run->advance();
            all &= run->finished();
          }
          if (!all && !moved) FAIL("deadlock");
        }
        uint64_t sent = 0, received = 0;
        for (int r = 0; r < n; ++r) {
          CHECK(plans[r]->check().checked == 6u * static_cast<size_t>(n - 1));
          CHECK(plans[r]->check().wrong == 0);
          CHECK(runs[r]->stats().bytes_sent == plans[r]->wire_bytes_sent());
          sent += runs[r]->stats().bytes_sent;
          received += runs[r]->stats().bytes_received;
        }
        CHECK(received == sent);
      }
    }
  }
}

}  // namespace qccl::test
