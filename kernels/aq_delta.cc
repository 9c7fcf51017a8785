// AQ-SGD's delta messages (aq_delta.h), composed from the codec's and the conversions' launchers, so
// that they inherit those launchers' bits (and the CUDA launchers', which give the same ones).
#include "kernels/aq_delta.h"

#include <vector>

#include "kernels/convert.h"

namespace qccl::kernels {

namespace {
// A thread's scratch: float(m) (then float(m) + the decoded delta) and x - float(m).
thread_local std::vector<float> tl_last, tl_delta;
}  // namespace

size_t aq_delta_send(const CodecConfig& c, const float* x, size_t n, DataType t, void* m, void* out,
                     const PhiloxKey& key, uint64_t first) {
  if (n == 0) return 0;
  tl_last.resize(n), tl_delta.resize(n);
  float* last = tl_last.data();
  float* delta = tl_delta.data();
  load_float(t, m, last, n);
  for (size_t i = 0; i < n; ++i) delta[i] = x[i] - last[i];
  const size_t bad = encode(c, delta, n, out, key, first).nonfinite;
  if (bad) return bad;
  decode_accumulate(c, out, n, last);  // what the receiver will compute, bit for bit
  store_float(t, last, m, n);
  return 0;
}

size_t aq_delta_receive(const CodecConfig& c, const void* in, size_t n, DataType t, void* m, float* x_out) {
  if (n == 0) return 0;
  load_float(t, m, x_out, n);
  const size_t bad = decode_accumulate(c, in, n, x_out);
  if (bad == 0) store_float(t, x_out, m, n);
  return bad;
}

}  // namespace qccl::kernels
