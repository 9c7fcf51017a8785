// What IntSGD's two all-reduce algorithms share (allreduce_intsgd.cc, the ring; and
// allreduce_intsgd_switch.cc, through aggregator processes): the exact first round, and the header
// of a chunk exchanged with an aggregator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/intsgd_schedule.h"
#include "collectives/method.h"
#include "collectives/plan.h"
#include "collectives/ring.h"
#include "kernels/int_codec.h"
#include "kernels/intsgd.h"

namespace qccl::coll {

// The exact round (IntsgdRound::exact): allreduce_ring.cc's reduce-scatter and allgather in place on
// recvbuf, fragment f of ring_fragments (chunk values of every segment; later fragments are empty).
// `total` is the plan's fragment count (message ids are step * total + f); scratch holds chunk
// values of the datatype.
void build_intsgd_exact(const CollArgs& args, const Ring& ring, const Segments& segments, size_t chunk,
                        size_t total, size_t f, std::byte* scratch, Program& p);

// A call of IntSGD (intsgd_method.cc): its round, fixed in prepare() from the state's memory (earlier
// calls on the state have completed by then), and what its kernels count: the clips and the exact
// sums of squares and largest |S| of the integer sums it decodes (the same on every rank).
class IntsgdCall final : public MethodCall {
 public:
  IntsgdCall(const CollArgs& args, IntsgdMemory* memory, double lr)
      : codec_(*args.codec), memory_(memory), lr_(lr), count_(args.count), nranks_(args.nranks) {}
  const IntsgdRound& round() const { return round_; }
  // Sets the round prepare() would compute (tests that run plans without a communicator).
  void set_round(const IntsgdRound& round) { round_ = round; }
  size_t* clipped() const { return &clipped_; }
  kernels::IntSums* sums() const { return &sums_; }

  void prepare(const CollArgs&) override;
  double scale() const override { return round_.alpha; }
  void complete(const CollArgs& args, const Plan& plan, size_t* nonfinite) override;
  bool reads_output(const Plan&) const override { return round_.exact; }  // the exact round's norm
  MethodStats stats(const Plan&) const override;

 private:
  const kernels::CodecConfig codec_;
  IntsgdMemory* memory_;  // null: a fixed alpha keeps no memory
  double lr_;             // the learning rate the state held when the call was made
  size_t count_;
  int nranks_;
  IntsgdRound round_;
  mutable size_t clipped_ = 0;
  mutable kernels::IntSums sums_;
};

// The IntSGD call of a plan's arguments (its plans run only with one: their cannot_run checks).
inline const IntsgdCall& intsgd_call(const CollArgs& args) { return *static_cast<const IntsgdCall*>(args.method_call); }

// IntSGD's numerics as step kernels (plan.h), bound to one call: the wire width, the clip range of
// this rank count, the rounding and its random key, the datatype and op of the result. A plan holds
// one and adds its steps through it; the kernels count into the call (IntsgdCall). A fragment that met NaN
// or Inf is tainted (as for Marsit): its integers are never summed into garbage, it decodes to NaN.
struct SwitchChunkHeader;  // below

class IntsgdSteps {
 public:
  explicit IntsgdSteps(const CollArgs& args);
  IntsgdSteps(const IntsgdSteps&) = delete;  // programs point at the kernels
  IntsgdSteps& operator=(const IntsgdSteps&) = delete;

  // dst (wire) = clip(Int(alpha * src)), values first .. first + count; counts the clips.
  void encode(Program& p, void* dst, const float* src, size_t count, uint64_t first, float alpha) const;
  // acc (wire) += src (wire), wrapping.
  void add(Program& p, void* acc, const void* src, size_t count) const;
  // dst (datatype) = src (wire) / (n alpha) (avg) or / alpha (sum), through `scratch` (float) unless
  // float32; the exact sums of squares and the largest |S| add up in the call.
  void decode(Program& p, void* dst, const void* src, size_t count, float alpha, float* scratch) const;
  // dst (8 bytes) = the SwitchChunkHeader of `count` wire values.
  void chunk_header(Program& p, void* dst, size_t count) const;
  // Device executions: the clips and sums the device's kernels counted, added to the call's.
  void absorb(const DeviceCounters& counters) const;

 private:
  struct Bound {
    int bits;
    bool stochastic;
    kernels::IntClip clip;
    kernels::PhiloxKey rng;
    DataType dtype;
    double divisor;              // n for an average, 1 for a sum
    size_t* clipped;             // the call's counts
    kernels::IntSums* sums;
  };
  struct Encode final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kEncode; }
    const char* name() const override { return "int_encode"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct Add final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "int_add"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct Decode final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "int_decode"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct Header final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kEncode; }
    const char* name() const override { return "int_header"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
    SwitchChunkHeader header(size_t count) const;  // of a chunk of `count` wire values
  };
  Bound bound_;
  Encode encode_;
  Add add_;
  Decode decode_;
  Header header_;
};

// The values a rank sends in a ring all-reduce (exact round: times the element size; integer round
// on the ring: times the wire bytes).
uint64_t intsgd_ring_elements(const Ring& ring, const Segments& segments);

// The 8 bytes in front of every chunk a worker sends to an aggregator and every sum it gets back
// (little-endian): the wire width and the values that follow, so that the aggregator, which knows
// no codec, can add them and check that every rank's contribution agrees.
struct SwitchChunkHeader {
  static constexpr size_t kBytes = 8;
  static constexpr uint8_t kMagic = 0x51;  // 'Q'
  uint8_t bits = 0;     // 8, 16 or 32
  uint32_t count = 0;   // values in the chunk
  void encode(void* out) const {
    auto* b = static_cast<uint8_t*>(out);
    b[0] = kMagic, b[1] = bits, b[2] = 0, b[3] = 0;
    for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<uint8_t>(count >> (8 * i));
  }
  // False when the bytes are not a header (wrong magic or width).
  bool decode(const void* in) {
    const auto* b = static_cast<const uint8_t*>(in);
    bits = b[1];
    count = 0;
    for (int i = 0; i < 4; ++i) count |= static_cast<uint32_t>(b[4 + i]) << (8 * i);
    return b[0] == kMagic && (bits == 8 || bits == 16 || bits == 32);
  }
};

}  // namespace qccl::coll
