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
//   - a transfer of zero bytes is never posted, and both ends agree on that;
//   - message ids are unique per (peer pair, collective) among the messages in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/marsit.h"
#include "kernels/types.h"

namespace qccl::coll {

using kernels::DataType;
using kernels::RedOp;

enum class CollKind : uint8_t { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kSend, kRecv };
constexpr int kNumCollKinds = 8;
const char* coll_name(CollKind kind);  // "AllReduce", ... as in the C API

// IntSGD's round (int8/int16/int32 codecs), fixed when the call starts to run: its scale depends on
// the results of the earlier calls on the same codec state (src/codec_state.h).
struct IntsgdRound {
  bool exact = false;  // a float all-reduce (the paper's exact first communication), not integers
  float alpha = 0;     // the scale every rank shares: m = Int(alpha * x), decoded as S / (n alpha)
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
  // Compressed collectives only (null otherwise): the codec, the error-feedback residual (count
  // floats, owned by the caller's codec state; null without error feedback), Marsit's compensation
  // (the sign codec with a state) and the key of the stochastic rounding (seed from the codec, step
  // from the state or the sequence number, rank).
  const kernels::CodecConfig* codec = nullptr;
  float* residual = nullptr;
  kernels::Compensation compensation;
  kernels::PhiloxKey rng;
  // The int codecs only: the round, owned by the call's record, filled in before the plan's first
  // fragment is built.
  const IntsgdRound* intsgd = nullptr;
  // Aggregator processes the communicator reached (QCCL_AGGREGATORS): transport peers nranks ..
  // nranks + aggregators - 1, for the int codecs' agg=switch.
  int aggregators = 0;

  size_t element_size() const { return kernels::element_size(dtype); }
  // The largest buffer this rank touches, in bytes (what algorithm thresholds look at).
  size_t message_bytes() const;
};

enum class StepKind : uint8_t {
  kRecv, kSend, kWait, kReduce, kCopy, kAverage,
  // Compressed collectives: float32 accumulators, the codec of CollArgs (elements in n).
  kLoad,           // dst (float) = src (datatype)
  kLoadAdd,        // dst (float) += src (datatype)
  kAddFloat,       // dst (float) += src (float)
  kDivide,         // dst (float) /= nranks
  kEncode,         // dst (bytes) = encode(src (float)); rounding keyed by stream (msg) and element (index)
  kDecodeAdd,      // dst (float) += decode(src (bytes))
  kDecodeOut,      // dst (datatype) = decode(src (bytes)), through src2 (float scratch) unless float32
  kErrorFeedback,  // dst (float residual) = factor * (src (float) - decode(src2 (bytes)))
  // Marsit (sign codec; the compensation c of CollArgs, elements index .. index + n). A fragment is
  // "tainted" once it met a non-finite value, here or (through a bit of the message key) at a peer; a
  // tainted fragment decodes to NaN and leaves the state alone.
  kPackSigns,      // dst (words) = signs of w = src (u) + c; c's stored values = w, the old ones to src2
                   // (float backup in scratch)
  kMergeSigns,     // dst (words) = merge(src, src2) at a hop of `aux` contributions, stream msg, word index
  kDecodeSigns,    // dst (float g) = eta (2 bit - 1) of src (words), recorded in c, so c = w - g (Marsit
                   // Alg. 1 line 10); when tainted: g NaN, c's stored values back from src2 (the backup)
  kAddCompensation,    // dst (float) = src (u) + c: the full-precision round's w
  kResetCompensation,  // after a full-precision round: for n values of g (src), c = 0 where g is
                       // finite; where it is not, c is kept and the value counts as non-finite output
  // IntSGD (int codecs; the wire type is the codec's). A fragment that met NaN or Inf is tainted as
  // for Marsit and decodes to NaN.
  kIntEncode,  // dst (wire) = clip(Int(factor * src (float))), n values from element index; counts clips
  kIntAdd,     // dst (wire) += src (wire), wrapping
  kIntDecode,  // dst (datatype) = src (wire) / (n alpha) (avg) or / alpha (sum), alpha = factor, through
               // src2 (float scratch) unless float32; the exact sums of squares and largest |S| add up
  kChunkHeader,  // dst (8 bytes) = the SwitchChunkHeader (collectives/intsgd.h) of n wire values
};

struct Step {
  StepKind kind;
  uint8_t slot = 0;           // kRecv, kSend, kWait: which of the fragment's transfer slots
  int32_t peer = -1;          // kRecv, kSend
  uint32_t msg = 0;           // kRecv, kSend: message id within the collective; kEncode: rounding stream
  const void* src = nullptr;  // kSend: data; kReduce: first operand; kCopy: source
  const void* src2 = nullptr; // kReduce: second operand
  void* dst = nullptr;        // kRecv: destination; kReduce, kCopy, kAverage: output
  size_t n = 0;               // kRecv, kSend, kCopy: bytes; the others: elements
  uint64_t index = 0;         // kEncode, Marsit: index of the first element in the whole buffer; kMergeSigns: word
  float factor = 1.0f;        // kErrorFeedback
  uint32_t aux = 0;           // kMergeSigns: the number of contributions after the merge
};

// The steps of one fragment, run in order. A kWait blocks the fragment (not the executor) until the
// slot's transfer completes; other fragments keep going meanwhile.
class Program {
 public:
  static constexpr int kSlots = 4;

  void clear() { steps_.clear(); }
  void recv(int slot, int peer, uint32_t msg, void* dst, size_t bytes) {
    if (bytes) steps_.push_back(Step{StepKind::kRecv, static_cast<uint8_t>(slot), peer, msg, nullptr, nullptr, dst, bytes});
  }
  void send(int slot, int peer, uint32_t msg, const void* src, size_t bytes) {
    if (bytes) steps_.push_back(Step{StepKind::kSend, static_cast<uint8_t>(slot), peer, msg, src, nullptr, nullptr, bytes});
  }
  // Waiting on a slot whose transfer was never posted (zero bytes) passes at once.
  void wait(int slot) { steps_.push_back(Step{StepKind::kWait, static_cast<uint8_t>(slot), -1, 0, nullptr, nullptr, nullptr, 0}); }
  // dst = a op b (elementwise, the plan's datatype and op); dst may equal a or b.
  void reduce(void* dst, const void* a, const void* b, size_t count) {
    if (count) steps_.push_back(Step{StepKind::kReduce, 0, -1, 0, a, b, dst, count});
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) steps_.push_back(Step{StepKind::kCopy, 0, -1, 0, src, nullptr, dst, bytes});
  }
  // buf = buf / nranks, the last step of RedOp::kAvg (a no-op for other ops).
  void average(void* buf, size_t count) {
    if (count) steps_.push_back(Step{StepKind::kAverage, 0, -1, 0, nullptr, nullptr, buf, count});
  }

  // Compressed collectives (see StepKind).
  void load(float* dst, const void* src, size_t count) { push(StepKind::kLoad, dst, src, nullptr, count); }
  void load_add(float* dst, const void* src, size_t count) { push(StepKind::kLoadAdd, dst, src, nullptr, count); }
  void add_float(float* dst, const float* src, size_t count) { push(StepKind::kAddFloat, dst, src, nullptr, count); }
  void divide(float* dst, size_t count) { push(StepKind::kDivide, dst, nullptr, nullptr, count); }
  void encode(void* dst, const float* src, size_t count, uint64_t first, uint32_t stream) {
    if (!count) return;
    push(StepKind::kEncode, dst, src, nullptr, count);
    steps_.back().index = first;
    steps_.back().msg = stream;
  }
  void decode_add(float* dst, const void* src, size_t count) { push(StepKind::kDecodeAdd, dst, src, nullptr, count); }
  void decode_out(void* dst, const void* src, size_t count, float* scratch) {
    push(StepKind::kDecodeOut, dst, src, scratch, count);
  }
  void error_feedback(float* residual, const float* acc, const void* encoded, size_t count, float factor) {
    if (!count) return;
    push(StepKind::kErrorFeedback, residual, acc, encoded, count);
    steps_.back().factor = factor;
  }

  // Marsit (see StepKind).
  void pack_signs(uint32_t* dst, const float* u, size_t first, size_t count, float* backup) {
    if (!count) return;
    push(StepKind::kPackSigns, dst, u, backup, count);
    steps_.back().index = first;
  }
  void merge_signs(uint32_t* dst, const uint32_t* incoming, const uint32_t* local, size_t words, uint32_t k,
                   uint32_t stream, uint64_t first_word) {
    if (!words) return;
    push(StepKind::kMergeSigns, dst, incoming, local, words);
    steps_.back().aux = k, steps_.back().msg = stream, steps_.back().index = first_word;
  }
  void decode_signs(float* g, const uint32_t* words, size_t first, size_t count, const float* backup) {
    if (!count) return;
    push(StepKind::kDecodeSigns, g, words, backup, count);
    steps_.back().index = first;
  }
  void add_compensation(float* w, const float* u, size_t first, size_t count) {
    if (!count) return;
    push(StepKind::kAddCompensation, w, u, nullptr, count);
    steps_.back().index = first;
  }
  void reset_compensation(const float* g, size_t first, size_t count) {
    if (!count) return;
    push(StepKind::kResetCompensation, nullptr, g, nullptr, count);
    steps_.back().index = first;
  }

  // IntSGD (see StepKind).
  void int_encode(void* dst, const float* src, size_t count, uint64_t first, float alpha) {
    if (!count) return;
    push(StepKind::kIntEncode, dst, src, nullptr, count);
    steps_.back().index = first, steps_.back().factor = alpha;
  }
  void int_add(void* acc, const void* src, size_t count) { push(StepKind::kIntAdd, acc, src, nullptr, count); }
  void int_decode(void* dst, const void* src, size_t count, float alpha, float* scratch) {
    if (!count) return;
    push(StepKind::kIntDecode, dst, src, scratch, count);
    steps_.back().factor = alpha;
  }

  void chunk_header(void* dst, size_t count) { push(StepKind::kChunkHeader, dst, nullptr, nullptr, count); }

  const std::vector<Step>& steps() const { return steps_; }

 private:
  void push(StepKind kind, void* dst, const void* src, const void* src2, size_t count) {
    if (count) steps_.push_back(Step{kind, 0, -1, 0, src, src2, dst, count});
  }
  std::vector<Step> steps_;
};

// One call's work for one algorithm.
class Plan {
 public:
  explicit Plan(const CollArgs& args) : args_(args) {}
  virtual ~Plan() = default;
  const CollArgs& args() const { return args_; }

  virtual size_t fragments() const = 0;
  // Scratch each fragment in flight needs (the executor gives every slot its own).
  virtual size_t scratch_bytes() const { return 0; }
  // Writes fragment f's steps into out (cleared first). Must not allocate beyond out's growth.
  virtual void build(size_t fragment, std::byte* scratch, Program& out) const = 0;
  // The ranks this rank sends to and receives from: each such link carries one frame header.
  virtual void links(std::vector<int>* send_to, std::vector<int>* recv_from) const = 0;
  // The closed-form payload bytes this rank sends; the executor's count must equal it.
  virtual uint64_t wire_bytes_sent() const = 0;
  // What the same collective sends uncompressed (for the compression ratio of compressed plans).
  virtual uint64_t raw_wire_bytes() const { return wire_bytes_sent(); }

 protected:
  CollArgs args_;
};

struct PlanOptions {
  size_t chunk_bytes = 256 * 1024;
};

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
