// Host loops of AQ-SGD's quantizer (aq_quant.h), over its element functions: the same bits as the
// CUDA launchers (codec_cuda.cu). Built without FMA contraction (kernels/CMakeLists.txt), although
// nothing here has an a * b + c to contract: x / d * 2^F and the exact dequantization.
//
// Per block: one pass for the channels' largest magnitudes (row by row, so the loads run along
// memory and the compiler vectorizes the channel loop), then one pass that quantizes and packs
// groups of 8 values into `bits` bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/aq_codec.h"
#include "kernels/aq_quant.h"
#include "kernels/half.h"
#include "kernels/philox.h"
#include "kernels/quant.h"

namespace qccl::kernels {

namespace {

// The channels' largest magnitudes over a block's n values (NaN sticks: a > NaN is false, and a
// NaN a replaces anything).
void channel_maxima(const float* x, size_t n, uint32_t channels, float* m) {
  const size_t h = std::min<size_t>(n, channels);
  std::fill(m, m + h, 0.0f);
  for (size_t row = 0; row < n; row += channels) {
    const size_t w = std::min<size_t>(channels, n - row);
    const float* r = x + row;
    for (size_t c = 0; c < w; ++c) {
      const float a = std::fabs(r[c]);
      m[c] = (a > m[c] || a != a) ? a : m[c];
    }
  }
}

// Packs `count` (<= 8) codes at out, writing ceil(count * bits / 8) bytes (a whole group: bits).
void pack_group(const uint32_t codes[8], size_t count, int bits, uint8_t* out) {
  if (count == 8) return pack8(codes, bits, out);
  uint8_t whole[8];
  uint32_t padded[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::copy(codes, codes + count, padded);
  pack8(padded, bits, whole);
  std::memcpy(out, whole, aq_code_bytes(count, bits));
}

void unpack_group(const uint8_t* in, size_t count, int bits, uint32_t codes[8]) {
  if (count == 8) return unpack8(in, bits, codes);
  uint8_t whole[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(whole, in, aq_code_bytes(count, bits));
  unpack8(whole, bits, codes);
}

// One block of n values (value 0 is index `first` of the whole run): scales, then codes. Returns the
// channels sent as NaN.
size_t encode_block(const CodecConfig& c, const float* x, size_t n, uint8_t* out, const PhiloxKey& key,
                    uint64_t first, std::vector<float>& scratch) {
  const size_t h = aq_block_scales(n, c.channels);
  scratch.resize(2 * h);
  float* m = scratch.data();
  float* d = scratch.data() + h;
  channel_maxima(x, n, c.channels, m);
  size_t bad = 0;
  for (size_t ch = 0; ch < h; ++ch) {
    const uint16_t s = aq_scale_bits(m[ch]);
    std::memcpy(out + 2 * ch, &s, 2);
    bad += aq_scale_is_nan(s);
    d[ch] = aq_divisor(half_to_float(s));
  }
  uint8_t* codes_out = out + 2 * h;
  const bool stochastic = c.rounding == Rounding::kStochastic;
  uint32_t codes[8];
  size_t ch = 0;
  for (size_t j = 0; j < n; j += 8) {
    const size_t g = std::min<size_t>(8, n - j);
    for (size_t i = 0; i < g; ++i) {
      const float u = stochastic ? philox_uniform(key, first + j + i) : 0.0f;
      codes[i] = aq_quantize(x[j + i], d[ch], u, stochastic, c.bits);
      if (++ch == c.channels) ch = 0;
    }
    pack_group(codes, g, c.bits, codes_out + j / 8 * static_cast<size_t>(c.bits));
  }
  return bad;
}

template <bool kAccumulate>
size_t decode_block(const CodecConfig& c, const uint8_t* in, size_t n, float* out, std::vector<float>& scratch) {
  const size_t h = aq_block_scales(n, c.channels);
  scratch.resize(h);
  float* s = scratch.data();
  size_t bad_values = 0;
  for (size_t ch = 0; ch < h; ++ch) {
    uint16_t bits;
    std::memcpy(&bits, in + 2 * ch, 2);
    s[ch] = half_to_float(bits);
    // a NaN channel's values: one per row of the block, plus the partial last row's if it has ch
    if (aq_scale_is_nan(bits)) bad_values += n / c.channels + (ch < n % c.channels ? 1 : 0);
  }
  const uint8_t* codes_in = in + 2 * h;
  uint32_t codes[8];
  size_t ch = 0;
  for (size_t j = 0; j < n; j += 8) {
    const size_t g = std::min<size_t>(8, n - j);
    unpack_group(codes_in + j / 8 * static_cast<size_t>(c.bits), g, c.bits, codes);
    for (size_t i = 0; i < g; ++i) {
      const float v = aq_dequantize(codes[i], s[ch], c.bits);
      if (kAccumulate)
        out[j + i] += v;
      else
        out[j + i] = v;
      if (++ch == c.channels) ch = 0;
    }
  }
  return bad_values;
}

template <bool kAccumulate>
size_t decode_run(const CodecConfig& c, const void* in, size_t count, float* out) {
  const auto* bytes = static_cast<const uint8_t*>(in);
  const size_t block = aq_block_values(c.rows, c.channels, count);
  std::vector<float> scratch;
  size_t bad = 0;
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b);
    bad += decode_block<kAccumulate>(c, bytes, n, out + b, scratch);
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return bad;
}

}  // namespace

size_t aq_encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                 uint64_t first) {
  auto* bytes = static_cast<uint8_t*>(out);
  const size_t block = aq_block_values(c.rows, c.channels, count);
  std::vector<float> scratch;
  size_t bad = 0;
  for (size_t b = 0; b < count; b += block) {
    const size_t n = std::min(block, count - b);
    bad += encode_block(c, in + b, n, bytes, key, first + b, scratch);
    bytes += aq_block_bytes(n, c.channels, c.bits);
  }
  return bad;
}

size_t aq_decode(const CodecConfig& c, const void* in, size_t count, float* out, bool accumulate) {
  return accumulate ? decode_run<true>(c, in, count, out) : decode_run<false>(c, in, count, out);
}

}  // namespace qccl::kernels
