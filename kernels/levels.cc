// The learned levels' positions (levels.h) and their fitting (QSDP Algorithm 2); the codec's host
// loops are the q codec's vector loops (codec.cc, codec-inl.h's QuantizeTileLevels).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/codec.h"
#include "kernels/levels.h"

namespace qccl::kernels {

namespace {

// Minimum and maximum of a bucket, -0 below +0 (as quant.h's scans), and whether all are finite.
void scan(const float* x, size_t n, float* lo, float* hi, bool* finite) {
  *lo = INFINITY, *hi = -INFINITY, *finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!finite_float(v)) {
      *finite = false;
      continue;
    }
    if (v < *lo || (v == *lo && std::signbit(v))) *lo = v;
    if (v > *hi || (v == *hi && !std::signbit(v))) *hi = v;
  }
  if (n == 0 || !*finite) *lo = *hi = 0.0f;
}

}  // namespace

LevelPositions level_positions(const CodecConfig& c) {
  const float top = static_cast<float>(quant_levels(c.bits));
  LevelPositions p{};  // the table past count zero: the host loops load a whole vector of it
  p.count = static_cast<uint32_t>(c.levels.size());
  for (uint32_t k = 0; k < p.count; ++k) p.g[k] = c.levels[k] * top;
  p.g[p.count - 1] = top;  // exactly L, whatever l * L rounds to
  return p;
}

std::vector<float> learn_levels(const float* data, size_t count, int bits, uint32_t bucket, double rate, int epochs) {
  const size_t k = size_t{1} << bits;
  std::vector<double> q(k);
  for (size_t j = 0; j < k; ++j) q[j] = static_cast<double>(j) / static_cast<double>(k - 1);  // uniform start
  std::vector<double> z;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (size_t begin = 0; begin < count; begin += bucket) {
      const size_t n = std::min<size_t>(bucket, count - begin);
      float lo, hi;
      bool finite;
      scan(data + begin, n, &lo, &hi, &finite);
      if (!finite || !(hi > lo)) continue;  // nothing to learn from a constant or non-finite bucket
      // Algorithm 2, lines 5-6, on the bucket's values normalized to [0, 1]: the nearest level moves
      // a step `rate` towards the value (online k-means). The end levels stay at 0 and 1, where every
      // bucket's minimum and maximum land: moved during a pass (the spec pins them after each epoch
      // only), they drew the inner levels' values to themselves, and the inner levels, trained against
      // ends that were not there, came out too far inward once the ends were put back (13% worse than
      // even spacing on uniform data, 1.85x on Student-t buckets at 4 bits).
      for (size_t i = 0; i < n; ++i) {
        const double v = (static_cast<double>(data[begin + i]) - lo) / (static_cast<double>(hi) - lo);
        const size_t up = static_cast<size_t>(std::lower_bound(q.begin(), q.end(), v) - q.begin());
        size_t nearest = up;
        if (up == k || (up > 0 && v - q[up - 1] <= q[up] - v)) nearest = up - 1;
        if (nearest > 0 && nearest + 1 < k) q[nearest] -= rate * (q[nearest] - v);
      }
      // Keep the levels sorted as they move, so that the search stays valid.
      std::sort(q.begin(), q.end());
    }
  }
  // Strictly increasing in float32 with the endpoints exact: levels that met are pushed apart by the
  // smallest step that float32 can tell.
  std::vector<float> levels(k);
  for (size_t j = 0; j < k; ++j) levels[j] = static_cast<float>(std::clamp(q[j], 0.0, 1.0));
  levels.front() = 0.0f, levels.back() = 1.0f;
  for (size_t j = 1; j + 1 < k; ++j)
    if (!(levels[j] > levels[j - 1])) levels[j] = std::nextafter(levels[j - 1], 2.0f);
  for (size_t j = k - 1; j-- > 1;)
    if (!(levels[j] < levels[j + 1])) levels[j] = std::nextafter(levels[j + 1], -1.0f);
  return levels;
}

}  // namespace qccl::kernels
