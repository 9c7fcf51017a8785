// IntSGD (Mishchenko et al., ICLR 2022) as a method: the int8/int16/int32 codecs, their plans
// (allreduce_intsgd.cc along a ring, allreduce_intsgd_switch.cc through aggregator processes), the
// schedule of the shared scale alpha (intsgd_schedule.h), and its state: the moving average r of
// Algorithm 1, which every rank holds identically.
#include <cstring>
#include <stdexcept>
#include <string>

#include "collectives/intsgd.h"
#include "collectives/intsgd_schedule.h"
#include "collectives/method.h"

namespace qccl::coll {

namespace {

class IntsgdState final : public MethodState {
 public:
  IntsgdMemory& memory() { return memory_; }

  size_t bytes() const override { return sizeof(memory_); }
  uint32_t version() const override { return 1; }
  size_t serialized_bytes() const override { return 16; }  // r (double), flags
  void save(uint8_t* out) const override {
    uint64_t r, flags = memory_.has_r ? 1 : 0;
    std::memcpy(&r, &memory_.r, sizeof(r));
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<uint8_t>(r >> (8 * i)), out[8 + i] = static_cast<uint8_t>(flags >> (8 * i));
  }
  void load(const uint8_t* in, size_t bytes, uint32_t version) override {
    if (version != 1)
      throw std::invalid_argument("IntSGD memory of format " + std::to_string(version) + " (this is 1)");
    if (bytes != serialized_bytes())
      throw std::invalid_argument("IntSGD memory of " + std::to_string(bytes) + " bytes (expected 16)");
    uint64_t r = 0, flags = 0;
    for (int i = 0; i < 8; ++i) r |= uint64_t{in[i]} << (8 * i), flags |= uint64_t{in[8 + i]} << (8 * i);
    std::memcpy(&memory_.r, &r, sizeof(r));
    memory_.has_r = flags & 1;
  }
  void load_legacy(const LegacyState& legacy) override {
    memory_.r = legacy.moving_average;
    memory_.has_r = legacy.has_moving_average;
  }

 private:
  IntsgdMemory memory_;
};

Refusal refusal(Refusal::Kind kind, const std::string& message) { return Refusal{kind, message}; }

class IntsgdMethod final : public Method {
 public:
  const char* name() const override { return "intsgd"; }
  const char* description() const override {
    return "int8, int16, int32: integers under a shared adaptive scale, summed exactly without decoding (IntSGD)";
  }
  bool serves(const kernels::CodecConfig& codec) const override { return codec.kind == kernels::CodecKind::kInt; }

  std::optional<Refusal> refuse(const CollArgs& args, const StateView* state, int aggregators) const override {
    const kernels::CodecConfig& c = *args.codec;
    const std::string spec = c.canonical();
    if (args.kind != CollKind::kAllReduce)
      return refusal(Refusal::Kind::kArgument, "codec '" + spec +
                                                   "': IntSGD's integer sums are an all-reduce in this release "
                                                   "(qcclAllReduceCompressed)");
    if (!state && c.alpha_mode != kernels::IntAlpha::kFixed)
      return refusal(Refusal::Kind::kArgument,
                     "state is NULL but codec '" + spec +
                         "' adapts its scale alpha from earlier rounds, which a state keeps (qcclCodecStateCreate), "
                         "or give a fixed alpha=A");
    if (state && c.alpha_mode == kernels::IntAlpha::kLr && !(state->learning_rate > 0))
      return refusal(Refusal::Kind::kUsage, "codec '" + spec +
                                                "' scales by the learning rate, but the state has none: call "
                                                "qcclCodecStateSetLearningRate first");
    if (c.switch_aggregation && aggregators == 0)
      return refusal(Refusal::Kind::kUsage,
                     "codec '" + spec +
                         "' sums through aggregator processes, but this communicator has none: start them (qcclrun "
                         "--aggregators K, or qccl_aggregator) and set QCCL_AGGREGATORS before creating it");
    return std::nullopt;
  }

  std::unique_ptr<MethodState> make_state(size_t, const kernels::CodecConfig* codec) const override {
    if (codec && codec->alpha_mode == kernels::IntAlpha::kFixed) return nullptr;  // a fixed alpha learns nothing
    return std::make_unique<IntsgdState>();
  }
  size_t state_bytes(size_t, const kernels::CodecConfig* codec) const override {
    return codec && codec->alpha_mode == kernels::IntAlpha::kFixed ? 0 : sizeof(IntsgdMemory);
  }

  std::unique_ptr<MethodCall> begin(const CollArgs& args, MethodState* state, const StateView* view) const override {
    IntsgdMemory* memory = state ? &static_cast<IntsgdState*>(state)->memory() : nullptr;
    return std::make_unique<IntsgdCall>(args, memory, view ? view->learning_rate : 0.0);
  }
};

}  // namespace

void IntsgdCall::prepare(const CollArgs&) { round_ = intsgd_round(codec_, memory_, lr_, count_, nranks_); }

// Every rank holds the same result (exact round) or decoded the same sums (integer round), so every
// rank computes the same norm and moves its memory the same way; a round with NaN or Inf teaches
// nothing (the paper's safeguard against a skipped step corrupting alpha).
void IntsgdCall::complete(const CollArgs& args, const Plan&, size_t* nonfinite) {
  double mean_squares = 0;
  if (round_.exact)
    mean_squares = intsgd_exact_norm(args.recvbuf, args.count, args.dtype, args.op, nranks_, nonfinite);
  else
    mean_squares = intsgd_integer_norm(sums_.squares(), round_.alpha, nranks_);
  if (*nonfinite == 0 && memory_) intsgd_observe(codec_, memory_, lr_, mean_squares);
}

MethodStats IntsgdCall::stats(const Plan&) const {
  MethodStats s;
  s.has_scale = true;
  s.scale = round_.alpha;
  s.clipped = clipped_;
  s.largest = sums_.max_abs;
  return s;
}

const Method& intsgd_method() {
  static const IntsgdMethod method;
  return method;
}

}  // namespace qccl::coll
