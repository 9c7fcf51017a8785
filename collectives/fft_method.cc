// FFT sparsification (Wang et al., "FFT-based Gradient Sparsification for the Distributed Training
// of Deep Neural Networks", HPDC '20; shared/specs/fftsparse.md) as a method: the fft codec
// (kernels/fft_sparse.h), its plan (allreduce_fft_allgather.cc), and its state, the optional
// error-feedback residual (not in the paper, which leaves it to "orthogonal" heuristics, §4.2):
// u = g + r is encoded, r <- u - decode(encode(u)), left alone on every rank for a segment that held
// NaN or Inf on any.
#include <string>

#include "collectives/fft.h"
#include "collectives/method.h"
#include "collectives/residual_state.h"
#include "kernels/types.h"

namespace qccl::coll {

namespace {

Refusal argument(const std::string& message) { return Refusal{Refusal::Kind::kArgument, message}; }

class FftMethod final : public Method {
 public:
  const char* name() const override { return "fft"; }
  const char* description() const override {
    return "fft: per segment the largest bins of the spectrum as range floats, all-gathered in variable length "
           "and summed by every rank in rank order (FFT sparsification)";
  }
  bool serves(const kernels::CodecConfig& codec) const override { return codec.kind == kernels::CodecKind::kFft; }

  std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int) const override {
    const std::string spec = args.codec->canonical();
    if (args.kind != CollKind::kAllReduce)
      return argument("codec '" + spec + "': " + coll_name(args.kind) + " has no FFT-sparsified form (AllReduce only)");
    if (args.dtype != DataType::kFloat32 && args.dtype != DataType::kFloat16 && args.dtype != DataType::kBfloat16)
      return argument("datatype " + std::string(kernels::data_type_name(args.dtype)) + ": codec '" + spec +
                      "' takes float32, float16 or bfloat16");
    if (args.op != RedOp::kSum && args.op != RedOp::kAvg)
      return argument("op " + std::string(kernels::red_op_name(args.op)) + ": codec '" + spec +
                      "' sums or averages (sum, avg)");
    if (args.codec->error_feedback && !state)
      return argument("state is NULL but codec '" + spec +
                      "' has ef=on: error feedback keeps its residual in a state (qcclCodecStateCreate)");
    return std::nullopt;
  }

  std::unique_ptr<MethodState> make_state(size_t count, const kernels::CodecConfig* codec) const override {
    if (codec && !codec->error_feedback) return nullptr;
    return std::make_unique<ResidualState>(count);
  }
  size_t state_bytes(size_t count, const kernels::CodecConfig* codec) const override {
    return codec && !codec->error_feedback ? 0 : ResidualState::bytes_for(count);
  }

  std::unique_ptr<MethodCall> begin(const CollArgs& args, MethodState* state, const StateView*) const override {
    auto call = std::make_unique<FftCall>();
    if (args.codec->error_feedback && state) call->residual = static_cast<ResidualState*>(state)->residual();
    return call;
  }
};

}  // namespace

const Method& fft_method() {
  static const FftMethod method;
  return method;
}

}  // namespace qccl::coll
