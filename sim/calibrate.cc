#include "sim/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>

#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/reduce.h"
#include "sim/simulator.h"

namespace qccl::sim {

const char* const kDefaultCalibrationCodecs[] = {
    "none", "fp16",  "bf16",  "q8",  "q4",  "q2",  "q1",  "sign:eta_s=0.001",
    "int8", "int16", "int32", "fft", "aq8", "aq4", "aq2", nullptr};

namespace {

// Seconds per call of fn, the median of `repeats` runs after one warm-up.
double median_seconds(int repeats, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Where a codec's costs go: under its name when the spec is the name alone ("q8"), else under its
// canonical spec (the sign codec's eta_s changes no cost, so sign is always "sign").
std::string stored_name(const std::string& spec, const kernels::CodecConfig& codec) {
  if (codec.kind == kernels::CodecKind::kSign) return "sign";
  return spec.find(':') == std::string::npos ? spec : codec.canonical();
}

}  // namespace

void calibrate(Model* model, const CalibrateOptions& o, std::ostream* log) {
  const size_t n = o.values;
  const double values = static_cast<double>(n);
  std::vector<float> a(n), b(n), out(n);
  std::mt19937 random(7);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < n; ++i) a[i] = normal(random), b[i] = normal(random);
  auto note = [&](const std::string& what, double per_unit, const char* unit) {
    if (log) *log << "  " << what << ": " << per_unit * 1e9 << " ns per " << unit << "\n";
  };
  using kernels::DataType;
  model->copy = median_seconds(o.repeats, [&] { std::memcpy(out.data(), a.data(), n * 4); }) / (values * 4);
  note("copy", model->copy, "byte");
  model->reduce =
      median_seconds(
          o.repeats,
          [&] { kernels::reduce(DataType::kFloat32, kernels::RedOp::kSum, a.data(), b.data(), out.data(), n); }) /
      values;
  note("reduce (float32 sum)", model->reduce, "value");
  model->load =
      median_seconds(o.repeats, [&] { kernels::load_float(DataType::kFloat32, a.data(), out.data(), n); }) / values;
  note("load", model->load, "value");
  model->store =
      median_seconds(o.repeats, [&] { kernels::store_float(DataType::kFloat32, a.data(), out.data(), n); }) / values;
  note("store", model->store, "value");
  model->add = median_seconds(o.repeats, [&] { kernels::add_float(a.data(), out.data(), n); }) / values;
  note("add", model->add, "value");
  model->divide = median_seconds(o.repeats, [&] { kernels::divide_float(out.data(), n, 3.0f); }) / values;
  note("divide", model->divide, "value");

  std::vector<std::string> specs = o.codecs;
  if (specs.empty())
    for (const char* const* s = kDefaultCalibrationCodecs; *s; ++s) specs.push_back(*s);
  for (const std::string& spec : specs) {
    kernels::CodecConfig codec;
    try {
      codec = kernels::parse_codec_spec(spec);
    } catch (const kernels::CodecSpecError& e) {
      throw std::invalid_argument("--codec: " + std::string(e.what()));
    }
    // An adaptive IntSGD scale is set per round; a fixed one of the same magnitude costs the same.
    if (codec.kind == kernels::CodecKind::kInt && codec.alpha <= 0) codec.alpha = 100.0;
    const size_t align = codec.alignment() ? codec.alignment() : n;
    const size_t count = std::max(n / align * align, align);
    if (count > n) throw std::invalid_argument("codec '" + spec + "': its blocks are longer than the measured run");
    std::vector<uint8_t> encoded(codec.encoded_bytes(count));
    const kernels::PhiloxKey key{codec.seed, 1, 0, 0};
    CodecCosts& cost = model->codecs[stored_name(spec, codec)];
    const double c = static_cast<double>(count);
    cost["encode"] =
        median_seconds(o.repeats, [&] { kernels::encode(codec, a.data(), count, encoded.data(), key, 0); }) / c;
    cost["decode"] = median_seconds(o.repeats, [&] { kernels::decode(codec, encoded.data(), count, out.data()); }) / c;
    cost["decode_add"] =
        median_seconds(o.repeats, [&] { kernels::decode_accumulate(codec, encoded.data(), count, out.data()); }) / c;
    // The method's own kernels, timed where its plans run them: an all-reduce of 4 ranks on the
    // in-process network (codecs without an all-reduce, aq, have none).
    Topology four;
    four.nranks = 4;
    CallSpec call;
    call.count = n / 4;
    call.op = kernels::RedOp::kAvg;
    call.codec = spec;
    StepProfile profile;
    try {
      execute(four, call, &profile);
    } catch (const std::invalid_argument&) {
      profile.kernels.clear();  // no all-reduce for this codec
    }
    for (const auto& [codec_name, kernels] : profile.kernels)
      for (const auto& [kernel, entry] : kernels)
        if (entry.units > 0) cost[kernel] = entry.seconds / entry.units;
    if (log) {
      *log << "  codec " << spec << ":";
      for (const auto& [step, seconds] : cost) *log << " " << step << " " << seconds * 1e9;
      *log << " ns per unit\n";
    }
  }
}

}  // namespace qccl::sim
