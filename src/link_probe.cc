#include "src/link_probe.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "src/comm.h"
#include "src/validate.h"

namespace qccl {

namespace {

constexpr size_t kFirstBytes = 64 * 1024;
constexpr size_t kLargestBytes = 64 * 1024 * 1024;
constexpr double kLongEnough = 0.05;  // seconds: a size this slow is the last
// Ethernet's payload per frame (MTU 1500): 1448 bytes of TCP payload cost 1538 on the wire, so a
// measured payload rate R is a link of R * 1538 / 1448, in QCCL_LINK_RATE's (and tc's) terms.
constexpr double kWirePerPayload = 1538.0 / 1448.0;
// The most the slope may exceed the last size's average rate (probed_link_rate).
constexpr double kMaxSlopeOverAverage = 4;

std::shared_ptr<OpRecord> transfer(Comm& comm, coll::CollKind kind, std::vector<uint8_t>& buffer, int peer) {
  auto record = std::make_shared<OpRecord>();
  const bool send = kind == coll::CollKind::kSend;
  record->args = validate_call(RawCall{kind, send ? buffer.data() : nullptr, send ? nullptr : buffer.data(),
                                       buffer.size(), qcclUint8, 0, peer},
                               comm.rank(), comm.nranks());
  record->comm = comm.shared_from_this();
  record->internal = true;  // the library's own transfer: no statistics of the caller's collectives
  comm.place(*record, /*in_group=*/false);
  comm.start(record, /*background=*/false);
  return record;
}

// One exchange of `bytes` on a leader: to `next` and from `previous` at once. Returns its seconds.
double exchange(Comm& comm, size_t bytes, int next, int previous, std::vector<uint8_t>& out,
                std::vector<uint8_t>& in) {
  using Clock = std::chrono::steady_clock;
  out.assign(bytes, 0), in.assign(bytes, 0);  // touched before the clock starts
  const auto begin = Clock::now();
  auto send = transfer(comm, coll::CollKind::kSend, out, next);
  auto recv = transfer(comm, coll::CollKind::kRecv, in, previous);
  comm.wait(*send);
  comm.wait(*recv);
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

}  // namespace

uint64_t probed_link_rate(double last_bytes, double last_seconds, double bytes, double seconds) {
  const double average = bytes / seconds;
  double rate = average;
  if (last_seconds > 0 && seconds > last_seconds) {
    // Two close timings make the slope many times the link (a 4x larger message 1% slower: 75 times
    // the average), and noise does that where both sizes take about the same time. What the slope
    // removes, the latency and a shaper's burst (milliseconds), is a small part of the last size's
    // time (50 ms, or 64 MiB on a link beyond 10 Gbit/s), so the link is at most a little faster than
    // the average: a slope beyond a few times it is noise.
    rate = std::min((bytes - last_bytes) / (seconds - last_seconds), kMaxSlopeOverAverage * average);
  }
  const double bits = rate * 8 * kWirePerPayload;  // NaN-free: seconds > 0 on every rank that calls this
  return static_cast<uint64_t>(
      std::clamp(bits, static_cast<double>(kMinLinkBits), static_cast<double>(kMaxLinkBits)));
}

LinkProbe probe_link_rate(Comm& comm) {
  const coll::NodeMap& map = comm.node_map();
  const int nodes = map.nodes(), node = map.node_of(comm.rank());
  const bool leader = map.leader(node) == comm.rank();
  const int next = map.leader((node + 1) % nodes), previous = map.leader((node + nodes - 1) % nodes);
  std::vector<uint8_t> out, in;
  std::vector<double> times(static_cast<size_t>(comm.nranks()));
  double last_bytes = 0, last_seconds = 0;
  LinkProbe probe;
  for (size_t bytes = kFirstBytes;; bytes *= 4) {
    // The faster of two exchanges (a loss and its retransmission slow one down, never speed it up);
    // a member's time is 0: the leaders' are what counts.
    double seconds = 0;
    if (leader) {
      const double first = exchange(comm, bytes, next, previous, out, in);
      seconds = std::min(first, exchange(comm, bytes, next, previous, out, in));
    }
    comm.allgather_bytes(&seconds, times.data(), sizeof seconds);
    const double slowest = *std::max_element(times.begin(), times.end());
    const double size = static_cast<double>(bytes);
    probe.bits_per_s = probed_link_rate(last_bytes, last_seconds, size, slowest);
    probe.description += format("%s%zu KiB %.2f ms", probe.description.empty() ? "" : ", ", bytes / 1024,
                                slowest * 1e3);
    if (slowest >= kLongEnough || bytes >= kLargestBytes) break;
    last_bytes = size, last_seconds = slowest;
  }
  return probe;
}

}  // namespace qccl
