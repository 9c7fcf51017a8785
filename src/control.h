// The control plane: a TCP star from every rank to rank 0 (the hub) that lives as long as the
// communicator. It carries no payload, only what keeps the job honest:
//   - liveness: a rank whose process dies closes its socket; the hub sees EOF and tells everyone,
//     and everyone sees EOF when the hub dies. A dead peer therefore fails the others at once,
//     whatever UCX transport is in use and without UCX's peer-failure mode (which would move
//     shared-memory traffic onto tcp);
//   - failure relay: a rank that detects a mismatch, a timeout or an abort reports it, and the hub
//     forwards the report, so that every rank fails the same collective with the same story. A rank
//     that leaves a failed communicator (qcclCommAbort, or qcclCommDestroy after the failure) says
//     from which collective on it leaves calls unfinished, so that its closed connection is no news
//     and the others' older calls may still finish. (Once the hub has left so, the others keep no
//     relay: a later death among them is found by QCCL_TIMEOUT.);
//   - barriers (end of init, qcclCommDestroy).
// Threads: service() is called only by the communicator's progress thread, which polls fds();
// barrier() and report_failure() may be called by any other thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/socket.h"
#include "include/qccl.h"

namespace qccl {

// What broke a communicator. A failure detected in collective #s (a mismatch, a timeout) does not
// concern collectives numbered below s, which the other ranks may already have finished; a dead peer
// or an abort concerns everything (first_sequence = 0).
struct Failure {
  qcclResult_t code = qcclSuccess;
  std::string message;
  uint64_t first_sequence = 0;

  // Whether a call fails with it: every point-to-point call (their numbers are per peer), and
  // collective #s from first_sequence on.
  bool concerns(bool p2p, uint64_t sequence) const {
    return p2p || first_sequence == 0 || sequence >= first_sequence;
  }
};

// The failures of one communicator, in the order they arrived. The first is the communicator's own
// (what it reports, what a call made from then on fails with); a call in flight fails with the first
// that concerns it. A failure is kept only where it concerns a collective that none before it did: a
// mismatch in collective #5 found after one in #9 (the calls 5 .. 8 would wait out QCCL_TIMEOUT for
// ranks that have moved on, and then report a timeout), an abort or a dead peer after either.
class Failures {
 public:
  // Returns whether `failure` was kept.
  bool add(const Failure& failure);
  bool empty() const { return kept_.empty(); }
  const Failure& first() const { return kept_.front(); }
  // The failure a call fails with, or nullptr where none concerns it (yet).
  const Failure* concerning(bool p2p, uint64_t sequence) const;

 private:
  std::vector<Failure> kept_;  // each concerns collectives older than every one before it
};

class ControlPlane {
 public:
  // Called (from the progress thread) with every failure a peer reports or the control plane detects.
  using FailureHandler = std::function<void(const Failure&)>;

  ControlPlane(int rank, int nranks, uint64_t magic, std::vector<std::string> peer_names,
               FailureHandler on_failure);

  // Hub: accepts the other nranks-1 ranks on `listener`, refusing (and logging) strangers.
  void accept_peers(net::Socket& listener, const net::Deadline& deadline);
  // Others: connects to the hub.
  void connect_to_hub(const net::Address& hub, const net::Deadline& deadline);

  std::vector<int> fds() const;
  // Reads and handles whatever has arrived on fd (progress thread only).
  void service(int fd);

  // Blocks until every rank has entered barrier() the same number of times. Throws the
  // communicator's failure if one arrives first, Error(qcclTimeout) at the deadline. After a
  // `closing` barrier (the last, in qcclCommDestroy) is released, ranks may leave at once, so a
  // closed connection from then on is a departure, not a failure.
  void barrier(const net::Deadline& deadline, bool closing = false);
  // Tells every other rank that this communicator failed here (best effort, never throws);
  // `departing`: and that this rank leaves it now, with calls from failure.first_sequence on unfinished.
  void report_failure(const Failure& failure, bool departing = false);
  // Fails this rank's barrier() waits, now and later, with `failure` (qcclCommAbort: a
  // qcclCommDestroy blocked in the closing barrier on another thread returns it), unless a failure
  // came first; returns whether this one was the first.
  bool fail_waits(const Failure& failure);
  // From now on a closed connection is a departure, not a failure (after the closing barrier).
  void begin_close();
  void close();

 private:
  struct Peer {
    int rank = -1;
    net::Socket socket;
    std::vector<uint8_t> inbox;
    // It announced its departure (report_failure's `departing`): its closed connection is then no
    // news, where a crash's fails every call (progress thread only).
    bool announced = false;
  };
  enum MessageType : uint32_t { kBarrier = 1, kRelease = 2, kFailure = 3 };

  void send(Peer& peer, MessageType type, const std::vector<uint8_t>& payload);
  void handle(Peer& from, MessageType type, const uint8_t* payload, size_t len);
  void arrive(uint64_t epoch);  // hub: one rank reached barrier `epoch`
  void fail_locally(const Failure& failure);
  void lost(Peer& peer);
  // Sends a failure report about `origin` to every peer but `except`.
  void broadcast_failure(int origin, const Failure& failure, int except, bool departing);

  const int rank_;
  const int nranks_;
  const uint64_t magic_;
  const std::vector<std::string> names_;  // "rank 3 (host:pid)" for messages
  FailureHandler on_failure_;
  std::vector<Peer> peers_;  // hub: every other rank; others: the hub only

  std::mutex mu_;  // guards everything below and socket writes
  std::condition_variable cv_;
  bool closing_ = false;
  bool failed_ = false;
  Failure failure_;
  uint64_t my_epoch_ = 0;        // barriers this rank has entered
  uint64_t released_epoch_ = 0;  // barriers completed
  uint64_t closing_epoch_ = 0;   // the closing barrier this rank entered, if any
  std::vector<uint64_t> arrived_;  // hub: per rank, the last epoch it reached
};

}  // namespace qccl
