// Marsit (Wu et al., "Sign Bit is Enough", DAC 2022) as a method: the sign codec, its plans
// (allreduce_marsit.cc: sign rounds on a ring or torus; marsit_full_precision.cc: every K-th round),
// and its state, the compensation c of one tensor (kept lazily, kernels/marsit.h), which a checkpoint
// holds as c itself.
#include <cstring>
#include <stdexcept>
#include <string>

#include "collectives/marsit.h"
#include "collectives/method.h"
#include "kernels/marsit.h"
#include "kernels/types.h"

namespace qccl::coll {

namespace {

class MarsitState final : public MethodState {
 public:
  explicit MarsitState(size_t count)
      : stored_(count, 0.0f), words_((count + 31) / 32, 0), eta_((count + 31) / 32, 0.0f) {}  // nothing pending
  kernels::Compensation compensation() { return kernels::Compensation{stored_.data(), words_.data(), eta_.data()}; }
  std::vector<StateArray> device_arrays() override {  // MarsitCall::use_device_arrays takes them in this order
    return {{stored_.data(), stored_.size() * sizeof(float)},
            {words_.data(), words_.size() * sizeof(uint32_t)},
            {eta_.data(), eta_.size() * sizeof(float)}};
  }

  size_t bytes() const override { return bytes_for(stored_.size()); }
  // A float per value, and a word and a float per 32 values.
  static size_t bytes_for(size_t count) {
    const size_t values = coll::bytes_for(count, sizeof(float));
    const size_t words = coll::bytes_for(count / 32 + (count % 32 != 0), sizeof(uint32_t) + sizeof(float));
    return values > SIZE_MAX - words ? SIZE_MAX : values + words;
  }
  uint32_t version() const override { return 1; }
  size_t serialized_bytes() const override { return stored_.size() * sizeof(float); }
  // c itself: the stored values with the pending round applied.
  void save(uint8_t* out) const override {
    auto* self = const_cast<MarsitState*>(this);
    kernels::add_compensation(nullptr, self->compensation(), 0, stored_.size(), reinterpret_cast<float*>(out));
  }
  void load(const uint8_t* in, size_t bytes, uint32_t version) override {
    if (version != 1) throw std::invalid_argument("compensation of format " + std::to_string(version) + " (this is 1)");
    if (bytes != serialized_bytes())
      throw std::invalid_argument("compensation of " + std::to_string(bytes / sizeof(float)) +
                                  " values, this state has " + std::to_string(stored_.size()));
    std::memcpy(stored_.data(), in, bytes);
    std::fill(eta_.begin(), eta_.end(), 0.0f);  // the checkpoint holds c itself
  }
  void load_legacy(const LegacyState& legacy) override {
    std::memcpy(stored_.data(), legacy.values, legacy.count * sizeof(float));
    std::fill(eta_.begin(), eta_.end(), 0.0f);
  }

 private:
  std::vector<float> stored_;
  std::vector<uint32_t> words_;
  std::vector<float> eta_;
};

Refusal argument(const std::string& message) { return Refusal{Refusal::Kind::kArgument, message}; }

class MarsitMethod final : public Method {
 public:
  const char* name() const override { return "marsit"; }
  const char* description() const override {
    return "sign: one bit per value merged at every hop of a ring or torus, with compensation (Marsit)";
  }
  bool serves(const kernels::CodecConfig& codec) const override { return codec.kind == kernels::CodecKind::kSign; }

  std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int) const override {
    const kernels::CodecConfig& c = *args.codec;
    const std::string spec = c.canonical();
    if (args.kind != CollKind::kAllReduce)
      return argument("codec '" + spec + "': Marsit is an all-reduce (qcclAllReduceCompressed)");
    if (!state)
      return argument("state is NULL but codec '" + spec +
                      "' is Marsit, which keeps its compensation and round counter in a state (qcclCodecStateCreate)");
    if (args.dtype != DataType::kFloat32)
      return argument(std::string("datatype = ") + kernels::data_type_name(args.dtype) + ": codec '" + spec +
                      "' (Marsit) takes float32 updates");
    if (args.op != RedOp::kAvg)
      return argument(std::string("op = ") + kernels::red_op_name(args.op) + ": codec '" + spec +
                      "' (Marsit) returns an estimate of the average update; pass qcclAvg");
    if (c.torus_rows && c.torus_rows * c.torus_cols != args.nranks)
      return argument("codec '" + spec + "': a " + std::to_string(c.torus_rows) + "x" + std::to_string(c.torus_cols) +
                      " torus has " + std::to_string(c.torus_rows * c.torus_cols) +
                      " places but the communicator has " + std::to_string(args.nranks) + " ranks");
    return std::nullopt;
  }

  std::unique_ptr<MethodState> make_state(size_t count, const kernels::CodecConfig*) const override {
    return std::make_unique<MarsitState>(count);
  }
  size_t state_bytes(size_t count, const kernels::CodecConfig*) const override {
    return MarsitState::bytes_for(count);
  }

  std::unique_ptr<MethodCall> begin(const CollArgs&, MethodState* state, const StateView*) const override {
    auto call = std::make_unique<MarsitCall>();
    if (state) call->compensation = static_cast<MarsitState*>(state)->compensation();
    return call;
  }
};

}  // namespace

const Method& marsit_method() {
  static const MarsitMethod method;
  return method;
}

}  // namespace qccl::coll
