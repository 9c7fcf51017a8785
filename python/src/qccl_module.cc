// qccl._qccl: the C API as Python objects, one thin layer. Buffers arrive as addresses and element
// counts: qccl/_buffers.py has already checked them (type, contiguity, writability, sizes), and holds
// the arrays alive (through their Buffers, which also hold the buffer exports); this layer owns the
// handles (communicators, requests, codecs, states), releases the GIL around every call that may
// block or take long, and turns a failed result into the exception that qccl/errors.py makes for
// its code (with the library's own message).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <qccl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// Set by qccl/errors.py at import: factory(code, message) -> an exception instance.
py::object& error_factory() {
  static py::object* factory = new py::object();  // never destroyed: outlives the interpreter's teardown
  return *factory;
}

[[noreturn]] void raise_error(int code, const std::string& message) {
  py::object exception = error_factory()(code, message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  throw py::error_already_set();
}

// The message must be read on the thread that made the call, before any other qccl call: it is.
void check(qcclResult_t result, qcclComm_t comm = nullptr) {
  if (result == qcclSuccess) return;
  raise_error(result, qcclGetLastError(comm));
}

// Runs a C call (qccl's API, which never throws) with the GIL released. Not in a
// py::gil_scoped_release: Python ends a daemon thread that takes the GIL back while the interpreter
// finalizes (pthread_exit, which unwinds the thread's stack), and unwinding out of that destructor,
// noexcept, aborted the process (a completion thread whose qcclWait returned during exit). From
// here the unwinding passes through pybind11 (which lets it through) and the thread ends quietly.
template <class Call>
qcclResult_t released(Call&& call) {
  PyThreadState* saved = PyEval_SaveThread();
  const qcclResult_t result = call();
  PyEval_RestoreThread(saved);
  return result;
}

// Runs a C call with the GIL released and raises on failure.
template <class Call>
void call_released(qcclComm_t comm, Call&& call) {
  check(released(std::forward<Call>(call)), comm);
}

const void* cptr(uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }
qcclDataType_t dtype(int code) { return static_cast<qcclDataType_t>(code); }
qcclRedOp_t redop(int code) { return static_cast<qcclRedOp_t>(code); }

// Configuration from keyword values (None: take the QCCL_* variable or the default).
struct Config {
  qcclConfig_t c = QCCL_CONFIG_INITIALIZER;
  std::string algorithms, codec;

  explicit Config(const py::dict& values) {
    for (auto item : values) {
      std::string key = py::cast<std::string>(item.first);
      py::handle value = item.second;
      if (value.is_none()) continue;
      // A value of the wrong type is qccl's InvalidArgument naming the setting, as a bad value is.
      auto as = [&](auto* out, const char* what) {
        try {
          *out = py::cast<std::remove_pointer_t<decltype(out)>>(value);
        } catch (const py::cast_error&) {
          raise_error(qcclInvalidArgument, "config: " + key + " = " + py::cast<std::string>(py::repr(value)) +
                                               " is not " + what);
        }
      };
      // A negative number is refused here: qcclConfig_t reads -1.0 and INT_MIN as 'not set'.
      auto at_least_zero = [&](double v) {
        if (v < 0) raise_error(qcclInvalidArgument, "config: " + key + " = " + py::cast<std::string>(py::repr(value)) +
                                                        " is negative");
      };
      if (key == "timeout") {
        as(&c.timeoutSeconds, "a number");
        at_least_zero(c.timeoutSeconds);
      } else if (key == "chunk_bytes") {
        as(&c.chunkBytes, "an int");
        at_least_zero(c.chunkBytes);
      } else if (key == "pipeline_depth") {
        as(&c.pipelineDepth, "an int");
        at_least_zero(c.pipelineDepth);
      } else if (key == "codec_min_bytes") {
        as(&c.codecMinBytes, "a number");
        at_least_zero(c.codecMinBytes);
      } else if (key == "algorithms") {
        as(&algorithms, "a str");
        c.algorithms = algorithms.c_str();
      } else if (key == "codec") {
        as(&codec, "a str");
        c.codec = codec.c_str();
      } else {
        raise_error(qcclInvalidArgument, "config: unknown setting '" + key + "'");
      }
    }
  }
  Config(const Config&) = delete;
};

// What this thread's open group (qccl.group()) keeps until its outermost end: the arrays of its
// calls, blocking ones included (qccl runs them at qcclGroupEnd, after the Python call returned),
// and the requests dropped inside it (qcclWait refuses a request whose group has not ended).
struct GroupKeep {
  int depth = 0;
  std::vector<py::object> arrays;
  std::vector<qcclRequest_t> dropped;
};
thread_local GroupKeep t_group;

class Request {
 public:
  Request(qcclRequest_t request, py::object keepalive) : request_(request), keepalive_(std::move(keepalive)) {}
  Request(const Request&) = delete;
  // A request dropped while its operation runs waits for it: the buffers are qccl's until then.
  ~Request() {
    if (request_ == nullptr) return;
    if (t_group.depth > 0) {  // its group may not have ended: waited for at the group's end
      t_group.dropped.push_back(request_);
      t_group.arrays.push_back(std::move(keepalive_));
      return;
    }
    {
      py::gil_scoped_release nogil;
      qcclWait(&request_);
    }
    // Refused (its group, open on another thread, has not ended): the arrays stay qccl's for good.
    if (request_ != nullptr) keepalive_.release();
  }
  // The result is kept: every wait() and is_completed() after completion raises a failure again.
  void wait() {
    if (request_ != nullptr) {
      const qcclResult_t result = released([&] { return qcclWait(&request_); });
      if (request_ != nullptr) check(result);  // refused; nothing changed
      completed(result);
    }
    raise_result();
  }
  bool test() {
    if (request_ != nullptr) {
      int done = 0;
      const qcclResult_t result = qcclTest(&request_, &done);
      if (!done) {
        check(result);
        return false;
      }
      completed(result);
    }
    raise_result();
    return true;
  }

 private:
  void completed(qcclResult_t result) {
    result_ = result;
    if (result != qcclSuccess) message_ = qcclGetLastError(nullptr);
    keepalive_ = py::none();
  }
  void raise_result() const {
    if (result_ != qcclSuccess) raise_error(result_, message_);
  }
  qcclRequest_t request_;
  py::object keepalive_;
  qcclResult_t result_ = qcclSuccess;
  std::string message_;
};

void group_start() {
  check(qcclGroupStart());
  ++t_group.depth;
}

// The outermost end waits for the requests dropped inside the group, then lets the arrays go.
void group_end() {
  const qcclResult_t result = released([] { return qcclGroupEnd(); });
  const std::string message = result != qcclSuccess ? qcclGetLastError(nullptr) : "";
  if (t_group.depth > 0 && --t_group.depth == 0) {
    std::vector<qcclRequest_t> dropped = std::move(t_group.dropped);
    t_group.dropped.clear();
    released([&] {
      for (qcclRequest_t& request : dropped) qcclWait(&request);
      return qcclSuccess;
    });
    t_group.arrays.clear();
  }
  if (result != qcclSuccess) raise_error(result, message);
}

// Blocking (request = nullptr) or not: `call(request)` is the C call. Non-blocking calls return a
// Request that keeps `keepalive` (the Buffers of the caller's arrays, which hold the arrays and their
// buffer exports) until it completes; inside a group, blocking calls leave them to the group.
template <class Call>
py::object launch(qcclComm_t comm, bool async_op, py::object keepalive, Call&& call) {
  if (!async_op) {
    call_released(comm, [&] { return call(nullptr); });
    if (t_group.depth > 0) t_group.arrays.push_back(std::move(keepalive));
    return py::none();
  }
  qcclRequest_t request = nullptr;
  call_released(comm, [&] { return call(&request); });
  return py::cast(new Request(request, std::move(keepalive)), py::return_value_policy::take_ownership);
}

// Checkpoints through the C API's Size/Save/Load functions of one handle type.
template <class Handle>
py::bytes save_checkpoint(Handle handle, qcclResult_t (*size)(Handle, size_t*),
                          qcclResult_t (*save)(Handle, void*, size_t)) {
  size_t bytes = 0;
  check(size(handle, &bytes));
  std::string buffer(bytes, '\0');
  call_released(nullptr, [&] { return save(handle, buffer.data(), buffer.size()); });
  return py::bytes(buffer);
}

template <class Handle>
void load_checkpoint(Handle handle, qcclResult_t (*load)(Handle, const void*, size_t), const py::bytes& checkpoint) {
  std::string_view view = checkpoint;
  call_released(nullptr, [&] { return load(handle, view.data(), view.size()); });
}

// A codec's canonical spec (qcclCodecGetSpec): what qcclCodecCreate reads back as the same codec.
std::string spec_of(qcclCodec_t codec) {
  size_t bytes = 0;
  check(qcclCodecGetSpec(codec, nullptr, 0, &bytes));
  std::string spec(bytes, '\0');
  check(qcclCodecGetSpec(codec, spec.data(), spec.size(), nullptr));
  spec.resize(bytes - 1);
  return spec;
}

class Codec {
 public:
  explicit Codec(const std::string& spec) : spec_(spec) { check(qcclCodecCreate(spec.c_str(), &codec_)); }
  Codec(qcclCodec_t codec, std::string spec) : codec_(codec), spec_(std::move(spec)) {}
  Codec(const Codec&) = delete;
  ~Codec() { qcclCodecDestroy(codec_); }
  qcclCodec_t get() const { return codec_; }
  const std::string& spec() const { return spec_; }

 private:
  qcclCodec_t codec_ = nullptr;
  std::string spec_;
};

// A codec state: owned (made by a communicator) or a codec store's (owned by the store).
class CodecState {
 public:
  CodecState(qcclCodecState_t state, bool owned) : state_(state), owned_(owned) {}
  CodecState(const CodecState&) = delete;
  ~CodecState() {
    if (owned_) qcclCodecStateDestroy(state_);
  }
  qcclCodecState_t get() const { return state_; }
  py::bytes save() const { return save_checkpoint(state_, qcclCodecStateSize, qcclCodecStateSave); }
  void load(const py::bytes& checkpoint) const { load_checkpoint(state_, qcclCodecStateLoad, checkpoint); }
  void set_learning_rate(double lr) const { check(qcclCodecStateSetLearningRate(state_, lr)); }

 private:
  qcclCodecState_t state_;
  bool owned_;
};

qcclCodecState_t state_of(const CodecState* state) { return state ? state->get() : nullptr; }

class CodecStore {
 public:
  CodecStore(qcclCodecStore_t store) : store_(store) {}
  CodecStore(const CodecStore&) = delete;
  ~CodecStore() { qcclCodecStoreDestroy(store_); }
  // The handle is the store's; the Python object keeps the store alive (keep_alive below).
  CodecState* get(uint64_t key, size_t count) {
    qcclCodecState_t state = nullptr;
    check(qcclCodecStoreGet(store_, key, count, &state));
    return new CodecState(state, false);
  }
  void erase(uint64_t key) { check(qcclCodecStoreErase(store_, key)); }
  py::bytes save() const { return save_checkpoint(store_, qcclCodecStoreSize, qcclCodecStoreSave); }
  void load(const py::bytes& checkpoint) const { load_checkpoint(store_, qcclCodecStoreLoad, checkpoint); }

 private:
  qcclCodecStore_t store_;
};

class DeltaStore {
 public:
  DeltaStore(const Codec& codec, size_t row_values, int store_dtype, size_t budget, bool evict, uint32_t id) {
    check(qcclDeltaStoreCreate(codec.get(), row_values, dtype(store_dtype), budget, evict ? 1 : 0, id, &store_));
  }
  DeltaStore(const DeltaStore&) = delete;
  ~DeltaStore() { qcclDeltaStoreDestroy(store_); }
  qcclDeltaStore_t get() const { return store_; }
  void set_warmup(bool on) { check(qcclDeltaStoreSetWarmup(store_, on ? 1 : 0)); }
  void set_file(const std::string& path) { check(qcclDeltaStoreSetFile(store_, path.c_str())); }
  void set_low_bits(int bits) { check(qcclDeltaStoreSetLowBits(store_, bits)); }
  py::dict info() const {
    qcclDeltaStoreInfo_t info{};
    check(qcclDeltaStoreGetInfo(store_, &info));
    py::dict d;
    d["keys"] = info.keys;
    d["bytes"] = info.bytes;
    d["sequence"] = info.sequence;
    d["last_message_bytes"] = info.lastMessageBytes;
    d["last_full_rows"] = info.lastFullRows;
    return d;
  }
  py::bytes save() const { return save_checkpoint(store_, qcclDeltaStoreSize, qcclDeltaStoreSave); }
  void load(const py::bytes& checkpoint) const { load_checkpoint(store_, qcclDeltaStoreLoad, checkpoint); }

 private:
  qcclDeltaStore_t store_ = nullptr;
};

std::vector<qcclSegment_t> segments_of(const std::vector<std::pair<size_t, bool>>& list) {
  std::vector<qcclSegment_t> segments;
  segments.reserve(list.size());
  for (const auto& [count, exact] : list) segments.push_back({count, exact ? 1 : 0});
  return segments;
}

class Comm {
 public:
  explicit Comm(qcclComm_t comm) : comm_(comm) {}
  Comm(const Comm&) = delete;
  // Not destroyed here: destroying is collective (every rank must reach it), which a garbage
  // collector cannot promise. qccl/communicator.py warns about a communicator left undestroyed.
  ~Comm() = default;

  static Comm* init_env(const py::dict& config) {
    Config c(config);
    qcclComm_t comm = nullptr;
    call_released(nullptr, [&] { return qcclCommInitEnv(&comm, &c.c); });
    return new Comm(comm);
  }
  static Comm* init_rank(int nranks, const py::bytes& unique_id, int rank, const py::dict& config) {
    std::string_view id = unique_id;
    if (id.size() != QCCL_UNIQUE_ID_BYTES)
      raise_error(qcclInvalidArgument, "unique_id: " + std::to_string(id.size()) + " bytes, expected " +
                                           std::to_string(QCCL_UNIQUE_ID_BYTES) + " (from qccl.get_unique_id())");
    qcclUniqueId uid;
    std::copy(id.begin(), id.end(), uid.internal);
    Config c(config);
    qcclComm_t comm = nullptr;
    call_released(nullptr, [&] { return qcclCommInitRankConfig(&comm, nranks, uid, rank, &c.c); });
    return new Comm(comm);
  }

  qcclComm_t get() const {
    if (comm_ == nullptr) raise_error(qcclInvalidUsage, "the communicator has been destroyed or aborted");
    return comm_;
  }
  bool alive() const { return comm_ != nullptr; }
  int rank() const {
    int r = 0;
    check(qcclCommUserRank(get(), &r), comm_);
    return r;
  }
  int size() const {
    int n = 0;
    check(qcclCommCount(get(), &n), comm_);
    return n;
  }
  Comm* split(int color, int key, const py::dict& config) {
    Config c(config);
    qcclComm_t comm = get(), newcomm = nullptr;
    call_released(comm, [&] { return qcclCommSplit(comm, color, key, &newcomm, &c.c); });
    return newcomm ? new Comm(newcomm) : nullptr;
  }
  void destroy() {
    qcclComm_t comm = get();
    // qccl refuses it while the group holds calls on comm, and the group's arrays wait for its end.
    if (t_group.depth > 0) raise_error(qcclInvalidUsage, "destroy: inside qccl.group(); destroy after the block");
    comm_ = nullptr;  // invalid afterwards, even on failure
    destroying_ = comm;  // for abort() from another thread, which releases the destroy (qccl.h)
    struct Done {
      qcclComm_t& destroying;
      ~Done() { destroying = nullptr; }  // (the GIL is held again here)
    } done{destroying_};
    call_released(nullptr, [&] { return qcclCommDestroy(comm); });
  }
  void abort() {
    // A destroy blocked in another thread (in its closing barrier) is released by the abort: the
    // handle stays the destroy's to free. Had it returned since (the GIL is let go in the call), qccl
    // refuses the freed handle cleanly.
    qcclComm_t comm = comm_ ? comm_ : destroying_ ? destroying_ : get();
    comm_ = nullptr;
    call_released(nullptr, [&] { return qcclCommAbort(comm); });
  }
  void check_async_error() const {
    qcclResult_t async_error = qcclSuccess;
    check(qcclCommGetAsyncError(get(), &async_error), comm_);
    check(async_error, comm_);
  }
  py::dict last_stats() const {
    qcclStats_t s{};
    s.size = sizeof(s);
    check(qcclCommGetLastStats(get(), &s), comm_);
    py::dict d;
    d["wire_bytes_sent"] = s.wireBytesSent;
    d["wire_bytes_received"] = s.wireBytesReceived;
    d["seconds"] = s.seconds;
    d["sequence"] = s.sequence;
    d["algorithm"] = std::string(s.algorithm);
    d["compression_ratio"] = s.compressionRatio;
    d["encode_seconds"] = s.encodeSeconds;
    d["decode_seconds"] = s.decodeSeconds;
    d["wire_seconds"] = s.wireSeconds;
    d["codec"] = std::string(s.codec);
    d["int_alpha"] = s.intAlpha;
    d["clipped_values"] = s.clippedValues;
    d["largest_integer"] = s.largestInteger;
    d["inter_node_bytes_sent"] = s.interNodeBytesSent;
    d["reduce_seconds"] = s.reduceSeconds;
    d["transport_seconds"] = s.transportSeconds;
    d["wait_seconds"] = s.waitSeconds;
    d["wakeups"] = s.wakeups;
    return d;
  }

  // ---- Collectives: addresses and counts checked by the caller (qccl/communicator.py) ----
  // A state or segments belong to a compressed call: without a codec they would go unused.
  static void require_codec(const Codec* codec, const CodecState* state, bool segments) {
    if (codec != nullptr) return;
    if (state != nullptr) raise_error(qcclInvalidArgument, "state: given without a codec (it is a codec's state)");
    if (segments) raise_error(qcclInvalidArgument, "segments: given without a codec (they say what it compresses)");
  }
  py::object all_reduce(uintptr_t send, uintptr_t recv, size_t count, int type, int op, const Codec* codec,
                        const CodecState* state, bool async_op, py::object keep) {
    qcclComm_t c = get();
    require_codec(codec, state, false);
    if (codec == nullptr)
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIAllReduce(cptr(send), ptr(recv), count, dtype(type), redop(op), c, r)
                 : qcclAllReduce(cptr(send), ptr(recv), count, dtype(type), redop(op), c);
      });
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIAllReduceCompressed(cptr(send), ptr(recv), count, dtype(type), redop(op), codec->get(),
                                          state_of(state), c, r)
               : qcclAllReduceCompressed(cptr(send), ptr(recv), count, dtype(type), redop(op), codec->get(),
                                         state_of(state), c);
    });
  }
  py::object broadcast(uintptr_t send, uintptr_t recv, size_t count, int type, int root, bool async_op,
                       py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIBroadcast(cptr(send), ptr(recv), count, dtype(type), root, c, r)
               : qcclBroadcast(cptr(send), ptr(recv), count, dtype(type), root, c);
    });
  }
  py::object reduce(uintptr_t send, uintptr_t recv, size_t count, int type, int op, int root, bool async_op,
                    py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIReduce(cptr(send), ptr(recv), count, dtype(type), redop(op), root, c, r)
               : qcclReduce(cptr(send), ptr(recv), count, dtype(type), redop(op), root, c);
    });
  }
  py::object all_gather(uintptr_t send, uintptr_t recv, size_t count, int type, const Codec* codec,
                        const CodecState* state, std::optional<std::vector<std::pair<size_t, bool>>> segments,
                        bool async_op, py::object keep) {
    qcclComm_t c = get();
    require_codec(codec, state, segments.has_value());
    if (codec == nullptr)
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIAllGather(cptr(send), ptr(recv), count, dtype(type), c, r)
                 : qcclAllGather(cptr(send), ptr(recv), count, dtype(type), c);
      });
    if (segments) {
      std::vector<qcclSegment_t> s = segments_of(*segments);
      int n = static_cast<int>(s.size());
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIAllGatherCompressedSegments(cptr(send), ptr(recv), count, dtype(type), codec->get(), s.data(),
                                                    n, state_of(state), c, r)
                 : qcclAllGatherCompressedSegments(cptr(send), ptr(recv), count, dtype(type), codec->get(), s.data(), n,
                                                   state_of(state), c);
      });
    }
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIAllGatherCompressed(cptr(send), ptr(recv), count, dtype(type), codec->get(), state_of(state), c,
                                          r)
               : qcclAllGatherCompressed(cptr(send), ptr(recv), count, dtype(type), codec->get(), state_of(state), c);
    });
  }
  py::object reduce_scatter(uintptr_t send, uintptr_t recv, size_t count, int type, int op, const Codec* codec,
                            const CodecState* state, std::optional<std::vector<std::pair<size_t, bool>>> segments,
                            bool async_op, py::object keep) {
    qcclComm_t c = get();
    require_codec(codec, state, segments.has_value());
    if (codec == nullptr)
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIReduceScatter(cptr(send), ptr(recv), count, dtype(type), redop(op), c, r)
                 : qcclReduceScatter(cptr(send), ptr(recv), count, dtype(type), redop(op), c);
      });
    if (segments) {
      std::vector<qcclSegment_t> s = segments_of(*segments);
      int n = static_cast<int>(s.size());
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIReduceScatterCompressedSegments(cptr(send), ptr(recv), count, dtype(type), redop(op),
                                                        codec->get(), s.data(), n, state_of(state), c, r)
                 : qcclReduceScatterCompressedSegments(cptr(send), ptr(recv), count, dtype(type), redop(op),
                                                       codec->get(), s.data(), n, state_of(state), c);
      });
    }
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIReduceScatterCompressed(cptr(send), ptr(recv), count, dtype(type), redop(op), codec->get(),
                                              state_of(state), c, r)
               : qcclReduceScatterCompressed(cptr(send), ptr(recv), count, dtype(type), redop(op), codec->get(),
                                             state_of(state), c);
    });
  }
  py::object all_to_all(uintptr_t send, uintptr_t recv, size_t count, int type, bool async_op, py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIAlltoAll(cptr(send), ptr(recv), count, dtype(type), c, r)
               : qcclAlltoAll(cptr(send), ptr(recv), count, dtype(type), c);
    });
  }
  py::object gather(uintptr_t send, uintptr_t recv, size_t count, int type, int root, bool async_op, py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIGather(cptr(send), ptr(recv), count, dtype(type), root, c, r)
               : qcclGather(cptr(send), ptr(recv), count, dtype(type), root, c);
    });
  }
  py::object scatter(uintptr_t send, uintptr_t recv, size_t count, int type, int root, bool async_op, py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIScatter(cptr(send), ptr(recv), count, dtype(type), root, c, r)
               : qcclScatter(cptr(send), ptr(recv), count, dtype(type), root, c);
    });
  }
  py::object send(uintptr_t buffer, size_t count, int type, int peer, const Codec* codec, bool async_op,
                  py::object keep) {
    qcclComm_t c = get();
    if (codec == nullptr)
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclISend(cptr(buffer), count, dtype(type), peer, c, r)
                 : qcclSend(cptr(buffer), count, dtype(type), peer, c);
      });
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclISendCompressed(cptr(buffer), count, dtype(type), codec->get(), peer, c, r)
               : qcclSendCompressed(cptr(buffer), count, dtype(type), codec->get(), peer, c);
    });
  }
  py::object recv(uintptr_t buffer, size_t count, int type, int peer, const Codec* codec, bool async_op,
                  py::object keep) {
    qcclComm_t c = get();
    if (codec == nullptr)
      return launch(c, async_op, keep, [&](qcclRequest_t* r) {
        return r ? qcclIRecv(ptr(buffer), count, dtype(type), peer, c, r)
                 : qcclRecv(ptr(buffer), count, dtype(type), peer, c);
      });
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIRecvCompressed(ptr(buffer), count, dtype(type), codec->get(), peer, c, r)
               : qcclRecvCompressed(ptr(buffer), count, dtype(type), codec->get(), peer, c);
    });
  }
  py::object delta_send(uintptr_t buffer, const std::vector<uint64_t>& keys, int type, const DeltaStore& store,
                        int peer, bool async_op, py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIDeltaSend(cptr(buffer), keys.size(), keys.data(), dtype(type), store.get(), peer, c, r)
               : qcclDeltaSend(cptr(buffer), keys.size(), keys.data(), dtype(type), store.get(), peer, c);
    });
  }
  py::object delta_recv(uintptr_t buffer, const std::vector<uint64_t>& keys, int type, const DeltaStore& store,
                        int peer, bool async_op, py::object keep) {
    qcclComm_t c = get();
    return launch(c, async_op, keep, [&](qcclRequest_t* r) {
      return r ? qcclIDeltaRecv(ptr(buffer), keys.size(), keys.data(), dtype(type), store.get(), peer, c, r)
               : qcclDeltaRecv(ptr(buffer), keys.size(), keys.data(), dtype(type), store.get(), peer, c);
    });
  }
  CodecState* codec_state(size_t count) {
    qcclCodecState_t state = nullptr;
    check(qcclCodecStateCreate(get(), count, &state), comm_);
    return new CodecState(state, true);
  }
  CodecStore* codec_store(size_t budget) {
    qcclCodecStore_t store = nullptr;
    check(qcclCodecStoreCreate(get(), budget, &store), comm_);
    return new CodecStore(store);
  }
  Codec* learn_levels(const Codec& codec, uintptr_t data, size_t count, int type, int epochs, int root) {
    qcclComm_t c = get();
    qcclCodec_t learned = nullptr;
    call_released(c, [&] {
      return qcclCodecLearnLevels(codec.get(), cptr(data), count, dtype(type), epochs, root, c, &learned);
    });
    return new Codec(learned, spec_of(learned));
  }

 private:
  qcclComm_t comm_;
  qcclComm_t destroying_ = nullptr;  // while destroy() waits in qcclCommDestroy
};

// An object's buffer export, held while qccl uses its memory: while it lives, a bytearray or
// array.array refuses to resize (BufferError) instead of moving its memory away from under a call in
// flight. (A memoryview would do, at twice describe's cost: it also works out shapes and flags.)
struct Export {
  PyObject_HEAD
  Py_buffer view;
};

void export_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyBuffer_Release(&reinterpret_cast<Export*>(self)->view);  // nothing when view.obj is null (not exported)
  PyObject_Free(self);
  Py_DECREF(type);  // instances of a heap type hold their type
}

PyTypeObject* export_type() {
  static PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(export_dealloc)},
                                {Py_tp_doc, const_cast<char*>("A buffer export qccl holds while it uses the memory.")},
                                {0, nullptr}};
  static PyType_Spec spec = {"qccl._qccl.BufferExport", sizeof(Export), 0, Py_TPFLAGS_DEFAULT, slots};
  static PyTypeObject* type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
  return type;
}

// Buffer(address, count, dtype, itemsize[, owner]): a struct sequence (as os.stat_result), which C
// makes and Python reads by name at a fraction of a namedtuple's cost. `owner` (by name only) keeps
// the memory: the object's buffer export (a BufferExport), or the torch tensor.
PyTypeObject* buffer_type() {
  static PyStructSequence_Field fields[] = {{"address", "the first element's address"},
                                            {"count", "elements"},
                                            {"dtype", "the qcclDataType_t"},
                                            {"itemsize", "bytes per element"},
                                            {"owner", "what keeps the memory while qccl uses it"},
                                            {nullptr, nullptr}};
  static PyStructSequence_Desc desc = {"qccl._qccl.Buffer", "An array's memory, as qccl uses it.", fields, 4};
  static PyTypeObject* type = PyStructSequence_NewType(&desc);
  return type;
}

py::object make_buffer(uintptr_t address, Py_ssize_t count, int datatype, Py_ssize_t itemsize, py::object owner) {
  PyObject* buffer = PyStructSequence_New(buffer_type());
  if (buffer == nullptr) throw py::error_already_set();
  PyStructSequence_SetItem(buffer, 0, PyLong_FromSize_t(address));
  PyStructSequence_SetItem(buffer, 1, PyLong_FromSsize_t(count));
  PyStructSequence_SetItem(buffer, 2, PyLong_FromLong(datatype));
  PyStructSequence_SetItem(buffer, 3, PyLong_FromSsize_t(itemsize));
  PyStructSequence_SetItem(buffer, 4, owner.release().ptr());
  return py::reinterpret_steal<py::object>(buffer);
}

// The qccl datatype of a buffer-protocol format (the struct module's letters, whose C int and long
// vary in size), or -1. Big-endian data are refused: qccl reduces in the host's order.
int datatype_of(const char* format, Py_ssize_t itemsize) {
  if (*format == '@' || *format == '=' || *format == '<') ++format;
  if (format[0] == '\0' || format[1] != '\0') return -1;
  const char letter = format[0];
  if (std::strchr("bhilq", letter))
    return itemsize == 1 ? qcclInt8 : itemsize == 4 ? qcclInt32 : itemsize == 8 ? qcclInt64 : -1;
  if (std::strchr("BHILQ", letter))
    return itemsize == 1 ? qcclUint8 : itemsize == 4 ? qcclUint32 : itemsize == 8 ? qcclUint64 : -1;
  if (letter == 'e' && itemsize == 2) return qcclFloat16;
  if (letter == 'f' && itemsize == 4) return qcclFloat32;
  if (letter == 'd' && itemsize == 8) return qcclFloat64;
  return -1;
}

// (address, element count, datatype, item size) of a buffer-protocol object (numpy arrays,
// bytearray, memoryview, array.array), checked for qccl's use: C-contiguous, writable where qccl
// writes, of a datatype qccl carries. Raises InvalidArgument naming the argument. In C++ because
// it runs before every call: each microsecond here delays the peers that wait for this rank.
// The Buffer's owner holds the export until the call completes (the caller keeps the Buffer): a
// bytearray or array.array resized meanwhile would move its memory away from under qccl, and while
// exported, resizing raises BufferError instead.
py::object describe_buffer(py::handle object, const std::string& name, bool writable) {
  Export* held = PyObject_New(Export, export_type());
  if (held == nullptr) throw py::error_already_set();
  held->view.obj = nullptr;  // not exported (yet): nothing to release
  py::object owner = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(held));
  const Py_buffer& view = held->view;
  if (PyObject_GetBuffer(object.ptr(), &held->view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      raise_error(qcclInvalidArgument, name + ": a " + Py_TYPE(object.ptr())->tp_name +
                                           " is not an array (pass a numpy array, a torch tensor or another object "
                                           "with the buffer protocol)");
    }
    // An exporter's refusal (numpy's for datetime64, a released memoryview's): named, with its reason.
    if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_BufferError))
      throw py::error_already_set();
    py::error_already_set error;
    raise_error(qcclInvalidArgument, name + ": a " + Py_TYPE(object.ptr())->tp_name +
                                         " whose memory qccl cannot use (" +
                                         py::str(error.value()).cast<std::string>() + ")");
  }
  if (view.readonly && writable)
    raise_error(qcclInvalidArgument, name + ": the array is read-only, and qccl writes the result into it");
  if (!PyBuffer_IsContiguous(&view, 'C'))
    raise_error(qcclInvalidArgument, name +
                                         ": the array is not C-contiguous (a strided view); pass a contiguous "
                                         "copy, e.g. numpy.ascontiguousarray");
  const std::string format = view.format ? view.format : "B";
  const int datatype = datatype_of(format.c_str(), view.itemsize);
  if (datatype < 0)
    raise_error(qcclInvalidArgument, name + ": element format '" + format + "' (" + std::to_string(view.itemsize) +
                                         " bytes) is not a qccl datatype (int8, uint8, int32, uint32, int64, uint64, "
                                         "float16, float32, float64; bfloat16 through torch)");
  return make_buffer(reinterpret_cast<uintptr_t>(view.buf), view.itemsize ? view.len / view.itemsize : 0, datatype,
                     view.itemsize, std::move(owner));
}

}  // namespace

PYBIND11_MODULE(_qccl, m) {
  m.doc() = "qccl's C API, one thin layer (use the qccl package, not this module)";
  m.attr("UNIQUE_ID_BYTES") = QCCL_UNIQUE_ID_BYTES;

  m.def("_set_error_factory", [](py::object factory) { error_factory() = std::move(factory); });
  m.def("version", [] {
    int version = 0;
    check(qcclGetVersion(&version));
    return version;
  });
  m.def("error_string", [](int code) { return std::string(qcclGetErrorString(static_cast<qcclResult_t>(code))); });
  m.def(
      "get_unique_id",
      [](const std::optional<std::string>& address) {
        qcclUniqueId id;
        if (address) call_released(nullptr, [&] { return qcclGetUniqueIdFromAddress(address->c_str(), &id); });
        else call_released(nullptr, [&] { return qcclGetUniqueId(&id); });
        return py::bytes(id.internal, sizeof(id.internal));
      },
      py::arg("address") = py::none());
  m.def("group_start", &group_start);
  m.def("group_end", &group_end);
  m.def("describe", &describe_buffer);
  m.attr("Buffer") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(buffer_type()));
  if (export_type() == nullptr) throw py::error_already_set();  // made here, where a failure can be reported

  py::class_<Request>(m, "Request").def("wait", &Request::wait).def("is_completed", &Request::test);

  py::class_<Codec>(m, "Codec").def(py::init<const std::string&>()).def_property_readonly("spec", &Codec::spec);

  py::class_<CodecState>(m, "CodecState")
      .def("save", &CodecState::save)
      .def("load", &CodecState::load)
      .def("set_learning_rate", &CodecState::set_learning_rate);

  py::class_<CodecStore>(m, "CodecStore")
      .def("get", &CodecStore::get, py::keep_alive<0, 1>())
      .def("erase", &CodecStore::erase)
      .def("save", &CodecStore::save)
      .def("load", &CodecStore::load);

  py::class_<DeltaStore>(m, "DeltaStore")
      .def(py::init<const Codec&, size_t, int, size_t, bool, uint32_t>())
      .def("set_warmup", &DeltaStore::set_warmup)
      .def("set_file", &DeltaStore::set_file)
      .def("set_low_bits", &DeltaStore::set_low_bits)
      .def("info", &DeltaStore::info)
      .def("save", &DeltaStore::save)
      .def("load", &DeltaStore::load);

  py::class_<Comm>(m, "Comm")
      .def_static("init_env", &Comm::init_env)
      .def_static("init_rank", &Comm::init_rank)
      .def_property_readonly("alive", &Comm::alive)
      .def("_handle", [](const Comm& c) { return reinterpret_cast<uintptr_t>(c.get()); })  // benchmarks only
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def("split", &Comm::split)
      .def("destroy", &Comm::destroy)
      .def("abort", &Comm::abort)
      .def("check_async_error", &Comm::check_async_error)
      .def("last_stats", &Comm::last_stats)
      .def("all_reduce", &Comm::all_reduce)
      .def("broadcast", &Comm::broadcast)
      .def("reduce", &Comm::reduce)
      .def("all_gather", &Comm::all_gather)
      .def("reduce_scatter", &Comm::reduce_scatter)
      .def("all_to_all", &Comm::all_to_all)
      .def("gather", &Comm::gather)
      .def("scatter", &Comm::scatter)
      .def("send", &Comm::send)
      .def("recv", &Comm::recv)
      .def("delta_send", &Comm::delta_send)
      .def("delta_recv", &Comm::delta_recv)
      .def("codec_state", &Comm::codec_state)
      .def("codec_store", &Comm::codec_store)
      .def("learn_levels", &Comm::learn_levels);
}
