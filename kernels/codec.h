// Codecs: how a run of float32 values becomes bytes on the wire and back (DESIGN.md "Interfaces").
//
//   none           float32 as is (4 bytes per value); for measuring the fused path's overhead
//   fp16, bf16     IEEE half / bfloat16, round to nearest even (2 bytes per value)
//   q1 .. q8       bucketed min-max quantization (quant.h): per bucket two float32 and N bits per value
//   sign           Marsit's sign bits (sign.h): 1 bit per value, merged stochastically at every hop;
//                  every k-th round is a full-precision average instead (marsit.h, the algorithms)
//   int8 .. int32  IntSGD's integers (int_codec.h): Int(alpha * x) under a scale alpha shared by all
//                  ranks, summed as integers without decoding (exact and order-independent)
//   fft            FFT sparsification (fft_sparse.h): per segment, the largest bins of its spectrum as
//                  range floats (rfloat.h) behind a bitmap or indices; variable length
//   aq2 .. aq8     AQ-SGD's quantizer (aq_quant.h): a max-abs fp16 scale per channel of a block of
//                  rows, N bits per value on the grid k s / 2^(N-1); point-to-point
//
// The spec grammar is `name[:key=value,...]` with keys bucket=B (q only; multiple of 8, default 512),
// round=nearest|stochastic (q only; default nearest), ef=on|off (error feedback, not sign; default
// off), seed=S (random rounding and merging; default 0), and for sign: eta_s=E (the magnitude of a
// sign round's update; required), k=K (full-precision every K-th round, 0 = never; default 100),
// topology=ring|torus:RxC (default ring); for int8, int16, int32: round=stochastic|nearest (default
// stochastic), alpha=grad|lr|A (the scale: adaptive from the decoded sums, adaptive from the learning
// rate the caller sets, or the fixed A; default grad), beta=B (moving average, [0, 1), default 0.9),
// eps=E (> 0, default 1e-8), alpha0=A (the first step's scale; default: the first step is exact),
// agg=ring|switch (who adds the integers: the ranks along a ring, or aggregator processes that play
// an in-network switch; default ring). For fft: theta=T (the fraction of bins dropped, [0, 1);
// default 0.9), bits=N (bits per real or imaginary part, 3..16; default 10), mant=M (mantissa bits,
// 1..N-1; default 6), max=X|auto (the range's largest magnitude; default 1, the paper's; auto: each
// segment's own, a power of two carried in its header), segment=L
// (values per FFT, 2..2^26; default 65536), index=auto|bitmap|coo (default auto: the smaller),
// round=trunc|nearest (default trunc, the paper's), ef=on|off, fallback=auto|off (default auto:
// where the codec cannot pay at the call's rank count, the dense ring runs; fft_sparse.h). For aq2 ..
// aq8: channels=H (values per row, the scales' channels, 1..2^24; default 1: one scale per block),
// rows=R (rows per block, 0..2^24; default 0: the whole run is one block), round=nearest|stochastic
// (default nearest, the reference's), seed=S. Unknown names, keys or values are errors that name the token.
//
// The encoded size is a pure function of the count and the spec (encoded_bytes), never of the data;
// fft's is a capacity, and its encodings report the bytes they wrote.
// Runs passed to encode/decode start on a bucket boundary; so that results do not depend on how a
// buffer is chunked, callers cut chunks at multiples of alignment() elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/levels.h"
#include "kernels/philox.h"

namespace qccl::kernels {

// A torus side is a group id in Marsit's random key (philox.h: the stream has 12 bits, 2 for the phase).
constexpr int kMaxTorusSide = 1024;

enum class CodecKind : uint8_t { kNone, kFp16, kBf16, kQuant, kSign, kInt, kFft, kAq };
// IntSGD's scale: Proposition 2 on the decoded sums (no learning rate), Proposition 2 with the
// caller's learning rate (Algorithm 1), or fixed.
enum class IntAlpha : uint8_t { kGrad, kLr, kFixed };
// kShift (q codecs only): QSDP's quantization by random shift (Definition 1), one uniform per bucket
// shared by all its values (quant.h).
// kTruncate (fft only): toward zero, the paper's Algorithm 1.
enum class Rounding : uint8_t { kNearest, kStochastic, kShift, kTruncate };
enum class FftIndex : uint8_t { kAuto, kBitmap, kCoo };

// A spec that does not parse; what() names the bad token.
struct CodecSpecError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct CodecConfig {
  CodecKind kind = CodecKind::kNone;
  int bits = 32;          // bits per value on the wire (metadata aside)
  uint32_t bucket = 512;  // kQuant only
  Rounding rounding = Rounding::kNearest;
  bool error_feedback = false;
  uint64_t seed = 0;
  // kSign (Marsit) only:
  float eta = 0;              // eta_s
  uint32_t period = 100;      // K: rounds t with t % K == 0 are full precision; 0 = never
  int torus_rows = 0;         // torus:RxC (sides up to kMaxTorusSide); 0 = ring
  int torus_cols = 0;
  // kInt (IntSGD) only (bits is the wire width, 8, 16 or 32; rounding defaults to stochastic):
  IntAlpha alpha_mode = IntAlpha::kGrad;
  double alpha = 0;   // kFixed: the scale
  double alpha0 = 0;  // > 0: step 0 is an integer round with this scale; 0: step 0 is exact
  double beta = 0.9;
  double eps = 1e-8;
  bool switch_aggregation = false;  // agg=switch: summed by aggregator processes, not along a ring
  // kQuant only: learned levels (levels.h), 2^bits values in [0, 1], strictly increasing, the first
  // 0 and the last 1; empty for the evenly spaced levels of quant.h.
  std::vector<float> levels;
  // kFft only (bits: per real or imaginary part; rounding kTruncate or kNearest):
  float theta = 0.9f;          // fraction of the bins dropped
  // theta as the decimal that canonical() writes ("0.9"), exactly: keep_numerator / keep_denominator
  // is 1 - theta, so that K = ceil((1 - theta) B) is the spec's (0.9f is 0.899999976, whose K for
  // B = 10 would be 2, not 1).
  uint64_t keep_numerator = 1, keep_denominator = 10;
  int mant = 6;                // mantissa bits of the range float
  float range_max = 1.0f;      // largest magnitude of the range float
  bool range_auto = false;     // max=auto: per segment, the power of two at or above its largest part
  uint32_t segment = 65536;    // values per FFT
  FftIndex index = FftIndex::kAuto;
  bool fallback = true;        // a call whose payloads could outweigh the dense ring's runs the ring
  // kAq only (bits 2..8; rounding kNearest or kStochastic):
  uint32_t channels = 1;  // values per row: channel of value i is i % channels
  uint32_t rows = 0;      // rows per block (one scale per channel per block); 0: the whole run

  // Canonical text ("q4:bucket=512,round=stochastic,ef=on,seed=7"): what hash() digests.
  std::string canonical() const;
  // Nonzero digest of canonical(), carried in frame headers so that ranks with different codecs fail.
  // An fft codec's also digests the FFT library that runs it (other than KissFFT), since libraries
  // round differently: hash() names the host's (fft_backend()), hash(library) another ("cufft").
  uint64_t hash() const;
  uint64_t hash(const char* fft_library) const;
  size_t encoded_bytes(size_t count) const;
  // Chunk boundaries must fall on multiples of this many values; 0: a run must not be cut at all (aq
  // with rows=0, whose scales span the whole run).
  size_t alignment() const {
    switch (kind) {
      case CodecKind::kQuant: return bucket;
      case CodecKind::kSign: return 32;
      case CodecKind::kFft: return segment;
      case CodecKind::kAq: return static_cast<size_t>(rows) * channels;
      default: return 1;
    }
  }
  // Whether encodings are shorter than encoded_bytes() depending on the data (fft).
  bool variable_length() const { return kind == CodecKind::kFft; }
  // kSign: whether round t is a full-precision one.
  bool full_precision_round(uint64_t t) const { return period != 0 && t % period == 0; }
};

CodecConfig parse_codec_spec(const std::string& spec);
// Whether `name` names a codec ("q4", "sign", "aq8"; not a spec with options).
bool is_codec_name(const std::string& name);

// What one encode saw: q buckets that held NaN or Inf (sent as NaN), or, for the casts, values that
// are not finite after the cast (NaN and Inf pass through as themselves; fp16 overflow becomes Inf).
struct EncodeReport {
  size_t nonfinite = 0;
  size_t bytes = 0;  // written: encoded_bytes(count), or less for a variable-length codec
};

// Encodes count values. `first` is the index of in[0] in the whole buffer (it keys the random
// rounding, so that chunking changes nothing). Thread-safe; no allocation.
EncodeReport encode(const CodecConfig& codec, const float* in, size_t count, void* out, const PhiloxKey& key,
                    uint64_t first);
// out[i] = decoded value i. Returns how many decoded values are not finite (a q bucket marked
// non-finite decodes to NaN in full), so every rank that decodes the same bytes sees the same count.
// A variable-length codec reads its lengths from its own headers (fft_decode checks them against
// the bytes received).
size_t decode(const CodecConfig& codec, const void* in, size_t count, float* out);
// acc[i] += decoded value i (the fused step of a reduce-scatter hop). Same return value.
size_t decode_accumulate(const CodecConfig& codec, const void* in, size_t count, float* acc);

// A q codec's learned level positions (levels.h), which the host loops and the CUDA kernels look codes
// up in.
LevelPositions level_positions(const CodecConfig& codec);

// QSDP's Algorithm 2 (levels.h): 2^bits levels fitted to `data` cut into buckets of `bucket` values,
// each normalized to [0, 1] by its minimum and maximum, by online k-means (the nearest level moves
// `rate` of the way to each value in turn), `epochs` passes, starting from the evenly spaced levels,
// the endpoints pinned to 0 and 1 after each pass. Deterministic; constant and non-finite buckets
// are skipped. The result is strictly increasing (levels that met are pushed apart by a float32 ulp).
std::vector<float> learn_levels(const float* data, size_t count, int bits, uint32_t bucket, double rate, int epochs);

}  // namespace qccl::kernels
