// The codec spec grammar (codec.h) and what follows from a spec alone: canonical text, hash, sizes.
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "kernels/aq_quant.h"
#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "kernels/quant.h"
#include "kernels/rfloat.h"
#include "kernels/sign.h"

namespace qccl::kernels {

namespace {

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw CodecSpecError("codec spec '" + spec + "': " + why);
}

double parse_real(const std::string& spec, const std::string& key, const std::string& value, bool zero = false) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end || errno || !std::isfinite(v) || !(v > 0 || (zero && v == 0)))
    bad(spec, key + "=" + value + ": '" + value + "' is not a " + (zero ? "non-negative" : "positive") + " number");
  return v;
}

// IntSGD's scales multiply and divide every value: one that is 0 or subnormal in float32 (1e-46
// is 0 there) would make every output NaN or Inf.
void require_normal_float(const std::string& spec, const std::string& token, const char* key, double v) {
  const float f = static_cast<float>(v);
  if (!(f >= std::numeric_limits<float>::min() && f <= std::numeric_limits<float>::max()))
    bad(spec, "'" + token + "': " + key + " must be a positive normal float32 (1.2e-38 .. 3.4e38)");
}

// levels=l0/l1/.../lK (levels.h): 2^bits numbers, strictly increasing, from exactly 0 to exactly 1.
std::vector<float> parse_levels(const std::string& spec, const std::string& value, int bits) {
  std::vector<float> levels;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t slash = value.find('/', at);
    const std::string item = value.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
    at = slash == std::string::npos ? value.size() + 1 : slash + 1;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end || errno || !(v >= 0.0 && v <= 1.0))
      bad(spec, "levels: '" + item + "' is not a number in [0, 1]");
    levels.push_back(static_cast<float>(v));
  }
  const size_t want = size_t{1} << bits;
  if (levels.size() != want)
    bad(spec, "levels: " + std::to_string(levels.size()) + " levels given, q" + std::to_string(bits) + " has " +
                  std::to_string(want));
  if (levels.front() != 0.0f || levels.back() != 1.0f)
    bad(spec, "levels: the first level must be 0 and the last 1 (the bucket's minimum and maximum)");
  for (size_t k = 1; k < levels.size(); ++k)
    if (!(levels[k] > levels[k - 1])) bad(spec, "levels: level " + std::to_string(k) + " is not above level " + std::to_string(k - 1));
  return levels;
}

// The shortest text that reads back as the float32 v.
std::string float_text(float v) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(text, nullptr) == v) break;
  }
  return text;
}

// 1 - theta, for theta's shortest decimal text ("0.9", "1e-05"), as an exact fraction num / 10^k. A
// theta too small for 10^k to fit 18 digits keeps every bin whatever its digits (theta B < 1e-9
// B < 1): it is taken as 0.
void decimal_keep_fraction(const std::string& text, uint64_t* num, uint64_t* den) {
  uint64_t digits = 0;
  int scale = 0;  // text = digits / 10^scale
  size_t i = 0;
  bool point = false;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      point = true;
      continue;
    }
    digits = digits * 10 + static_cast<uint64_t>(text[i] - '0');
    if (point) ++scale;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) scale -= std::atoi(text.c_str() + i + 1);
  while (scale < 0) digits *= 10, ++scale;  // theta < 1: never more than a few digits
  if (scale > 18) {
    *num = *den = 1;
    return;
  }
  uint64_t power = 1;
  for (int k = 0; k < scale; ++k) power *= 10;
  *num = power - digits;
  *den = power;
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

// The kind and width a codec's name gives; false for no codec's name.
bool codec_of_name(const std::string& name, CodecConfig* c) {
  if (name == "none") {
    c->kind = CodecKind::kNone, c->bits = 32;
  } else if (name == "fp16") {
    c->kind = CodecKind::kFp16, c->bits = 16;
  } else if (name == "bf16") {
    c->kind = CodecKind::kBf16, c->bits = 16;
  } else if (name.size() == 2 && name[0] == 'q' && name[1] >= '1' && name[1] <= '8') {
    c->kind = CodecKind::kQuant, c->bits = name[1] - '0';
  } else if (name == "sign") {
    c->kind = CodecKind::kSign, c->bits = 1;
  } else if (name == "int8" || name == "int16" || name == "int32") {
    c->kind = CodecKind::kInt, c->bits = std::atoi(name.c_str() + 3);
    c->rounding = Rounding::kStochastic;  // the paper's Int(): unbiased, what its theory covers
  } else if (name == "fft") {
    c->kind = CodecKind::kFft, c->bits = 10;
    c->rounding = Rounding::kTruncate;  // the paper's Algorithm 1
  } else if (name.size() == 3 && name[0] == 'a' && name[1] == 'q' && name[2] >= '2' && name[2] <= '8') {
    c->kind = CodecKind::kAq, c->bits = name[2] - '0';
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool is_codec_name(const std::string& name) {
  CodecConfig c;
  return codec_of_name(name, &c);
}

CodecConfig parse_codec_spec(const std::string& spec) {
  CodecConfig c;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  if (name == "aq1")
    bad(spec, "aq1: one bit has the levels {-s, 0} only, which never correct a positive delta (use aq2 .. aq8)");
  if (!codec_of_name(name, &c))
    bad(spec, "unknown codec '" + name + "' (none, fp16, bf16, q1 .. q8, sign, int8, int16, int32, fft, aq2 .. aq8)");
  if (colon == std::string::npos) {
    if (c.kind == CodecKind::kSign) bad(spec, "sign needs eta_s=E, the magnitude of a sign round's update");
    return c;
  }
  std::string rest = spec.substr(colon + 1);
  if (rest.empty()) bad(spec, "nothing after ':'");
  size_t at = 0;
  std::set<std::string> keys;  // each key once: a second would silently win
  std::string max_token;       // fft's max as written, for the range check's message
  while (at <= rest.size()) {
    const size_t comma = rest.find(',', at);
    const std::string token = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    const size_t eq = token.find('=');
    if (token.empty() || eq == std::string::npos || eq == 0) bad(spec, "'" + token + "' is not key=value");
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    if (!keys.insert(key).second) bad(spec, "'" + token + "': key '" + key + "' is given twice");
    if (key == "bucket") {
      if (c.kind != CodecKind::kQuant) bad(spec, "'" + token + "': only q1 .. q8 have buckets");
      c.bucket = static_cast<uint32_t>(parse_number(spec, key, value, 8, 1u << 20));
      if (c.bucket % 8) bad(spec, "'" + token + "': the bucket must be a multiple of 8");
    } else if (c.kind == CodecKind::kFft && key == "round") {
      if (value == "trunc")
        c.rounding = Rounding::kTruncate;
      else if (value == "nearest")
        c.rounding = Rounding::kNearest;
      else
        bad(spec, "'" + token + "': fft's round is trunc or nearest");
    } else if (key == "round") {
      if (c.kind != CodecKind::kQuant && c.kind != CodecKind::kInt && c.kind != CodecKind::kAq)
        bad(spec, "'" + token + "': only q1 .. q8, int8 .. int32, fft and aq2 .. aq8 round");
      if (value == "nearest")
        c.rounding = Rounding::kNearest;
      else if (value == "stochastic")
        c.rounding = Rounding::kStochastic;
      else if (value == "shift" && c.kind == CodecKind::kQuant)
        c.rounding = Rounding::kShift;
      else
        bad(spec, "'" + token + "': round is nearest, stochastic" + (c.kind == CodecKind::kQuant ? " or shift" : ""));
    } else if (c.kind == CodecKind::kSign && key == "eta_s") {
      c.eta = static_cast<float>(parse_real(spec, key, value));
      if (!(c.eta > 0) || !std::isfinite(c.eta)) bad(spec, "'" + token + "': eta_s must be a positive float32");
    } else if (c.kind == CodecKind::kSign && key == "k") {
      c.period = static_cast<uint32_t>(parse_number(spec, key, value, 0, std::numeric_limits<uint32_t>::max()));
    } else if (c.kind == CodecKind::kSign && key == "topology") {
      int rows = 0, cols = 0;
      char extra = 0;
      if (value == "ring") {
        c.torus_rows = c.torus_cols = 0;
      } else if (std::sscanf(value.c_str(), "torus:%dx%d%c", &rows, &cols, &extra) == 2 && rows >= 1 && cols >= 1 &&
                 rows <= kMaxTorusSide && cols <= kMaxTorusSide) {
        c.torus_rows = rows, c.torus_cols = cols;
      } else {
        bad(spec, "'" + token + "': topology is ring or torus:RxC with 1 <= R, C <= " +
                      std::to_string(kMaxTorusSide) + " (e.g. torus:2x4)");
      }
    } else if (c.kind == CodecKind::kInt && key == "alpha") {
      if (value == "grad") {
        c.alpha_mode = IntAlpha::kGrad;
      } else if (value == "lr") {
        c.alpha_mode = IntAlpha::kLr;
      } else {
        c.alpha_mode = IntAlpha::kFixed;
        c.alpha = parse_real(spec, key, value);
        require_normal_float(spec, token, "alpha", c.alpha);
      }
    } else if (c.kind == CodecKind::kInt && key == "alpha0") {
      c.alpha0 = parse_real(spec, key, value);
      require_normal_float(spec, token, "alpha0", c.alpha0);
    } else if (c.kind == CodecKind::kInt && key == "beta") {
      c.beta = parse_real(spec, key, value, /*zero=*/true);
      if (!(c.beta < 1)) bad(spec, "'" + token + "': beta is in [0, 1)");
    } else if (c.kind == CodecKind::kInt && key == "eps") {
      c.eps = parse_real(spec, key, value);
      if (!std::isfinite(c.eps * c.eps))  // alpha's denominator holds eps^2: infinite, alpha would be 0
        bad(spec, "'" + token + "': eps must be at most 1e150 (its square must be a finite double)");
    } else if (c.kind == CodecKind::kInt && key == "agg") {
      if (value == "ring")
        c.switch_aggregation = false;
      else if (value == "switch")
        c.switch_aggregation = true;
      else
        bad(spec, "'" + token + "': agg is ring or switch");
    } else if (c.kind == CodecKind::kAq && key == "channels") {
      c.channels = static_cast<uint32_t>(parse_number(spec, key, value, 1, 1u << 24));
    } else if (c.kind == CodecKind::kAq && key == "rows") {
      c.rows = static_cast<uint32_t>(parse_number(spec, key, value, 0, 1u << 24));
    } else if (key == "ef") {
      if (c.kind == CodecKind::kAq)
        bad(spec, "'" + token + "': aq codecs keep no residual (AQ-SGD corrects through its keyed deltas, no ef)");
      if (c.kind == CodecKind::kInt) bad(spec, "'" + token + "': IntSGD needs no error feedback (no ef)");
      if (c.kind == CodecKind::kSign) bad(spec, "'" + token + "': sign keeps its own compensation (no ef)");
      if (value == "on")
        c.error_feedback = true;
      else if (value == "off")
        c.error_feedback = false;
      else
        bad(spec, "'" + token + "': ef is on or off");
    } else if (c.kind == CodecKind::kFft && key == "theta") {
      errno = 0;
      char* end = nullptr;
      const double theta = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || errno || !(theta >= 0 && theta < 1))
        bad(spec, "'" + token + "': theta, the fraction of bins dropped, is a number in [0, 1)");
      c.theta = static_cast<float>(theta) + 0.0f;  // -0 is 0: one canonical text and hash (-0 + 0 is +0)
      if (!(c.theta < 1.0f)) bad(spec, "'" + token + "': theta rounds to 1 in float32");
      decimal_keep_fraction(float_text(c.theta), &c.keep_numerator, &c.keep_denominator);
    } else if (c.kind == CodecKind::kFft && key == "bits") {
      c.bits = static_cast<int>(parse_number(spec, key, value, 3, 16));
    } else if (c.kind == CodecKind::kFft && key == "mant") {
      c.mant = static_cast<int>(parse_number(spec, key, value, 1, 15));
    } else if (c.kind == CodecKind::kFft && key == "max") {
      c.range_auto = value == "auto";
      c.range_max = c.range_auto ? 1.0f : static_cast<float>(parse_real(spec, key, value));
      if (!c.range_auto) max_token = value;
    } else if (c.kind == CodecKind::kFft && key == "segment") {
      c.segment = static_cast<uint32_t>(parse_number(spec, key, value, 2, 1u << 26));
    } else if (c.kind == CodecKind::kFft && key == "index") {
      if (value == "auto")
        c.index = FftIndex::kAuto;
      else if (value == "bitmap")
        c.index = FftIndex::kBitmap;
      else if (value == "coo")
        c.index = FftIndex::kCoo;
      else
        bad(spec, "'" + token + "': index is auto, bitmap or coo");
    } else if (c.kind == CodecKind::kFft && key == "fallback") {
      if (value == "auto")
        c.fallback = true;
      else if (value == "off")
        c.fallback = false;
      else
        bad(spec, "'" + token + "': fallback is auto or off");
    } else if (key == "seed" && c.kind != CodecKind::kFft) {
      c.seed = parse_number(spec, key, value, 0, std::numeric_limits<uint64_t>::max());
    } else if (c.kind == CodecKind::kQuant && key == "levels") {
      c.levels = parse_levels(spec, value, c.bits);
    } else {
      bad(spec, "unknown key '" + key + "' (" +
                    (c.kind == CodecKind::kSign  ? "eta_s, k, topology, seed"
                     : c.kind == CodecKind::kInt ? "round, alpha, alpha0, beta, eps, agg, seed"
                     : c.kind == CodecKind::kFft ? "theta, bits, mant, max, segment, index, round, ef, fallback"
                     : c.kind == CodecKind::kAq  ? "channels, rows, round, seed"
                                                 : "bucket, round, ef, seed, levels") +
                    ")");
    }
  }
  if (c.kind == CodecKind::kFft) {  // whether its range float exists
    if (const char* why = range_float_invalid(c.bits, c.mant, c.range_max))
      bad(spec, "bits=" + std::to_string(c.bits) + ", mant=" + std::to_string(c.mant) + ", max=" +
                    (max_token.empty() ? float_text(c.range_max) : max_token) + ": " + why);
  }
  if (c.kind == CodecKind::kSign && !(c.eta > 0)) bad(spec, "sign needs eta_s=E, the magnitude of a sign round's update");
  // Error feedback needs a compressor whose error shrinks its input; one bit between a bucket's min and
  // max does not (the residual widens the range, which widens the error): measured, 4 ranks, the
  // summed error reached 1e23 in 100 steps with round=stochastic, and grew steadily with nearest.
  if (c.kind == CodecKind::kQuant && c.bits == 1 && c.error_feedback)
    bad(spec, "q1 with ef=on: one bit of min-max quantization is not contractive, so error feedback "
              "diverges (use q2 or more, or the sign codec)");
  return c;
}

std::string CodecConfig::canonical() const {
  switch (kind) {
    case CodecKind::kNone:
      return std::string("none") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kFp16:
      return std::string("fp16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kBf16:
      return std::string("bf16") + (error_feedback ? ":ef=on" : "");
    case CodecKind::kQuant:
      break;
    case CodecKind::kInt: {
      auto real = [](double v) {  // the shortest text that reads back as v
        char text[32];
        for (int digits = 6; digits <= 17; ++digits) {
          std::snprintf(text, sizeof(text), "%.*g", digits, v);
          if (std::strtod(text, nullptr) == v) break;
        }
        return std::string(text);
      };
      return "int" + std::to_string(bits) + ":round=" + (rounding == Rounding::kStochastic ? "stochastic" : "nearest") +
             ",alpha=" + (alpha_mode == IntAlpha::kGrad ? "grad" : alpha_mode == IntAlpha::kLr ? "lr" : real(alpha)) +
             (alpha0 > 0 ? ",alpha0=" + real(alpha0) : "") + ",beta=" + real(beta) + ",eps=" + real(eps) +
             (switch_aggregation ? ",agg=switch" : "") + ",seed=" + std::to_string(seed);
    }
    case CodecKind::kFft:
      return "fft:theta=" + float_text(theta) + ",bits=" + std::to_string(bits) + ",mant=" + std::to_string(mant) +
             ",max=" + (range_auto ? std::string("auto") : float_text(range_max)) + ",segment=" + std::to_string(segment) +
             ",index=" +
             (index == FftIndex::kBitmap ? "bitmap" : index == FftIndex::kCoo ? "coo" : "auto") +
             ",round=" + (rounding == Rounding::kNearest ? "nearest" : "trunc") + ",ef=" + (error_feedback ? "on" : "off") +
             ",fallback=" + (fallback ? "auto" : "off");
    case CodecKind::kAq:
      return "aq" + std::to_string(bits) + ":channels=" + std::to_string(channels) + ",rows=" + std::to_string(rows) +
             ",round=" + (rounding == Rounding::kStochastic ? "stochastic" : "nearest") + ",seed=" + std::to_string(seed);
    case CodecKind::kSign: {
      char eta_text[32];
      std::snprintf(eta_text, sizeof(eta_text), "%.9g", static_cast<double>(eta));
      return std::string("sign:eta_s=") + eta_text + ",k=" + std::to_string(period) + ",topology=" +
             (torus_rows ? "torus:" + std::to_string(torus_rows) + "x" + std::to_string(torus_cols) : "ring") +
             ",seed=" + std::to_string(seed);
    }
  }
  std::string text = "q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket) +
                     ",round=" + (rounding == Rounding::kStochastic ? "stochastic" : rounding == Rounding::kShift ? "shift" : "nearest") +
                     ",ef=" + (error_feedback ? "on" : "off") + ",seed=" + std::to_string(seed);
  if (!levels.empty()) {
    text += ",levels=";
    for (size_t k = 0; k < levels.size(); ++k) {
      char level[32];
      std::snprintf(level, sizeof(level), "%.9g", static_cast<double>(levels[k]));  // reads back as the same float
      text += (k ? "/" : "") + std::string(level);
    }
  }
  return text;
}

uint64_t CodecConfig::hash() const { return hash(fft_backend()); }

uint64_t CodecConfig::hash(const char* fft_library) const {
  uint64_t h = 1469598103934665603ull;
  std::string text = canonical();
  if (kind == CodecKind::kFft && std::strcmp(fft_library, "kissfft") != 0) text += std::string(";") + fft_library;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h ? h : 1;
}

size_t CodecConfig::encoded_bytes(size_t count) const {
  switch (kind) {
    case CodecKind::kNone:
      return count * 4;
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return count * 2;
    case CodecKind::kQuant:
      return quant_encoded_bytes(count, bucket, bits);
    case CodecKind::kSign:
      return sign_words(count) * sizeof(uint32_t);
    case CodecKind::kInt:
      return count * static_cast<size_t>(bits / 8);
    case CodecKind::kFft: {
      const size_t whole = count / segment, tail = count % segment;
      return whole * fft_segment_capacity(*this, segment) + (tail ? fft_segment_capacity(*this, tail) : 0);
    }
    case CodecKind::kAq:
      return aq_encoded_bytes(count, rows, channels, bits);
  }
  return 0;
}

}  // namespace qccl::kernels
