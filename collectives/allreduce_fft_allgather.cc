// FFT-sparsified all-reduce (Wang et al., HPDC '20, §3 and §4 "Implementation"; shared/specs/
// fftsparse.md §1.2 and §1.7): every rank encodes each segment of its input once with the fft codec,
// sends the payload, whose length depends on the data, to every other rank (an all-gather of
// variable-length messages: receives of the codec's capacity learn the actual length, and the wire
// carries only what was written), and decodes all n payloads, its own included, in rank order into
// one float32 sum (divided by n for an average). Every rank decodes the same bytes in the same order,
// so the output is bitwise identical everywhere.
//
// A fragment is a run of whole segments, as many as a pipeline chunk holds in float32 (one segment
// at the defaults: 65536 values, 256 KiB), so the pipeline overlaps fragment f + 1's FFTs with
// fragment f's transfers; short segments travel several to a message (and a device's kernels take
// them as one batch, a block each), which changes no bit: a run encodes to its segments' payloads
// back to back.
// The payloads' sparse spectra are added in rank order and the sum goes through one inverse FFT per
// segment, not n (spec P6: the inverse of the sum is the sum of the inverses, up to float32 rounding).
//
// Error feedback (ef=on): each rank adds its residual to its input and its encode leaves there what
// the payload misses, but a segment whose sum is NaN or Inf (a rank's input held one) takes back on
// every rank the residual it had before the step (spec §5.4), kept aside in the scratch.
//
// Error with truncation, per segment: a rank's decoded payload x^ has |x^| <= |x| (Parseval and a
// quantizer that never grows a magnitude; spec P16) and |x - x^|^2 <= theta_eff |x|^2 + quantization
// (P3), so the sum's error is at most the sum of the ranks' errors.
//
// Wire bytes: (n - 1) times this rank's payloads, at most (n - 1) encoded_bytes(count).
#include <algorithm>
#include <cmath>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/device_kernels.h"
#include "collectives/fft.h"
#include "kernels/fft_sparse.h"

namespace qccl::coll {

namespace {

// The codec's numerics as step kernels, bound to the call (its residual and statistics) and to a
// workspace of FFT plans (kernels run on the executor's thread only, one step at a time).
struct FftKernels {
  explicit FftKernels(const CollArgs& args)
      : codec(*args.codec),
        call(const_cast<FftCall*>(static_cast<const FftCall*>(args.method_call))),
        workspace(kernels::take_fft_workspace()) {
    encode.k = add_spectrum.k = synthesize.k = restore_residual.k = this;
  }

  // dst = encode(src) for values index .. index + count (whole segments, but for the call's last);
  // *src2 (size_t) = its length. With error feedback, the residual there becomes src - decode(dst),
  // except over segments that held NaN or Inf.
  struct Encode final : StepKernel {
    FftKernels* k;
    Phase phase() const override { return Phase::kEncode; }
    const char* name() const override { return "fft_encode"; }
    void run(const step::Compute& s, StepContext&) const override {
      float* residual = k->call && k->call->residual ? k->call->residual + s.index : nullptr;
      const kernels::FftReport report = kernels::fft_encode(k->codec, static_cast<const float*>(s.src), s.count,
                                                            s.dst, *k->workspace, residual);
      *static_cast<size_t*>(const_cast<void*>(s.src2)) = report.bytes;
      if (k->call) k->call->clamped += report.clamped;
    }
    bool launch(const step::Compute& s, DeviceStepContext& context) const override {
      if (!context.kernels->runs_fft()) return false;
      float* residual = k->call && k->call->residual ? k->call->residual + s.index : nullptr;
      context.kernels->fft_encode(k->codec, static_cast<const float*>(s.src), s.count, s.dst,
                                  static_cast<size_t*>(const_cast<void*>(s.src2)), residual, context.counters);
      return true;
    }
  };
  // dst (a spectrum) = (aux: +=) the bins of src, *src2 (size_t) bytes of payloads of count values.
  struct AddSpectrum final : StepKernel {
    FftKernels* k;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "add_spectrum"; }
    void run(const step::Compute& s, StepContext&) const override {
      kernels::fft_decode_spectrum(k->codec, s.src, *static_cast<const size_t*>(s.src2), s.count,
                                   static_cast<float*>(s.dst), s.aux != 0, *k->workspace);
    }
    bool launch(const step::Compute& s, DeviceStepContext& context) const override {
      if (!context.kernels->runs_fft()) return false;
      context.kernels->fft_add_spectrum(k->codec, s.src, static_cast<const size_t*>(s.src2), s.count,
                                        static_cast<float*>(s.dst), s.aux != 0);
      return true;
    }
  };
  // dst (float) = the inverse transform of the spectrum src, count values.
  struct Synthesize final : StepKernel {
    FftKernels* k;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "synthesize"; }
    void run(const step::Compute& s, StepContext&) const override {
      kernels::fft_synthesize(k->codec, static_cast<const float*>(s.src), s.count, static_cast<float*>(s.dst),
                              *k->workspace);
    }
    bool launch(const step::Compute& s, DeviceStepContext& context) const override {
      if (!context.kernels->runs_fft()) return false;
      context.kernels->fft_synthesize(k->codec, static_cast<const float*>(s.src), s.count, static_cast<float*>(s.dst));
      return true;
    }
  };

  // dst (the residual) = src (as it was before the step) over the segments where src2 (the sum, count
  // values) is not finite.
  struct RestoreResidual final : StepKernel {
    FftKernels* k;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "restore_residual"; }
    void run(const step::Compute& s, StepContext&) const override {
      kernels::fft_restore_residual(k->codec, static_cast<const float*>(s.src), static_cast<const float*>(s.src2),
                                    s.count, static_cast<float*>(s.dst));
    }
    bool launch(const step::Compute& s, DeviceStepContext& context) const override {
      if (!context.kernels->runs_fft()) return false;
      context.kernels->fft_restore_residual(k->codec, static_cast<const float*>(s.src),
                                            static_cast<const float*>(s.src2), s.count, static_cast<float*>(s.dst));
      return true;
    }
  };

  const kernels::CodecConfig& codec;
  FftCall* call;
  kernels::FftWorkspaceHandle workspace;
  Encode encode;
  AddSpectrum add_spectrum;
  Synthesize synthesize;
  RestoreResidual restore_residual;
};

class AllReduceFftAllgather final : public Plan {
 public:
  AllReduceFftAllgather(const CollArgs& args, const PlanOptions& options)
      : Plan(args),
        span_(args.codec->segment * std::max<size_t>(1, options.chunk_bytes / (args.codec->segment * sizeof(float)))),
        kernels_(std::make_unique<FftKernels>(args)) {}

  size_t fragments() const override { return (args_.count + span_ - 1) / span_; }

  // The n payloads' lengths, a float32 contribution (then the sum), the sum's spectrum, the n payloads
  // and, with error feedback, the residual as it was.
  size_t scratch_bytes() const override {
    return lengths_bytes() + floats_bytes() + spectrum_bytes() + n() * payload_stride() +
           (residual() ? floats_bytes() : 0);
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int me = args_.rank;
    const size_t es = args_.element_size(), offset = f * span_;
    const size_t count = std::min(span_, args_.count - offset), capacity = args_.codec->encoded_bytes(count);
    auto* lengths = reinterpret_cast<size_t*>(scratch);
    float* contribution = reinterpret_cast<float*>(scratch + lengths_bytes());
    float* sum = contribution;  // once encoded, the contribution's buffer takes the sum
    float* spectrum = reinterpret_cast<float*>(scratch + lengths_bytes() + floats_bytes());
    std::byte* payloads = scratch + lengths_bytes() + floats_bytes() + spectrum_bytes();
    auto payload = [&](int q) { return payloads + static_cast<size_t>(q) * payload_stride(); };
    float* saved_residual = reinterpret_cast<float*>(payloads + n() * payload_stride());
    float* residual = this->residual() ? this->residual() + offset : nullptr;

    int slot = 0;
    std::vector<int> from(n(), -1);
    for (int q = 0; q < static_cast<int>(n()); ++q)
      if (q != me) {
        from[q] = slot;
        p.recv_upto(slot++, q, 0, payload(q), capacity, &lengths[q]);
      }
    p.load(contribution, static_cast<const char*>(args_.sendbuf) + offset * es, count);
    if (residual) {
      p.add_float(contribution, residual, count);
      p.copy(saved_residual, residual, count * sizeof(float));
    }
    p.compute(step::Compute{&kernels_->encode, payload(me), contribution, &lengths[me], count, offset, 0, 0, 0});
    std::vector<int> sends;
    for (int q = 0; q < static_cast<int>(n()); ++q)
      if (q != me) {
        sends.push_back(slot);
        p.send_length(slot++, q, 0, payload(me), capacity, &lengths[me]);
      }
    for (int q = 0; q < static_cast<int>(n()); ++q) {
      if (q != me) p.wait(from[q]);
      p.compute(step::Compute{&kernels_->add_spectrum, spectrum, payload(q), &lengths[q], count, offset,
                              static_cast<uint32_t>(q != 0), 0, 0});
    }
    p.compute(step::Compute{&kernels_->synthesize, sum, spectrum, nullptr, count, offset, 0, 0, 0});
    if (residual)
      p.compute(step::Compute{&kernels_->restore_residual, residual, saved_residual, sum, count, offset, 0, 0, 0});
    if (args_.op == RedOp::kAvg) p.divide(sum, count);
    for (int s : sends) p.wait(s);
    p.store(static_cast<char*>(args_.recvbuf) + offset * es, sum, count);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    for (int q = 0; q < args_.nranks; ++q)
      if (q != args_.rank) send_to->push_back(q), recv_from->push_back(q);
  }

  // Variable length: the capacity, (n - 1) encoded_bytes(count); the statistics count what was sent.
  uint64_t wire_bytes_sent() const override { return (n() - 1) * args_.codec->encoded_bytes(args_.count); }
  uint64_t raw_wire_bytes() const override { return (n() - 1) * args_.count * args_.element_size(); }
  bool variable_length() const override { return true; }
  void absorb(const DeviceCounters& counters) override {
    if (kernels_->call) kernels_->call->clamped += counters.clamped;
  }

 private:
  size_t n() const { return static_cast<size_t>(args_.nranks); }
  float* residual() const { return kernels_->call ? kernels_->call->residual : nullptr; }
  size_t lengths_bytes() const { return whole_lines(n() * sizeof(size_t)); }
  size_t floats_bytes() const { return whole_lines(std::min(span_, args_.count) * sizeof(float)); }
  size_t spectrum_bytes() const {
    return whole_lines(kernels::fft_spectrum_floats(*args_.codec, std::min(span_, args_.count)) * sizeof(float));
  }
  size_t payload_stride() const { return whole_lines(args_.codec->encoded_bytes(std::min(span_, args_.count))); }

  size_t span_;  // values per fragment: whole segments
  std::unique_ptr<FftKernels> kernels_;  // programs point at its kernels
};

}  // namespace

namespace {
bool has_residual(const CollArgs& args) {
  return args.method_call && static_cast<const FftCall*>(args.method_call)->residual;
}
// theta = 0 drops nothing, but its range floats would still round every bin: the spec's lossless
// theta = 0 (fftsparse.md §1.8, the paper's schedule ending at 0) is the dense ring's exact sum.
bool lossless(const CollArgs& args) { return args.codec->theta == 0; }
}  // namespace

const char* allreduce_fft_allgather_cannot_run(const CollArgs& args) {
  if (!args.codec || args.codec->kind != kernels::CodecKind::kFft) return "runs the fft codec only";
  if (lossless(args)) return "theta=0 is lossless: the dense ring sums exactly (fft_dense_ring runs)";
  if (args.codec->fallback && !has_residual(args) &&
      !kernels::fft_compression_pays(*args.codec, args.count, args.nranks, args.element_size()))
    return "the dense ring moves fewer bytes at this rank count (fft_dense_ring runs; fallback=off forces this)";
  if (args.codec->fallback && !has_residual(args) && args.link &&
      !kernels::fft_pays_at_rate(*args.codec, args.count, args.element_size(), args.link->rate,
                                 args.link->fft_seconds_per_value))
    return "at this link rate (QCCL_LINK_RATE) the codec costs more time than it saves on the wire (Eq. 4; "
           "fft_dense_ring runs; fallback=off forces this)";
  return needs_two_ranks(args);
}

// The fall-back: the fft codec's call as the uncompressed ring all-reduce (exact). Error feedback
// keeps fft_allgather, whose residual must see the codec's loss, but at theta = 0: nothing is lost
// there, so the residual is left as it is (the outputs plus the residual still hold every input,
// spec P15) for the next call that drops bins to send.
const char* allreduce_fft_dense_ring_cannot_run(const CollArgs& args) {
  if (!args.codec || args.codec->kind != kernels::CodecKind::kFft) return "runs the fft codec only";
  if (has_residual(args) && !lossless(args)) return "error feedback needs the codec's loss (fft_allgather runs)";
  return needs_two_ranks(args);
}

std::unique_ptr<Plan> make_allreduce_fft_dense_ring(const CollArgs& args, const PlanOptions& options) {
  return make_allreduce_ring(args, options);
}

std::unique_ptr<Plan> make_allreduce_fft_allgather(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<AllReduceFftAllgather>(args, options);
}

}  // namespace qccl::coll
