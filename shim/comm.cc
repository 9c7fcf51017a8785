// Communicators of the NCCL drop-in: one handle holds a qccl communicator and, from the first
// device-buffer call on, the real NCCL's communicator.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "shim/codec_policy.h"
#include "shim/dispatch.h"
#include "shim/shim.h"

namespace qccl_nccl {

// ---- Registry ------------------------------------------------------------------------------------------

namespace {
std::mutex g_registry_mutex;
std::unordered_map<const void*, CommRef>& registry() {
  static auto* r = new std::unordered_map<const void*, CommRef>;  // never destroyed: atexit order
  return *r;
}
ncclComm_t handle_of(Comm* c) { return reinterpret_cast<ncclComm_t>(c); }
}  // namespace

ncclComm_t register_comm(CommRef c) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  ncclComm_t h = handle_of(c.get());
  registry()[h] = std::move(c);
  return h;
}

CommRef unregister_comm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find(comm);
  if (it == registry().end()) return nullptr;
  CommRef c = std::move(it->second);
  registry().erase(it);
  return c;
}

CommRef find_comm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find(comm);
  return it == registry().end() ? nullptr : it->second;
}

CommRef usable(ncclComm_t comm, const char* arg) {
  CommRef c = find_comm(comm);
  if (!c) fail(ncclInvalidArgument, "%s = %p is not a communicator of this library", arg, static_cast<void*>(comm));
  // NCCL's ncclCommEnsureReady: ncclInvalidArgument while in progress, else the initialisation's own error.
  if (c->init_state.load() != 0)
    fail(ncclInvalidArgument, "%s = %p is still being initialised (ncclCommGetAsyncError reports ncclInProgress)", arg,
         static_cast<void*>(comm));
  if (splitting(*c))
    fail(ncclInvalidArgument, "%s = %p is splitting: a non-blocking ncclCommSplit of it runs (ncclCommGetAsyncError "
         "reports ncclInProgress until it ends)", arg, static_cast<void*>(comm));
  if (c->init_result != ncclSuccess)
    fail(c->init_result, "%s = %p failed to initialise: %s", arg, static_cast<void*>(comm), c->init_error.c_str());
  if (c->finalized) fail(ncclInvalidUsage, "%s = %p was finalized (ncclCommFinalize)", arg, static_cast<void*>(comm));
  if (!c->q.load()) fail(ncclInvalidUsage, "%s = %p has no qccl communicator (aborted)", arg, static_cast<void*>(comm));
  return c;
}

Comm::~Comm() {
  // The last reference may be the init thread's own (after an abort detached it): never join oneself.
  for (std::thread* job : {&init_thread, &finalize_thread}) {
    if (job->joinable() && job->get_id() != std::this_thread::get_id()) job->join();
    if (job->joinable()) job->detach();
  }
  if (store) qcclCodecStoreDestroy(store);
  for (void* token : registrations) delete static_cast<char*>(token);  // registered, never deregistered
}

struct Clique {
  std::mutex mutex;
  int open = 0;                  // members not yet finalized or destroyed
  std::vector<CommRef> closing;  // members waiting for the others
};

namespace {

std::mutex g_cliques_mutex;
std::unordered_map<std::string, std::weak_ptr<Clique>>& cliques() {
  static auto* m = new std::unordered_map<std::string, std::weak_ptr<Clique>>;  // never destroyed: atexit order
  return *m;
}

// c has just been made: it joins the other ranks of its communicator in this process, unless they have
// all been finalized or destroyed already (a communicator's ranks all finish their inits before any
// destroy can complete, so a rank arriving then belongs to another thread, which destroys it itself).
// An init aborted meanwhile joins nothing: the lock orders this with abort_comm's look at the clique.
void join_clique(Comm& c) {
  std::lock_guard<std::mutex> lock(g_cliques_mutex);
  if (c.abandoned.load() || !c.q.load()) return;
  auto& known = cliques();
  for (auto it = known.begin(); it != known.end();) it = it->second.expired() ? known.erase(it) : std::next(it);
  if (auto clique = known[c.identity].lock()) {
    std::lock_guard<std::mutex> members(clique->mutex);
    if (clique->open > 0) {
      ++clique->open;
      c.clique = std::move(clique);
      return;
    }
  }
  c.clique = std::make_shared<Clique>();
  c.clique->open = 1;
  known[c.identity] = c.clique;
}

// c's clique, read under the lock that join_clique sets it under (abort_comm may run during the init).
std::shared_ptr<Clique> clique_of(const Comm& c) {
  std::lock_guard<std::mutex> lock(g_cliques_mutex);
  return c.clique;
}

}  // namespace

// ---- Configuration ----------------------------------------------------------------------------------------

namespace {

// A field of the caller's config: NCCL_CONFIG_UNDEF_INT (its default) where the caller's struct (its
// size) or its header (its version) predates the field, as NCCL reads it.
int config_field(const ncclConfig_t* config, size_t offset, int since) {
  if (offset + sizeof(int) > config->size || static_cast<int>(config->version) < since) return NCCL_CONFIG_UNDEF_INT;
  int value;
  std::memcpy(&value, reinterpret_cast<const char*>(config) + offset, sizeof value);
  return value;
}

// NCCL_COMM_BLOCKING, as NCCL reads it (init.cc's parseCommConfig, an integer parameter: strtoll of
// base 0, so text without digits reads as 0): 0 or 1 overrides every config's `blocking`, a config
// or none; other values leave it. (NCCL keeps the first value it read; this reads it at each init.)
std::optional<bool> env_blocking() {
  const char* text = std::getenv("NCCL_COMM_BLOCKING");
  if (!text || !*text) return std::nullopt;
  errno = 0;
  const long long value = std::strtoll(text, nullptr, 0);
  if (errno != 0 || (value != 0 && value != 1)) return std::nullopt;
  return value == 1;
}

}  // namespace

// NCCL's rule (init.cc's parseCommConfig): size first, the magic must be NCCL_CONFIG_INITIALIZER's,
// fields newer than `version` take their defaults, and the set ones are held to their ranges (the
// shim uses `blocking` only, but refuses what NCCL refuses). A config older than 2.14 blocks.
// NCCL_COMM_BLOCKING, where 0 or 1, decides over the config (checked all the same).
bool config_blocking(const ncclConfig_t* config, const char* call) {
  if (!config) return env_blocking().value_or(true);
  constexpr unsigned kMagic = 0xcafebeef;
  if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    fail(ncclInvalidArgument, "config->size = %zu is smaller than the oldest ncclConfig_t (%s)", config->size, call);
  if (config->magic != kMagic)
    fail(ncclInvalidArgument, "config->magic = 0x%x: the ncclConfig_t was not initialised with NCCL_CONFIG_INITIALIZER",
         config->magic);
  constexpr int kUndef = NCCL_CONFIG_UNDEF_INT;
#define QCCL_CONFIG_FIELD(name, since) config_field(config, offsetof(ncclConfig_t, name), since)
  const int blocking = QCCL_CONFIG_FIELD(blocking, NCCL_VERSION(2, 14, 0));
  const int cga = QCCL_CONFIG_FIELD(cgaClusterSize, NCCL_VERSION(2, 17, 0));
  const int min_ctas = QCCL_CONFIG_FIELD(minCTAs, NCCL_VERSION(2, 17, 0));
  const int max_ctas = QCCL_CONFIG_FIELD(maxCTAs, NCCL_VERSION(2, 17, 0));
  const int split_share = QCCL_CONFIG_FIELD(splitShare, NCCL_VERSION(2, 18, 0));
  const int collnet = QCCL_CONFIG_FIELD(collnetEnable, NCCL_VERSION(2, 27, 0));
  const int shrink_share = QCCL_CONFIG_FIELD(shrinkShare, NCCL_VERSION(2, 27, 0));
  const int nvls_ctas = QCCL_CONFIG_FIELD(nvlsCTAs, NCCL_VERSION(2, 27, 0));
  const int cta_policy = QCCL_CONFIG_FIELD(CTAPolicy, NCCL_VERSION(2, 27, 0));
  const int per_peer = QCCL_CONFIG_FIELD(nChannelsPerNetPeer, NCCL_VERSION(2, 28, 0));
  const int nvlink_centric = QCCL_CONFIG_FIELD(nvlinkCentricSched, NCCL_VERSION(2, 28, 0));
#undef QCCL_CONFIG_FIELD
  auto zero_or_one = [&](int value, const char* name) {
    if (value != kUndef && value != 0 && value != 1)
      fail(ncclInvalidArgument, "config->%s = %d is neither 0 nor 1 (%s)", name, value, call);
  };
  auto positive = [&](int value, const char* name) {
    if (value != kUndef && value <= 0)
      fail(ncclInvalidArgument, "config->%s = %d is not positive (%s)", name, value, call);
  };
  zero_or_one(blocking, "blocking");
  if (cga != kUndef && cga < 0) fail(ncclInvalidArgument, "config->cgaClusterSize = %d is negative (%s)", cga, call);
  positive(min_ctas, "minCTAs");
  positive(max_ctas, "maxCTAs");
  if (min_ctas != kUndef && max_ctas != kUndef && min_ctas > max_ctas)
    fail(ncclInvalidArgument, "config->minCTAs = %d is above config->maxCTAs = %d (%s)", min_ctas, max_ctas, call);
  zero_or_one(split_share, "splitShare");
  zero_or_one(collnet, "collnetEnable");
  zero_or_one(shrink_share, "shrinkShare");
  if (cta_policy != kUndef && (cta_policy < NCCL_CTA_POLICY_DEFAULT || cta_policy > NCCL_CTA_POLICY_ZERO))
    fail(ncclInvalidArgument,
         "config->CTAPolicy = %d is none of NCCL_CTA_POLICY_DEFAULT (0) .. NCCL_CTA_POLICY_ZERO (%d) (%s)", cta_policy,
         NCCL_CTA_POLICY_ZERO, call);
  positive(nvls_ctas, "nvlsCTAs");
  constexpr int kMaxChannels = 64;  // NCCL's MAXCHANNELS
  if (per_peer != kUndef && (per_peer <= 0 || per_peer > kMaxChannels))
    fail(ncclInvalidArgument, "config->nChannelsPerNetPeer = %d is outside [1, %d] (%s)", per_peer, kMaxChannels, call);
  zero_or_one(nvlink_centric, "nvlinkCentricSched");
  return env_blocking().value_or(blocking != 0);  // unset (or older than 2.14): blocking, NCCL's default
}

namespace {

// qccl's own QCCL_CODEC would compress plain all-reduces underneath the shim: the shim's communicators
// leave compression to QCCL_NCCL_CODEC alone (an empty codec spec is "no policy").
qcclConfig_t qccl_config() {
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.codec = "";
  return config;
}

// Gives c its qccl communicator and the compression policy's store. The policy is read first, so that
// a bad QCCL_NCCL_CODEC fails every rank before anything is sent; a store that cannot be made frees q.
void attach(Comm& c, qcclComm_t q, std::unique_ptr<CodecPolicy> policy) {
  if (policy) {
    qcclResult_t r = qcclCodecStoreCreate(q, policy->state_budget(), &c.store);
    if (r != qcclSuccess) {
      std::string message = qcclGetLastError(nullptr);
      qcclCommAbort(q);
      throw ShimError{to_nccl(r), message};
    }
    log("INFO", "comm %p rank %d/%d: QCCL_NCCL_CODEC %s", static_cast<void*>(&c), c.rank, c.nranks,
        policy->describe().c_str());
  }
  c.codec = std::move(policy);
  c.q.store(q);
  // Aborted while this ran: whichever of the two takes q from c aborts it.
  if (c.abandoned.load())
    if (qcclComm_t mine = c.q.exchange(nullptr)) qcclCommAbort(mine);
}

// Makes c: `make` (given the qccl config) returns this rank's qccl communicator, or null for a split's
// NCCL_SPLIT_NOCOLOR rank; the outcome is recorded in c (attached and in its clique, or the error),
// then the initialisation is marked done. Every QCCL_NCCL_* variable is checked first, as the core checks
// its own at creation: QCCL_NCCL_DEVICE too, which a program might otherwise first read at a device call
// long after (QCCL_NCCL_LIB is a path, judged when the real NCCL is loaded, if it is needed at all).
template <class Make>
void create(Comm& c, Make&& make) {
  try {
    device_on_qccl();
    std::unique_ptr<CodecPolicy> policy = CodecPolicy::from_env();
    if (qcclComm_t q = make(qccl_config())) {
      attach(c, q, std::move(policy));
      join_clique(c);
    }
    c.init_result = ncclSuccess;
  } catch (const ShimError& e) {
    c.init_result = e.code;
    c.init_error = e.message;
  }
  c.init_state.store(0);
}

}  // namespace

void run_init(Comm& c, const InitRequest& request) {
  create(c, [&](qcclConfig_t config) {
    qcclComm_t q = nullptr;
    check_qccl(qcclCommInitRankConfig(&q, request.nranks, request.id, request.rank, &config), "qcclCommInitRankConfig");
    // An id from an address (NCCL_COMM_ID) is the same for every communicator made from it: the
    // number of this rank's earlier inits with it in this process tells them apart.
    static std::mutex uses_mutex;
    static auto* uses = new std::map<std::pair<std::string, int>, uint64_t>;  // never destroyed: atexit order
    const std::string id(reinterpret_cast<const char*>(&request.id), sizeof(request.id));
    std::lock_guard<std::mutex> lock(uses_mutex);
    c.identity = id + "#" + std::to_string((*uses)[{id, request.rank}]++);
    return q;
  });
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config) {
  if (!out) fail(ncclInvalidArgument, "comm = NULL");
  *out = nullptr;  // as NCCL: a failed init leaves no stale handle (which the real NCCL would be handed)
  if (nranks < 1) fail(ncclInvalidArgument, "nranks = %d; it must be at least 1", nranks);
  if (rank < 0 || rank >= nranks) fail(ncclInvalidArgument, "rank = %d is outside [0, nranks = %d)", rank, nranks);
  const bool blocking = config_blocking(config, "ncclCommInitRankConfig");
  static_assert(sizeof(ncclUniqueId) == sizeof(qcclUniqueId), "qccl's id travels in NCCL's 128 bytes");
  InitRequest request{nranks, rank, {}, blocking};
  std::memcpy(&request.id, &id, sizeof(request.id));

  auto c = std::make_shared<Comm>();
  c->nranks = nranks;
  c->rank = rank;
  c->device = cuda::current_device();
  c->blocking = blocking;
  if (in_group()) {  // NCCL initialises grouped communicators together at ncclGroupEnd
    c->init_state.store(1);
    *out = register_comm(c);
    defer_init({c, [request](Comm& made) { run_init(made, request); }, nullptr, rank});
    return ncclSuccess;
  }
  if (!blocking) {
    c->init_state.store(1);
    c->init_thread = std::thread([c, request] { run_init(*c, request); });
    *out = register_comm(c);
    return ncclInProgress;
  }
  run_init(*c, request);
  if (c->init_result != ncclSuccess) throw ShimError{c->init_result, c->init_error};
  *out = register_comm(c);
  return ncclSuccess;
}

void init_all(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms) fail(ncclInvalidArgument, "comm = NULL");
  if (ndev < 1) fail(ncclInvalidArgument, "ndev = %d; it must be at least 1", ndev);
  std::fill(comms, comms + ndev, nullptr);
  if (devlist) {  // as NCCL: each a device of this machine (where CUDA has any), each once
    std::vector<bool> seen;
    for (int i = 0; i < ndev; ++i) {
      const int d = devlist[i];
      if (d < 0 || (cuda::available() && d >= cuda::device_count()))
        fail(ncclInvalidArgument, "devlist[%d] = %d is not a CUDA device here (%d)", i, d, cuda::device_count());
      if (static_cast<size_t>(d) >= seen.size()) seen.resize(static_cast<size_t>(d) + 1);
      if (seen[static_cast<size_t>(d)]) fail(ncclInvalidUsage, "devlist[%d] = %d is listed twice", i, d);
      seen[static_cast<size_t>(d)] = true;
    }
  }
  qcclUniqueId id;
  check_qccl(qcclGetUniqueId(&id), "qcclGetUniqueId");
  // One process, ndev ranks: each joins on its own thread, as the bootstrap needs them all at once.
  std::vector<CommRef> made(static_cast<size_t>(ndev));
  std::vector<std::thread> threads;
  for (int r = 0; r < ndev; ++r) {
    made[r] = std::make_shared<Comm>();
    made[r]->nranks = ndev;
    made[r]->rank = r;
    made[r]->device = devlist ? devlist[r] : (cuda::available() ? r : -1);
    made[r]->init_state.store(1);
    threads.emplace_back([&, r] { run_init(*made[r], InitRequest{ndev, r, id, true}); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ndev; ++r) {
    if (made[r]->init_result == ncclSuccess) continue;
    for (auto& c : made)  // a failure anywhere: nothing is handed out
      if (qcclComm_t q = c->q.exchange(nullptr)) qcclCommAbort(q);
    fail(made[r]->init_result, "rank %d of %d: %s", r, ndev, made[r]->init_error.c_str());
  }
  for (int r = 0; r < ndev; ++r) comms[r] = register_comm(made[r]);
}

namespace {

// This rank's part of qcclCommSplit, collective over the parent's ranks: makes child, or leaves it
// without a communicator where color is NCCL_SPLIT_NOCOLOR.
void run_split(Comm& child, qcclComm_t parent, int color, int key) {
  create(child, [&](qcclConfig_t config) {
    qcclComm_t q = nullptr;
    check_qccl(qcclCommSplit(parent, color, key, &q, &config), "qcclCommSplit");
    if (q) {
      qcclCommCount(q, &child.nranks);
      qcclCommUserRank(q, &child.rank);
    }
    return q;
  });
}

}  // namespace

ncclResult_t split(const CommRef& parent, int color, int key, ncclComm_t* newcomm, const ncclConfig_t* config) {
  if (!newcomm) fail(ncclInvalidArgument, "newcomm = NULL");
  *newcomm = nullptr;  // as NCCL, on failure
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    fail(ncclInvalidArgument, "color = %d; it must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
  // As NCCL: the parent's config decides whether the split blocks (it runs as the parent's job), the
  // child's whether the child's own calls do.
  const bool blocking = parent->blocking;
  const bool joins = color != NCCL_SPLIT_NOCOLOR;
  auto c = std::make_shared<Comm>();
  c->device = parent->device;
  c->blocking = config ? config_blocking(config, "ncclCommSplit") : env_blocking().value_or(parent->blocking);
  c->identity = parent->identity + "/" + std::to_string(parent->splits++) + ":" + std::to_string(color);
  if (in_group()) {
    // As NCCL: the handle now (NULL for a rank that joins none, which still takes part), the split at
    // the outermost ncclGroupEnd, together with the group's other splits and inits.
    c->init_state.store(1);
    *newcomm = joins ? register_comm(c) : nullptr;
    // The job holds the parent, so that it splits what was passed even if the handle is destroyed first.
    defer_init({c, [parent, color, key](Comm& child) { run_split(child, parent->q.load(), color, key); }, parent.get(),
                parent->rank});
    return ncclSuccess;
  }
  qcclComm_t pq = parent->q.load();
  if (!blocking) {
    c->init_state.store(1);
    c->init_thread = std::thread([c, pq, color, key] { run_split(*c, pq, color, key); });
    // NULL at once for a rank that joins none; the parent shows the split's progress (one thread may
    // drive several ranks)
    *newcomm = joins ? register_comm(c) : nullptr;
    std::lock_guard<std::mutex> lock(parent->splits_mutex);
    parent->pending_splits.push_back({c, joins});
    return ncclInProgress;
  }
  run_split(*c, pq, color, key);
  if (c->init_result != ncclSuccess) throw ShimError{c->init_result, c->init_error};
  *newcomm = c->q.load() ? register_comm(c) : nullptr;
  return ncclSuccess;
}

namespace {

// Waits for the pending splits, which use c's qccl communicator, before it goes.
void wait_pending_splits(Comm& c) {
  std::vector<Comm::PendingSplit> splits;
  {
    std::lock_guard<std::mutex> lock(c.splits_mutex);
    splits.swap(c.pending_splits);
  }
  for (const Comm::PendingSplit& split : splits) {
    if (!split.joined) {  // only the parent holds it
      if (split.child->init_thread.joinable()) split.child->init_thread.join();
      continue;
    }
    // A joined child's thread is its handle's to join (another thread may destroy it now): its last
    // use of the parent is over when its state says done.
    while (split.child->init_state.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

bool splitting(Comm& c) {
  std::lock_guard<std::mutex> lock(c.splits_mutex);
  for (const Comm::PendingSplit& split : c.pending_splits)
    if (split.child->init_state.load() != 0) return true;
  return false;
}

bool pending_split_state(Comm& c, ncclResult_t* out) {
  std::lock_guard<std::mutex> lock(c.splits_mutex);
  for (auto it = c.pending_splits.begin(); it != c.pending_splits.end();) {
    Comm& split = *it->child;
    if (split.init_state.load() != 0) {
      *out = ncclInProgress;
      return true;
    }
    // The thread may still hold the child: joined by whoever holds the handle, or here.
    if (!it->joined && split.init_thread.joinable()) split.init_thread.join();
    const ncclResult_t result = split.init_result;
    const std::string error = split.init_error;
    const bool joined = it->joined;
    it = c.pending_splits.erase(it);
    if (result != ncclSuccess && !joined) {
      *out = result;
      set_last_error("ncclCommGetAsyncError: ncclCommSplit with NCCL_SPLIT_NOCOLOR failed: " + error);
      return true;
    }
  }
  return false;
}

void async_error(Comm& c, ncclResult_t* out) {
  if (c.init_state.load() != 0) {
    *out = ncclInProgress;
    return;
  }
  if (pending_split_state(c, out)) return;
  if (c.init_result != ncclSuccess) {
    *out = c.init_result;
    set_last_error("ncclCommGetAsyncError: initialisation failed: " + c.init_error);
    return;
  }
  if (c.finalizing.load()) {
    *out = ncclInProgress;
    return;
  }
  if (c.finalize_result != ncclSuccess) {
    *out = c.finalize_result;
    set_last_error("ncclCommGetAsyncError: ncclCommFinalize failed: " + c.finalize_error);
    return;
  }
  qcclComm_t q = c.q.load();
  if (!q) {  // finalized: the host side has nothing outstanding
    *out = ncclSuccess;
  } else {
    qcclResult_t health = qcclSuccess;
    check_qccl(qcclCommGetAsyncError(q, &health), "qcclCommGetAsyncError");
    *out = to_nccl(health);
    if (health != qcclSuccess) set_last_error(qcclGetLastError(nullptr));
  }
  // The real communicator's errors count too (device work fails there).
  if (*out == ncclSuccess && c.real) {
    ncclResult_t r = ncclSuccess;
    if (real()->CommGetAsyncError(c.real, &r) == ncclSuccess && r != ncclSuccess) {
      *out = r;
      set_last_error_from_real();
    }
  }
}

ncclComm_t ensure_real(Comm& c, const char* call) {
  std::lock_guard<std::mutex> lock(c.real_mutex);
  if (c.real) return c.real;
  const RealNccl* r = real();
  if (!r)
    fail(ncclInvalidUsage,
         "device buffers need the real NCCL, and none could be loaded (set QCCL_NCCL_LIB to libnccl.so.2's path) (%s)",
         call);
  if (!cuda::available()) fail(ncclInvalidUsage, "device buffers need a CUDA device, and the driver reports none (%s)", call);
  // Collective over qccl: rank 0 makes the real id, every rank receives it over qccl's communicator.
  // Rank 0 sends a failure as well, so that no rank waits for an id that will not come.
  struct {
    ncclUniqueId id;
    int32_t made;
  } shared{};
  ncclResult_t id_result = ncclSuccess;
  if (c.rank == 0) {
    id_result = r->GetUniqueId(&shared.id);
    shared.made = id_result == ncclSuccess;
  }
  qcclComm_t q = c.q.load();
  check_qccl(qcclBroadcast(&shared, &shared, sizeof(shared), qcclUint8, 0, q),
             "qcclBroadcast of the real NCCL's unique id");
  if (id_result != ncclSuccess) {
    set_last_error_from_real();
    throw ShimError{id_result, ""};
  }
  if (!shared.made) fail(ncclRemoteError, "rank 0 could not make the real NCCL's unique id (%s)", call);
  const ncclUniqueId& id = shared.id;
  ncclComm_t made = nullptr;
  ncclResult_t result;
  {
    const cuda::RelaxedCapture relaxed;  // the first device call may be one being captured
    const cuda::OnDevice on(c.device, call);  // as NCCL binds a communicator to its device at init
    result = r->CommInitRank(&made, c.nranks, id, c.rank);
  }
  if (result != ncclSuccess) {
    set_last_error_from_real();
    throw ShimError{result, ""};
  }
  log("INFO", "comm %p rank %d/%d: real NCCL communicator %p made for device buffers (%s)", static_cast<void*>(&c),
      c.rank, c.nranks, static_cast<void*>(made), call);
  c.real = made;
  return made;
}

namespace {
void log_stats(const Comm& c) {
  if (!log_info()) return;
  const Stats& s = c.stats;
  log("INFO",
      "comm %p rank %d/%d: %llu host calls (%llu bytes), %llu device calls (%llu bytes), %llu compressed "
      "(%llu bytes on the wire for %llu)",
      static_cast<const void*>(&c), c.rank, c.nranks, (unsigned long long)s.host_calls.load(),
      (unsigned long long)s.host_bytes.load(), (unsigned long long)s.device_calls.load(),
      (unsigned long long)s.device_bytes.load(), (unsigned long long)s.compressed_calls.load(),
      (unsigned long long)s.compressed_wire_bytes.load(), (unsigned long long)s.compressed_plain_bytes.load());
}
}  // namespace

// qcclCommDestroy of every member at once (one thread each: the destroys wait for each other's peers).
void destroy_together(std::vector<CommRef>& members) {
  std::vector<qcclResult_t> results(members.size(), qcclSuccess);
  std::vector<std::string> messages(members.size());
  auto destroy_one = [&](size_t i) {
    if (qcclComm_t q = members[i]->q.exchange(nullptr)) {
      results[i] = qcclCommDestroy(q);
      if (results[i] != qcclSuccess) messages[i] = qcclGetLastError(nullptr);
    }
  };
  if (members.size() == 1) {
    destroy_one(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < members.size(); ++i) threads.emplace_back(destroy_one, i);
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < members.size(); ++i)
    if (results[i] != qcclSuccess)
      throw ShimError{to_nccl(results[i]), "qcclCommDestroy of rank " + std::to_string(members[i]->rank) + ": " + messages[i]};
}

// Hands c's qccl communicator to qcclCommDestroy, the collective that completes its work with its
// peers: now, or with the last member of its clique (all of them together, one thread each).
void close_host(const CommRef& c) {
  if (c->closed.exchange(true)) return;
  if (c->store) {
    qcclCodecStoreDestroy(c->store);
    c->store = nullptr;
  }
  std::vector<CommRef> members{c};
  if (c->clique) {
    std::lock_guard<std::mutex> lock(c->clique->mutex);
    c->clique->closing.push_back(c);
    if (--c->clique->open > 0) return;  // the last member destroys them all
    members = std::move(c->clique->closing);
  }
  destroy_together(members);
}

// NCCL's finalize completes the communicator's work with its peers; qccl's destroy is the collective
// that does so, so it runs here and ncclCommDestroy only frees what is left. A non-blocking
// communicator's returns at once, as NCCL's job does, so that a program need not wait for it.
ncclResult_t finalize(const CommRef& c) {
  if (c->real) {
    ncclResult_t r = real()->CommFinalize(c->real);
    if (r != ncclSuccess && r != ncclInProgress) {
      set_last_error_from_real();
      throw ShimError{r, ""};
    }
  }
  log_stats(*c);
  wait_pending_splits(*c);
  c->finalized = true;
  if (c->blocking) {
    close_host(c);
    return ncclSuccess;
  }
  c->finalizing.store(true);
  std::lock_guard<std::mutex> lock(c->jobs_mutex);
  if (c->init_thread.joinable()) c->init_thread.join();  // a non-blocking init's, ended (usable())
  c->finalize_thread = std::thread([c] {
    try {
      close_host(c);
    } catch (const ShimError& e) {
      c->finalize_result = e.code;
      c->finalize_error = e.message;
    } catch (const std::exception& e) {  // thread creation, memory: not out of this thread
      c->finalize_result = ncclSystemError;
      c->finalize_error = e.what();
    }
    c->finalizing.store(false);
  });
  return ncclInProgress;
}

void destroy(ncclComm_t comm) {
  // As NCCL (ncclCommEnsureReady): a communicator in progress is not destroyed, and stays usable.
  if (const CommRef c = find_comm(comm); c && (c->init_state.load() != 0 || splitting(*c) || c->finalizing.load()))
    fail(ncclInvalidArgument, "comm = %p is still %s (ncclCommGetAsyncError reports ncclInProgress): wait for "
         "ncclSuccess, or ncclCommAbort it", static_cast<void*>(comm),
         c->init_state.load() != 0 ? "being initialised" : c->finalizing.load() ? "being finalized" : "splitting");
  CommRef c = unregister_comm(comm);
  if (!c) fail(ncclInvalidArgument, "comm = %p is not a communicator of this library", static_cast<void*>(comm));
  {
    std::lock_guard<std::mutex> lock(c->jobs_mutex);
    if (c->init_thread.joinable()) c->init_thread.join();
    if (c->finalize_thread.joinable()) c->finalize_thread.join();  // ended (finalizing is false)
  }
  wait_pending_splits(*c);
  ShimError first{ncclSuccess, ""};
  if (c->real) {
    ncclResult_t r = real()->CommDestroy(c->real);
    if (r != ncclSuccess) first = {r, std::string("the real NCCL's ncclCommDestroy: ") + real()->GetLastError(nullptr)};
    c->real = nullptr;
  }
  if (!c->finalized) log_stats(*c);
  try {
    close_host(c);
  } catch (const ShimError& e) {
    if (first.code == ncclSuccess) first = e;
  }
  if (first.code != ncclSuccess) throw first;
}

void abort_comm(ncclComm_t comm) {
  CommRef c = unregister_comm(comm);
  if (!c) fail(ncclInvalidArgument, "comm = %p is not a communicator of this library", static_cast<void*>(comm));
  // An initialisation in flight is abandoned, not waited for (NCCL's way to time out an init is a
  // non-blocking init, polling, then ncclCommAbort): it aborts its communicator when it ends.
  c->abandoned.store(true);
  {
    std::lock_guard<std::mutex> lock(c->jobs_mutex);
    if (c->init_thread.joinable()) c->init_thread.detach();
    // A finalize job is not waited for either. It cannot be cut short: its qcclCommDestroy has the
    // communicator, and frees the handle as it returns, so an abort could meet a freed one. It holds
    // the Comm until it ends (at QCCL_TIMEOUT where a peer never finalizes).
    if (c->finalize_thread.joinable()) c->finalize_thread.detach();
  }
  if (c->real) {
    real()->CommAbort(c->real);
    c->real = nullptr;
  }
  if (qcclComm_t q = c->q.exchange(nullptr)) qcclCommAbort(q);  // local, always returns
  // The clique's members that wait for this one need not wait any longer.
  std::shared_ptr<Clique> clique = clique_of(*c);
  if (clique && !c->closed.exchange(true)) {
    std::vector<CommRef> rest;
    {
      std::lock_guard<std::mutex> lock(clique->mutex);
      if (--clique->open == 0) rest = std::move(clique->closing);
    }
    if (!rest.empty()) destroy_together(rest);
  }
  // Calls still running on other threads hold their own references; the last one frees c.
}

}  // namespace qccl_nccl
