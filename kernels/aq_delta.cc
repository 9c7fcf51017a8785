// AQ-SGD's delta messages (aq_delta.h) over one contiguous run: a run of one row, through the fused
// launchers of kernels/aq_codec.cc.
#include "kernels/aq_delta.h"

#include "kernels/convert.h"

namespace qccl::kernels {

size_t aq_delta_send(const CodecConfig& c, const float* x, size_t n, DataType t, void* m, void* out,
                     const PhiloxKey& key, uint64_t first) {
  if (n == 0) return 0;
  const void* m_in = m;
  const AqDeltaRows rows{1, n, t, &m_in, &m};
  return aq_delta_send_rows(c, &x, rows, out, key, first);
}

size_t aq_delta_receive(const CodecConfig& c, const void* in, size_t n, DataType t, void* m, float* x_out) {
  if (n == 0) return 0;
  const void* m_in = m;
  const AqDeltaRows rows{1, n, t, &m_in, &m};
  const size_t bad = aq_delta_receive_rows(c, in, rows, &x_out);
  if (bad) {  // x_out as documented, NaN where the channels are (the rows launcher writes nothing)
    load_float(t, m, x_out, n);
    decode_accumulate(c, in, n, x_out);
  }
  return bad;
}

}  // namespace qccl::kernels
