// Compression methods as objects (docs/ARCHITECTURE.md "Adding a compression method").
//
// A method is everything one paper adds beside its codec's numerics: which codecs it serves, which
// calls it accepts, what it keeps for a tensor between calls (its MethodState: serialized,
// versioned, charged to the memory budget), what it does when a call starts to run and when it
// completes (its MethodCall), and its plans (registry entries whose cannot_run accepts its codecs).
// The runtime (src/) and the transports name no method: they ask the registry below for the
// method of a call's codec and talk to it through these interfaces, so adding a method means adding
// its files and one line in collectives/methods.cc.
//
// Threads. A Method is immutable and shared. A MethodState belongs to one codec state; calls on one
// state run one after the other in call order (the communicator guarantees it), so a MethodCall may
// read and write its state without locks from prepare() to complete().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "kernels/codec.h"

namespace qccl::coll {

// Why a method refuses a call, before anything is sent: a bad argument, or a call that is valid but
// not now (a learning rate not yet set, no aggregators).
struct Refusal {
  enum class Kind { kArgument, kUsage };
  Kind kind;
  std::string message;
};

// Why a call failed on this rank although the communicator is sound (a keyed delta message that the
// receiver refused: both ends fail alike, and the next call may go on): the call alone fails.
struct CallFailure {
  enum class Kind { kArgument, kUsage, kMismatch, kNonFinite, kSystem };
  Kind kind;
  std::string message;
};

// What the caller's codec state tells a method about a call (null when the call passes none).
struct StateView {
  size_t count = 0;
  double learning_rate = 0;  // 0 until the caller sets one (qcclCodecStateSetLearningRate)
};

// What checkpoints of format 1 and 2 held, before states were per method: a float per value (an
// error-feedback residual or Marsit's compensation) and IntSGD's moving average.
struct LegacyState {
  const float* values = nullptr;  // count values
  size_t count = 0;
  double moving_average = 0;
  bool has_moving_average = false;
};

// What a method keeps for one tensor between calls.
// Memory a state holds that a call on device buffers uses on the device (error feedback's residual,
// Marsit's compensation).
struct StateArray {
  void* host;
  size_t bytes;
};

class MethodState {
 public:
  virtual ~MethodState() = default;
  // The arrays a call on device buffers reads and writes in device memory (none by default): the
  // codec state keeps a device copy of each, current whichever side its last call ran on.
  virtual std::vector<StateArray> device_arrays() { return {}; }
  // Memory it holds, charged to the communicator's QCCL_CODEC_STATE_BUDGET.
  virtual size_t bytes() const = 0;
  virtual uint32_t version() const = 0;  // of its serialized form
  virtual size_t serialized_bytes() const = 0;
  virtual void save(uint8_t* out) const = 0;
  // Restores what save() wrote, from this version or an earlier one. Throws std::invalid_argument
  // naming what does not match; the state is unchanged then.
  virtual void load(const uint8_t* in, size_t bytes, uint32_t version) = 0;
  virtual void load_legacy(const LegacyState& legacy) = 0;
};

// What a method reports about a completed call (qcclStats_t).
struct MethodStats {
  bool has_scale = false;
  double scale = 0;      // IntSGD's alpha
  uint64_t clipped = 0;  // values clipped to the wire range
  int64_t largest = 0;   // the largest integer sum
};

// One call of a method, bound to its state (if any) when the call is started, and reachable by the
// method's plans through CollArgs::method_call.
class MethodCall {
 public:
  virtual ~MethodCall() = default;
  // A call on device buffers, before prepare(): its state's device_arrays() in device memory, in that
  // order, for its kernels to use instead of the host's.
  virtual void use_device_arrays(const std::vector<void*>&) {}
  // The call is about to run: every earlier call on its state has completed.
  virtual void prepare(const CollArgs&) {}
  // The scale every rank must share (FrameHeader::codec_scale; 0: none), valid after prepare().
  virtual double scale() const { return 0; }
  // The call completed on this rank: learn from its result. `nonfinite` (outputs that are NaN or Inf,
  // the same on every rank) may grow where the method inspects the output itself.
  virtual void complete(const CollArgs&, const Plan&, size_t* /*nonfinite*/) {}
  // Whether complete() reads the output (CollArgs::recvbuf) after `plan` ran: a call on device buffers
  // then gets a copy in host memory.
  virtual bool reads_output(const Plan&) const { return false; }
  virtual MethodStats stats(const Plan&) const { return MethodStats{}; }
  // After complete(): why this call failed although its plan ran (null: it did not).
  virtual const CallFailure* failure() const { return nullptr; }
  // The call is over, whatever its result (completed, failed, withdrawn with its communicator): what
  // it holds of its state may go, although the call object may live on in the caller's request.
  virtual void end() {}
};

// count * bytes_each, or SIZE_MAX where the product does not fit (no budget holds that).
inline size_t bytes_for(size_t count, size_t bytes_each) {
  return count > SIZE_MAX / bytes_each ? SIZE_MAX : count * bytes_each;
}

class Method {
 public:
  virtual ~Method() = default;
  virtual const char* name() const = 0;
  virtual const char* description() const = 0;
  virtual bool serves(const kernels::CodecConfig& codec) const = 0;
  // Why this call cannot run (nullopt: it can). `state` is null when the caller passes none;
  // `aggregators` is the number of aggregator processes the communicator reached.
  virtual std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int aggregators) const = 0;
  // A fresh state for a tensor of `count` values, or null when the method keeps nothing for this
  // codec. codec null: the state it keeps for codecs that keep one (a checkpoint is being restored).
  virtual std::unique_ptr<MethodState> make_state(size_t count, const kernels::CodecConfig* codec) const = 0;
  // The bytes() of what make_state(count, codec) makes (0 for null; SIZE_MAX where that does not fit
  // a size_t), known before it is made: the budget is charged first, so a state past it is refused
  // before its memory is allocated and touched.
  virtual size_t state_bytes(size_t count, const kernels::CodecConfig* codec) const = 0;
  // Binds one call (args.codec, args.rng and the buffers are set) to its state (null: none).
  virtual std::unique_ptr<MethodCall> begin(const CollArgs& args, MethodState* state, const StateView* view) const = 0;
};

// The registry of methods, in the order qccl_info lists them.
const std::vector<const Method*>& methods();
// The method that serves a codec (every codec has one), or nullptr.
const Method* method_for(const kernels::CodecConfig& codec);
const Method* find_method(const std::string& name);

}  // namespace qccl::coll
