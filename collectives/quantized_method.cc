// The value-codec method: none, fp16, bf16 and q1-q8 (bucketed min-max quantization, QSDP / CGX
// style), fused into the compressed all-reduce (allreduce_sra_compressed.cc, allreduce_ring_compressed.cc),
// all-gather (allgather_compressed_ring.cc) and reduce-scatter (reduce_scatter_compressed_pairwise.cc).
// Its state is the error-feedback residual (ef=on): a float per value of the tensor, which compressed.h
// updates as r <- acc - decode(encode(acc)).
#include <cstring>
#include <stdexcept>
#include <string>

#include "collectives/compressed.h"
#include "collectives/method.h"
#include "kernels/types.h"

namespace qccl::coll {

namespace {

class QuantizedState final : public MethodState {
 public:
  explicit QuantizedState(size_t count) : residual_(count, 0.0f) {}
  float* residual() { return residual_.data(); }

  size_t bytes() const override { return residual_.size() * sizeof(float); }
  uint32_t version() const override { return 1; }
  size_t serialized_bytes() const override { return bytes(); }
  void save(uint8_t* out) const override { std::memcpy(out, residual_.data(), bytes()); }
  void load(const uint8_t* in, size_t bytes, uint32_t version) override {
    if (version != 1) throw std::invalid_argument("residual of format " + std::to_string(version) + " (this is 1)");
    if (bytes != this->bytes())
      throw std::invalid_argument("residual of " + std::to_string(bytes / sizeof(float)) + " values, this state has " +
                                  std::to_string(residual_.size()));
    std::memcpy(residual_.data(), in, bytes);
  }
  void load_legacy(const LegacyState& legacy) override {
    std::memcpy(residual_.data(), legacy.values, legacy.count * sizeof(float));
  }

 private:
  std::vector<float> residual_;
};

Refusal argument(const std::string& message) { return Refusal{Refusal::Kind::kArgument, message}; }

class QuantizedMethod final : public Method {
 public:
  const char* name() const override { return "quantized"; }
  const char* description() const override {
    return "none, fp16, bf16, q1-q8: each value encoded on its own, with optional error feedback";
  }
  bool serves(const kernels::CodecConfig& codec) const override {
    return codec.kind == kernels::CodecKind::kNone || codec.kind == kernels::CodecKind::kFp16 ||
           codec.kind == kernels::CodecKind::kBf16 || codec.kind == kernels::CodecKind::kQuant;
  }

  std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int) const override {
    const std::string spec = args.codec->canonical();
    if (args.kind != CollKind::kAllReduce && args.kind != CollKind::kAllGather && args.kind != CollKind::kReduceScatter)
      return argument(std::string("codec '") + spec + "': " + coll_name(args.kind) + " has no compressed form");
    if (args.codec->error_feedback && !state)
      return argument("state is NULL but codec '" + spec +
                      "' has ef=on: error feedback keeps its residual in a state (qcclCodecStateCreate)");
    return std::nullopt;
  }

  std::unique_ptr<MethodState> make_state(size_t count, const kernels::CodecConfig* codec) const override {
    if (codec && !codec->error_feedback) return nullptr;
    return std::make_unique<QuantizedState>(count);
  }

  std::unique_ptr<MethodCall> begin(const CollArgs& args, MethodState* state, const StateView*) const override {
    auto call = std::make_unique<QuantizedCall>();
    if (args.codec->error_feedback && state) call->residual = static_cast<QuantizedState*>(state)->residual();
    return call;
  }
};

}  // namespace

const Method& quantized_method() {
  static const QuantizedMethod method;
  return method;
}

}  // namespace qccl::coll
