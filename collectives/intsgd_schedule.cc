#include "collectives/intsgd_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/convert.h"
#include "kernels/int_codec.h"

namespace qccl::coll {

IntsgdRound intsgd_round(const kernels::CodecConfig& codec, const IntsgdMemory* memory, double lr, size_t count,
                               int nranks) {
  IntsgdRound round;
  double alpha = codec.alpha;
  if (codec.alpha_mode != kernels::IntAlpha::kFixed) {
    if (!memory || !memory->has_r) {
      round.exact = codec.alpha0 <= 0;
      alpha = codec.alpha0;
    } else {
      const double eta = codec.alpha_mode == kernels::IntAlpha::kLr ? lr : 1.0;
      alpha = kernels::intsgd_alpha(static_cast<double>(count), nranks, memory->r, eta, codec.eps);
    }
  }
  // A normal float32: at 0 (a scale that underflowed) every output would be 0/0.
  constexpr double kMin = std::numeric_limits<float>::min(), kMax = std::numeric_limits<float>::max();
  if (!round.exact) round.alpha = static_cast<float>(alpha > kMin ? std::min(alpha, kMax) : kMin);
  return round;
}

void intsgd_observe(const kernels::CodecConfig& codec, IntsgdMemory* memory, double lr, double mean_squares) {
  if (codec.alpha_mode == kernels::IntAlpha::kFixed || !memory) return;
  const double v = codec.alpha_mode == kernels::IntAlpha::kLr ? lr * lr * mean_squares : mean_squares;
  memory->r = kernels::intsgd_moving_average(memory->has_r ? memory->r : 0.0, v, codec.beta);
  memory->has_r = true;
}

double intsgd_integer_norm(double sum_of_squares, float alpha, int nranks) {
  const double scale = 1.0 / (static_cast<double>(nranks) * static_cast<double>(alpha));
  return sum_of_squares * scale * scale;
}

double intsgd_exact_norm(const void* out, size_t count, kernels::DataType dtype, kernels::RedOp op, int nranks,
                         size_t* nonfinite) {
  const double divide = op == kernels::RedOp::kAvg ? 1.0 : static_cast<double>(nranks);
  const size_t es = kernels::element_size(dtype);
  float tile[1024];
  double sum = 0;
  for (size_t i = 0; i < count; i += 1024) {
    const size_t n = std::min<size_t>(1024, count - i);
    kernels::load_float(dtype, static_cast<const char*>(out) + i * es, tile, n);
    for (size_t j = 0; j < n; ++j) {
      if (!std::isfinite(tile[j])) ++*nonfinite;
      const double g = tile[j] / divide;
      sum += g * g;
    }
  }
  return sum;
}

}  // namespace qccl::coll
