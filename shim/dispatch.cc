// Dispatch of NCCL calls: host buffers run on qccl on the calling thread, device buffers (and every
// call made during CUDA graph capture) go to the real NCCL; groups collect calls until their end.
#include "shim/dispatch.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <unordered_map>

#include "shim/codec_policy.h"

namespace qccl_nccl {

namespace {

bool is_reduction(Kind k) { return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter; }
bool has_root(Kind k) { return k == Kind::kBroadcast || k == Kind::kReduce || k == Kind::kGather || k == Kind::kScatter; }
bool is_p2p(Kind k) { return k == Kind::kSend || k == Kind::kRecv; }

// Elements of sendbuff and recvbuff the call touches on this rank (NCCL's layouts).
size_t send_elements(const Call& c) {
  const size_t n = static_cast<size_t>(c.comm->nranks);
  switch (c.kind) {
    case Kind::kReduceScatter: case Kind::kAlltoAll: return c.count * n;
    case Kind::kScatter: return c.comm->rank == c.root ? c.count * n : 0;
    case Kind::kRecv: return 0;
    case Kind::kBroadcast: return c.comm->rank == c.root ? c.count : 0;
    default: return c.count;
  }
}
size_t recv_elements(const Call& c) {
  const size_t n = static_cast<size_t>(c.comm->nranks);
  switch (c.kind) {
    case Kind::kAllGather: case Kind::kAlltoAll: return c.count * n;
    case Kind::kGather: return c.comm->rank == c.root ? c.count * n : 0;
    case Kind::kReduce: return c.comm->rank == c.root ? c.count : 0;
    case Kind::kSend: return 0;
    default: return c.count;
  }
}

bool is_fp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }

// A copy: another thread may destroy the op while a call uses it.
std::optional<PreMulSumOp> custom_op(Comm& c, ncclRedOp_t op) {
  std::lock_guard<std::mutex> lock(c.ops_mutex);
  auto it = c.ops.find(static_cast<int>(op));
  if (it == c.ops.end()) return std::nullopt;
  return it->second;
}

void validate(Call& call) {
  Comm& c = *call.comm;
  const size_t size = type_size(call.datatype);
  if (!size) fail(ncclInvalidArgument, "datatype = %d is not an ncclDataType_t", static_cast<int>(call.datatype));
  if (is_reduction(call.kind) && !(call.op >= ncclSum && call.op < ncclNumOps)) {
    const std::optional<PreMulSumOp> custom = custom_op(c, call.op);
    if (!custom)
      fail(ncclInvalidArgument, "op = %d is neither a built-in ncclRedOp_t nor one made by ncclRedOpCreatePreMulSum on "
           "this comm", static_cast<int>(call.op));
    if (custom->datatype != call.datatype)  // its scalar is a value of its datatype
      fail(ncclInvalidArgument, "op = %d was made for datatype %s but datatype = %s", static_cast<int>(call.op),
           type_name(custom->datatype), type_name(call.datatype));
    call.custom = custom;
  }
  if (has_root(call.kind) && (call.root < 0 || call.root >= c.nranks))
    fail(ncclInvalidArgument, "root = %d is outside [0, nranks = %d)", call.root, c.nranks);
  if (is_p2p(call.kind) && (call.root < 0 || call.root >= c.nranks))
    fail(ncclInvalidArgument, "peer = %d is outside [0, nranks = %d)", call.root, c.nranks);
  if (send_elements(call) && !call.sendbuff) fail(ncclInvalidArgument, "sendbuff = NULL with count = %zu", call.count);
  if (recv_elements(call) && !call.recvbuff) fail(ncclInvalidArgument, "recvbuff = NULL with count = %zu", call.count);
  call.empty = !send_elements(call) && !recv_elements(call);

  // Where the buffers live decides who runs the call; a graph being captured needs the real NCCL.
  const bool send_dev = send_elements(call) && cuda::is_device_pointer(call.sendbuff);
  const bool recv_dev = recv_elements(call) && cuda::is_device_pointer(call.recvbuff);
  if (send_elements(call) && recv_elements(call) && send_dev != recv_dev)
    fail(ncclInvalidArgument, "sendbuff = %p is %s memory and recvbuff = %p %s memory; both must be one or the other",
         call.sendbuff, send_dev ? "device" : "host", call.recvbuff, recv_dev ? "device" : "host");
  const bool capturing = cuda::is_capturing(call.stream);
  call.device = send_dev || recv_dev || capturing;
  // QCCL_NCCL_DEVICE=qccl: device buffers run on qccl's device path too, except in a graph being
  // captured, which only the real NCCL can record.
  if (call.device && !capturing && device_on_qccl()) {
    call.device = false;
    call.qccl_device = true;
  }
  // (An empty call holds no fp8 value: it completes at once wherever it runs, as in NCCL.)
  if (!call.device && !call.empty && is_fp8(call.datatype))
    fail(ncclInvalidArgument, "datatype = %s: qccl has no fp8 types%s", type_name(call.datatype),
         call.qccl_device ? " (QCCL_NCCL_DEVICE=nccl sends device buffers to the real NCCL)"
                          : ", so host buffers cannot hold them");
}

// ---- PreMulSum ----------------------------------------------------------------------------------------------

// out[i] = scalar * in[i] in the datatype, the scalar a value of that datatype (the op's, which the
// call's must be), as NCCL's PreMulSum multiplies before it sums. Integers multiply as integers
// (wrapping as unsigned), half and bfloat16 round the float product once (the product of two 16-bit
// values is exact in float, so this is the datatype's own multiply).
template <typename T>
T scalar_of(const void* scalar) {
  T value;
  std::memcpy(&value, scalar, sizeof(T));
  return value;
}

template <typename T>
void scale_int(const void* in, void* out, size_t n, const void* scalar) {
  using U = std::make_unsigned_t<T>;
  const U s = static_cast<U>(scalar_of<T>(scalar));
  for (size_t i = 0; i < n; ++i)
    static_cast<T*>(out)[i] = static_cast<T>(static_cast<U>(static_cast<const T*>(in)[i]) * s);
}

void scale(ncclDataType_t t, const void* in, void* out, size_t n, const void* scalar) {
  switch (t) {
    case ncclInt8: return scale_int<int8_t>(in, out, n, scalar);
    case ncclUint8: return scale_int<uint8_t>(in, out, n, scalar);
    case ncclInt32: return scale_int<int32_t>(in, out, n, scalar);
    case ncclUint32: return scale_int<uint32_t>(in, out, n, scalar);
    case ncclInt64: return scale_int<int64_t>(in, out, n, scalar);
    case ncclUint64: return scale_int<uint64_t>(in, out, n, scalar);
    case ncclFloat32: {
      const float s = scalar_of<float>(scalar);
      for (size_t i = 0; i < n; ++i) static_cast<float*>(out)[i] = static_cast<const float*>(in)[i] * s;
      return;
    }
    case ncclFloat64: {
      const double s = scalar_of<double>(scalar);
      for (size_t i = 0; i < n; ++i) static_cast<double*>(out)[i] = static_cast<const double*>(in)[i] * s;
      return;
    }
    case ncclFloat16: {
      const float s = __half2float(scalar_of<__half>(scalar));
      for (size_t i = 0; i < n; ++i)
        static_cast<__half*>(out)[i] = __float2half_rn(__half2float(static_cast<const __half*>(in)[i]) * s);
      return;
    }
    case ncclBfloat16: {
      const float s = __bfloat162float(scalar_of<__nv_bfloat16>(scalar));
      for (size_t i = 0; i < n; ++i)
        static_cast<__nv_bfloat16*>(out)[i] =
            __float2bfloat16_rn(__bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]) * s);
      return;
    }
    default: fail(ncclInvalidArgument, "datatype = %s cannot be scaled on host buffers", type_name(t));
  }
}

// ncclAvg on a floating type as NCCL runs it (its enqueue.cc turns it into PreMulSum): each rank's
// input times 1/nranks rounded to the datatype, then a sum. qccl's average sums first and divides
// after, which overflows where NCCL's does not (float16 60000 on two ranks: Inf, NCCL 60000). Writes
// the scalar into `scalar` (8 bytes) and returns true for those types; integers keep NCCL's
// sum-then-divide.
bool average_scalar(ncclDataType_t t, int nranks, unsigned char scalar[8]) {
  const double inverse = 1.0 / nranks;
  switch (t) {
    case ncclFloat16: {
      const __half h = __float2half_rn(static_cast<float>(inverse));
      std::memcpy(scalar, &h, sizeof h);
      return true;
    }
    case ncclBfloat16: {
      const __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(inverse));
      std::memcpy(scalar, &b, sizeof b);
      return true;
    }
    case ncclFloat32: {
      const float f = static_cast<float>(inverse);
      std::memcpy(scalar, &f, sizeof f);
      return true;
    }
    case ncclFloat64: std::memcpy(scalar, &inverse, sizeof inverse); return true;
    default: return false;
  }
}

// ---- Host path ------------------------------------------------------------------------------------------

qcclDataType_t q_type(ncclDataType_t t) { return static_cast<qcclDataType_t>(t); }  // same numbering

uint64_t state_key(Kind kind, const void* buffer, size_t count) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t v : {static_cast<uint64_t>(kind), static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buffer)),
                     static_cast<uint64_t>(count)})
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return h;
}

int size_class(size_t bytes) {
  int c = 0;
  while (bytes > 1) bytes >>= 1, ++c;
  return c;
}

void log_decision(Comm& c, const Call& call, size_t bytes, const std::string& decision) {
  if (!log_info()) return;
  std::string key = std::string(call.name) + " " + type_name(call.datatype) + " " + decision;
  {
    std::lock_guard<std::mutex> lock(c.logged_mutex);
    if (!c.logged.insert({key, size_class(bytes)}).second) return;
  }
  log("INFO", "comm %p rank %d/%d: %s %s, %zu bytes (size class 2^%d): %s", static_cast<void*>(&c), c.rank, c.nranks,
      call.name, type_name(call.datatype), bytes, size_class(bytes), decision.c_str());
}

// Buffers a host call needs until its qccl group ends (PreMulSum's scaled inputs).
using Scratch = std::vector<std::vector<unsigned char>>;

// What the shim checks of a queued host call when it runs (its communicator may have been aborted
// since it was queued): for a whole group before any of it is issued. Returns the call's PreMulSum
// op, if it has one (the call's copy: the op itself may have been destroyed since).
const std::optional<PreMulSumOp>& check_runnable(const Call& call) {
  Comm& c = *call.comm;
  if (!c.q.load())
    fail(ncclInvalidUsage, "comm = %p has no qccl communicator (aborted or finalized)",
         static_cast<void*>(call.handle));
  const std::optional<PreMulSumOp>& custom = call.custom;
  if (!custom || call.empty) return custom;  // (an empty call scales nothing: issue_host)
  if (call.qccl_device)
    fail(ncclInvalidUsage, "op = %d is a PreMulSum op, which qccl scales on the host: on device buffers it runs on "
         "the real NCCL only (QCCL_NCCL_DEVICE=nccl)", static_cast<int>(call.op));
  if (custom->residence == ncclScalarDevice && cuda::is_device_pointer(custom->scalar_pointer))
    fail(ncclInvalidUsage, "op = %d's scalar is in device memory, which qccl's host path cannot read; use "
         "ncclScalarHostImmediate for host buffers", static_cast<int>(call.op));
  return custom;
}

// Issues one host call on qccl (queued when a qccl group is open, else run to completion).
void issue_host(Call& call, Scratch& scratch) {
  const std::optional<PreMulSumOp>& custom = check_runnable(call);
  // An empty call moves nothing: done at once, as the real NCCL discards it, and on every path, so
  // that every rank's qccl numbers its collectives alike (a zero-count collective takes a number in
  // qccl, and a group that went to the real NCCL dropped its empty calls: group_end). Also: qccl has no
  // fp8 types, but an empty fp8 call holds none.
  if (call.empty) return;
  Comm& c = *call.comm;
  qcclComm_t q = c.q.load();
  const size_t esize = type_size(call.datatype);
  const size_t bytes = call.count * esize;
  const qcclDataType_t t = q_type(call.datatype);
  if (call.qccl_device) {
    c.stats.device_calls++;
    c.stats.device_bytes += bytes;
    // qccl orders the call with the stream itself (its device path joins the communicator's stream).
    check_qccl(qcclCommSetStream(q, call.stream), "qcclCommSetStream");
  } else {
    c.stats.host_calls++;
    c.stats.host_bytes += bytes;
  }

  // PreMulSum: scale this rank's input, then sum.
  const void* send = call.sendbuff;
  qcclRedOp_t op = static_cast<qcclRedOp_t>(call.op);
  if (custom) {
    // A pointer scalar is read when the call runs, as NCCL reads it.
    const void* s = custom->residence == ncclScalarDevice ? custom->scalar_pointer : custom->immediate;
    const size_t n = send_elements(call);
    scratch.emplace_back(n * esize);
    scale(call.datatype, call.sendbuff, scratch.back().data(), n, s);
    send = scratch.back().data();
    op = qcclSum;
  }

  // QCCL_NCCL_CODEC: compressed float all-reduces (all-gathers, reduce-scatters) with keyed state.
  if (c.codec && (call.kind == Kind::kAllReduce || call.kind == Kind::kAllGather || call.kind == Kind::kReduceScatter)) {
    const CollKind kind = call.kind == Kind::kAllReduce ? CollKind::kAllReduce
                          : call.kind == Kind::kAllGather ? CollKind::kAllGather
                                                          : CollKind::kReduceScatter;
    const char* why = "";
    qcclCodec_t codec = c.codec->codec_for(kind, call.datatype, call.op, bytes, &why);
    if (codec) {
      const size_t state_count = send_elements(call);
      qcclCodecState_t state = nullptr;
      check_qccl(qcclCodecStoreGet(c.store, state_key(call.kind, call.sendbuff, call.count), state_count, &state),
                 "qcclCodecStoreGet");
      log_decision(c, call, bytes, "compressed with " + c.codec->spec_for(call.datatype) +
                                       (call.qccl_device ? " on the device" : ""));
      qcclResult_t r = qcclSuccess;
      if (call.kind == Kind::kAllReduce)
        r = qcclAllReduceCompressed(send, call.recvbuff, call.count, t, op, codec, state, q);
      else if (call.kind == Kind::kAllGather)
        r = qcclAllGatherCompressed(send, call.recvbuff, call.count, t, codec, state, q);
      else
        r = qcclReduceScatterCompressed(send, call.recvbuff, call.count, t, op, codec, state, q);
      // NaN or Inf outputs: NCCL returns them without an error, and so does the shim (with a warning).
      if (r == qcclNonFinite) log("WARN", "%s: %s", call.name, qcclGetLastError(nullptr));
      else check_qccl(r, nullptr);
      c.stats.compressed_calls++;
      c.stats.compressed_plain_bytes += bytes;
      qcclStats_t st{};
      st.size = sizeof(st);
      if (qcclCommGetLastStats(q, &st) == qcclSuccess) c.stats.compressed_wire_bytes += st.wireBytesSent;
      return;
    }
    log_decision(c, call, bytes, std::string("exact (") + why + ")");
  } else {
    log_decision(c, call, bytes, call.qccl_device ? "exact on qccl, device buffers" : "exact on qccl");
  }
  // (A compressed call above averages as its codec does; device buffers take qccl's own average.)
  unsigned char inverse[8];
  if (is_reduction(call.kind) && call.op == ncclAvg && !call.qccl_device &&
      average_scalar(call.datatype, c.nranks, inverse)) {
    const size_t n = send_elements(call);
    scratch.emplace_back(n * esize);
    scale(call.datatype, call.sendbuff, scratch.back().data(), n, inverse);
    send = scratch.back().data();
    op = qcclSum;
  }

  const char* name = nullptr;  // qccl's message names its call; entry() prefixes the NCCL one
  switch (call.kind) {
    case Kind::kAllReduce: return check_qccl(qcclAllReduce(send, call.recvbuff, call.count, t, op, q), name);
    case Kind::kBroadcast:
      return check_qccl(qcclBroadcast(call.sendbuff, call.recvbuff, call.count, t, call.root, q), name);
    case Kind::kReduce: return check_qccl(qcclReduce(send, call.recvbuff, call.count, t, op, call.root, q), name);
    case Kind::kAllGather: return check_qccl(qcclAllGather(call.sendbuff, call.recvbuff, call.count, t, q), name);
    case Kind::kReduceScatter: return check_qccl(qcclReduceScatter(send, call.recvbuff, call.count, t, op, q), name);
    case Kind::kAlltoAll: return check_qccl(qcclAlltoAll(call.sendbuff, call.recvbuff, call.count, t, q), name);
    case Kind::kSend: return check_qccl(qcclSend(call.sendbuff, call.count, t, call.root, q), name);
    case Kind::kRecv: return check_qccl(qcclRecv(call.recvbuff, call.count, t, call.root, q), name);
    case Kind::kGather:
      return check_qccl(qcclGather(call.sendbuff, call.recvbuff, call.count, t, call.root, q), name);
    case Kind::kScatter:
      return check_qccl(qcclScatter(call.sendbuff, call.recvbuff, call.count, t, call.root, q), name);
  }
}

// ---- Device path --------------------------------------------------------------------------------------------

// Makes the real NCCL's twin of a shim op.
ncclRedOp_t make_real_op(PreMulSumOp& custom, ncclComm_t real_comm) {
  void* scalar = custom.residence == ncclScalarDevice ? const_cast<void*>(custom.scalar_pointer) : custom.immediate;
  ncclRedOp_t made = ncclSum;
  ncclResult_t r = real()->RedOpCreatePreMulSum(&made, scalar, custom.datatype,
                                                custom.residence == ncclScalarDevice ? ncclScalarDevice : ncclScalarHostImmediate,
                                                real_comm);
  if (r != ncclSuccess) {
    set_last_error_from_real();
    throw ShimError{r, ""};
  }
  return made;
}

// The real op a forwarded call takes. A live shim op's twin is made on first use (the real communicator
// may be younger than the op) and kept with it; a call whose op was destroyed since it was queued (NCCL
// allows that once the call returned) gets a twin of its copy for its own use, which *transient holds
// for the caller to destroy once the real call returned (as NCCL allows of any op).
ncclRedOp_t real_op(Call& call, ncclComm_t real_comm, std::optional<ncclRedOp_t>* transient) {
  if (!call.custom) return call.op;
  Comm& c = *call.comm;
  std::lock_guard<std::mutex> lock(c.ops_mutex);
  auto it = c.ops.find(static_cast<int>(call.op));
  if (it == c.ops.end()) {
    *transient = make_real_op(*call.custom, real_comm);
    return **transient;
  }
  PreMulSumOp& custom = it->second;
  if (!custom.has_real) {
    custom.real_op = make_real_op(custom, real_comm);
    custom.has_real = true;
  }
  return custom.real_op;
}

ncclResult_t forward_with(Call& call, ncclComm_t rc, ncclRedOp_t op) {
  const RealNccl* r = real();
  switch (call.kind) {
    case Kind::kAllReduce: return r->AllReduce(call.sendbuff, call.recvbuff, call.count, call.datatype, op, rc, call.stream);
    case Kind::kBroadcast:
      return r->Broadcast(call.sendbuff, call.recvbuff, call.count, call.datatype, call.root, rc, call.stream);
    case Kind::kReduce:
      return r->Reduce(call.sendbuff, call.recvbuff, call.count, call.datatype, op, call.root, rc, call.stream);
    case Kind::kAllGather: return r->AllGather(call.sendbuff, call.recvbuff, call.count, call.datatype, rc, call.stream);
    case Kind::kReduceScatter:
      return r->ReduceScatter(call.sendbuff, call.recvbuff, call.count, call.datatype, op, rc, call.stream);
    case Kind::kAlltoAll: return r->AlltoAll(call.sendbuff, call.recvbuff, call.count, call.datatype, rc, call.stream);
    case Kind::kGather:
      return r->Gather(call.sendbuff, call.recvbuff, call.count, call.datatype, call.root, rc, call.stream);
    case Kind::kScatter:
      return r->Scatter(call.sendbuff, call.recvbuff, call.count, call.datatype, call.root, rc, call.stream);
    case Kind::kSend: return r->Send(call.sendbuff, call.count, call.datatype, call.root, rc, call.stream);
    case Kind::kRecv: return r->Recv(call.recvbuff, call.count, call.datatype, call.root, rc, call.stream);
  }
  return ncclInternalError;
}

ncclResult_t forward(Call& call) {
  Comm& c = *call.comm;
  ncclComm_t rc = ensure_real(c, call.name);
  c.stats.device_calls++;
  c.stats.device_bytes += call.count * type_size(call.datatype);
  log_decision(c, call, call.count * type_size(call.datatype), "device buffers: the real NCCL");
  std::optional<ncclRedOp_t> transient;
  const ncclRedOp_t op = real_op(call, rc, &transient);
  const ncclResult_t result = forward_with(call, rc, op);
  if (transient) real()->RedOpDestroy(*transient, rc);
  return result;
}

void check_real(ncclResult_t r) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  set_last_error_from_real();
  throw ShimError{r, ""};
}

// ---- Groups ---------------------------------------------------------------------------------------------------

struct Group {
  int depth = 0;
  std::vector<Call> calls;
  std::vector<DeferredInit> inits;
  std::optional<ShimError> refused;  // the first call refused inside the group, its name in the message
};
thread_local Group t_group;

// A call that moves no elements and is no graph capture's: where it runs changes nothing.
bool routing_neutral(const Call& call) { return call.empty && !call.device; }

[[noreturn]] void fail_refused(const Group& group) {
  fail(group.refused->code, "the group ran none of its %zu queued calls: a call in it was refused: %s",
       group.calls.size(), group.refused->message.c_str());
}

void run_inits(std::vector<DeferredInit>& inits) {
  std::vector<std::vector<DeferredInit*>> lanes;  // one thread each
  std::unordered_map<const Comm*, size_t> lane_of_parent;
  for (DeferredInit& init : inits) {
    if (!init.parent) {
      lanes.push_back({&init});
      continue;
    }
    auto [it, fresh] = lane_of_parent.emplace(init.parent, lanes.size());
    if (fresh) lanes.emplace_back();
    lanes[it->second].push_back(&init);
  }
  std::vector<std::thread> threads;
  for (auto& lane : lanes)
    threads.emplace_back([&lane] {
      for (DeferredInit* init : lane) init->run(*init->c);
    });
  for (auto& t : threads) t.join();
  for (DeferredInit& init : inits)
    if (init.c->init_result != ncclSuccess)
      throw ShimError{init.c->init_result, "rank " + std::to_string(init.rank) + ": " + init.c->init_error};
}

// The real communicators a group's device calls need, made before the group runs. Each is collective
// over its qccl communicator (whose ranks exchange the real id), and one thread may hold several ranks
// of one (ncclCommInitAll, grouped inits): made one after the other, the first would wait for ranks
// this thread drives later. So the missing ones are made together, one thread each, as NCCL makes a
// group's communicators together.
void make_real_communicators(const std::vector<Call>& calls) {
  std::vector<const Call*> missing;
  for (const Call& c : calls)
    if (!c.comm->real.load() &&
        std::none_of(missing.begin(), missing.end(), [&](const Call* m) { return m->comm == c.comm; }))
      missing.push_back(&c);
  if (missing.size() == 1) ensure_real(*missing[0]->comm, missing[0]->name);
  if (missing.size() <= 1) return;
  std::vector<std::exception_ptr> errors(missing.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < missing.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        ensure_real(*missing[i]->comm, missing[i]->name);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

bool device_on_qccl() {
  static const int mode = [] {
    const char* v = std::getenv("QCCL_NCCL_DEVICE");
    if (!v || !*v || std::strcmp(v, "nccl") == 0) return 0;
    if (std::strcmp(v, "qccl") == 0) return 1;
    return -1;
  }();
  if (mode < 0)
    fail(ncclInvalidArgument, "QCCL_NCCL_DEVICE = '%s' is neither nccl nor qccl", std::getenv("QCCL_NCCL_DEVICE"));
  return mode == 1;
}

bool in_group() { return t_group.depth > 0; }

void group_start() { ++t_group.depth; }

void defer_init(DeferredInit init) { t_group.inits.push_back(std::move(init)); }

void group_refuse(const char* name, const ShimError& error) {
  if (in_group() && !t_group.refused) t_group.refused = ShimError{error.code, std::string(name) + ": " + error.message};
}

ncclResult_t group_end() {
  if (t_group.depth == 0) fail(ncclInvalidUsage, "no ncclGroupStart to end");
  if (--t_group.depth > 0) return ncclSuccess;
  Group group = std::move(t_group);
  t_group = Group{};
  if (!group.inits.empty()) run_inits(group.inits);
  if (group.refused) fail_refused(group);
  if (group.calls.empty()) return ncclSuccess;

  // An empty call (routing_neutral) takes the side of the group's other calls.
  const Call* first_host = nullptr;
  const Call* first_device = nullptr;
  for (const Call& c : group.calls) {
    if (routing_neutral(c)) continue;
    if (c.device && !first_device) first_device = &c;
    if (!c.device && !first_host) first_host = &c;
  }
  if (first_host && first_device)
    fail(ncclInvalidUsage,
         "the group mixes calls qccl runs (%s on comm %p, %s buffers) with calls for the real NCCL (%s on comm %p, "
         "device buffers or graph capture), which cannot run as one group; nothing ran",
         first_host->name, static_cast<void*>(first_host->handle), first_host->qccl_device ? "device" : "host",
         first_device->name, static_cast<void*>(first_device->handle));

  if (first_device) {
    // Empty calls the buffers would have sent to qccl are dropped: the real NCCL discards an empty
    // collective, and a point-to-point call of nothing needs no partner (so the peer's may be dropped
    // too); they also need no real communicator of their own.
    group.calls.erase(std::remove_if(group.calls.begin(), group.calls.end(), routing_neutral), group.calls.end());
    make_real_communicators(group.calls);
    const RealNccl* r = real();
    check_real(r->GroupStart());
    ncclResult_t first = ncclSuccess;
    try {
      for (Call& c : group.calls) {
        ncclResult_t result = forward(c);
        if (result != ncclSuccess && first == ncclSuccess) first = result;
      }
    } catch (...) {
      r->GroupEnd();  // the real library's group never stays open
      throw;
    }
    ncclResult_t end = r->GroupEnd();
    check_real(first != ncclSuccess ? first : end);
    return end;
  }

  // Host: a call that cannot run now (its op destroyed, its communicator aborted since it was queued)
  // fails the group before any call starts.
  for (const Call& c : group.calls) {
    try {
      check_runnable(c);
    } catch (const ShimError& e) {
      fail(e.code, "%s: %s; nothing ran", c.name, e.message.c_str());
    }
  }
  // Then wait for every stream's earlier work, and run one qccl group.
  for (const Call& c : group.calls)
    if (!c.qccl_device) cuda::synchronize(c.stream, c.name);
  Scratch scratch;
  check_qccl(qcclGroupStart(), "qcclGroupStart");
  try {
    for (Call& c : group.calls) issue_host(c, scratch);
  } catch (...) {
    qcclGroupEnd();  // a call qccl refused fails its group: this end runs none of the queued calls
    throw;
  }
  check_qccl(qcclGroupEnd(), nullptr);
  return ncclSuccess;
}

ncclResult_t simulate_group_end(ncclSimInfo_t* info) {
  if (!info) return group_end();  // as NCCL: no estimate asked for, so the group runs
  if (t_group.depth == 0) fail(ncclInvalidUsage, "no ncclGroupStart to end");
  if (--t_group.depth > 0) return ncclSuccess;
  Group group = std::move(t_group);
  t_group = Group{};
  // As NCCL (group.cc): the group ends, and is dropped, when what it was to fill is not an
  // ncclSimInfo_t (fields past `size` keep the initializer's).
  constexpr unsigned kSimInfoMagic = 0x74685283;
  ncclSimInfo_t given = NCCL_SIM_INFO_INITIALIZER;
  size_t size = 0;
  std::memcpy(&size, info, sizeof(size));
  std::memcpy(&given, info, std::min(size, sizeof(given)));
  try {
    if (given.magic != kSimInfoMagic)
      fail(ncclInvalidArgument, "simInfo->magic = 0x%x: the ncclSimInfo_t was not initialised with "
           "NCCL_SIM_INFO_INITIALIZER; the group was dropped", given.magic);
    if (!group.inits.empty())
      fail(ncclInvalidUsage, "the group creates communicators, which cannot be simulated; nothing ran");
  } catch (const ShimError& e) {
    // Its communicators' initialisations go with it: they fail with its error (NCCL's groupCleanup
    // records it on them), so that they say so and may be destroyed, instead of staying in progress.
    for (DeferredInit& init : group.inits) {
      init.c->init_result = e.code;
      init.c->init_error = "its group ended in ncclGroupSimulateEnd, which failed: " + e.message;
      init.c->init_state.store(0);
    }
    throw;
  }
  if (group.refused) fail_refused(group);
  // Empty calls go with the device calls, which drop them (group_end).
  group.calls.erase(std::remove_if(group.calls.begin(), group.calls.end(), routing_neutral), group.calls.end());
  for (const Call& c : group.calls)
    if (!c.device)
      fail(ncclInvalidUsage, "%s on host buffers: qccl has no cost model to simulate; the group ended without running",
           c.name);
  if (group.calls.empty()) return ncclSuccess;  // as NCCL: the estimate stays as it was
  make_real_communicators(group.calls);
  const RealNccl* r = real();
  check_real(r->GroupStart());
  try {
    for (Call& c : group.calls) check_real(forward(c));
  } catch (...) {
    r->GroupSimulateEnd(info);  // closes the real library's group without running it
    throw;
  }
  ncclResult_t result = r->GroupSimulateEnd(info);
  check_real(result);
  return result;
}

void dispatch(Call call) {
  validate(call);
  if (in_group()) {
    t_group.calls.push_back(std::move(call));
    return;
  }
  if (call.device) return check_real(forward(call));
  // Stream semantics: the call runs after the work already on its stream and is complete on return
  // (qccl's device path joins the stream itself).
  if (!call.qccl_device) cuda::synchronize(call.stream, call.name);
  Scratch scratch;
  issue_host(call, scratch);
}

void create_premulsum(Comm& c, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence) {
  if (!op) fail(ncclInvalidArgument, "op = NULL");
  if (!scalar) fail(ncclInvalidArgument, "scalar = NULL");
  if (!type_size(datatype)) fail(ncclInvalidArgument, "datatype = %d is not an ncclDataType_t", static_cast<int>(datatype));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    fail(ncclInvalidArgument, "residence = %d is neither ncclScalarDevice nor ncclScalarHostImmediate",
         static_cast<int>(residence));
  PreMulSumOp made{datatype, residence, scalar, {}, ncclSum, false};
  if (residence == ncclScalarHostImmediate) {
    if (datatype == ncclFloat8e4m3 || datatype == ncclFloat8e5m2)
      fail(ncclInvalidArgument, "datatype = %s: qccl has no fp8 types", type_name(datatype));
    std::memcpy(made.immediate, scalar, type_size(datatype));
    made.scalar_pointer = nullptr;
  }
  std::lock_guard<std::mutex> lock(c.ops_mutex);
  if (c.next_op == ncclMaxRedOp) fail(ncclInvalidUsage, "every custom op id of comm %p is in use", static_cast<void*>(&c));
  const int id = c.next_op++;
  c.ops[id] = made;
  *op = static_cast<ncclRedOp_t>(id);
}

void destroy_op(Comm& c, ncclRedOp_t op) {
  std::lock_guard<std::mutex> lock(c.ops_mutex);
  auto it = c.ops.find(static_cast<int>(op));
  if (it == c.ops.end())
    fail(ncclInvalidArgument, "op = %d was not made by ncclRedOpCreatePreMulSum on comm %p", static_cast<int>(op),
         static_cast<void*>(&c));
  if (it->second.has_real && c.real) real()->RedOpDestroy(it->second.real_op, c.real);
  c.ops.erase(it);
}

}  // namespace qccl_nccl
