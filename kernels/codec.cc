// Codec spec parsing and the host launchers: loops over the element functions of quant.h and half.h.
#include "kernels/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/half.h"
#include "kernels/quant.h"

namespace qccl::kernels {

// ---- Spec ------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw CodecSpecError("codec spec '" + spec + "': " + why);
}

uint64_t parse_number(const std::string& spec, const std::string& key, const std::string& value, uint64_t lo,
                      uint64_t hi) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
    bad(spec, key + "=" + value + ": '" + value + "' is not a non-negative integer");
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), nullptr, 10);
  if (errno || v < lo || v > hi)
    bad(spec, key + "=" + value + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

}  // namespace

CodecConfig parse_codec_spec(const std::string& spec) {
  CodecConfig c;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  if (name == "none") {
    c.kind = CodecKind::kNone, c.bits = 32;
  } else if (name == "fp16") {
    c.kind = CodecKind::kFp16, c.bits = 16;
  } else if (name == "bf16") {
    c.kind = CodecKind::kBf16, c.bits = 16;
  } else if (name.size() == 2 && name[0] == 'q' && name[1] >= '1' && name[1] <= '8') {
    c.kind = CodecKind::kQuant, c.bits = name[1] - '0';
  } else {
    bad(spec, "unknown codec '" + name + "' (none, fp16, bf16, q1 .. q8)");
  }
  if (colon == std::string::npos) return c;
  std::string rest = spec.substr(colon + 1);
  if (rest.empty()) bad(spec, "nothing after ':'");
  size_t at = 0;
  while (at <= rest.size()) {
    const size_t comma = rest.find(',', at);
    const std::string token = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    const size_t eq = token.find('=');
    if (token.empty() || eq == std::string::npos || eq == 0)
      bad(spec, "'" + token + "' is not key=value");
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    if (key == "bucket") {
      if (c.kind != CodecKind::kQuant) bad(spec, "'" + token + "': only q1 .. q8 have buckets");
      c.bucket = static_cast<uint32_t>(parse_number(spec, key, value, 8, 1u << 20));
      if (c.bucket % 8) bad(spec, "'" + token + "': the bucket must be a multiple of 8");
    } else if (key == "round") {
      if (c.kind != CodecKind::kQuant) bad(spec, "'" + token + "': only q1 .. q8 round");
      if (value == "nearest") c.rounding = Rounding::kNearest;
      else if (value == "stochastic") c.rounding = Rounding::kStochastic;
      else bad(spec, "'" + token + "': round is nearest or stochastic");
    } else if (key == "ef") {
      if (value == "on") c.error_feedback = true;
      else if (value == "off") c.error_feedback = false;
      else bad(spec, "'" + token + "': ef is on or off");
    } else if (key == "seed") {
      c.seed = parse_number(spec, key, value, 0, std::numeric_limits<uint64_t>::max());
    } else {
      bad(spec, "unknown key '" + key + "' (bucket, round, ef, seed)");
    }
  }
  return c;
}

std::string CodecConfig::canonical() const {
  switch (kind) {
    case CodecKind::kNone: return std::string("none") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kFp16: return std::string("fp16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kBf16: return std::string("bf16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kQuant: break;
  }
  return "q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket) +
         ",round=" + (rounding == Rounding::kStochastic ? "stochastic" : "nearest") +
         ",ef=" + (error_feedback ? "on" : "off") + ",seed=" + std::to_string(seed);
}

uint64_t CodecConfig::hash() const {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : canonical()) h = (h ^ ch) * 1099511628211ull;
  return h ? h : 1;
}

size_t CodecConfig::encoded_bytes(size_t count) const {
  switch (kind) {
    case CodecKind::kNone: return count * 4;
    case CodecKind::kFp16:
    case CodecKind::kBf16: return count * 2;
    case CodecKind::kQuant: return quant_encoded_bytes(count, bucket, bits);
  }
  return 0;
}

// ---- Host launchers ----------------------------------------------------------------------------------

namespace {

EncodeReport encode_quant(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                          uint64_t first) {
  EncodeReport report;
  auto* metas = static_cast<BucketMeta*>(out);
  auto* codes = static_cast<uint8_t*>(out) + quant_meta_bytes(count, c.bucket);
  const uint32_t levels = quant_levels(c.bits);
  const bool stochastic = c.rounding == Rounding::kStochastic;
  for (size_t b0 = 0, k = 0; b0 < count; b0 += c.bucket, ++k) {
    const size_t len = std::min<size_t>(c.bucket, count - b0);
    const float* x = in + b0;
    float lo = x[0], hi = x[0];
    bool finite = true;
    for (size_t i = 0; i < len; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
      finite &= std::isfinite(x[i]);
    }
    const BucketMeta m = bucket_meta(lo, hi, finite, c.bits);
    metas[k] = m;
    report.nonfinite += finite ? 0 : 1;
    uint8_t* dst = codes + b0 / 8 * c.bits;
    for (size_t g = 0; g < len; g += 8) {
      uint32_t group[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const uint64_t e0 = first + b0 + g;  // global index of the group's first value
      for (size_t i = 0; i < 8 && g + i < len; ++i) {
        const float u = stochastic ? philox_uniform(key, e0 + i) : 0.5f;
        group[i] = quantize(x[g + i], m, u, levels);
      }
      pack8(group, c.bits, dst + g / 8 * c.bits);
    }
  }
  return report;
}

template <bool kAccumulate>
size_t decode_quant(const CodecConfig& c, const void* in, size_t count, float* out) {
  const auto* metas = static_cast<const BucketMeta*>(in);
  const auto* codes = static_cast<const uint8_t*>(in) + quant_meta_bytes(count, c.bucket);
  size_t nonfinite = 0;
  for (size_t b0 = 0, k = 0; b0 < count; b0 += c.bucket, ++k) {
    const size_t len = std::min<size_t>(c.bucket, count - b0);
    const BucketMeta m = metas[k];
    if (meta_is_nonfinite(m)) nonfinite += len;
    const uint8_t* src = codes + b0 / 8 * c.bits;
    float* y = out + b0;
    for (size_t g = 0; g < len; g += 8) {
      uint32_t group[8];
      unpack8(src + g / 8 * c.bits, c.bits, group);
      for (size_t i = 0; i < 8 && g + i < len; ++i) {
        const float v = dequantize(group[i], m);
        if (kAccumulate) y[g + i] += v;
        else y[g + i] = v;
      }
    }
  }
  return nonfinite;
}

template <bool kAccumulate, class Load>
size_t decode_cast(const void* in, size_t count, float* out, Load load) {
  size_t nonfinite = 0;
  for (size_t i = 0; i < count; ++i) {
    const float v = load(in, i);
    nonfinite += std::isfinite(v) ? 0 : 1;
    out[i] = kAccumulate ? out[i] + v : v;
  }
  return nonfinite;
}

template <bool kAccumulate>
size_t decode_any(const CodecConfig& c, const void* in, size_t count, float* out) {
  switch (c.kind) {
    case CodecKind::kNone:
      return decode_cast<kAccumulate>(in, count, out, [](const void* p, size_t i) { return static_cast<const float*>(p)[i]; });
    case CodecKind::kFp16:
      return decode_cast<kAccumulate>(in, count, out,
                                      [](const void* p, size_t i) { return half_to_float(static_cast<const uint16_t*>(p)[i]); });
    case CodecKind::kBf16:
      return decode_cast<kAccumulate>(in, count, out,
                                      [](const void* p, size_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); });
    case CodecKind::kQuant: return decode_quant<kAccumulate>(c, in, count, out);
  }
  return 0;
}

}  // namespace

EncodeReport encode(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                    uint64_t first) {
  if (c.kind == CodecKind::kQuant) return encode_quant(c, in, count, out, key, first);
  // The casts carry NaN and Inf as themselves; the report counts non-finite results, which include
  // finite values beyond the format's range (fp16 overflows above 65504).
  EncodeReport report;
  if (c.kind == CodecKind::kNone) {
    std::memcpy(out, in, count * sizeof(float));
    for (size_t i = 0; i < count; ++i) report.nonfinite += std::isfinite(in[i]) ? 0 : 1;
    return report;
  }
  auto* y = static_cast<uint16_t*>(out);
  const bool half = c.kind == CodecKind::kFp16;
  for (size_t i = 0; i < count; ++i) {
    y[i] = half ? float_to_half(in[i]) : float_to_bf16(in[i]);
    report.nonfinite += std::isfinite(half ? half_to_float(y[i]) : bf16_to_float(y[i])) ? 0 : 1;
  }
  return report;
}

size_t decode(const CodecConfig& c, const void* in, size_t count, float* out) {
  return decode_any<false>(c, in, count, out);
}

size_t decode_accumulate(const CodecConfig& c, const void* in, size_t count, float* acc) {
  return decode_any<true>(c, in, count, acc);
}

}  // namespace qccl::kernels
