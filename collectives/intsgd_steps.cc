// IntSGD's step kernels (collectives/intsgd.h): the element work lives in kernels/intsgd.h; this file
// binds it to one call's width, clip range, rounding and result type.
#include "collectives/intsgd.h"

#include <algorithm>
#include <limits>

#include "collectives/device_kernels.h"
#include "kernels/convert.h"
#include "kernels/intsgd.h"

namespace qccl::coll {

IntsgdSteps::IntsgdSteps(const CollArgs& args) {
  bound_.bits = args.codec->bits;
  bound_.stochastic = args.codec->rounding == kernels::Rounding::kStochastic;
  bound_.clip = kernels::int_clip(args.codec->bits, args.nranks);
  bound_.rng = args.rng;
  bound_.dtype = args.dtype;
  bound_.divisor = args.op == RedOp::kAvg ? args.nranks : 1;
  bound_.clipped = intsgd_call(args).clipped();
  bound_.sums = intsgd_call(args).sums();
  encode_.b = add_.b = decode_.b = header_.b = &bound_;
}

void IntsgdSteps::encode(Program& p, void* dst, const float* src, size_t count, uint64_t first, float alpha) const {
  p.compute(step::Compute{&encode_, dst, src, nullptr, count, first, 0, 0, alpha});
}

void IntsgdSteps::add(Program& p, void* acc, const void* src, size_t count) const {
  p.compute(step::Compute{&add_, acc, src, nullptr, count, 0, 0, 0, 0});
}

void IntsgdSteps::decode(Program& p, void* dst, const void* src, size_t count, float alpha, float* scratch) const {
  p.compute(step::Compute{&decode_, dst, src, scratch, count, 0, 0, 0, alpha});
}

void IntsgdSteps::chunk_header(Program& p, void* dst, size_t count) const {
  p.compute(step::Compute{&header_, dst, nullptr, nullptr, count, 0, 0, 0, 0});
}

void IntsgdSteps::Encode::run(const step::Compute& s, StepContext& context) const {
  const kernels::IntEncodeReport report = kernels::int_encode(b->bits, static_cast<const float*>(s.src), s.count,
                                                              s.factor, b->stochastic, b->clip, b->rng, s.index, s.dst);
  *b->clipped += report.clipped;
  if (report.nonfinite) *context.tainted = true;  // never summed: the peers learn it from the key
}

void IntsgdSteps::Add::run(const step::Compute& s, StepContext&) const {
  kernels::int_add(b->bits, s.src, s.dst, s.count);
}

void IntsgdSteps::Decode::run(const step::Compute& s, StepContext& context) const {
  // Every rank decodes the same sums with the same taint, so every rank counts the same.
  auto* out = static_cast<float*>(s.dst);
  float* f32 = b->dtype == DataType::kFloat32 ? out : static_cast<float*>(const_cast<void*>(s.src2));
  if (*context.tainted) {
    std::fill(f32, f32 + s.count, std::numeric_limits<float>::quiet_NaN());
    *context.nonfinite += s.count;
  } else {
    kernels::int_decode(b->bits, s.src, s.count, 1.0 / (b->divisor * static_cast<double>(s.factor)), f32);
    kernels::int_accumulate_sums(b->bits, s.src, s.count, b->sums);
  }
  if (f32 != out) kernels::store_float(b->dtype, f32, s.dst, s.count);
}

// The device forms: the same element functions (codec_cuda.h), the fragment's taint on the device.
bool IntsgdSteps::Encode::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->int_encode(b->bits, static_cast<const float*>(s.src), s.count, s.factor, b->stochastic, b->clip,
                              b->rng, s.index, s.dst, &context.counters->clipped, context.taint);
  return true;
}

bool IntsgdSteps::Add::launch(const step::Compute& s, DeviceStepContext& context) const {
  context.kernels->int_add(b->bits, s.src, s.dst, s.count);
  return true;
}

bool IntsgdSteps::Decode::launch(const step::Compute& s, DeviceStepContext& context) const {
  float* f32 = b->dtype == DataType::kFloat32 ? static_cast<float*>(s.dst) : static_cast<float*>(const_cast<void*>(s.src2));
  context.kernels->int_decode(b->bits, s.src, s.count, 1.0 / (b->divisor * static_cast<double>(s.factor)), f32,
                              context.taint, context.tainted, context.counters);
  if (f32 != s.dst) context.kernels->store_float(b->dtype, f32, s.dst, s.count);
  return true;
}

bool IntsgdSteps::Header::launch(const step::Compute& s, DeviceStepContext& context) const {
  uint8_t bytes[SwitchChunkHeader::kBytes];
  header(s.count).encode(bytes);
  context.kernels->write_bytes(s.dst, bytes, sizeof bytes);
  return true;
}

void IntsgdSteps::absorb(const DeviceCounters& counters) const {
  *bound_.clipped += counters.clipped;
  kernels::IntSums sums;
  sums.squares_lo = counters.squares_lo;
  sums.squares_hi = counters.squares_hi;
  sums.max_abs = static_cast<uint32_t>(counters.max_abs);
  bound_.sums->merge(sums);
}

void IntsgdSteps::Header::run(const step::Compute& s, StepContext&) const { header(s.count).encode(s.dst); }

SwitchChunkHeader IntsgdSteps::Header::header(size_t count) const {
  SwitchChunkHeader h;
  h.bits = static_cast<uint8_t>(b->bits);
  h.count = static_cast<uint32_t>(count);
  return h;
}

}  // namespace qccl::coll
