// The value-codec method: none, fp16, bf16 and q1-q8 (bucketed min-max quantization, QSDP / CGX
// style), fused into the compressed all-reduce (allreduce_sra_compressed.cc, allreduce_ring_compressed.cc),
// all-gather (allgather_compressed_ring.cc) and reduce-scatter (reduce_scatter_compressed_pairwise.cc),
// and into point-to-point messages (sendrecv_compressed.cc), where AQ-SGD's aq2-aq8 (a max-abs scale
// per channel, kernels/aq_quant.h) serve too: its stateless quantization of activations and their
// gradients. Its state is the error-feedback residual (ef=on; collectives only): a float per value of
// the tensor, which compressed.h updates as r <- acc - decode(encode(acc)).
#include <string>

#include "collectives/compressed.h"
#include "collectives/method.h"
#include "collectives/residual_state.h"
#include "kernels/types.h"

namespace qccl::coll {

namespace {

Refusal argument(const std::string& message) { return Refusal{Refusal::Kind::kArgument, message}; }

class QuantizedMethod final : public Method {
 public:
  const char* name() const override { return "quantized"; }
  const char* description() const override {
    return "none, fp16, bf16, q1-q8, aq2-aq8: each value encoded on its own, with optional error feedback (aq: "
           "point-to-point only)";
  }
  bool serves(const kernels::CodecConfig& codec) const override {
    return codec.kind == kernels::CodecKind::kNone || codec.kind == kernels::CodecKind::kFp16 ||
           codec.kind == kernels::CodecKind::kBf16 || codec.kind == kernels::CodecKind::kQuant ||
           codec.kind == kernels::CodecKind::kAq;
  }

  std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int) const override {
    const std::string spec = args.codec->canonical();
    const bool p2p = args.kind == CollKind::kSend || args.kind == CollKind::kRecv;
    if (args.codec->kind == kernels::CodecKind::kAq && !p2p)
      return argument("codec '" + spec + "': " + coll_name(args.kind) +
                      " has no aq form (AQ-SGD's quantizer is point-to-point: qcclSendCompressed, qcclRecvCompressed)");
    if (!p2p && args.kind != CollKind::kAllReduce && args.kind != CollKind::kAllGather &&
        args.kind != CollKind::kReduceScatter)
      return argument(std::string("codec '") + spec + "': " + coll_name(args.kind) + " has no compressed form");
    if (p2p && args.codec->error_feedback)
      return argument("codec '" + spec + "': " + coll_name(args.kind) +
                      " keeps no residual (point-to-point messages are not summed): use ef=off");
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
    auto call = std::make_unique<QuantizedCall>();
    if (args.codec->error_feedback && state) call->residual = static_cast<ResidualState*>(state)->residual();
    return call;
  }
};

}  // namespace

const Method& quantized_method() {
  static const QuantizedMethod method;
  return method;
}

}  // namespace qccl::coll
