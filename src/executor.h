// Executors: what runs a Plan. The communicator hands each call's plan to its Executor and drives the
// Execution it gets back; the plan never knows which executor runs it, so the same plans can run on
// the host over UCX (HostExecutor, here), on a GPU stream over NCCL point-to-point, or on a timed
// simulation of a cluster. DeviceExecutor (below) runs them on device memory.
//
// An Execution is a passive state machine: advance() does whatever can be done without blocking (post
// transfers, test them, run reductions and codec steps) and returns whether anything moved. The
// communicator's drive loop calls advance() on the active executions (collectives in call order,
// sharing the pipeline slots through set_fragment_limit), and blocks on the executor's event
// descriptor when nothing moves. Hot-path budget per fragment: no allocation (the Program is
// rebuilt in place; slot tables grow only when a fragment needs more than any before), no system call
// beyond the transport's own, no lock.
//
// Frame headers (src/frame.h) travel on the plan's links (Plan::links): message 0 to every rank the
// plan sends to, checked before any payload from that peer is used. That is enough when every
// rank's output depends on every other rank's data, which then reaches it only through checked
// links. It is not enough for the rooted collectives (Broadcast, Reduce, Gather and Scatter): data
// flows one way, from or to the root, so ranks that disagree (on the root above all, which changes
// the plan's shape) may exchange nothing at all, and an agreeing rank may complete before anyone
// has seen the disagreement. Their headers therefore also go through ceil(log2 n) agreement rounds,
// as in a dissemination barrier: in round k a rank sends its header to rank + 2^k and receives from
// rank - 2^k (mod n; round 0 is the ring), and it sends round k only after it has checked rounds
// 0 .. k-1. A checked round k thus vouches for the 2^k ranks before the sender as well, so a rank
// that has checked every round knows that every rank announced the same header. The operation
// finishes only then: a disagreement anywhere fails the rank that sees it (qcclMismatch, which the
// control plane relays to every rank), while every other rank waits for a round that never comes
// and learns of it through the relay. The payload does not wait for the rounds; only completion
// does. On the device executor's wire A, whose transfers cannot be withdrawn, every collective runs
// the rounds, and its payload waits for them too (DeviceExecutor). Other calls send no rounds, but
// a collective that has made no progress for a while listens for round 0 from rank - 1, in case a
// rank there called one with rounds where this one called one without (their plans may share no
// link either).
//
// Payload keys (src/message_key.h) carry the fragment, not a per-message id: plans are ordered (plan.h),
// so the messages of one fragment between two ranks match in program order, and fragments in flight
// differ. Message 0 is the frame header, 1 + (f mod 0xffef) fragment f's payload, 0xfff0 + k agreement
// round k; no two fragments in flight are 0xffef or more apart, so keys never collide, at any rank
// count. In ordered mode (for transports without tags, like NCCL point-to-point) a fragment also posts
// its transfers to a peer only after every earlier fragment has posted its own to that peer, so each
// pair of ranks posts its messages in one agreed order.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "src/device.h"
#include "src/frame.h"
#include "transports/transport.h"

namespace qccl {

struct OperationIdentity {
  uint64_t sequence = 0;  // the collective's number on the communicator (per peer for point-to-point)
  bool p2p = false;
  bool keyed = false;  // a keyed delta call (point-to-point; its keys: src/message_key.h)
  FrameHeader header;    // what this rank sends on each of its links
  FrameHeader expected;  // what it expects from each peer (its `receiver`: this rank's role, not compared)
};

// What an execution measured, read once it finished.
struct ExecutionStats {
  uint64_t bytes_sent = 0;  // payload bytes this rank put on the wire (actual lengths)
  uint64_t inter_node_bytes_sent = 0;  // the part sent to ranks of other nodes (CollArgs::nodes)
  uint64_t bytes_received = 0;
  double encode_seconds = 0;  // compressed collectives: time in Encode steps and a method's encode kernels...
  // ...and in the other steps of a codec's float32 path: DecodeAdd, DecodeOut, Load, AddFloat, Divide,
  // Store, ErrorFeedback, and a method's other kernels (StepKernel::Phase)
  double decode_seconds = 0;
  double reduce_seconds = 0;  // the data steps outside a codec: uncompressed sums, copies, averages
  double post_seconds = 0;    // posting payload transfers to the transport (isend, irecv)
  size_t nonfinite = 0;       // output values that decoded to NaN or Inf (the same on every rank)
};

// One call being run by an executor.
class Execution {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Execution() = default;

  // Does what can be done without blocking; true when anything moved. Throws Error (qcclMismatch,
  // qcclRemoteError, ...) when the collective cannot complete.
  virtual bool advance() = 0;
  virtual bool started() const = 0;
  virtual bool finished() const = 0;
  // Pipeline slots across operations (the communicator runs its collectives in call order and
  // hands the slots the older ones leave free to the next): the most fragments this execution may
  // have in flight from now on. It starts a new fragment only while it has fewer than `limit` in
  // flight, and never withdraws one it has started. Default: its pipeline depth.
  virtual void set_fragment_limit(size_t limit) = 0;
  // Fragments started and not yet completed (0 before the execution starts and once it finished).
  virtual size_t fragments_in_flight() const = 0;
  // Whether every fragment of the plan has been started (true for a plan of none, once started).
  virtual bool started_every_fragment() const = 0;
  // Whether a later call may use this one's buffers: it has finished, or (on the device) every step
  // it will take is queued on the device's stream, which runs a later call's steps after them. A
  // started fragment is not enough on the staged wire: its steps after a receive are queued when the
  // message arrives.
  virtual bool queued_all() const = 0;
  // Withdraws every outstanding transfer (after a failure).
  virtual void cancel() = 0;
  // For timeout messages: what the first blocked fragment waits for.
  virtual std::string waiting_for() const = 0;
  virtual Clock::time_point last_progress() const = 0;
  virtual const ExecutionStats& stats() const = 0;

  virtual const coll::Algorithm& algorithm() const = 0;
  virtual const coll::Plan& plan() const = 0;
  virtual const OperationIdentity& identity() const = 0;
  // Before the execution starts: the codec scale its frame headers announce (FrameHeader::codec_scale).
  virtual void set_codec_scale(double scale) = 0;
  // Before the execution starts: its scratch (Executor::launch), so that a call queued behind others
  // holds none until it runs.
  virtual void set_scratch(std::byte* scratch) = 0;
};

// Runs plans. Not thread-safe: the communicator's drive lock serializes every call.
class Executor {
 public:
  virtual ~Executor() = default;
  // Binds one call's plan. `scratch` must hold scratch_bytes(plan) bytes and outlive the execution;
  // it may be null when Execution::set_scratch gives it before the first advance().
  virtual std::unique_ptr<Execution> launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                            const OperationIdentity& identity, std::byte* scratch) = 0;
  virtual size_t scratch_bytes(const coll::Plan& plan) const = 0;
  // Moves the wire; true when something happened.
  virtual bool progress() = 0;
  // A descriptor that becomes readable when progress() has work (-1: poll only); block on it only after
  // arm() returned true.
  virtual int event_fd() const = 0;
  virtual bool arm() = 0;
  virtual std::string describe() const = 0;
  // After Execution::cancel()s, before their calls end: waits (a bounded time) until the transport is
  // done with the receive buffers it could not withdraw (transport.h, settle), so that no cancelled
  // call's output is written after it returned.
  virtual void settle_cancelled() {}
};

// Calibration (qccl_sim calibrate): the time a method's step kernels took, per codec name and kernel
// ("sign" -> "merge"), with the units they did (Compute::count), summed over an executor's steps.
struct StepProfile {
  struct Entry {
    double seconds = 0;
    double units = 0;
  };
  std::map<std::string, std::map<std::string, Entry>> kernels;
};

struct HostExecutorOptions {
  int depth = 2;         // fragments in flight per execution (QCCL_PIPELINE_DEPTH)
  bool ordered = false;  // post each peer's transfers in fragment order (see above)
  StepProfile* profile = nullptr;  // when set, Compute steps are timed into it
};

// The pipeline slots an execution of `plan` makes at pipeline depth `depth`, each with a scratch
// stride of its own: one per fragment it may have in flight, one when its fragments run in sequence,
// and never more than it has fragments. Executions and the scratch sized for them both take it from
// here, so that a one-fragment call holds one stride however deep the pipeline.
inline size_t pipeline_slots(const coll::Plan& plan, int depth) {
  const size_t most = plan.fragments_in_sequence() ? 1 : static_cast<size_t>(std::max(depth, 1));
  return std::min(most, std::max<size_t>(plan.fragments(), 1));
}

// The host executor: plans on host memory, numerics on this CPU, bytes through a Transport.
// `names` gives "rank 3 (host:pid)" for error messages and must outlive the executor. Destroy the
// transport before the executor: buffers of transfers a failure abandoned stay with the executor
// until then.
class HostExecutor final : public Executor {
 public:
  HostExecutor(transport::Transport& transport, const HostExecutorOptions& options,
               const std::vector<std::string>* names)
      : transport_(transport), options_(options), names_(names) {}

  std::unique_ptr<Execution> launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                    const OperationIdentity& identity, std::byte* scratch) override;
  size_t scratch_bytes(const coll::Plan& plan) const override {  // a stride for each of the execution's slots
    return plan.scratch_stride() * pipeline_slots(plan, options_.depth);
  }
  bool progress() override { return transport_.progress(); }
  int event_fd() const override { return transport_.event_fd(); }
  bool arm() override { return transport_.arm(); }
  std::string describe() const override;
  // The rest of a message already in flight arrives within milliseconds; a peer that died mid-message
  // never sends it, and only then is the bound reached.
  void settle_cancelled() override { transport_.settle(2.0); }

 private:
  transport::Transport& transport_;
  HostExecutorOptions options_;
  const std::vector<std::string>* names_;
  std::vector<std::unique_ptr<uint8_t[]>> abandoned_;  // frame headers of cancelled executions
};

// The device executor: plans whose buffers are device memory. A plan's data steps are enqueued, in
// program order, on the device's stream (Device::launch: the same bits as the host's numerics).
// Fragments, frame headers, agreement rounds and pipelining are the host executor's own code. Its
// transfers take one of two wires:
//   - wire B (no PeerWire): the Transport, as the host executor's do, each message crossing a pinned
//     host buffer: a send's bytes are copied there on the stream, after the steps that wrote them,
//     and the message is posted once the device reached that copy; a received message is copied to
//     its device destination on the stream, before the steps after its Wait. Chunk c+1's kernels run
//     while chunk c is on the wire, and the host waits for the device only where a send needs its
//     bytes. A message of variable length, whose length only the device knows, crosses at its
//     capacity with its length word beside it and is posted at that length; a received one's length
//     follows its bytes to the device. Point-to-point calls, plans with aggregator processes and plans
//     with messages of variable length always take it.
//   - wire A (a PeerWire, NCCL point-to-point): the transfers themselves are posted on the stream,
//     a fragment's consecutive transfers in one group, so that a ring step's send and receive
//     progress together; the group ends at a data step and at a Wait for a receive (what follows may
//     use the bytes, a send too), while a Wait for a send is empty (the stream's order). The wire has
//     no tags and a posted transfer cannot be withdrawn, so nothing is posted before every rank is
//     known to have called the same collective (the agreement rounds of executor.h run for every
//     collective); one fragment at a time in ordered mode (one stream runs kernels and transfers in
//     turn, so more would not overlap). Fixed-length messages only.
// A method's Compute steps run as their kernels' device form (StepKernel::launch, enqueued through
// the Device: collectives/device_kernels.h); a kernel without one fails the call (Comm refuses such
// calls first). A fragment of such a plan keeps its taint (NaN or Inf met here or at a peer) in a
// device word as well as on the host: a staged send copies the word to pinned memory beside its bytes
// and sets its key's taint bit from it when it is posted; on wire A, which has no keys, every send is
// followed by the sender's taint word and every receive by the peer's, added to the slot's once the
// receive is waited for. So a decode finds the taint without a host round trip.
// Scratch and staging buffers come from the executor's pool (allocated once, reused). An execution
// finishes once the device reached its last step: its counters (coll::DeviceCounters: the non-finite
// count and what a method's kernels count) come back then, once per collective (the plan absorbs
// the method's), and the caller's stream (CollArgs::stream) waits for the collective's work.
class DeviceExecutor final : public Executor {
 public:
  // A block of the pool.
  struct Block {
    Device::Memory kind = Device::Memory::kDevice;
    void* p = nullptr;
    size_t bytes = 0;
  };
  // What executions share with the executor and may outlive it with (a caller's request may hold
  // one): the device, the wire, and the pool, whose blocks are given back once the stream no longer
  // uses them and taken again smallest-that-fits, all released when the last owner goes.
  // Thread-safe: executions end on whichever thread drops them.
  class Shared {
   public:
    Shared(std::shared_ptr<Device> device, std::shared_ptr<PeerWire> wire)
        : device_(std::move(device)), wire_(std::move(wire)) {}
    ~Shared();
    Shared(const Shared&) = delete;
    Shared& operator=(const Shared&) = delete;
    Block take(Device::Memory kind, size_t bytes);
    // An empty block is ignored; an abandoned one (a cancelled transfer's staging, which the
    // transport may still read or write) is released only with the pool, after the transport is gone.
    void give(const Block& block, bool abandoned = false);
    Device& device() const { return *device_; }
    PeerWire* wire() const {
      std::lock_guard<std::mutex> lock(mu_);
      return wire_.get();
    }
    void attach(std::shared_ptr<PeerWire> wire) {
      std::lock_guard<std::mutex> lock(mu_);
      wire_ = std::move(wire);
    }

   private:
    std::shared_ptr<Device> device_;
    std::shared_ptr<PeerWire> wire_;
    mutable std::mutex mu_;
    std::vector<Block> free_[2];  // device, pinned
    std::vector<Block> abandoned_;
  };

  // Whether a call takes wire A once there is one: collectives among the ranks; point-to-point calls
  // and plans that exchange data with aggregator processes, which are no NCCL ranks, stay staged.
  // Messages of variable length stay staged too (NCCL's receives take fixed lengths).
  static bool on_wire(const OperationIdentity& identity, const coll::Plan& plan) {
    return !identity.p2p && !plan.uses_aggregators() && !plan.variable_length();
  }

  // `wire` null: wire B (until attach_wire). With a wire, collectives run with depth 1, ordered.
  DeviceExecutor(transport::Transport& transport, std::shared_ptr<Device> device, std::shared_ptr<PeerWire> wire,
                 const HostExecutorOptions& options, const std::vector<std::string>* names);

  std::unique_ptr<Execution> launch(const coll::Algorithm& algorithm, std::unique_ptr<coll::Plan> plan,
                                    const OperationIdentity& identity, std::byte* scratch) override;
  size_t scratch_bytes(const coll::Plan&) const override { return 0; }  // its own, in device memory
  bool progress() override { return transport_.progress(); }
  int event_fd() const override { return transport_.event_fd(); }
  // event_fd() is the transport's alone: a caller of this interface must not sleep while the device
  // has work (the communicator polls the device's own descriptor too: arm_device, device_event_fd).
  bool arm() override { return !device_busy() && transport_.arm(); }
  bool device_busy() { return shared_->device().busy(); }
  // The device's side of the drive loop's sleep (Device::arm, Device::event_fd).
  bool arm_device() { return shared_->device().arm(); }
  int device_event_fd() { return shared_->device().event_fd(); }
  // Wire A for the collectives launched from now on (the communicator chooses it at its first
  // collective on device buffers, after point-to-point calls may already have run).
  void attach_wire(std::shared_ptr<PeerWire> wire) { shared_->attach(std::move(wire)); }
  bool has_wire() const { return shared_->wire() != nullptr; }
  std::string describe() const override;

 private:
  transport::Transport& transport_;
  std::shared_ptr<Shared> shared_;
  HostExecutorOptions options_;          // wire B, and point-to-point calls
  HostExecutorOptions wire_options_;     // wire A
  const std::vector<std::string>* names_;
  std::vector<std::unique_ptr<uint8_t[]>> abandoned_;
};

// The host's numerics of one data step (coll::is_data_step): what the host executor runs, and what a
// device's stand-in runs in the device's place. Returns the non-finite values it counted (Store and
// DecodeOut). Encode stores its length where the step asks.
size_t run_data_step(const coll::Step& data_step, const coll::CollArgs& args);

}  // namespace qccl
