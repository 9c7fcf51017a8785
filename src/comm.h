// The communicator: who the ranks are (bootstrap), how they talk (transport + control plane), and the
// engine that runs operations.
//
// Threads. A communicator is driven by whoever holds its drive lock: the thread blocked in a call
// (so a blocking collective runs on the caller's thread with no hand-off), or the communicator's
// progress thread, which drives non-blocking operations while the caller computes, and also
// watches the control plane for dead peers and failure reports. A caller that wants to wait asks
// the progress thread to step aside. The progress thread takes over operations that nobody drives
// 1 ms after they were left so (started in the background, or still active when a wait ended),
// unless a caller drives them by then (it holds the drive lock when the timer fires); a driver
// asleep on events wakes at that timer too, to take up calls started since. A caller that issues
// non-blocking calls back to back and waits for them one by one drives them itself, with no thread
// beside it and no trading of the drive lock (on an oversubscribed host each trade can cost a
// scheduler slice), while one that computes leaves them undriven for 1 ms at most. 100 us was too
// short for issuing 20 calls on 2 ranks on 2 cores (docs/PERF.md). The drive loop spins for
// QCCL_SPIN_US after the last event, then blocks on the transport's event descriptor, so that 8 ranks
// on 2 cores still move.
//
// Order. The collectives of a communicator run in call order through one pipeline, as on a CUDA
// stream: at most QCCL_PIPELINE_DEPTH fragments of all of them together are in flight, the oldest
// collective gets the slots first, and collective k+1 starts once collective k has started all its
// fragments and a slot is free, so the pipeline stays full across the boundary instead of draining.
// (Running every outstanding collective at once, each with its own slots, made 20 non-blocking
// 1 MiB all-reduces up to 5x slower than 20 blocking ones: docs/PERF.md.) A collective also
// completes (its request, its statistics) only after every older one has: completion order is call
// order. A collective that has not started has no timeout clock yet (QCCL_TIMEOUT counts from its
// start). Point-to-point calls stand outside the order: each runs with its own slots as soon as it
// is started, beside everything else, because ranks may post sends and receives in different orders
// (qcclGroupStart/End with several peers, qcclISend then qcclIRecv on both sides), and ordering
// them could deadlock. Calls that share a codec state also wait for the older one to finish, not
// just to start (waits_for_its_state).
//
// Device buffers. A call whose buffers are CUDA device memory (the driver says so, when the process
// has loaded it: a host-only process never pays for the check) runs on the device executor (executor.h,
// DeviceExecutor), made at the first such call, beside the host executor and over the same
// transport, on the communicator's stream (qcclCommSetStream) at the time of the call.
//
// Failure. The first failure breaks the communicator: it is recorded, reported to every peer
// through the control plane, and fails the calls in flight it concerns (a collective's: that one and
// those after it, which the others may not have finished; a dead peer's or an abort: all) and every
// call made from then on. One found later in an older collective is kept and reported in the same
// way (Failures, control.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "collectives/method.h"
#include "collectives/plan.h"
#include "include/qccl.h"
#include "src/aggregator.h"
#include "src/auto_codec.h"
#include "src/bootstrap.h"
#include "src/codec_state.h"
#include "src/control.h"
#include "src/device.h"
#include "src/executor.h"
#include "src/policy.h"
#include "src/topology.h"
#include "src/validate.h"
#include "transports/ucx_transport.h"

namespace qccl {

class Comm;

// The CUDA device whose memory p is (-1: host memory, or no CUDA in the process): see comm.cc.
int device_of(const void* p);

// Where the communicator's drivers (a waiting caller or the progress thread, one at a time) spent their
// time outside the executions' own steps, as running totals: a call's share is the difference between
// its completion and the start of its execution.
struct DriveTotals {
  int64_t transport_ns = 0;  // in the transport's progress, when it moved something
  int64_t waiting_ns = 0;    // waiting for the wire or a peer: passes that moved nothing, and sleeps
  int64_t wakeups = 0;       // sleeps: on the armed transport, or a pause while it cannot be armed
};

// One call: created when the API is called, started at once or at qcclGroupEnd.
struct OpRecord {
  coll::CollArgs args;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<const kernels::CodecConfig> codec;  // keeps args.codec alive (compressed calls)
  std::vector<coll::Segment> segments;                 // args.segments points here, when it is set
  std::shared_ptr<CodecState> state;                  // the caller's codec state, if any
  std::shared_ptr<void> state_call;                   // CodecState::begin_call's, until finish()
  // Calls with the same non-null `serial` run one after the other in call order, each once the one
  // before it completed: they read and write one state (a codec state, a delta store).
  const void* serial = nullptr;
  // Compressed calls: the call of the codec's method (args.method_call points here); a keyed delta
  // call's is made with the record (args.delta).
  std::unique_ptr<coll::MethodCall> call;
  std::unique_ptr<Execution> operation;
  std::shared_ptr<std::vector<std::byte>> scratch;  // from the communicator's pool, once it runs
  size_t scratch_bytes = 0;
  std::chrono::steady_clock::time_point started_at;
  DriveTotals drive_at_start;  // the communicator's totals when its execution started
  // False while deferred in a group; set by qcclGroupEnd's start while a completion thread's
  // qcclTest or qcclWait may read it.
  std::atomic<bool> started{false};
  bool on_device = false;             // buffers in device memory: the device executor runs it (place)
  bool internal = false;              // the library's own exchange (allgather_bytes): no statistics
  // A call on device memory that the host executor runs (Comm::stage: a keyed delta call, whose
  // store and kernels are the host's; the fft codec under QCCL_GPU_FFT=host): its buffers cross
  // through pinned host memory, after the work the caller queued on the communicator's stream
  // before the call (`mark`): its inputs when it starts to run, its outputs when it completes (also
  // the rows a failed delta receive applied, as on host buffers). A record dropped before its end (a
  // call refused after it was staged) releases what it holds.
  struct Staging {
    struct Buffer {
      void* device;
      void* pinned;  // null once released (or kept for good by a device that cannot synchronize)
      size_t bytes;
      bool in, out;  // copied to the host when the call starts, to the device when it completes
    };
    explicit Staging(std::shared_ptr<Device> d) : device(std::move(d)) {}
    ~Staging();
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    std::shared_ptr<Device> device;
    std::vector<Buffer> buffers;
    uintptr_t mark = 0;      // Device::Mark, until waited for or forgotten
    bool completed = false;  // its plan ran to the end: the outputs go to the device
  };
  std::unique_ptr<Staging> staging;
  uint64_t submitted = 0;             // its place among the communicator's active records (start)
  // Zero-count collectives called after this one while it ran, with their collective numbers: they
  // complete when it does, as they move nothing but keep the call order (guarded by ops_mu_).
  std::vector<std::pair<std::shared_ptr<OpRecord>, uint64_t>> followers;
  std::atomic<bool> done{false};
  qcclResult_t result = qcclSuccess;  // valid once done
  std::string error;                  // valid once done
};

// The drive lock: whichever thread holds it drives all of a communicator's calls. A caller waiting for
// its own call waits for the lock or for that call's completion, whichever comes first: a completion
// thread's qcclWait must not wait for the owning thread's blocking call, which holds the lock until
// its own call completes. signal() after every completion and release wakes such waiters.
class DriveLock {
 public:
  void lock() { mu_.lock(); }
  bool try_lock() { return mu_.try_lock(); }
  void unlock() {
    mu_.unlock();
    signal();
  }
  // True holding the lock; false, without it, once done() holds.
  bool lock_unless(const std::function<bool()>& done);
  // A call completed, or the lock was let go: the waiters look again.
  void signal();

 private:
  std::mutex mu_;
  std::mutex signal_mu_;
  std::condition_variable signalled_;
  std::atomic<int> waiters_{0};
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  // Collective over the nranks ranks: bootstrap, control plane, transport endpoints, barrier.
  static std::shared_ptr<Comm> create(const BootstrapId& id, int nranks, int rank, const Config& config);
  // Throws the error a communicator of `config` would throw at creation for a setting that does not
  // parse (QCCL_ALGO, QCCL_CODEC): for a split, whose child is made only after exchanges with the
  // parent's ranks, so that its bad settings fail before anything is sent, as an init's do.
  static void check_settings(const Config& config, int nranks);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Unique among this process's communicators and never reused, where a destroyed one's address may
  // be (what a delta store remembers of the communicator its calls ran on).
  uint64_t id() const { return id_; }
  const Config& config() const { return config_; }
  bool oversubscribed() const { return oversubscribed_; }
  // The ranks that share this host's CPUs: this communicator's on this host (all of them under
  // QCCL_OVERSUBSCRIBED=1), or its parent's (Config::parent_host_ranks) when more.
  int host_ranks() const { return host_ranks_; }
  const coll::NodeMap& node_map() const { return node_map_; }

  // Starts a validated call (a zero count moves nothing: it completes at once, or a collective's with
  // the newest collective still running, in call order). background: let the progress thread
  // drive it now (non-blocking calls and groups); otherwise the caller will wait() at once.
  // Throws the communicator's error when it is broken.
  void start(const std::shared_ptr<OpRecord>& record, bool background);
  // A queued call whose start threw (qcclGroupEnd): it completes with that error, its codec state's
  // call over.
  void refuse(OpRecord& record, const Error& error) { finish(record, error.code(), error.message()); }
  // Before start, after validation: whether the call's buffers are device memory (then
  // record.on_device, and args.stream is the communicator's stream), refusing mixed buffers and
  // what the device path does not run yet (qcclInvalidArgument, qcclInvalidUsage; nothing sent).
  void place(OpRecord& record, bool in_group);
  // A buffer of `bytes` bytes in CUDA device memory of a call the host executor runs on its behalf:
  // the pinned host buffer that stands for it (record.staging), which the call's plan reads (in) or
  // writes (out) instead. The same buffer staged twice is one pinned buffer.
  void* stage(OpRecord& record, const void* buffer, size_t bytes, bool in, bool out);
  // qcclCommSetStream: the CUDA stream of later calls on device buffers (null: the legacy default).
  void set_stream(void* stream) { stream_.store(stream); }
  void* stream() const { return stream_.load(); }
  // Blocks until the record is done; throws its error.
  void wait(OpRecord& record);
  // Drives a little without blocking; true when the record is done.
  bool test(OpRecord& record);
  // A blocking AllGather of `bytes` bytes per rank, for the runtime's own exchanges (qcclCommSplit):
  // a collective like any other, in call order with the caller's. Throws the operation's error.
  void allgather_bytes(const void* send, void* recv, size_t bytes);

  void destroy();  // collective
  void abort();    // local, always returns

  qcclResult_t health(std::string* message) const;
  void last_stats(qcclStats_t* out) const;
  const std::shared_ptr<StateBudget>& state_budget() const { return state_budget_; }
  // IntSGD's aggregator processes this communicator registered with (QCCL_AGGREGATORS).
  int aggregators() const { return static_cast<int>(aggregator_links_.size()); }

 private:
  Comm(int rank, int nranks, const Config& config);
  void join(const BootstrapId& id);

  // Drives until done() holds. may_block: sleep on events when nothing moves (else return then).
  void drive_until(const std::function<bool()>& done, bool progress_thread, bool may_block = true);
  void wait_for_events(bool progress_thread, std::chrono::microseconds timeout, bool transport);
  void progress_thread_main();
  bool waits_for_its_state(size_t index) const;  // index into driving_: an older call on its `serial`
  bool waits_for_its_buffers(size_t index) const;  // ... an older collective using its buffers
  static BufferUse callers_buffer_use(const OpRecord& record);  // staged calls: the device buffers
  bool waits_for_its_key(size_t index) const;  // ... a point-to-point call whose keys its own would repeat
  void check_timeouts();
  void take_scratch(OpRecord& record);  // before the record's operation first advances
  void finish(OpRecord& record, qcclResult_t result, const std::string& message);
  void finish_completed(OpRecord& record);
  // Record.staging's end: a completed call's outputs to the device, the pinned buffers released. A
  // failure here becomes the call's result if it had none.
  void end_staging(OpRecord& record, qcclResult_t* result, std::string* error);
  // A compressed call about to run: its method's prepare() and the scale its headers announce.
  void prepare(OpRecord& record);
  // With the drive lock held: fails and withdraws the operations the failure concerns (after an
  // abort, every one: those older than an earlier failure with the abort's).
  void fail_affected_operations();
  // With the drive lock held, once an aggregator is lost: fails and withdraws the operations that sum
  // through the aggregators; the others go on.
  void fail_aggregator_operations();
  void break_comm(const Failure& failure, bool report);
  // The first collective sequence number a failure of this record concerns (see Failure).
  static uint64_t failure_sequence(const OpRecord& record);
  // The oldest collective this rank has not finished, or the next one's number if none.
  uint64_t first_unfinished_collective() const;
  void wake(int fd);
  void arm_hand_off(bool arm);  // arms (or disarms) hand_off_fd_
  void agree_auto_codec();      // join: QCCL_CODEC=auto's facts
  void set_link_facts();        // join: the fft codec's facts for config_.link_rate_bits
  std::string describe_links() const;  // for the INFO log
  void shutdown();
  void shut_down_now();  // shutdown()'s work, run once
  std::string abort_message() const;  // "qcclCommAbort was called on rank R (host:pid)"
  // An aggregator's registration connection became readable: it closed (the aggregator died or was
  // stopped). Fails the agg=switch operations in flight, and later agg=switch calls (progress thread
  // only).
  void service_aggregator(size_t k);
  std::vector<int> aggregator_fds() const;

  const int rank_;
  const int nranks_;
  const uint64_t id_ = next_id();
  static uint64_t next_id() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }
  Config config_;  // const after join, where a probed link rate (QCCL_LINK_RATE=probe) sets its rate and chunk
  const AlgorithmPolicy policy_;
  const CodecPolicy codec_policy_;
  std::unique_ptr<AutoCodec> auto_codec_;  // QCCL_CODEC=auto (instead of codec_policy_); agreed at join
  const std::shared_ptr<StateBudget> state_budget_;
  LocalTopology topology_;
  std::vector<PeerInfo> peers_;
  coll::NodeMap node_map_;  // which ranks share a host (QCCL_NODE_MAP or the peers' hosts); set at join
  coll::LinkFacts link_facts_;  // QCCL_LINK_RATE and the slowest rank's codec costs; set at join
  std::vector<AggregatorLink> aggregator_links_;  // kept open: closing them ends the job at the aggregators
  std::string aggregator_lost_;                   // guarded by ops_mu_: why agg=switch cannot run
  int aggregator_calls_entering_ = 0;             // guarded by ops_mu_: agg=switch calls past that check,
                                                  // not yet in active_
  std::atomic<bool> aggregator_lost_set_{false};  // an aggregator was lost and agg=switch calls may be in
                                                  // flight: the driver fails them (fail_aggregator_operations)
  std::vector<std::string> names_;  // "rank 3 (host:pid)", then "aggregator 0 (host:port)"
  bool oversubscribed_ = false;      // more ranks on this host than CPUs: spinning yields
  int host_ranks_ = 1;               // host_ranks()
  // DriveTotals, added to and read by the driver (under the drive lock): at an execution's start and
  // at its completion.
  std::atomic<int64_t> transport_ns_{0}, waiting_ns_{0}, wakeups_{0};
  DriveTotals drive_totals() const;

  std::unique_ptr<transport::UcxTransport> transport_;  // set up here; moved by the executor
  std::unique_ptr<Executor> executor_;
  // The GPU path, made at the first call on device buffers (under device_mu_); the drive loop reads
  // the executor through the atomic pointer, published once it is complete.
  // The device of this communicator's device buffers: CUDA device `ordinal`, that of its first call
  // on them, or null with *why (a build without CUDA, no usable device).
  Device* device(int ordinal, std::string* why);
  // device(ordinal) for a call's buffer `name` = `buffer` in it, or qcclInvalidArgument naming them
  // (no usable device; another device than the communicator's).
  Device& device_for(const char* name, const void* buffer, int ordinal);
  void start_device_executor();  // at the first call on device buffers (place)
  void choose_gpu_wire();        // collective: at the first collective on device buffers (place)
  std::mutex device_mu_;
  std::shared_ptr<Device> device_;
  std::unique_ptr<DeviceExecutor> device_executor_owned_;
  std::atomic<DeviceExecutor*> device_executor_{nullptr};
  std::string no_device_;         // guarded by device_mu_: why there is none (once tried)
  bool gpu_wire_chosen_ = false;  // guarded by device_mu_
  std::atomic<void*> stream_{nullptr};
  std::unique_ptr<ControlPlane> control_;
  std::thread progress_thread_;
  int progress_wake_fd_ = -1;  // wakes the progress thread
  int driver_wake_fd_ = -1;    // wakes a caller that drives
  int hand_off_fd_ = -1;       // a timer: wakes the progress thread a moment after operations were
                               // left undriven (started in the background, or when a wait ended)
  std::atomic<bool> hand_off_armed_{false};  // set when armed, cleared when it fired: saves system calls

  // Submission side (the calling thread).
  uint64_t next_sequence_ = 0;
  // Collectives numbered and in active_ (or finished), in call order: numbers from here on may be
  // taken by a start() not yet done (guarded by ops_mu_; first_unfinished_collective reads it).
  uint64_t collectives_issued_ = 0;
  std::vector<uint64_t> send_sequence_, recv_sequence_;  // point-to-point calls to and from each peer
  // The numbers of the point-to-point calls in active_, per peer and direction (p2p_direction), for
  // waits_for_its_key (guarded by ops_mu_).
  std::vector<std::set<uint64_t>> p2p_running_;
  static size_t p2p_direction(const coll::CollArgs& args) {
    return 2 * static_cast<size_t>(args.peer) + (args.kind == coll::CollKind::kRecv ? 1 : 0);
  }

  // Operations started and not done, in call order; `active_version_` changes whenever the list does.
  // A deque: they finish from the front, and hundreds may be outstanding.
  mutable std::mutex ops_mu_;
  std::deque<std::shared_ptr<OpRecord>> active_;
  std::atomic<uint64_t> active_version_{0};
  std::atomic<int> active_count_{0};
  std::atomic<int> active_p2p_{0};  // the point-to-point calls among them
  std::vector<std::shared_ptr<std::vector<std::byte>>> scratch_pool_;  // guarded by ops_mu_
  // Failed staged calls' pinned buffers, kept until the transport goes (end_staging); guarded by ops_mu_.
  std::vector<std::unique_ptr<OpRecord::Staging>> failed_staging_;
  qcclStats_t last_stats_{};                                          // guarded by ops_mu_

  DriveLock drive_mu_;
  std::vector<std::shared_ptr<OpRecord>> driving_;  // the driver's copy of active_
  uint64_t submitted_ = 0;          // records ever added to active_ (guarded by ops_mu_)
  uint64_t driving_submitted_ = 0;  // ...of which driving_ has seen these
  bool driving_p2p_ = false;  // whether driving_ holds a point-to-point call
  uint64_t driving_version_ = ~uint64_t{0};
  // When the driver (whichever thread holds drive_mu_) next looks for calls past QCCL_TIMEOUT: kept
  // across drive_until's calls, so that qcclTest's single passes check it too.
  std::chrono::steady_clock::time_point next_timeout_check_{};
  std::atomic<int> callers_waiting_{0};
  std::atomic<bool> progress_driving_{false};  // the progress thread holds (or is taking) the drive lock
  std::atomic<bool> stopping_{false};
  std::atomic<bool> aborting_{false};  // qcclCommAbort began: a destroy waiting meanwhile returns its failure

  std::atomic<bool> broken_{false};  // failures_ holds one
  Failures failures_;                // guarded by ops_mu_
  std::once_flag shutdown_once_;
  std::atomic<bool> shut_down_{false};
  // start() holds it shared while it uses the executors; shut_down_now() exclusively to destroy them
  // (a qcclCommAbort from another thread).
  std::shared_mutex executors_mu_;
};

}  // namespace qccl
