#include "transports/ucx_transport.h"

#include <ucs/debug/log_def.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "base/errors.h"
#include "base/log.h"

namespace qccl::transport {

namespace {

[[noreturn]] void fail_ucx(const char* what, ucs_status_t status) {
  fail(qcclSystemError, "UCX %s failed: %s", what, ucs_status_string(status));
}

// A transfer refused as it is posted because the peer's endpoint failed (the peer died, or the link
// to it) is the peer's failure, as one that fails later in test() is: qcclRemoteError. So is a
// shared-memory error there: UCX attaches to the peer's segment at its first message, and the
// segment is gone when the peer destroyed its communicator (after a failure it saw first) or died.
qcclResult_t posting_error(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_SHMEM_SEGMENT:
      return qcclRemoteError;
    default:
      return qcclSystemError;
  }
}

// UCX logs a failed cross-memory read (cma: process_vm_readv) at FATAL level, and its default log
// handler then aborts the process, when the endpoint has no peer-failure handling. A peer that dies
// during a shared-memory rendezvous would thereby kill every survivor before qccl's control plane
// could report the death. Peer-failure mode is not the answer (it moves shared-memory traffic onto
// tcp loopback, transports.md §1.3), so this handler, which runs before UCX's own, demotes exactly
// that message to a qccl warning: the read then fails with an error status, the transfer fails,
// and the communicator reports the dead peer.
ucs_log_func_rc_t demote_cma_peer_death(const char* file, unsigned line, const char*, ucs_log_level_t level,
                                        const ucs_log_component_config_t*, const char* format, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL || !file || !std::strstr(file, "cma_ep.c")) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  std::vsnprintf(text, sizeof(text), format, ap);
  QCCL_WARN("UCX %s:%u: %s (the peer process is gone)", file, line, text);
  return UCS_LOG_FUNC_RC_STOP;
}

ucp_tag_t make_tag(int sender, Key key) { return (static_cast<ucp_tag_t>(sender) << kKeyBits) | (key & kKeyMask); }

}  // namespace

// The process-wide UCP context, shared by every communicator's worker and released with the last.
class UcxTransport::Context {
 public:
  ucp_context_h handle = nullptr;

  static std::shared_ptr<Context> get() {
    // Never destroyed: a thread may still be creating a communicator when the process exits (an
    // initialisation abandoned by the NCCL drop-in's ncclCommAbort), and an exit-time destructor of
    // these would race with it.
    static std::mutex* mu = new std::mutex;
    static std::weak_ptr<Context>* shared = new std::weak_ptr<Context>;
    std::lock_guard<std::mutex> lock(*mu);
    if (auto existing = shared->lock()) return existing;
    auto created = std::make_shared<Context>();
    *shared = created;
    return created;
  }

  Context() {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) fail_ucx("ucp_config_read", status);
    // Pipeline chunks (256 KiB by default, base/config.h; at most 1 MiB when sized from
    // QCCL_LINK_RATE) travel eagerly through UCX's shared-memory FIFOs rather than by rendezvous:
    // the rendezvous reads the sender's pages with process_vm_readv (cma), whose page pinning made
    // all-reduce about 2x slower at every size from 64 KiB to 16 MiB here (docs/PERF.md, "Eager
    // chunks"). Larger messages (point-to-point) still use the rendezvous. The user's
    // UCX_RNDV_THRESH, if set, wins.
    if (!std::getenv("UCX_RNDV_THRESH")) {
      status = ucp_config_modify(config, "RNDV_THRESH", "1m");
      if (status != UCS_OK) QCCL_WARN("UCX: cannot set RNDV_THRESH: %s", ucs_status_string(status));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;  // workers of different communicators live on different threads
    status = ucp_init(&params, config, &handle);
    ucp_config_release(config);
    if (status != UCS_OK) fail_ucx("ucp_init", status);
    static std::once_flag handler_once;
    std::call_once(handler_once, [] { ucs_log_push_handler(demote_cma_peer_death); });
  }
  ~Context() { ucp_cleanup(handle); }
};

UcxTransport::UcxTransport(int rank, int nranks) : context_(Context::get()), rank_(rank), nranks_(nranks) {
  if (nranks > kMaxRanks) fail(qcclInvalidArgument, "nranks = %d exceeds the UCX tag layout's %d ranks", nranks, kMaxRanks);
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // The communicator's drive lock serialises every call on this worker (caller or progress thread).
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t status = ucp_worker_create(context_->handle, &params, &worker_);
  if (status != UCS_OK) fail_ucx("ucp_worker_create", status);
  status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker_);
    fail_ucx("ucp_worker_get_efd", status);
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  status = ucp_worker_get_address(worker_, &address, &length);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker_);
    fail_ucx("ucp_worker_get_address", status);
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(address);
  address_.assign(bytes, bytes + length);
  ucp_worker_release_address(worker_, address);
}

UcxTransport::~UcxTransport() {
  // Destroying an endpoint whose transport still has queued work trips UCX assertions, so first let
  // abandoned receives finish: a queued read from a dead peer fails quickly rather than lingering.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  abandoned_receives_.insert(abandoned_receives_.end(), unsettled_receives_.begin(), unsettled_receives_.end());
  for (void* request : abandoned_receives_) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    ucp_request_free(request);
  }
  // Force-close: by the time a communicator is destroyed every rank has passed the closing
  // barrier (or the job is failing), so no message is still owed to a peer.
  for (ucp_ep_h ep : endpoints_) {
    if (!ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(req)) {
      for (int i = 0; i < 1000 && ucp_request_check_status(req) == UCS_INPROGRESS; ++i) ucp_worker_progress(worker_);
      ucp_request_free(req);
    }
  }
  if (worker_) ucp_worker_destroy(worker_);
}

void UcxTransport::connect(const std::vector<std::vector<uint8_t>>& addresses) {
  if (static_cast<int>(addresses.size()) != nranks_)
    fail(qcclInternalError, "UcxTransport::connect: %zu addresses for %d ranks", addresses.size(), nranks_);
  endpoints_.assign(nranks_, nullptr);
  for (int peer = 0; peer < nranks_; ++peer) connect_peer(peer, addresses[peer]);
}

std::string UcxTransport::library_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

void UcxTransport::connect_peer(int peer, const std::vector<uint8_t>& address) {
  if (peer < 0 || peer >= kMaxRanks) fail(qcclInternalError, "UcxTransport::connect_peer: peer %d", peer);
  if (static_cast<size_t>(peer) >= endpoints_.size()) endpoints_.resize(static_cast<size_t>(peer) + 1, nullptr);
  // (A null endpoint would crash the first send to that peer.)
  if (address.empty()) fail(qcclRemoteError, "peer %d sent an empty UCX worker address", peer);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t status = ucp_ep_create(worker_, &params, &endpoints_[peer]);
  if (status != UCS_OK)
    fail(qcclSystemError, "UCX ucp_ep_create to peer %d failed: %s", peer, ucs_status_string(status));
}

Handle UcxTransport::isend(int peer, Key key, const void* buf, size_t bytes) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t req = ucp_tag_send_nbx(endpoints_[peer], buf, bytes, make_tag(rank_, key), &param);
  if (UCS_PTR_IS_ERR(req))
    fail(posting_error(UCS_PTR_STATUS(req)), "UCX send of %zu bytes to rank %d failed: %s", bytes, peer,
         ucs_status_string(UCS_PTR_STATUS(req)));
  Handle h;
  if (req == nullptr) h.finished = true;
  else h.request = req;
  return h;
}

Handle UcxTransport::irecv(int peer, Key key, Key ignore, void* buf, size_t bytes) {
  ucp_request_param_t param{};
  // UCX 1.13 leaves recv_info.tag_info unwritten when a receive completes inside the call, so we
  // always take a request and read the sender's tag and length from it in test().
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.datatype = ucp_dt_make_contig(1);
  const ucp_tag_t mask = ~static_cast<ucp_tag_t>(ignore & kKeyMask);
  ucs_status_ptr_t req = ucp_tag_recv_nbx(worker_, buf, bytes, make_tag(peer, key), mask, &param);
  if (UCS_PTR_IS_ERR(req))
    fail(posting_error(UCS_PTR_STATUS(req)), "UCX receive of %zu bytes from rank %d failed: %s", bytes, peer,
         ucs_status_string(UCS_PTR_STATUS(req)));
  Handle h;
  h.receive = true;
  h.request = req;
  return h;
}

Poll UcxTransport::test(Handle& handle, Completion* done, std::string* error) {
  if (handle.finished) {  // only sends finish inside the post (receives take NO_IMM_CMPL)
    *done = Completion{};
    handle = Handle{};
    return Poll::kDone;
  }
  ucp_tag_recv_info_t info{};
  // ucp_tag_recv_request_test reads receive-only fields: sends go through ucp_request_check_status.
  ucs_status_t status = handle.receive ? ucp_tag_recv_request_test(handle.request, &info)
                                       : ucp_request_check_status(handle.request);
  if (status == UCS_INPROGRESS) return Poll::kPending;
  if (status == UCS_OK) {
    done->bytes = info.length;
    done->key = info.sender_tag & kKeyMask;
    ucp_request_free(handle.request);
    handle = Handle{};
    return Poll::kDone;
  }
  *error = ucs_status_string(status);
  done->truncated = status == UCS_ERR_MESSAGE_TRUNCATED;
  ucp_request_free(handle.request);
  handle = Handle{};
  return Poll::kFailed;
}

void UcxTransport::cancel(Handle& handle) {
  if (handle.request) {
    if (handle.receive) {
      // A receive that has matched goes on receiving the rest of its message (the fragments or the
      // rendezvous read queued): settle() waits for it, and it is freed once UCX has finished with it.
      // One that matched nothing is withdrawn at once, and freed now: a collective that listened for
      // a message nobody sent cancels one at its end.
      ucp_request_cancel(worker_, handle.request);
      if (ucp_request_check_status(handle.request) != UCS_INPROGRESS)
        ucp_request_free(handle.request);
      else
        unsettled_receives_.push_back(handle.request);
    } else {
      ucp_request_free(handle.request);  // released by UCX whenever it completes
    }
  }
  handle = Handle{};
}

bool UcxTransport::settle(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    auto finished = std::remove_if(unsettled_receives_.begin(), unsettled_receives_.end(), [](void* request) {
      if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
      ucp_request_free(request);
      return true;
    });
    unsettled_receives_.erase(finished, unsettled_receives_.end());
    if (unsettled_receives_.empty()) return true;
    if (std::chrono::steady_clock::now() >= deadline) break;
    ucp_worker_progress(worker_);
  }
  // Their peers stopped sending: freed with the transport (the destructor waits for them again).
  abandoned_receives_.insert(abandoned_receives_.end(), unsettled_receives_.begin(), unsettled_receives_.end());
  unsettled_receives_.clear();
  return false;
}

bool UcxTransport::progress() { return ucp_worker_progress(worker_) != 0; }

bool UcxTransport::arm() {
  ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return false;
  if (status != UCS_OK) fail_ucx("ucp_worker_arm", status);
  return true;
}

// UCX 1.13 has no ucp_ep_query for transport names; ucp_ep_print_info lists each lane as
// "lane[0]:  3:sysv/memory.0 md[2] ..." and we collect the distinct "name/device" tokens.
std::set<std::string> UcxTransport::lanes_of(int peer) const {
  std::set<std::string> lanes;
  if (peer < 0 || static_cast<size_t>(peer) >= endpoints_.size() || !endpoints_[peer]) return lanes;
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (!stream) return lanes;
  ucp_ep_print_info(endpoints_[peer], stream);
  std::fclose(stream);
  for (const char* p = text; (p = std::strstr(p, "lane[")) != nullptr;) {
    const char* colon = std::strchr(p, ':');
    if (!colon) break;
    const char* start = std::strchr(colon + 1, ':');  // after the resource index
    if (!start) break;
    ++start;
    const char* end = start;
    while (*end && *end != ' ' && *end != '.') ++end;
    lanes.insert(std::string(start, end));
    p = end;
  }
  std::free(text);
  return lanes;
}

namespace {
std::string join_lanes(const std::set<std::string>& lanes) {
  std::string out;
  for (const auto& lane : lanes) out += (out.empty() ? "" : ", ") + lane;
  return out;
}
}  // namespace

std::string UcxTransport::peer_transports(int peer) const { return join_lanes(lanes_of(peer)); }

std::string UcxTransport::describe() const {
  std::set<std::string> lanes;
  for (int peer = 0; peer < nranks_; ++peer) {
    if (peer == rank_ && nranks_ > 1) continue;
    lanes.merge(lanes_of(peer));
  }
  return "UCX " + std::string(ucp_get_version_string()) + " (" + join_lanes(lanes) + ")";
}

}  // namespace qccl::transport
