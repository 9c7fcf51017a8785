// Marsit's step kernels (collectives/marsit.h): the element work lives in kernels/marsit.h; this file
// binds it to one call's compensation, random key and eta_s.
#include "collectives/marsit.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "collectives/device_kernels.h"
#include "kernels/marsit.h"

namespace qccl::coll {

// The call's compensation is read when a step runs, not copied here: a call on device buffers gets
// its device copy (MarsitCall::use_device_arrays) after its plan was made.
MarsitSteps::MarsitSteps(const CollArgs& args)
    : bound_{args.method_call ? &static_cast<const MarsitCall*>(args.method_call)->compensation : &none_, args.rng,
             args.codec ? args.codec->eta : 0.0f} {
  pack_.b = merge_.b = decode_.b = add_.b = reset_.b = &bound_;
}

void MarsitSteps::pack_signs(Program& p, uint32_t* dst, const float* u, size_t first, size_t count,
                             float* backup) const {
  p.compute(step::Compute{&pack_, dst, u, backup, count, first, 0, 0, 0});
}

void MarsitSteps::merge_signs(Program& p, uint32_t* dst, const uint32_t* incoming, const uint32_t* local, size_t words,
                              uint32_t k, uint32_t stream, uint64_t first_word) const {
  p.compute(step::Compute{&merge_, dst, incoming, local, words, first_word, k, stream, 0});
}

void MarsitSteps::decode_signs(Program& p, float* g, const uint32_t* words, size_t first, size_t count,
                               const float* backup) const {
  p.compute(step::Compute{&decode_, g, words, backup, count, first, 0, 0, 0});
}

void MarsitSteps::add_compensation(Program& p, float* w, const float* u, size_t first, size_t count) const {
  p.compute(step::Compute{&add_, w, u, nullptr, count, first, 0, 0, 0});
}

void MarsitSteps::reset_compensation(Program& p, const float* g, size_t first, size_t count) const {
  p.compute(step::Compute{&reset_, nullptr, g, nullptr, count, first, 0, 0, 0});
}

void MarsitSteps::Pack::run(const step::Compute& s, StepContext& context) const {
  if (kernels::pack_signs(static_cast<const float*>(s.src), b->c, s.index, s.count, static_cast<uint32_t*>(s.dst),
                          static_cast<float*>(const_cast<void*>(s.src2))))
    *context.tainted = true;
}

void MarsitSteps::Merge::run(const step::Compute& s, StepContext&) const {
  kernels::PhiloxKey key = b->rng;
  key.rank = s.aux, key.stream = s.stream;  // one merge per (step, phase, group, hop, word): marsit.md §6.2
  kernels::merge_signs(static_cast<const uint32_t*>(s.src), static_cast<const uint32_t*>(s.src2),
                       static_cast<uint32_t*>(s.dst), s.count, s.aux, key, s.index);
}

void MarsitSteps::Decode::run(const step::Compute& s, StepContext& context) const {
  auto* g = static_cast<float*>(s.dst);
  if (*context.tainted) {  // a NaN or Inf somewhere in this fragment: no finite garbage, state kept
    std::fill(g, g + s.count, std::numeric_limits<float>::quiet_NaN());
    std::memcpy(b->c->stored + s.index, s.src2, s.count * sizeof(float));
    *context.nonfinite += s.count;
    return;
  }
  kernels::decode_signs(static_cast<const uint32_t*>(s.src), s.count, b->eta, g, b->c, s.index);
}

void MarsitSteps::AddCompensation::run(const step::Compute& s, StepContext&) const {
  kernels::add_compensation(static_cast<const float*>(s.src), *b->c, s.index, s.count, static_cast<float*>(s.dst));
}

void MarsitSteps::ResetCompensation::run(const step::Compute& s, StepContext& context) const {
  *context.nonfinite += kernels::reset_compensation(static_cast<const float*>(s.src), *b->c, s.index, s.count);
}

// The device forms: the same element functions (codec_cuda.h), the fragment's taint on the device.
bool MarsitSteps::Pack::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->pack_signs(static_cast<const float*>(s.src), *b->c, s.index, s.count, static_cast<uint32_t*>(s.dst),
                              static_cast<float*>(const_cast<void*>(s.src2)), context.taint);
  return true;
}

bool MarsitSteps::Merge::launch(const step::Compute& s, DeviceStepContext& context) const {
  kernels::PhiloxKey key = b->rng;
  key.rank = s.aux, key.stream = s.stream;
  context.kernels->merge_signs(static_cast<const uint32_t*>(s.src), static_cast<const uint32_t*>(s.src2),
                               static_cast<uint32_t*>(s.dst), s.count, s.aux, key, s.index);
  return true;
}

bool MarsitSteps::Decode::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->decode_signs(static_cast<const uint32_t*>(s.src), s.count, b->eta, static_cast<float*>(s.dst), *b->c,
                                s.index, static_cast<const float*>(s.src2), context.taint, context.tainted,
                                &context.counters->nonfinite);
  return true;
}

bool MarsitSteps::AddCompensation::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->add_compensation(static_cast<const float*>(s.src), *b->c, s.index, s.count,
                                    static_cast<float*>(s.dst));
  return true;
}

bool MarsitSteps::ResetCompensation::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->reset_compensation(static_cast<const float*>(s.src), *b->c, s.index, s.count,
                                      &context.counters->nonfinite);
  return true;
}

}  // namespace qccl::coll
