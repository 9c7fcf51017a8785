// The executor interface: what an algorithm hands the executor (DESIGN.md "The data path").
//
// An algorithm never touches a socket or a thread. Bound to one call's arguments it becomes a Plan,
// which cuts the work into fragments (pipeline chunks) and, asked for fragment f, writes that chunk's
// steps into a Program: post a receive or a send, wait for one, reduce, copy, average. The executor
// owns the pipelining (how many fragments run at once, STYLE rule 6), the tags, the frame headers
// and the transport; the Program is rebuilt in place for every fragment, so that steady state
// allocates nothing.
//
// Promises every plan keeps:
//   - the same arguments give the same fragments and steps on every run;
//   - the result does not depend on the chunk size or the pipeline depth: the reduction order of
//     each element is fixed by the rank count alone (segments never depend on the chunk size);
//   - a fixed-size transfer of zero bytes is never posted, and both ends agree on that;
//   - ordered: within a fragment, the messages one rank sends another are received by that rank in
//     the same order (the labels `msg` of its sends to p equal, in program order, those of p's
//     receives from it). The executor therefore needs no per-message id on the wire: messages are
//     keyed by fragment, and a transport without tags (NCCL point-to-point) matches them in order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "collectives/node_map.h"
#include "kernels/codec.h"
#include "kernels/philox.h"
#include "kernels/types.h"

namespace qccl::coll {

using kernels::DataType;
using kernels::RedOp;

// Values are on the wire (frame headers): new kinds go at the end.
enum class CollKind : uint8_t {
  kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kSend, kRecv, kGather, kScatter
};
constexpr int kNumCollKinds = 10;
const char* coll_name(CollKind kind);  // "AllReduce", ... as in the C API
// The collectives with a root (CollArgs::root; every rank must name the same one).
inline bool rooted(CollKind kind) {
  return kind == CollKind::kBroadcast || kind == CollKind::kReduce || kind == CollKind::kGather ||
         kind == CollKind::kScatter;
}

class MethodCall;  // collectives/method.h
class DeltaCall;   // collectives/sendrecv_delta.h

// What the communicator knows of its links (QCCL_LINK_RATE) and of this machine's codec costs, the
// same on every rank (the slowest rank's costs), for the plans that decide by them whether
// compressing pays (the fft codec's fall-back: spec fftsparse.md P17, the paper's Eq. 4).
struct LinkFacts {
  double rate = 0;                   // bytes/s of each rank's link
  double fft_seconds_per_value = 0;  // the fft codec's encode + decode of one float32 value
};

// A run of a compressed block: `count` values from `offset`, encoded by the call's codec, or exactly
// (in the block's own datatype: float32 as is, float16 and bfloat16 through the fp16 and bf16 casts,
// which are exact on them).
struct Segment {
  size_t offset = 0;
  size_t count = 0;
  bool exact = false;
};

// The validated arguments of one call (count in elements, with NCCL's meaning per collective:
// AllGather's sendcount, ReduceScatter's recvcount, AlltoAll's count per peer).
struct CollArgs {
  CollKind kind = CollKind::kAllReduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;  // Broadcast, Reduce
  int peer = 0;  // Send, Recv
  int rank = 0;
  int nranks = 1;
  // Which ranks share a host: the communicator's (computed once at its creation, owned by it, valid
  // while the call runs); null where no communicator made the arguments (simulated-network tests
  // that do not set one). Hierarchical plans split their rings by it.
  const NodeMap* nodes = nullptr;
  // Compressed AllGather and ReduceScatter only (null otherwise): the block (sendcount or recvcount
  // values) cut into consecutive segments, e.g. one per layer, some sent exactly (norms and biases:
  // QSDP §5.1); the codec's bucket grid restarts at every segment (collectives/compressed.h, Pieces).
  const std::vector<Segment>* segments = nullptr;
  // Compressed collectives only (null otherwise): the codec, the key of its random rounding (seed
  // from the codec, step from the codec state or the sequence number, rank), and the call of the
  // codec's method (collectives/method.h), through which the method's plans reach its state.
  const kernels::CodecConfig* codec = nullptr;
  kernels::PhiloxKey rng;
  const MethodCall* method_call = nullptr;
  // AQ-SGD's keyed delta calls (Send and Recv; null otherwise): the call, with its store and its own
  // buffers, datatype and keys (each end has its own datatype, and a key count that differs must fail
  // through the store's checks, on both ends alike): count and dtype are then 1 and uint8, so that the
  // frame headers check only that both ends make a delta call. method_call points to it as well.
  DeltaCall* delta = nullptr;
  // Aggregator processes the communicator reached (QCCL_AGGREGATORS): transport peers nranks ..
  // nranks + aggregators - 1, for plans that sum through them.
  int aggregators = 0;
  // The communicator's link facts, or null where it does not know its links (QCCL_LINK_RATE unset).
  const LinkFacts* link = nullptr;
  // Buffers in device memory: the caller's CUDA stream (a cudaStream_t), which the device executor
  // joins; plans ignore it.
  void* stream = nullptr;

  size_t element_size() const { return kernels::element_size(dtype); }
  // The largest buffer this rank touches, in bytes (what algorithm thresholds look at).
  size_t message_bytes() const;
};

// ---- Steps ----------------------------------------------------------------------------------------
//
// A fragment's program is a list of typed steps. The transfer and data-movement steps are the
// executor's own; the codec steps take the codec they use (so one plan may use a different codec on
// each step, e.g. one per link class); a method's own numerics are Compute steps, which call a
// StepKernel the plan owns (so the executor knows no method).
namespace step {

// Posts a receive from `peer` into dst (capacity bytes). With `received`, the message may be shorter
// than the capacity and its length is stored there once it arrives (variable-length codecs); without,
// it must be exactly `capacity` bytes.
struct Recv {
  uint32_t slot;
  int32_t peer;
  uint32_t msg;  // the plan's label of the message (unique per fragment, peer pair and direction)
  void* dst;
  size_t capacity;
  size_t* received;
};
// Posts a send of `bytes` bytes, or, with `length`, of the *length bytes an earlier step wrote there
// (at most `bytes`; a variable-length message is sent even when empty, since its receive is posted).
struct Send {
  uint32_t slot;
  int32_t peer;
  uint32_t msg;
  const void* src;
  size_t bytes;
  const size_t* length;
};
// Blocks the fragment (not the executor) until the slot's transfer completed; an unused slot passes.
struct Wait {
  uint32_t slot;
};
struct Reduce {  // dst = a op b, elementwise in the call's datatype and op; dst may equal a or b
  void* dst;
  const void* a;
  const void* b;
  size_t count;
};
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};
struct Average {  // buf /= nranks, the last step of RedOp::kAvg (a no-op for other ops)
  void* buf;
  size_t count;
};
// float32 accumulators of the compressed collectives.
struct Load {  // dst (float) = src (the call's datatype), or += with `add`
  float* dst;
  const void* src;
  size_t count;
  bool add;
};
// dst (the call's datatype) = src (float32), rounded to nearest even; the executor counts the
// non-finite values it writes (NaN or Inf that reached the sum, and float16's overflow to Inf).
struct Store {
  void* dst;
  const float* src;
  size_t count;
};
struct AddFloat {
  float* dst;
  const float* src;
  size_t count;
};
struct Divide {  // dst /= nranks
  float* dst;
  size_t count;
};
// dst = encode(src): rounding keyed by `stream` and element index `first`; with `length`, the number
// of bytes written is stored there.
struct Encode {
  const kernels::CodecConfig* codec;
  void* dst;
  const float* src;
  size_t count;
  uint64_t first;
  uint32_t stream;
  size_t* length;
};
struct DecodeAdd {  // dst (float) += decode(src)
  const kernels::CodecConfig* codec;
  float* dst;
  const void* src;
  size_t count;
};
// dst (the call's datatype) = decode(src), through `scratch` (float) unless the datatype is float32.
// Every rank decodes the same bytes, so every rank counts the same non-finite outputs.
struct DecodeOut {
  const kernels::CodecConfig* codec;
  void* dst;
  const void* src;
  size_t count;
  float* scratch;
};
// residual = factor * (acc - decode(encoded)): error feedback's memory of what the encode missed.
struct ErrorFeedback {
  const kernels::CodecConfig* codec;
  float* residual;
  const float* acc;
  const void* encoded;
  size_t count;
  float factor;
};
struct Compute;

}  // namespace step

// What a StepKernel may touch besides its operands: the fragment's taint (a non-finite value met
// here or, through the message keys, at a peer: the fragment decodes to NaN and leaves state alone)
// and the operation's count of non-finite outputs.
struct DeviceStepContext;  // device_kernels.h
struct DeviceCounters;

struct StepContext {
  bool* tainted;
  size_t* nonfinite;
};

// A method's numerics for one kind of step (Marsit's sign packing, IntSGD's integer encode, ...):
// the plan owns its kernels, bound to the call (its state, its random key), and lists them in Compute
// steps. run() must not allocate; it is called on the executor's thread only.
class StepKernel {
 public:
  enum class Phase : uint8_t { kEncode, kDecode };  // which statistic its time counts in
  virtual ~StepKernel() = default;
  virtual Phase phase() const = 0;
  // One word naming what it does ("pack", "merge", "add_spectrum"): with the codec's name, the key of
  // its cost in the simulator's model (sim/model.h), per unit of Compute::count.
  virtual const char* name() const = 0;
  // Whether the step may run now. A step that needs another fragment's work first (a message's
  // sections, applied only once its head was checked) waits: the executor retries it, running the
  // other fragments meanwhile. What it waits for must be an earlier fragment's (fragments start in
  // order, so the earliest one left never waits).
  virtual bool ready(const step::Compute&) const { return true; }
  virtual void run(const step::Compute& step, StepContext& context) const = 0;
  // run()'s work enqueued on a device (device_kernels.h), the same bits; false when the kernel has no
  // device form (the device executor then fails the call, which Comm refuses before it starts).
  virtual bool launch(const step::Compute&, DeviceStepContext&) const { return false; }
};

namespace step {
// Operands a kernel interprets as it documents.
struct Compute {
  const StepKernel* kernel;
  void* dst;
  const void* src;
  const void* src2;
  size_t count;
  uint64_t index;
  uint32_t aux;
  uint32_t stream;
  float factor;
};
}  // namespace step

using Step = std::variant<step::Recv, step::Send, step::Wait, step::Reduce, step::Copy, step::Average, step::Load,
                          step::Store, step::AddFloat, step::Divide, step::Encode, step::DecodeAdd, step::DecodeOut,
                          step::ErrorFeedback, step::Compute>;

// The executor's own numerics (everything but the transfers, Wait and a method's Compute): what a
// device executor runs as kernels of its own.
inline bool is_data_step(const Step& s) {
  return !std::holds_alternative<step::Recv>(s) && !std::holds_alternative<step::Send>(s) &&
         !std::holds_alternative<step::Wait>(s) && !std::holds_alternative<step::Compute>(s);
}

// The steps of one fragment, run in order. The builders skip steps with nothing to do (zero counts),
// so both ends of a transfer agree that an empty fixed-size message is never posted.
class Program {
 public:
  // The codec of the codec steps that name none: the call's (the executor sets it), or another a plan
  // chooses for the steps that follow with use_codec(); clear() returns to the call's.
  void set_default_codec(const kernels::CodecConfig* codec) { default_codec_ = codec_ = codec; }
  void use_codec(const kernels::CodecConfig* codec) { codec_ = codec; }

  void clear() {
    steps_.clear();
    transfer_slots_ = 0;
    codec_ = default_codec_;
  }
  void recv(int slot, int peer, uint32_t msg, void* dst, size_t bytes) {
    if (bytes) add_transfer(slot, step::Recv{slot_index(slot), peer, msg, dst, bytes, nullptr});
  }
  // A receive of at most `capacity` bytes whose length is stored in *received.
  void recv_upto(int slot, int peer, uint32_t msg, void* dst, size_t capacity, size_t* received) {
    add_transfer(slot, step::Recv{slot_index(slot), peer, msg, dst, capacity, received});
  }
  void send(int slot, int peer, uint32_t msg, const void* src, size_t bytes) {
    if (bytes) add_transfer(slot, step::Send{slot_index(slot), peer, msg, src, bytes, nullptr});
  }
  // A send of the *length bytes (at most `capacity`) an earlier step stored.
  void send_length(int slot, int peer, uint32_t msg, const void* src, size_t capacity, const size_t* length) {
    add_transfer(slot, step::Send{slot_index(slot), peer, msg, src, capacity, length});
  }
  void wait(int slot) { steps_.push_back(step::Wait{slot_index(slot)}); }
  void reduce(void* dst, const void* a, const void* b, size_t count) {
    if (count) steps_.push_back(step::Reduce{dst, a, b, count});
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) steps_.push_back(step::Copy{dst, src, bytes});
  }
  void average(void* buf, size_t count) {
    if (count) steps_.push_back(step::Average{buf, count});
  }

  // Compressed collectives (see step::).
  void load(float* dst, const void* src, size_t count) {
    if (count) steps_.push_back(step::Load{dst, src, count, false});
  }
  void load_add(float* dst, const void* src, size_t count) {
    if (count) steps_.push_back(step::Load{dst, src, count, true});
  }
  void store(void* dst, const float* src, size_t count) {
    if (count) steps_.push_back(step::Store{dst, src, count});
  }
  void add_float(float* dst, const float* src, size_t count) {
    if (count) steps_.push_back(step::AddFloat{dst, src, count});
  }
  void divide(float* dst, size_t count) {
    if (count) steps_.push_back(step::Divide{dst, count});
  }
  void encode(void* dst, const float* src, size_t count, uint64_t first, uint32_t stream, size_t* length = nullptr) {
    if (count) steps_.push_back(step::Encode{codec_, dst, src, count, first, stream, length});
  }
  void decode_add(float* dst, const void* src, size_t count) {
    if (count) steps_.push_back(step::DecodeAdd{codec_, dst, src, count});
  }
  void decode_out(void* dst, const void* src, size_t count, float* scratch) {
    if (count) steps_.push_back(step::DecodeOut{codec_, dst, src, count, scratch});
  }
  void error_feedback(float* residual, const float* acc, const void* encoded, size_t count, float factor) {
    if (count) steps_.push_back(step::ErrorFeedback{codec_, residual, acc, encoded, count, factor});
  }
  // A method's step (see StepKernel): skipped when count is zero.
  void compute(const step::Compute& s) {
    if (s.count) steps_.push_back(s);
  }

  const std::vector<Step>& steps() const { return steps_; }
  // Transfer slots this fragment uses (1 + the largest slot index): not capped.
  size_t transfer_slots() const { return transfer_slots_; }

 private:
  static uint32_t slot_index(int slot) { return static_cast<uint32_t>(slot); }
  template <class S>
  void add_transfer(int slot, const S& s) {
    transfer_slots_ = std::max(transfer_slots_, static_cast<size_t>(slot) + 1);
    steps_.push_back(s);
  }
  std::vector<Step> steps_;
  size_t transfer_slots_ = 0;
  const kernels::CodecConfig* default_codec_ = nullptr;
  const kernels::CodecConfig* codec_ = nullptr;
};

// Bytes rounded up to whole 64-byte lines: where a plan's scratch regions start, so that each holds
// any type aligned whatever the odd counts before it (an odd chunk of 2-byte values, for instance).
inline size_t whole_lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

// One call's work for one algorithm.
class Plan {
 public:
  explicit Plan(const CollArgs& args) : args_(args) {}
  virtual ~Plan() = default;
  const CollArgs& args() const { return args_; }

  virtual size_t fragments() const = 0;
  // Scratch each fragment in flight needs (the executor gives every slot its own).
  virtual size_t scratch_bytes() const { return 0; }
  // How far apart the executor puts its slots' scratch: whole 64-byte lines, so that every slot's
  // buffers keep the alignment the first slot's have.
  size_t scratch_stride() const { return whole_lines(scratch_bytes()); }
  // Writes fragment f's steps into out (cleared first). Must not allocate beyond out's growth.
  virtual void build(size_t fragment, std::byte* scratch, Program& out) const = 0;
  // The ranks this rank sends to and receives from: each such link carries one frame header.
  virtual void links(std::vector<int>* send_to, std::vector<int>* recv_from) const = 0;
  // The closed-form payload bytes this rank sends; the executor's count must equal it.
  virtual uint64_t wire_bytes_sent() const = 0;
  // What the same collective sends uncompressed (for the compression ratio of compressed plans).
  virtual uint64_t raw_wire_bytes() const { return wire_bytes_sent(); }
  // Whether it exchanges data with the communicator's aggregator processes (peers nranks and up).
  virtual bool uses_aggregators() const { return false; }
  // Whether it sends messages of variable length (Program::send_length, recv_upto).
  virtual bool variable_length() const { return false; }
  // Whether a fragment's steps depend on what the fragments before it did (a length the peer
  // announced, a part the fragment before encoded): the executor then runs one fragment at a time,
  // and builds each once the one before has completed.
  virtual bool fragments_in_sequence() const { return false; }
  // Device executions: what the device's kernels counted for the call's method (IntSGD's clips and
  // sums), read back once the collective's work is done.
  virtual void absorb(const DeviceCounters&) {}

 protected:
  CollArgs args_;
};

struct PlanOptions {
  size_t chunk_bytes = 256 * 1024;
};

// The fewest bytes a compressed chunk's message carries, for a chunk of `chunk_bytes` of input: what a
// 4-bit codec's chunk encodes to (chunk_bytes / 8), up to 32 KiB. A chunk counts input bytes, so a 1-
// or 2-bit codec would send messages of 8 or 16 KiB at the default chunk, and the kernel's TCP path
// charges about 8 us a message at each end beside its bytes (docs/PERF.md, "Messages of at least
// min(chunk/8, 32 KiB)": q1 12-13% faster at 1 Gbit/s): compressed plans whose every message is
// encoded (compressed_chunk) and Marsit's sign rounds grow their chunks to this. Codecs of 4 bits a
// float32 value or more are untouched, and the chunk still bounds a message.
inline constexpr size_t kMinMessageCapBytes = 32 * 1024;
constexpr size_t min_message_bytes(size_t chunk_bytes) { return std::min(chunk_bytes / 8, kMinMessageCapBytes); }

// One entry of the registry (STYLE rule 2). Selection is by name, never by position; list order
// breaks ties: by default the first entry of a collective that can run and whose default size range
// holds the message is chosen.
struct Algorithm {
  const char* name;
  CollKind collective;
  const char* description;
  const char* wire_bytes;         // the formula for wire_bytes_sent(), for qccl_info
  size_t default_max_bytes;       // chosen by default up to this message size; 0 = any size
  // nullptr when the algorithm can run these arguments; else why not (not an error).
  const char* (*cannot_run)(const CollArgs& args);
  std::unique_ptr<Plan> (*make)(const CollArgs& args, const PlanOptions& options);
};

const std::vector<Algorithm>& algorithms();
// The entry named `name` for `kind`, or nullptr.
const Algorithm* find_algorithm(CollKind kind, const std::string& name);

}  // namespace qccl::coll
