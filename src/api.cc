// The C API: each entry point fills a descriptor and makes one call, inside api_call(), which turns
// exceptions into a result code and the thread's last-error line (STYLE rules 4 and 15).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <forward_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_set>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "base/log.h"
#include "include/qccl.h"
#include "collectives/aqsgd_store.h"
#include "collectives/sendrecv_delta.h"
#include "kernels/convert.h"
#include "kernels/subnormals.h"
#include "src/bootstrap.h"
#include "src/comm.h"
#include "src/comm_split.h"
#include "src/group.h"
#include "src/launch_env.h"
#include "src/validate.h"

struct qcclComm {
  std::shared_ptr<qccl::Comm> impl;
  // Who frees the handle: qcclCommDestroy, or qcclCommAbort unless it comes while a destroy runs in
  // another thread (the abort then releases that destroy, which frees the handle as it returns).
  // Read and set under the live-handle registry's lock (live_handles below).
  enum Closing { kOpen, kDestroying };
  Closing closing = kOpen;
};

struct qcclRequest {
  std::shared_ptr<qccl::OpRecord> record;
};

struct qcclCodec {
  std::shared_ptr<const qccl::kernels::CodecConfig> config;
};

struct qcclCodecState {
  std::shared_ptr<qccl::CodecState> state;  // null once its store erased the key
  qcclCodecStore* store = nullptr;          // the store it belongs to (it frees the handle), if any
  uint64_t key = 0;
};

// A store's handles live as long as the store, so that a handle of an erased key fails cleanly.
struct qcclCodecStore {
  std::shared_ptr<qccl::CodecStore> impl;
  std::mutex mu;
  std::map<uint64_t, std::unique_ptr<qcclCodecState>> handles;
};

// Shared with the store's calls in flight, which keep it alive past qcclDeltaStoreDestroy.
struct qcclDeltaStore {
  std::shared_ptr<qccl::coll::DeltaLink> link;
};

namespace qccl {
namespace {

// The communicator handles not yet freed. qcclCommAbort may come from any thread at any time, also
// while another thread is entering a call with the same handle: a call looks its handle up here and
// holds the Comm for its whole length (CallHolds), and a handle leaves the set, under the exclusive
// lock, before it is freed. A freed handle then fails cleanly instead of being read (unless a new
// communicator's handle took its address).
struct LiveHandles {
  std::shared_mutex mu;
  std::unordered_set<const qcclComm*> handles;
};

LiveHandles& live_handles() {
  static LiveHandles* const live = new LiveHandles;  // never freed: a destroy may run from exit handlers
  return *live;
}

// The Comms that one api_call looked up (get), held until it returns: a handle freed meanwhile leaves
// the Comm alive until then. Each api_call has its own on its stack (a call nested in another holds
// its own), found through a thread-local pointer, which, unlike a thread-local container, is still
// there for calls made from exit handlers after the thread's thread-locals are destroyed. A call looks
// up one communicator, so none allocates here.
class CallHolds {
 public:
  CallHolds() : outer_(current_) { current_ = this; }
  ~CallHolds() { current_ = outer_; }
  CallHolds(const CallHolds&) = delete;
  CallHolds& operator=(const CallHolds&) = delete;

  // The thread's innermost api_call's.
  static CallHolds& current() {
    if (!current_) fail(qcclInternalError, "a communicator was looked up outside an API call");
    return *current_;
  }

  // Held until the api_call returns; the reference stays valid until then.
  const std::shared_ptr<Comm>& hold(std::shared_ptr<Comm> comm) {
    if (inline_count_ < kInline) {
      inline_[inline_count_] = std::move(comm);
      return inline_[inline_count_++];
    }
    more_.push_front(std::move(comm));  // a list: its elements stay where they are
    return more_.front();
  }

 private:
  static constexpr size_t kInline = 2;
  static thread_local CallHolds* current_;
  std::shared_ptr<Comm> inline_[kInline];
  size_t inline_count_ = 0;
  std::forward_list<std::shared_ptr<Comm>> more_;
  CallHolds* outer_;
};

thread_local CallHolds* CallHolds::current_ = nullptr;

void fail_not_live(const qcclComm* comm) {
  fail(qcclInvalidArgument, "comm = %p is not a live communicator: destroyed or aborted, or never made",
       static_cast<const void*>(comm));
}

template <class F>
qcclResult_t api_call(const char* name, F&& body) {
  const kernels::SubnormalsKept ieee;  // the caller's thread may flush them (kernels/subnormals.h)
  const CallHolds holds;               // dropped after the catches below: a Comm's last hold may free it
  try {
    body();
    return qcclSuccess;
  } catch (const Error& e) {
    set_last_error(std::string(name) + ": " + e.message());
    return e.code();
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(name) + ": out of memory");
    return qcclSystemError;
  } catch (const std::exception& e) {
    set_last_error(std::string(name) + ": internal error: " + e.what());
    return qcclInternalError;
  } catch (...) {
    set_last_error(std::string(name) + ": internal error: unknown exception");
    return qcclInternalError;
  }
}

// The body of an entry point whose call a group defers, or refuses (qcclCommSplit): refused inside a
// group, it fails the whole group, as in NCCL (qcclGroupEnd then runs none of it).
template <class F>
qcclResult_t deferrable_call(const char* name, F&& body) {
  return api_call(name, [&] {
    try {
      body();
    } catch (const Error& e) {
      if (group_active()) group_refuse(Error(e.code(), std::string(name) + ": " + e.message()));
      throw;
    } catch (const std::bad_alloc&) {
      if (group_active()) group_refuse(Error(qcclSystemError, std::string(name) + ": out of memory"));
      throw;
    }
  });
}

// The Comm behind a live handle, held until the api_call that asked returns. Read nothing through the
// handle itself afterwards: an abort in another thread may free it at any time.
const std::shared_ptr<Comm>& get_held(qcclComm_t comm) {
  if (!comm) fail(qcclInvalidArgument, "comm is NULL");
  std::shared_ptr<Comm> held;
  {
    LiveHandles& live = live_handles();
    const std::shared_lock<std::shared_mutex> lock(live.mu);
    if (!live.handles.count(comm)) fail_not_live(comm);
    held = comm->impl;
  }
  log_set_rank(held->rank());  // the thread's log lines carry the rank of the communicator it calls
  return CallHolds::current().hold(std::move(held));
}

Comm& get(qcclComm_t comm) { return *get_held(comm); }

template <class T>
void require_out(T* p, const char* name) {
  if (!p) fail(qcclInvalidArgument, "%s is NULL", name);
}

// A store's lock, held while a handle of the store is read (qcclCodecStoreLoad repoints its handles
// from other threads; a store is thread-safe); none for a state made alone.
std::unique_lock<std::mutex> lock_store_of(qcclCodecState_t state) {
  return state && state->store ? std::unique_lock<std::mutex>(state->store->mu) : std::unique_lock<std::mutex>();
}

// The codec state behind a handle (a store's handle whose key was erased has none), read under the
// store's lock when `store_lock` (lock_store_of) holds it.
std::shared_ptr<CodecState> state_of(qcclCodecState_t state, const std::unique_lock<std::mutex>& store_lock) {
  (void)store_lock;  // held by the caller: the handle's state is read below
  require_out(state, "state");
  if (!state->state)
    fail(qcclInvalidUsage, "state: key %llu was erased from its store (qcclCodecStoreGet makes it anew)",
         static_cast<unsigned long long>(state->key));
  return state->state;
}

std::shared_ptr<CodecState> state_of(qcclCodecState_t state) { return state_of(state, lock_store_of(state)); }

qcclCodecStore& store_of(qcclCodecStore_t store) {
  if (!store || !store->impl) fail(qcclInvalidArgument, "store is NULL (make one with qcclCodecStoreCreate)");
  return *store;
}

// The checks a compressed call adds to validate_call's: the generic ones here, then the codec's
// method's (collectives/method.h), then the state's size. Nothing is sent before they pass.
void validate_compressed(const OpRecord& record, qcclCodec_t codec, int aggregators) {
  const coll::CollArgs& a = record.args;
  if (!codec || !codec->config) fail(qcclInvalidArgument, "codec is NULL (make one with qcclCodecCreate)");
  const kernels::CodecConfig& c = *codec->config;
  if (!kernels::codec_input_type(a.dtype))
    fail(qcclInvalidArgument, "datatype = %s: codecs take float, half or bfloat16", kernels::data_type_name(a.dtype));
  const bool reduces = a.kind == coll::CollKind::kAllReduce || a.kind == coll::CollKind::kReduceScatter;
  if (reduces && a.op != kernels::RedOp::kSum && a.op != kernels::RedOp::kAvg)
    fail(qcclInvalidArgument, "op = %s: compressed %s sums or averages", kernels::red_op_name(a.op),
         a.kind == coll::CollKind::kAllReduce ? "all-reduce" : "reduce-scatter");
  const coll::Method* method = coll::method_for(c);
  if (!method) fail(qcclInternalError, "codec '%s' has no method", c.canonical().c_str());
  coll::CollArgs with_codec = a;
  with_codec.codec = &c;
  const coll::StateView view = record.state ? record.state->view() : coll::StateView{};
  if (auto refusal = method->refuse(with_codec, record.state ? &view : nullptr, aggregators))
    fail(refusal->kind == coll::Refusal::Kind::kUsage ? qcclInvalidUsage : qcclInvalidArgument, "%s",
         refusal->message.c_str());
  // The state covers what this rank encodes: AllGather's sendcount values, ReduceScatter's whole
  // input (nranks * recvcount), an all-reduce's count.
  if (a.kind == coll::CollKind::kReduceScatter) {
    const size_t input = a.count * static_cast<size_t>(a.nranks);
    if (record.state && record.state->count() != input)
      fail(qcclInvalidArgument, "state holds %zu values but nranks * recvcount = %d * %zu = %zu (the residual "
           "covers the whole input)", record.state->count(), a.nranks, a.count, input);
  } else if (record.state && record.state->count() != a.count) {
    fail(qcclInvalidArgument, "state holds %zu values but %s = %zu (one state per tensor)", record.state->count(),
         a.kind == coll::CollKind::kAllGather ? "sendcount" : "count", a.count);
  }
  // The method's state is made at the first call that needs one: past the budget, or when another
  // method made the state's, the call fails here, before it takes a sequence number or a step.
  if (record.state) record.state->bind(*method, c);
}

// Validates, then runs (blocking), starts (non-blocking) or defers (inside a group) one call.
// A compressed call's segment list (qcclSegment_t) as the plans take it; the counts must add up to
// the block.
std::vector<coll::Segment> segment_list(const qcclSegment_t* segments, int nsegments, size_t block, const char* count_name) {
  if (nsegments < 1 || nsegments > (1 << 20))
    fail(qcclInvalidArgument, "nsegments = %d is out of range [1, %d]", nsegments, 1 << 20);
  if (!segments) fail(qcclInvalidArgument, "segments is NULL with nsegments = %d", nsegments);
  std::vector<coll::Segment> list;
  size_t offset = 0;
  for (int i = 0; i < nsegments; ++i) {
    if (segments[i].exact != 0 && segments[i].exact != 1)
      fail(qcclInvalidArgument, "segments[%d].exact = %d: 1 (sent exactly) or 0 (with the codec)", i, segments[i].exact);
    if (segments[i].count > block - offset)
      fail(qcclInvalidArgument, "segments[0..%d] hold more than %s = %zu values", i, count_name, block);
    list.push_back(coll::Segment{offset, segments[i].count, segments[i].exact == 1});
    offset += segments[i].count;
  }
  if (offset != block)
    fail(qcclInvalidArgument, "the %d segments hold %zu values but %s = %zu", nsegments, offset, count_name, block);
  return list;
}

// A validated record: deferred inside a group, else started; blocking (request null) waits for it.
void launch(Comm& c, const std::shared_ptr<OpRecord>& record, qcclRequest_t* request) {
  if (group_active()) {
    group_defer(record, request == nullptr);
    if (request) *request = new qcclRequest{record};
    return;
  }
  c.start(record, /*background=*/request != nullptr);
  if (request) {
    *request = new qcclRequest{record};
    return;
  }
  c.wait(*record);
}

// The segment list of a qccl*CompressedSegments call (checked by segment_list: NULL and 0 are refused).
struct SegmentList {
  const qcclSegment_t* segments;
  int count;
};

void submit(qcclComm_t comm, const RawCall& call, qcclRequest_t* request, qcclCodec_t codec = nullptr,
            qcclCodecState_t state = nullptr, bool compressed = false,
            const std::optional<SegmentList>& segments = std::nullopt) {
  const std::shared_ptr<Comm>& held = get_held(comm);  // held until the call returns
  Comm& c = *held;
  auto record = std::make_shared<OpRecord>();
  record->args = validate_call(call, c.rank(), c.nranks());
  record->comm = held;
  if (compressed) {
    if (state) {
      // Under the store's lock: its Load and Save refuse while calls are in flight, and check that
      // under it, so a call begins either before (and is seen) or after (on the restored state).
      const std::unique_lock<std::mutex> store_lock = lock_store_of(state);
      record->state = state_of(state, store_lock);
      record->state_call = record->state->begin_call(&c);
    }
    record->serial = record->state.get();
    validate_compressed(*record, codec, c.aggregators());
    record->codec = codec->config;
    record->args.codec = record->codec.get();
    if (segments) {
      record->segments = segment_list(segments->segments, segments->count, record->args.count,
                                      call.kind == coll::CollKind::kAllGather ? "sendcount" : "recvcount");
      record->args.segments = &record->segments;
    }
  }
  c.place(*record, group_active());
  launch(c, record, request);
}

// The body of every blocking collective and point-to-point entry point.
qcclResult_t run_collective(const char* name, qcclComm_t comm, const RawCall& call) {
  return deferrable_call(name, [&] { submit(comm, call, nullptr); });
}

// The body of every non-blocking (qcclI*) entry point: *request is set only on success.
qcclResult_t start_collective(const char* name, qcclComm_t comm, const RawCall& call, qcclRequest_t* request) {
  return deferrable_call(name, [&] {
    require_out(request, "request");
    submit(comm, call, request);
  });
}

qcclComm_t wrap(std::shared_ptr<Comm> impl) {
  auto handle = std::make_unique<qcclComm>();
  handle->impl = std::move(impl);
  LiveHandles& live = live_handles();
  const std::unique_lock<std::shared_mutex> lock(live.mu);
  live.handles.insert(handle.get());
  return handle.release();
}

// Frees a handle once it has left the registry, so that no call can look it up any more (the Comm
// lives on while calls hold it).
struct RetireHandle {
  void operator()(qcclComm* handle) const {
    {
      LiveHandles& live = live_handles();
      const std::unique_lock<std::shared_mutex> lock(live.mu);
      live.handles.erase(handle);  // gone already when an abort came during the destroy that frees it
    }
    delete handle;
  }
};

}  // namespace
}  // namespace qccl

using namespace qccl;

extern "C" {

QCCL_API qcclResult_t qcclGetVersion(int* version) {
  return api_call("qcclGetVersion", [&] {
    require_out(version, "version");
    *version = QCCL_VERSION_CODE;
  });
}

QCCL_API const char* qcclGetErrorString(qcclResult_t result) { return result_string(result); }

QCCL_API const char* qcclGetLastError(qcclComm_t) { return last_error(); }

QCCL_API qcclResult_t qcclGetUniqueId(qcclUniqueId* uniqueId) {
  return api_call("qcclGetUniqueId", [&] {
    require_out(uniqueId, "uniqueId");
    Config config = Config::resolve(nullptr);
    net::Socket listener = net::Socket::listen(net::local_address(config.socket_ifname));
    BootstrapId id{random_magic(), listener.local_address()};
    encode_unique_id(id, uniqueId);
    start_root_service(std::move(listener), id.magic, 0, config.timeout_seconds);
  });
}

namespace {

// Rank 0's root for an id whose address every rank was given: on that port of every interface of
// this host, which the address names (`own`: checked first by binding it, so that a rank 0 on
// another host fails at once instead of every rank timing out). The root waits for its first rank,
// this one, for the timeout at most: an init that fails before it says hello leaves no listener.
void start_root_at(const BootstrapId& id, int nranks, double timeout_seconds, bool own) {
  if (own) net::Socket::listen(id.root).close();
  net::Address any = net::Address::parse(id.root.family() == AF_INET6 ? "[::]:0" : "0.0.0.0:0", "any");
  any.set_port(id.root.port());
  start_root_service(net::Socket::listen(any), id.magic, nranks, timeout_seconds,
                     timeout_seconds > 0 ? net::Deadline::after(timeout_seconds) : net::Deadline::never());
}

}  // namespace

QCCL_API qcclResult_t qcclGetUniqueIdFromAddress(const char* address, qcclUniqueId* uniqueId) {
  return api_call("qcclGetUniqueIdFromAddress", [&] {
    require_out(uniqueId, "uniqueId");
    if (!address) fail(qcclInvalidArgument, "address = NULL");
    BootstrapId id;
    id.root = net::Address::parse(address, "address");
    if (id.root.port() == 0)  // rank 0 would listen on a port of its choosing that no rank knows
      fail(qcclInvalidArgument, "address = '%s': port 0 cannot be the root's port (every rank connects to it)", address);
    // The magic of the port alone: hosts may resolve one name to different addresses (a host's own
    // name to 127.0.1.1), and two roots cannot share a port anyway.
    const std::string text = "qcclGetUniqueIdFromAddress|" + std::to_string(id.root.port());
    id.magic = 1469598103934665603ull;
    for (unsigned char ch : text) id.magic = (id.magic ^ ch) * 1099511628211ull;
    id.root_at_init = true;
    encode_unique_id(id, uniqueId);
  });
}

QCCL_API qcclResult_t qcclCommInitRankConfig(qcclComm_t* comm, int nranks, qcclUniqueId uniqueId, int rank,
                                             const qcclConfig_t* config) {
  return api_call("qcclCommInitRank", [&] {
    require_out(comm, "comm");
    if (nranks < 1 || nranks > transport::UcxTransport::kMaxRanks)
      fail(qcclInvalidArgument, "nranks = %d is out of range [1, %d]", nranks, transport::UcxTransport::kMaxRanks);
    if (rank < 0 || rank >= nranks) fail(qcclInvalidArgument, "rank = %d is out of range [0, %d)", rank, nranks);
    BootstrapId id = decode_unique_id(uniqueId);
    Config resolved = Config::resolve(config);
    if (id.root_at_init && rank == 0) start_root_at(id, nranks, resolved.timeout_seconds, true);  // an id from an address
    *comm = wrap(Comm::create(id, nranks, rank, resolved));
  });
}

QCCL_API qcclResult_t qcclCommInitRank(qcclComm_t* comm, int nranks, qcclUniqueId uniqueId, int rank) {
  return qcclCommInitRankConfig(comm, nranks, uniqueId, rank, nullptr);
}

QCCL_API qcclResult_t qcclCommInitEnv(qcclComm_t* comm, const qcclConfig_t* config) {
  return api_call("qcclCommInitEnv", [&] {
    require_out(comm, "comm");
    Config resolved = Config::resolve(config);
    EnvLaunch launch = read_launch_environment();
    BootstrapId id;
    RootServiceHandle private_root;
    if (launch.nranks == 1) {
      // A job of one: a private root on loopback keeps a single code path (QCCL_MAGIC checked all the same).
      net::Socket listener = net::Socket::listen(net::Address::parse("127.0.0.1:0", "loopback"));
      id = BootstrapId{env("QCCL_MAGIC") ? launch_magic(launch) : random_magic(), listener.local_address()};
      // Its one rank is this init, now, and is done with it once the init returns: stopped then (a
      // failed init, one that never said hello, left its thread and port waiting for ever), and
      // waiting for the hello no longer than the timeout in any case.
      private_root = start_root_service(
          std::move(listener), id.magic, 1, resolved.timeout_seconds,
          resolved.timeout_seconds > 0 ? net::Deadline::after(resolved.timeout_seconds) : net::Deadline::never());
    } else {
      id = BootstrapId{launch_magic(launch), launch.root_address};
      if (launch.rank == 0) start_root_at(id, launch.nranks, resolved.timeout_seconds, false);
    }
    QCCL_INFO("qcclCommInitEnv: rank %d of %d from %s", launch.rank, launch.nranks, launch.source.c_str());
    try {
      *comm = wrap(Comm::create(id, launch.nranks, launch.rank, resolved));
    } catch (...) {
      private_root.stop();
      throw;
    }
    private_root.stop();  // it has sent this rank the table: this waits for its thread's last moment
  });
}

QCCL_API qcclResult_t qcclCommSplit(qcclComm_t comm, int color, int key, qcclComm_t* newcomm,
                                    const qcclConfig_t* config) {
  return deferrable_call("qcclCommSplit", [&] {
    // Held through a qcclCommAbort from another thread, which frees the handle: the split uses the
    // parent between its two exchanges, after the first one's record let go of it.
    const std::shared_ptr<Comm> parent = get_held(comm);
    require_out(newcomm, "newcomm");
    if (group_active())
      fail(qcclInvalidUsage, "called between qcclGroupStart and qcclGroupEnd: a split cannot be deferred");
    std::shared_ptr<Comm> made = split_comm(*parent, color, key, config);
    *newcomm = made ? wrap(std::move(made)) : nullptr;
  });
}

QCCL_API qcclResult_t qcclCommDestroy(qcclComm_t comm) {
  return api_call("qcclCommDestroy", [&] {
    Comm& c = get(comm);  // held through a qcclCommAbort from another thread
    if (group_holds(c))
      fail(qcclInvalidUsage, "comm has calls queued in this thread's group: call qcclGroupEnd first (comm stays valid)");
    {
      // Claimed under the registry's lock, which an abort takes to claim or retire the handle: the
      // handle is alive here, and stays alive while kDestroying (only this call frees it then).
      LiveHandles& live = live_handles();
      const std::unique_lock<std::shared_mutex> lock(live.mu);
      // An abort freed it since get (and a new communicator may have taken its address: its Comm is
      // another than the one this call holds).
      if (!live.handles.count(comm) || comm->impl.get() != &c) fail_not_live(comm);
      if (comm->closing != qcclComm::kOpen) fail(qcclInvalidUsage, "comm is being destroyed by another thread");
      comm->closing = qcclComm::kDestroying;
    }
    // Stays in the registry while the destroy waits, so that an abort from another thread can find it
    // and release the wait; leaves it as this returns (invalid afterwards, whatever happens).
    const std::unique_ptr<qcclComm, RetireHandle> handle(comm);
    c.destroy();
  });
}

QCCL_API qcclResult_t qcclCommAbort(qcclComm_t comm) {
  return api_call("qcclCommAbort", [&] {
    if (!comm) fail(qcclInvalidArgument, "comm is NULL");
    std::shared_ptr<Comm> c;
    std::unique_ptr<qcclComm> handle;
    {
      // Looked up and retired in one step: a second abort, or any call, from another thread then
      // finds the handle gone (fail_not_live) instead of reading it once it is freed.
      LiveHandles& live = live_handles();
      const std::unique_lock<std::shared_mutex> lock(live.mu);
      if (!live.handles.erase(comm)) fail_not_live(comm);
      c = comm->impl;
      // Freed here, unless a qcclCommDestroy in another thread holds it: this releases that destroy,
      // which frees the handle as it returns.
      if (comm->closing == qcclComm::kOpen) handle.reset(comm);
    }
    log_set_rank(c->rank());
    c->abort();
  });
}

QCCL_API qcclResult_t qcclCommCount(const qcclComm_t comm, int* count) {
  return api_call("qcclCommCount", [&] {
    Comm& c = get(comm);
    require_out(count, "count");
    *count = c.nranks();
  });
}

QCCL_API qcclResult_t qcclCommUserRank(const qcclComm_t comm, int* rank) {
  return api_call("qcclCommUserRank", [&] {
    Comm& c = get(comm);
    require_out(rank, "rank");
    *rank = c.rank();
  });
}

QCCL_API qcclResult_t qcclCommGetAsyncError(qcclComm_t comm, qcclResult_t* asyncError) {
  return api_call("qcclCommGetAsyncError", [&] {
    Comm& c = get(comm);
    require_out(asyncError, "asyncError");
    std::string message;
    *asyncError = c.health(&message);
    if (*asyncError != qcclSuccess) set_last_error("qcclCommGetAsyncError: " + message);
  });
}

QCCL_API qcclResult_t qcclCommSetStream(qcclComm_t comm, void* stream) {
  return api_call("qcclCommSetStream", [&] { get(comm).set_stream(stream); });
}

QCCL_API qcclResult_t qcclCommGetStream(qcclComm_t comm, void** stream) {
  return api_call("qcclCommGetStream", [&] {
    require_out(stream, "stream");
    *stream = get(comm).stream();
  });
}

QCCL_API qcclResult_t qcclCommGetLastStats(qcclComm_t comm, qcclStats_t* stats) {
  return api_call("qcclCommGetLastStats", [&] {
    Comm& c = get(comm);
    require_out(stats, "stats");
    // Callers compiled against an older, shorter qcclStats_t get the fields they know.
    constexpr size_t kOldest = offsetof(qcclStats_t, compressionRatio);
    if (stats->size < kOldest || stats->size > sizeof(qcclStats_t))
      fail(qcclInvalidArgument, "stats->size = %zu; set it to sizeof(qcclStats_t) = %zu", stats->size,
           sizeof(qcclStats_t));
    qcclStats_t full{};
    full.size = sizeof(full);
    c.last_stats(&full);
    const size_t size = stats->size;
    std::memcpy(stats, &full, size);
    stats->size = size;
  });
}

QCCL_API qcclResult_t qcclAllReduce(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                    qcclRedOp_t op, qcclComm_t comm) {
  return run_collective("qcclAllReduce", comm,
                        RawCall{coll::CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0});
}
QCCL_API qcclResult_t qcclBroadcast(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                    int root, qcclComm_t comm) {
  return run_collective("qcclBroadcast", comm,
                        RawCall{coll::CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, 0, root});
}
QCCL_API qcclResult_t qcclReduce(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                 qcclRedOp_t op, int root, qcclComm_t comm) {
  return run_collective("qcclReduce", comm,
                        RawCall{coll::CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root});
}
QCCL_API qcclResult_t qcclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, qcclDataType_t datatype,
                                    qcclComm_t comm) {
  return run_collective("qcclAllGather", comm,
                        RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0});
}
QCCL_API qcclResult_t qcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, qcclDataType_t datatype,
                                        qcclRedOp_t op, qcclComm_t comm) {
  return run_collective("qcclReduceScatter", comm,
                        RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0});
}
QCCL_API qcclResult_t qcclGather(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype, int root,
                                 qcclComm_t comm) {
  return run_collective("qcclGather", comm, RawCall{coll::CollKind::kGather, sendbuff, recvbuff, count, datatype, 0, root});
}

QCCL_API qcclResult_t qcclScatter(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype, int root,
                                  qcclComm_t comm) {
  return run_collective("qcclScatter", comm, RawCall{coll::CollKind::kScatter, sendbuff, recvbuff, count, datatype, 0, root});
}

QCCL_API qcclResult_t qcclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                   qcclComm_t comm) {
  return run_collective("qcclAlltoAll", comm,
                        RawCall{coll::CollKind::kAlltoAll, sendbuff, recvbuff, count, datatype, 0, 0});
}
QCCL_API qcclResult_t qcclSend(const void* sendbuff, size_t count, qcclDataType_t datatype, int peer, qcclComm_t comm) {
  return run_collective("qcclSend", comm, RawCall{coll::CollKind::kSend, sendbuff, nullptr, count, datatype, 0, peer});
}
QCCL_API qcclResult_t qcclRecv(void* recvbuff, size_t count, qcclDataType_t datatype, int peer, qcclComm_t comm) {
  return run_collective("qcclRecv", comm, RawCall{coll::CollKind::kRecv, nullptr, recvbuff, count, datatype, 0, peer});
}

QCCL_API qcclResult_t qcclIAllReduce(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                     qcclRedOp_t op, qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIAllReduce", comm,
                          RawCall{coll::CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0}, request);
}
QCCL_API qcclResult_t qcclIBroadcast(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                     int root, qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIBroadcast", comm,
                          RawCall{coll::CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, 0, root}, request);
}
QCCL_API qcclResult_t qcclIReduce(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                  qcclRedOp_t op, int root, qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIReduce", comm,
                          RawCall{coll::CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root}, request);
}
QCCL_API qcclResult_t qcclIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, qcclDataType_t datatype,
                                     qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIAllGather", comm,
                          RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0}, request);
}
QCCL_API qcclResult_t qcclIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         qcclDataType_t datatype, qcclRedOp_t op, qcclComm_t comm,
                                         qcclRequest_t* request) {
  return start_collective("qcclIReduceScatter", comm,
                          RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0},
                          request);
}
QCCL_API qcclResult_t qcclIGather(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype, int root,
                                  qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIGather", comm,
                          RawCall{coll::CollKind::kGather, sendbuff, recvbuff, count, datatype, 0, root}, request);
}

QCCL_API qcclResult_t qcclIScatter(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype, int root,
                                   qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIScatter", comm,
                          RawCall{coll::CollKind::kScatter, sendbuff, recvbuff, count, datatype, 0, root}, request);
}

QCCL_API qcclResult_t qcclIAlltoAll(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                    qcclComm_t comm, qcclRequest_t* request) {
  return start_collective("qcclIAlltoAll", comm,
                          RawCall{coll::CollKind::kAlltoAll, sendbuff, recvbuff, count, datatype, 0, 0}, request);
}
QCCL_API qcclResult_t qcclISend(const void* sendbuff, size_t count, qcclDataType_t datatype, int peer, qcclComm_t comm,
                                qcclRequest_t* request) {
  return start_collective("qcclISend", comm,
                          RawCall{coll::CollKind::kSend, sendbuff, nullptr, count, datatype, 0, peer}, request);
}
QCCL_API qcclResult_t qcclIRecv(void* recvbuff, size_t count, qcclDataType_t datatype, int peer, qcclComm_t comm,
                                qcclRequest_t* request) {
  return start_collective("qcclIRecv", comm,
                          RawCall{coll::CollKind::kRecv, nullptr, recvbuff, count, datatype, 0, peer}, request);
}

QCCL_API qcclResult_t qcclCodecCreate(const char* spec, qcclCodec_t* codec) {
  return api_call("qcclCodecCreate", [&] {
    require_out(spec, "spec");
    require_out(codec, "codec");
    try {
      *codec = new qcclCodec{std::make_shared<const kernels::CodecConfig>(kernels::parse_codec_spec(spec))};
    } catch (const kernels::CodecSpecError& e) {
      fail(qcclInvalidArgument, "%s", e.what());
    }
  });
}

QCCL_API qcclResult_t qcclCodecLearnLevels(qcclCodec_t codec, const void* data, size_t count, qcclDataType_t datatype,
                                           int epochs, int root, qcclComm_t comm, qcclCodec_t* learned) {
  return api_call("qcclCodecLearnLevels", [&] {
    Comm* c = comm ? &get(comm) : nullptr;
    const int rank = c ? c->rank() : 0, nranks = c ? c->nranks() : 1;
    // This rank's verdict on its own arguments, and the root's levels. With a communicator every rank
    // takes part in one exchange of a fixed size whatever its arguments, so that a refusal on one rank
    // (the root's data, say) fails every rank at once and leaves the communicator in step.
    std::unique_ptr<Error> refused;
    std::vector<float> mine;
    int bits = 0;
    uint64_t codec_hash = 0;
    try {
      require_out(learned, "learned");
      if (!codec || !codec->config) fail(qcclInvalidArgument, "codec is NULL (make one with qcclCodecCreate)");
      const kernels::CodecConfig& base = *codec->config;
      if (base.kind != kernels::CodecKind::kQuant)
        fail(qcclInvalidArgument, "codec = '%s': only q1 .. q8 have levels", base.canonical().c_str());
      bits = base.bits;
      codec_hash = base.hash();
      if (epochs < 1 || epochs > 1000) fail(qcclInvalidArgument, "epochs = %d is out of range [1, 1000]", epochs);
      if (root < 0 || root >= nranks) fail(qcclInvalidArgument, "root = %d is out of range [0, %d)", root, nranks);
      if (rank == root) {
        if (datatype < 0 || datatype >= qcclNumTypes ||
            !kernels::codec_input_type(static_cast<kernels::DataType>(datatype)))
          fail(qcclInvalidArgument, "datatype = %d: levels are learned from float, half or bfloat16", datatype);
        if (count && !data) fail(qcclInvalidArgument, "data is NULL with count = %zu", count);
        std::vector<float> values(count);
        kernels::load_float(static_cast<kernels::DataType>(datatype), data, values.data(), count);
        mine = kernels::learn_levels(values.data(), count, base.bits, base.bucket, 0.01, epochs);
      }
    } catch (const Error& e) {
      if (!c) throw;
      refused = std::make_unique<Error>(e);
    }
    std::vector<float> levels = mine;
    if (c) {
      struct Offer {
        int32_t refused;  // 1: this rank refused its arguments
        int32_t root;     // the root it names
        int32_t bits;     // its codec's bits (0 when it has none)
        uint64_t codec;   // its codec's hash (0 when it has none)
        float levels[256];  // the root's learned levels (2^bits of them)
      };
      Offer offer{refused ? 1 : 0, root, bits, codec_hash, {}};
      std::copy(mine.begin(), mine.end(), offer.levels);
      std::vector<Offer> all(static_cast<size_t>(nranks));
      c->allgather_bytes(&offer, all.data(), sizeof offer);
      if (refused) throw *refused;
      for (int r = 0; r < nranks; ++r) {
        if (all[r].refused)
          fail(qcclInvalidArgument, "rank %d refused its arguments (its qcclGetLastError says why): nothing was "
               "learned", r);
        if (all[r].root != root)
          fail(qcclInvalidArgument, "root = %d but rank %d passed root = %d: every rank must pass the same", root, r,
               all[r].root);
        if (all[r].bits != bits)
          fail(qcclInvalidArgument, "codec has %d bits but rank %d's has %d: every rank must pass the same codec",
               bits, r, all[r].bits);
        // The root fits the levels to its own bucket size; the ranks' collectives would fail later.
        if (all[r].codec != codec_hash)
          fail(qcclInvalidArgument, "codec = '%s' is not rank %d's (its bucket, rounding, seed or levels differ): "
               "every rank must pass the same codec", codec->config->canonical().c_str(), r);
      }
      levels.assign(all[root].levels, all[root].levels + (size_t{1} << bits));
    }
    kernels::CodecConfig result = *codec->config;
    result.levels = std::move(levels);
    *learned = new qcclCodec{std::make_shared<const kernels::CodecConfig>(std::move(result))};
  });
}

QCCL_API qcclResult_t qcclCodecGetSpec(qcclCodec_t codec, char* spec, size_t bytes, size_t* needed) {
  return api_call("qcclCodecGetSpec", [&] {
    if (!codec || !codec->config) fail(qcclInvalidArgument, "codec is NULL (make one with qcclCodecCreate)");
    const std::string text = codec->config->canonical();
    if (needed) *needed = text.size() + 1;
    if (!spec && bytes == 0) {
      if (!needed) fail(qcclInvalidArgument, "spec and needed are NULL: nothing to return");
      return;
    }
    require_out(spec, "spec");
    if (bytes < text.size() + 1)
      fail(qcclInvalidArgument, "bytes = %zu: the spec takes %zu (its NUL included)", bytes, text.size() + 1);
    std::memcpy(spec, text.c_str(), text.size() + 1);
  });
}

QCCL_API qcclResult_t qcclCodecDestroy(qcclCodec_t codec) {
  return api_call("qcclCodecDestroy", [&] {
    require_out(codec, "codec");
    delete codec;  // calls in flight keep the codec alive
  });
}

QCCL_API qcclResult_t qcclCodecStateCreate(qcclComm_t comm, size_t count, qcclCodecState_t* state) {
  return api_call("qcclCodecStateCreate", [&] {
    Comm& c = get(comm);
    require_out(state, "state");
    if (count == 0) fail(qcclInvalidArgument, "count = 0: a codec state is for a tensor of at least one value");
    if (count > (size_t{1} << 60) / sizeof(float)) fail(qcclInvalidArgument, "count = %zu is too large", count);
    *state = new qcclCodecState{std::make_shared<CodecState>(c.state_budget(), count)};
  });
}

QCCL_API qcclResult_t qcclCodecStateDestroy(qcclCodecState_t state) {
  return api_call("qcclCodecStateDestroy", [&] {
    require_out(state, "state");
    if (state->store)
      fail(qcclInvalidUsage, "state belongs to a codec store (key %llu): erase it with qcclCodecStoreErase",
           static_cast<unsigned long long>(state->key));
    delete state;  // calls in flight keep the state alive
  });
}

QCCL_API qcclResult_t qcclCodecStateSize(qcclCodecState_t state, size_t* bytes) {
  return api_call("qcclCodecStateSize", [&] {
    const std::shared_ptr<CodecState> s = state_of(state);
    require_out(bytes, "bytes");
    *bytes = s->serialized_bytes();
  });
}

QCCL_API qcclResult_t qcclCodecStateSave(qcclCodecState_t state, void* buffer, size_t bytes) {
  return api_call("qcclCodecStateSave", [&] {
    const std::shared_ptr<CodecState> s = state_of(state);
    require_out(buffer, "buffer");
    s->save(buffer, bytes);
  });
}

QCCL_API qcclResult_t qcclCodecStateLoad(qcclCodecState_t state, const void* buffer, size_t bytes) {
  return api_call("qcclCodecStateLoad", [&] {
    const std::shared_ptr<CodecState> s = state_of(state);
    require_out(buffer, "buffer");
    s->load(buffer, bytes);
  });
}

QCCL_API qcclResult_t qcclCodecStateSetLearningRate(qcclCodecState_t state, double lr) {
  return api_call("qcclCodecStateSetLearningRate", [&] {
    const std::shared_ptr<CodecState> s = state_of(state);
    if (!(lr > 0) || !std::isfinite(lr)) fail(qcclInvalidArgument, "lr = %g: a learning rate is positive and finite", lr);
    s->set_learning_rate(lr);
  });
}

QCCL_API qcclResult_t qcclCodecStoreCreate(qcclComm_t comm, size_t budgetBytes, qcclCodecStore_t* store) {
  return api_call("qcclCodecStoreCreate", [&] {
    Comm& c = get(comm);
    require_out(store, "store");
    auto made = std::make_unique<qcclCodecStore>();
    made->impl = std::make_shared<CodecStore>(c.state_budget(), budgetBytes);
    *store = made.release();
  });
}

QCCL_API qcclResult_t qcclCodecStoreDestroy(qcclCodecStore_t store) {
  return api_call("qcclCodecStoreDestroy", [&] {
    store_of(store);
    delete store;  // its handles with it; calls in flight keep their states alive
  });
}

QCCL_API qcclResult_t qcclCodecStoreGet(qcclCodecStore_t store, uint64_t key, size_t count, qcclCodecState_t* state) {
  return api_call("qcclCodecStoreGet", [&] {
    qcclCodecStore& s = store_of(store);
    require_out(state, "state");
    if (count == 0) fail(qcclInvalidArgument, "count = 0: a codec state is for a tensor of at least one value");
    if (count > (size_t{1} << 60) / sizeof(float)) fail(qcclInvalidArgument, "count = %zu is too large", count);
    std::lock_guard<std::mutex> lock(s.mu);
    std::unique_ptr<qcclCodecState>& handle = s.handles[key];
    if (!handle) handle = std::make_unique<qcclCodecState>(qcclCodecState{nullptr, store, key});
    handle->state = s.impl->get(key, count);
    *state = handle.get();
  });
}

QCCL_API qcclResult_t qcclCodecStoreErase(qcclCodecStore_t store, uint64_t key) {
  return api_call("qcclCodecStoreErase", [&] {
    qcclCodecStore& s = store_of(store);
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.impl->erase(key))
      fail(qcclInvalidArgument, "key = %llu: the store holds no state of that key", static_cast<unsigned long long>(key));
    auto it = s.handles.find(key);
    if (it != s.handles.end()) it->second->state = nullptr;
  });
}

QCCL_API qcclResult_t qcclCodecStoreSize(qcclCodecStore_t store, size_t* bytes) {
  return api_call("qcclCodecStoreSize", [&] {
    qcclCodecStore& s = store_of(store);
    require_out(bytes, "bytes");
    *bytes = s.impl->serialized_bytes();
  });
}

QCCL_API qcclResult_t qcclCodecStoreSave(qcclCodecStore_t store, void* buffer, size_t bytes) {
  return api_call("qcclCodecStoreSave", [&] {
    qcclCodecStore& s = store_of(store);
    require_out(buffer, "buffer");
    std::lock_guard<std::mutex> lock(s.mu);  // no call begins meanwhile (submit)
    s.impl->save(buffer, bytes);
  });
}

QCCL_API qcclResult_t qcclCodecStoreLoad(qcclCodecStore_t store, const void* buffer, size_t bytes) {
  return api_call("qcclCodecStoreLoad", [&] {
    qcclCodecStore& s = store_of(store);
    require_out(buffer, "buffer");
    std::lock_guard<std::mutex> lock(s.mu);
    s.impl->load(buffer, bytes);
    // Handles follow their keys to the restored states; those of keys the checkpoint lacks are erased.
    for (auto& [key, handle] : s.handles) handle->state = s.impl->find(key);
  });
}

QCCL_API qcclResult_t qcclAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                              qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                              qcclCodecState_t state, qcclComm_t comm) {
  return deferrable_call("qcclAllReduceCompressed", [&] {
    submit(comm, RawCall{coll::CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0}, nullptr, codec,
           state, true);
  });
}

QCCL_API qcclResult_t qcclIAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                               qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                               qcclCodecState_t state, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIAllReduceCompressed", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0}, request, codec,
           state, true);
  });
}

QCCL_API qcclResult_t qcclAllGatherCompressed(const void* sendbuff, void* recvbuff, size_t sendcount,
                                              qcclDataType_t datatype, qcclCodec_t codec, qcclCodecState_t state,
                                              qcclComm_t comm) {
  return deferrable_call("qcclAllGatherCompressed", [&] {
    submit(comm, RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0}, nullptr, codec,
           state, true);
  });
}

QCCL_API qcclResult_t qcclIAllGatherCompressed(const void* sendbuff, void* recvbuff, size_t sendcount,
                                               qcclDataType_t datatype, qcclCodec_t codec, qcclCodecState_t state,
                                               qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIAllGatherCompressed", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0}, request, codec,
           state, true);
  });
}

QCCL_API qcclResult_t qcclSendCompressed(const void* sendbuff, size_t count, qcclDataType_t datatype,
                                         qcclCodec_t codec, int peer, qcclComm_t comm) {
  return deferrable_call("qcclSendCompressed", [&] {
    submit(comm, RawCall{coll::CollKind::kSend, sendbuff, nullptr, count, datatype, 0, peer}, nullptr, codec, nullptr,
           true);
  });
}

QCCL_API qcclResult_t qcclRecvCompressed(void* recvbuff, size_t count, qcclDataType_t datatype, qcclCodec_t codec,
                                         int peer, qcclComm_t comm) {
  return deferrable_call("qcclRecvCompressed", [&] {
    submit(comm, RawCall{coll::CollKind::kRecv, nullptr, recvbuff, count, datatype, 0, peer}, nullptr, codec, nullptr,
           true);
  });
}

QCCL_API qcclResult_t qcclISendCompressed(const void* sendbuff, size_t count, qcclDataType_t datatype,
                                          qcclCodec_t codec, int peer, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclISendCompressed", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kSend, sendbuff, nullptr, count, datatype, 0, peer}, request, codec, nullptr,
           true);
  });
}

QCCL_API qcclResult_t qcclIRecvCompressed(void* recvbuff, size_t count, qcclDataType_t datatype, qcclCodec_t codec,
                                          int peer, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIRecvCompressed", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kRecv, nullptr, recvbuff, count, datatype, 0, peer}, request, codec, nullptr,
           true);
  });
}

QCCL_API qcclResult_t qcclAllGatherCompressedSegments(const void* sendbuff, void* recvbuff, size_t sendcount,
                                                      qcclDataType_t datatype, qcclCodec_t codec,
                                                      const qcclSegment_t* segments, int nsegments,
                                                      qcclCodecState_t state, qcclComm_t comm) {
  return deferrable_call("qcclAllGatherCompressedSegments", [&] {
    submit(comm, RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0}, nullptr, codec,
           state, true, SegmentList{segments, nsegments});
  });
}

QCCL_API qcclResult_t qcclIAllGatherCompressedSegments(const void* sendbuff, void* recvbuff, size_t sendcount,
                                                       qcclDataType_t datatype, qcclCodec_t codec,
                                                       const qcclSegment_t* segments, int nsegments,
                                                       qcclCodecState_t state, qcclComm_t comm,
                                                       qcclRequest_t* request) {
  return deferrable_call("qcclIAllGatherCompressedSegments", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0}, request, codec,
           state, true, SegmentList{segments, nsegments});
  });
}

QCCL_API qcclResult_t qcclReduceScatterCompressedSegments(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                          qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                          const qcclSegment_t* segments, int nsegments,
                                                          qcclCodecState_t state, qcclComm_t comm) {
  return deferrable_call("qcclReduceScatterCompressedSegments", [&] {
    submit(comm, RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, nullptr,
           codec, state, true, SegmentList{segments, nsegments});
  });
}

QCCL_API qcclResult_t qcclIReduceScatterCompressedSegments(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                           qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                           const qcclSegment_t* segments, int nsegments,
                                                           qcclCodecState_t state, qcclComm_t comm,
                                                           qcclRequest_t* request) {
  return deferrable_call("qcclIReduceScatterCompressedSegments", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, request,
           codec, state, true, SegmentList{segments, nsegments});
  });
}

QCCL_API qcclResult_t qcclReduceScatterCompressed(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                  qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                  qcclCodecState_t state, qcclComm_t comm) {
  return deferrable_call("qcclReduceScatterCompressed", [&] {
    submit(comm, RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, nullptr,
           codec, state, true);
  });
}

QCCL_API qcclResult_t qcclIReduceScatterCompressed(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                   qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                   qcclCodecState_t state, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIReduceScatterCompressed", [&] {
    require_out(request, "request");
    submit(comm, RawCall{coll::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, request,
           codec, state, true);
  });
}

QCCL_API qcclResult_t qcclGroupStart(void) {
  return api_call("qcclGroupStart", [] { group_start(); });
}

QCCL_API qcclResult_t qcclGroupEnd(void) {
  return api_call("qcclGroupEnd", [] { group_end(); });
}

QCCL_API qcclResult_t qcclTest(qcclRequest_t* request, int* done) {
  qcclResult_t result = qcclSuccess;
  qcclResult_t call = api_call("qcclTest", [&] {
    require_out(request, "request");
    require_out(done, "done");
    if (!*request) {  // completed and freed already (a test or wait said so): done, as qcclWait returns at once
      *done = 1;
      return;
    }
    OpRecord& record = *(*request)->record;
    if (!record.started && !record.done)  // (a refused group's calls are done without starting)
      fail(qcclInvalidUsage, "the request belongs to a group that has not ended (qcclGroupEnd)");
    *done = record.comm->test(record) ? 1 : 0;
    if (!*done) return;
    result = record.result;
    if (result != qcclSuccess) set_last_error("qcclTest: " + record.error);
    delete *request;
    *request = nullptr;
  });
  return call != qcclSuccess ? call : result;
}

QCCL_API qcclResult_t qcclWait(qcclRequest_t* request) {
  return api_call("qcclWait", [&] {
    require_out(request, "request");
    if (!*request) return;
    std::unique_ptr<qcclRequest> owned(*request);
    OpRecord& record = *owned->record;
    if (!record.started && !record.done) {
      owned.release();
      fail(qcclInvalidUsage, "the request belongs to a group that has not ended (qcclGroupEnd)");
    }
    *request = nullptr;
    record.comm->wait(record);
  });
}

}  // extern "C"

// ---- AQ-SGD's keyed delta messages (collectives/aqsgd_store.h) ----------------------------------------

namespace qccl {
namespace {

coll::DeltaLink& delta_of(qcclDeltaStore_t store) {
  if (!store || !store->link) fail(qcclInvalidArgument, "store is NULL (make one with qcclDeltaStoreCreate)");
  return *store->link;
}

qcclResult_t delta_code(coll::DeltaStoreError::Kind kind) {
  switch (kind) {
    case coll::DeltaStoreError::Kind::kArgument: return qcclInvalidArgument;
    case coll::DeltaStoreError::Kind::kBudget: return qcclInvalidUsage;
    case coll::DeltaStoreError::Kind::kNonFinite: return qcclNonFinite;
    case coll::DeltaStoreError::Kind::kMismatch:
    case coll::DeltaStoreError::Kind::kSequence:
    case coll::DeltaStoreError::Kind::kCorrupt: return qcclMismatch;
    case coll::DeltaStoreError::Kind::kSystem: return qcclSystemError;
  }
  return qcclInternalError;
}

kernels::DataType delta_type(qcclDataType_t t, const char* name) {
  if (t != qcclFloat32 && t != qcclFloat16 && t != qcclBfloat16)
    fail(qcclInvalidArgument, "%s = %d: float, half or bfloat16", name, static_cast<int>(t));
  return static_cast<kernels::DataType>(t);
}

// The most values a delta store's row, or one call's rows, may hold: their bytes (at most 8 a value,
// with the codec's) and the sums the store makes of them stay far from size_t's limit, as
// buffer_bytes keeps collectives' buffers.
constexpr size_t kMaxDeltaValues = std::numeric_limits<size_t>::max() / 2 / 8;

// Validates, then runs (blocking), starts (non-blocking) or defers (inside a group) one keyed delta
// call: a point-to-point call whose plan is the store's exchange (collectives/sendrecv_delta.h).
void submit_delta(bool sender, const void* buffer, size_t nkeys, const uint64_t* keys,
                  qcclDataType_t datatype, qcclDeltaStore_t store, int peer, qcclComm_t comm, qcclRequest_t* request) {
  const std::shared_ptr<Comm>& held = get_held(comm);  // held until the call returns
  Comm& c = *held;
  delta_of(store);
  const std::shared_ptr<coll::DeltaLink> link = store->link;
  if (nkeys == 0) fail(qcclInvalidArgument, "nkeys = 0: nothing to send");
  if (nkeys > kMaxDeltaValues / link->store.config().row_values)
    fail(qcclInvalidArgument, "nkeys = %zu rows of %zu values make a message larger than the address space", nkeys,
         link->store.config().row_values);
  require_out(keys, "keys");
  if (!buffer) fail(qcclInvalidArgument, "the buffer is NULL with nkeys = %zu", nkeys);
  if (peer < 0 || peer >= c.nranks()) fail(qcclInvalidArgument, "peer = %d is out of range [0, %d)", peer, c.nranks());
  if (peer == c.rank()) fail(qcclInvalidArgument, "peer = %d is this rank: a store is one end of a link", peer);
  const kernels::DataType t = delta_type(datatype, "datatype");
  {
    std::unordered_set<uint64_t> seen;  // checked here too, so that a bad call fails before it is sent
    for (size_t r = 0; r < nkeys; ++r)
      if (!seen.insert(keys[r]).second)
        fail(qcclInvalidArgument, "keys[%zu] = %llu appears twice in one call", r, static_cast<unsigned long long>(keys[r]));
  }
  auto record = std::make_shared<OpRecord>();
  // Rows in device memory cross through pinned host memory: the store and its kernels are the host's
  // (a store may outgrow the GPU: its file tier), and the rows' copies cost less than the wire.
  if (device_of(buffer) >= 0)
    buffer = c.stage(*record, buffer, nkeys * link->store.config().row_values * kernels::element_size(t), sender,
                     !sender);
  coll::CollArgs& args = record->args;
  args.kind = sender ? coll::CollKind::kSend : coll::CollKind::kRecv;
  args.sendbuf = sender ? buffer : nullptr;
  args.recvbuf = sender ? nullptr : const_cast<void*>(buffer);
  args.count = 1;  // see CollArgs::delta
  args.dtype = kernels::DataType::kUint8;
  args.peer = peer;
  args.rank = c.rank();
  args.nranks = c.nranks();
  std::unique_ptr<coll::DeltaCall> delta;
  try {
    delta = std::make_unique<coll::DeltaCall>(link, sender, buffer, t, keys, nkeys, c.id(), peer);
  } catch (const coll::DeltaUsageError& e) {
    fail(qcclInvalidUsage, "%s", e.what());
  }
  args.delta = delta.get();
  args.method_call = delta.get();
  record->call = std::move(delta);
  record->serial = link.get();
  record->comm = held;
  launch(c, record, request);
}

}  // namespace
}  // namespace qccl

QCCL_API qcclResult_t qcclDeltaStoreCreate(qcclCodec_t codec, size_t rowValues, qcclDataType_t storeType,
                                           size_t budgetBytes, int evictLeastRecent, uint32_t id,
                                           qcclDeltaStore_t* store) {
  return api_call("qcclDeltaStoreCreate", [&] {
    require_out(store, "store");
    if (!codec || !codec->config) fail(qcclInvalidArgument, "codec is NULL (make one with qcclCodecCreate)");
    if (evictLeastRecent != 0 && evictLeastRecent != 1)
      fail(qcclInvalidArgument, "evictLeastRecent = %d: 0 or 1", evictLeastRecent);
    if (rowValues > kMaxDeltaValues)
      fail(qcclInvalidArgument, "rowValues = %zu makes a row larger than the address space", rowValues);
    coll::DeltaStore::Config config;
    config.codec = *codec->config;
    config.row_values = rowValues;
    config.store_type = config.full_type = delta_type(storeType, "storeType");
    config.budget_bytes = budgetBytes;
    config.evict = evictLeastRecent ? coll::DeltaStore::Evict::kLeastRecent : coll::DeltaStore::Evict::kNone;
    config.id = id;
    auto made = std::make_unique<qcclDeltaStore>();
    try {
      made->link = std::make_shared<coll::DeltaLink>(config);
    } catch (const coll::DeltaStoreError& e) {
      fail(qcclInvalidArgument, "%s", e.what());
    }
    *store = made.release();
  });
}

QCCL_API qcclResult_t qcclDeltaStoreDestroy(qcclDeltaStore_t store) {
  return api_call("qcclDeltaStoreDestroy", [&] {
    delta_of(store);
    delete store;  // calls in flight keep the link until they complete
  });
}

QCCL_API qcclResult_t qcclDeltaStoreSetWarmup(qcclDeltaStore_t store, int on) {
  return api_call("qcclDeltaStoreSetWarmup", [&] {
    coll::DeltaLink& s = delta_of(store);
    std::lock_guard<std::mutex> lock(s.mu);
    s.warmup = on != 0;
  });
}

// What changes the store's rows outside a call (its settings, a checkpoint's restore) waits for no
// call: it is refused while calls are in flight, whose messages were or will be made from the rows.
namespace {
void refuse_in_flight(const coll::DeltaLink& s, const char* what) {
  if (s.calls)
    fail(qcclInvalidUsage, "%s while %d calls on the store are in flight (qcclWait for them first)", what, s.calls);
}

// A setting a store takes only while it holds no key: its refusal then (kArgument, once the API has
// checked the arguments) is a usage error.
template <class F>
void change_empty_store(coll::DeltaLink& s, const char* what, F&& change) {
  std::lock_guard<std::mutex> lock(s.mu);
  refuse_in_flight(s, what);
  try {
    change(s.store);
  } catch (const coll::DeltaStoreError& e) {
    fail(e.kind() == coll::DeltaStoreError::Kind::kArgument ? qcclInvalidUsage : delta_code(e.kind()), "%s", e.what());
  }
}
}  // namespace

QCCL_API qcclResult_t qcclDeltaStoreSetLowBits(qcclDeltaStore_t store, int bits) {
  return api_call("qcclDeltaStoreSetLowBits", [&] {
    coll::DeltaLink& s = delta_of(store);
    if (bits != 0 && (bits < 2 || bits > 8)) fail(qcclInvalidArgument, "bits = %d: 0 (m in storeType) or 2 .. 8", bits);
    change_empty_store(s, "low-bit m set", [&](coll::DeltaStore& d) { d.set_store_bits(bits); });
  });
}

QCCL_API qcclResult_t qcclDeltaStoreSetFile(qcclDeltaStore_t store, const char* path) {
  return api_call("qcclDeltaStoreSetFile", [&] {
    coll::DeltaLink& s = delta_of(store);
    if (!path) fail(qcclInvalidArgument, "path is NULL (\"\" keeps the rows in memory)");
    change_empty_store(s, "file tier set", [&](coll::DeltaStore& d) { d.set_file(path); });
  });
}

QCCL_API qcclResult_t qcclDeltaStoreGetInfo(qcclDeltaStore_t store, qcclDeltaStoreInfo_t* info) {
  return api_call("qcclDeltaStoreGetInfo", [&] {
    coll::DeltaLink& s = delta_of(store);
    require_out(info, "info");
    std::lock_guard<std::mutex> lock(s.mu);
    const coll::DeltaStore& d = s.store;
    *info = qcclDeltaStoreInfo_t{d.keys(), d.bytes(), d.sequence(), d.last_message_bytes(), d.last_full_rows()};
  });
}

QCCL_API qcclResult_t qcclDeltaStoreSize(qcclDeltaStore_t store, size_t* bytes) {
  return api_call("qcclDeltaStoreSize", [&] {
    coll::DeltaLink& s = delta_of(store);
    require_out(bytes, "bytes");
    std::lock_guard<std::mutex> lock(s.mu);
    *bytes = s.store.checkpoint_bytes();
  });
}

QCCL_API qcclResult_t qcclDeltaStoreSave(qcclDeltaStore_t store, void* buffer, size_t bytes) {
  return api_call("qcclDeltaStoreSave", [&] {
    coll::DeltaLink& s = delta_of(store);
    require_out(buffer, "buffer");
    std::lock_guard<std::mutex> lock(s.mu);
    if (bytes != s.store.checkpoint_bytes())
      fail(qcclInvalidArgument, "bytes = %zu, the checkpoint takes %zu (qcclDeltaStoreSize)", bytes,
           s.store.checkpoint_bytes());
    s.store.save(static_cast<uint8_t*>(buffer));  // straight in: a store may be larger than memory
  });
}

QCCL_API qcclResult_t qcclDeltaStoreLoad(qcclDeltaStore_t store, const void* buffer, size_t bytes) {
  return api_call("qcclDeltaStoreLoad", [&] {
    coll::DeltaLink& s = delta_of(store);
    require_out(buffer, "buffer");
    std::lock_guard<std::mutex> lock(s.mu);
    refuse_in_flight(s, "a checkpoint loaded");
    try {
      s.store.load(static_cast<const uint8_t*>(buffer), bytes);
    } catch (const coll::DeltaStoreError& e) {
      const auto kind = e.kind();
      // A checkpoint that is not a store's (corrupt, truncated) is the argument's fault, not a peer's.
      using Kind = coll::DeltaStoreError::Kind;
      fail(kind == Kind::kMismatch || kind == Kind::kBudget || kind == Kind::kSystem ? delta_code(kind)
                                                                                   : qcclInvalidArgument,
           "%s", e.what());
    }
  });
}

QCCL_API qcclResult_t qcclDeltaSend(const void* sendbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                    qcclDeltaStore_t store, int peer, qcclComm_t comm) {
  return deferrable_call("qcclDeltaSend", [&] {
    submit_delta(true, sendbuff, nkeys, keys, datatype, store, peer, comm, nullptr);
  });
}

QCCL_API qcclResult_t qcclDeltaRecv(void* recvbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                    qcclDeltaStore_t store, int peer, qcclComm_t comm) {
  return deferrable_call("qcclDeltaRecv", [&] {
    submit_delta(false, recvbuff, nkeys, keys, datatype, store, peer, comm, nullptr);
  });
}

QCCL_API qcclResult_t qcclIDeltaSend(const void* sendbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                     qcclDeltaStore_t store, int peer, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIDeltaSend", [&] {
    require_out(request, "request");
    submit_delta(true, sendbuff, nkeys, keys, datatype, store, peer, comm, request);
  });
}

QCCL_API qcclResult_t qcclIDeltaRecv(void* recvbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                     qcclDeltaStore_t store, int peer, qcclComm_t comm, qcclRequest_t* request) {
  return deferrable_call("qcclIDeltaRecv", [&] {
    require_out(request, "request");
    submit_delta(false, recvbuff, nkeys, keys, datatype, store, peer, comm, request);
  });
}
