// What Marsit's two kinds of round share (Wu et al., "Sign Bit is Enough", DAC 2022, Alg. 1 and 2;
// ../shared/specs/marsit.md). Each call is round t = the codec state's step; the caller passes u (its
// learning-rate-scaled update) and the state holds the compensation c. Every rank contributes
// w = u + c and receives the same g:
//
//   sign round (allreduce_marsit.cc):   g = eta_s (2 b - 1), b the multi-hop merged signs of w;
//                                       c <- w - g
//   full precision, t mod K = 0 (here): g = the average of w over the ranks; c <- 0
//
// so that on every rank the updates sent so far plus c equal the updates given so far.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/method.h"
#include "collectives/plan.h"
#include "kernels/marsit.h"

namespace qccl::coll {

// The full-precision round: a ring all-reduce (average) of w = u + c into recvbuf, then c = 0 where
// the average is finite (where it is not, c is kept and the value is reported as non-finite).
std::unique_ptr<Plan> make_marsit_full_precision(const CollArgs& args, const PlanOptions& options);

// The links of both rounds: the ring in rank order, and on a torus the row and column rings too. Both
// rounds announce the same frame headers on the same links, so that ranks whose states are at
// different steps (one in a sign round, one in a full-precision round) meet a header that says so.
void marsit_links(const CollArgs& args, std::vector<int>* send_to, std::vector<int>* recv_from);

// Why Marsit cannot run these arguments, or nullptr.
const char* marsit_cannot_run(const CollArgs& args);

// Words of sign bits per cell in a fragment of the sign round, on a grid of `rows` rows (a row
// step's message holds one piece per row; a column step's, one): a chunk of float32 input, as for
// the other codecs (chunk_bytes / 128 words), but so that a row message is at least
// min_message_bytes(chunk_bytes) (plan.h): at 1/32 of the input a message would be 8 KiB at the
// default chunk (docs/PERF.md, "Marsit over an emulated network": 15-26% faster at 1 Gbit/s with
// 32 KiB).
constexpr size_t marsit_chunk_words(size_t chunk_bytes, size_t rows = 1) {
  const size_t input = chunk_bytes / sizeof(float) / 32;
  const size_t least = min_message_bytes(chunk_bytes) / sizeof(uint32_t) / std::max<size_t>(rows, 1);
  return std::max<size_t>(1, std::max(input, least));
}

// A call of Marsit (marsit_method.cc): the compensation c of its state.
struct MarsitCall final : MethodCall {
  kernels::Compensation compensation;
  void use_device_arrays(const std::vector<void*>& arrays) override {
    if (arrays.size() == 3)
      compensation = {static_cast<float*>(arrays[0]), static_cast<uint32_t*>(arrays[1]), static_cast<float*>(arrays[2])};
  }
};

// Marsit's numerics as step kernels (plan.h), bound to one call: its compensation c, random key and
// eta_s. A plan holds one and adds its steps through it. A fragment is "tainted" once it met a
// non-finite value, here or at a peer: a tainted fragment decodes to NaN and leaves the state alone.
class MarsitSteps {
 public:
  explicit MarsitSteps(const CollArgs& args);
  MarsitSteps(const MarsitSteps&) = delete;  // programs point at the kernels
  MarsitSteps& operator=(const MarsitSteps&) = delete;

  // dst (words) = signs of w = u + c for values first .. first + count; c's stored values become w,
  // the old ones go to `backup` (float scratch) for a tainted fragment to put back.
  void pack_signs(Program& p, uint32_t* dst, const float* u, size_t first, size_t count, float* backup) const;
  // dst = merge(incoming, local) at a hop that has k contributions after it, random stream `stream`,
  // words first_word .. (marsit.md §6.2: one merge per step, phase, group, hop and word).
  void merge_signs(Program& p, uint32_t* dst, const uint32_t* incoming, const uint32_t* local, size_t words,
                   uint32_t k, uint32_t stream, uint64_t first_word) const;
  // g = eta_s (2 bit - 1) of the words, recorded in c so that c = w - g (Marsit Alg. 1 line 10); when
  // tainted: g = NaN, and c's stored values back from `backup`.
  void decode_signs(Program& p, float* g, const uint32_t* words, size_t first, size_t count,
                    const float* backup) const;
  // w = u + c: the full-precision round's contribution.
  void add_compensation(Program& p, float* w, const float* u, size_t first, size_t count) const;
  // After a full-precision round: c = 0 where g is finite; where it is not, c is kept and the value
  // counts as non-finite output.
  void reset_compensation(Program& p, const float* g, size_t first, size_t count) const;

 private:
  struct Bound {
    const kernels::Compensation* c;  // the call's (none_ without a call)
    kernels::PhiloxKey rng;
    float eta;
  };
  struct Pack final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kEncode; }
    const char* name() const override { return "pack"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct Merge final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kEncode; }
    const char* name() const override { return "merge"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct Decode final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "decode_signs"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct AddCompensation final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "add_compensation"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  struct ResetCompensation final : StepKernel {
    const Bound* b;
    Phase phase() const override { return Phase::kDecode; }
    const char* name() const override { return "reset_compensation"; }
    void run(const step::Compute& s, StepContext& context) const override;
    bool launch(const step::Compute& s, DeviceStepContext& context) const override;
  };
  kernels::Compensation none_;
  Bound bound_;
  Pack pack_;
  Merge merge_;
  Decode decode_;
  AddCompensation add_;
  ResetCompensation reset_;
};

}  // namespace qccl::coll
