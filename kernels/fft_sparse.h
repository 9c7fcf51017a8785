// The FFT-sparsifying codec (Wang et al., "FFT-based Gradient Sparsification", HPDC '20;
// shared/specs/fftsparse.md): per segment of L values, a real-to-complex FFT scaled by 1/sqrt(L'),
// L' = fft_transform_length(L), the smallest even 2-3-5 length at or above L, the segment zero-padded
// to it (orthonormal: the spectrum has the segment's energy, Parseval), the K =
// ceil((1 - theta) (L'/2 + 1)) bins of largest magnitude (ties to the lower bin), each bin's real and
// imaginary parts as range floats (rfloat.h), packed behind a bitmap of the L'/2 + 1 bins or a list of
// their indices (whichever is smaller, or as the spec says). Decoding scatters the codes back into a
// spectrum and runs the inverse FFT with the same scaling.
//
// A segment's payload, little-endian, variable length (a kept bin whose two codes both underflow to
// zero is dropped, so the count varies below K):
//   u16 magic 0x5146 | u16 flags (bit 0: the segment held NaN or Inf, nothing follows; bit 1:
//   indices, not a bitmap; bits 8-15, max=auto only: the segment's scale exponent e, an int8 in
//   [kFftMinExponent, fft_largest_auto_exponent], the parts sent being part / 2^e, which is exact) |
//   u32 logical length | u32 count of bins sent | u32
//   low half of the codec's hash
//   bitmap: ceil(B / 8) bytes, bin k at bit k % 8 of byte k / 8   or   indices: count u32, increasing
//   codes: 2 count codes of N bits (real, imaginary per bin), packed from bit 0 of the first byte
// An encoded run is its segments' payloads back to back.
//
// An FftWorkspace serves one thread at a time (KissFFT plans keep scratch); take_fft_workspace() lends
// pooled ones, so that plans are made once per process and length, not per call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/codec.h"
#include "kernels/rfloat.h"

namespace qccl::kernels {

constexpr size_t kFftHeaderBytes = 16;

// max=auto's exponent of a segment whose largest |part| is `top` (finite): e with top = f 2^e, f in
// [0.5, 1), so that top / 2^e is below max=1 and nothing clamps; 0 for a segment of zeros. The
// encoder scales by 2^-e and the decoder by 2^e, each one float32 multiply: both factors are exact
// (normal, or the subnormal 2^-127) and finite for e in [-127, 127], which the header's int8 also
// holds. A top of 2^127 or more (possible only at L' = 2: the unscaled bins are finite, so top is at
// most FLT_MAX / sqrt(L')) takes e = 127 and clamps; one below 2^-128 (subnormal: float32 keeps it to
// at most 21 bits) takes e = -127 and is sent at 2^127 times its size. Integer arithmetic on the
// bits: host and device alike.
constexpr int kFftMinExponent = -127, kFftMaxExponent = 127;
QCCL_HD int fft_auto_exponent(float top) {
  const uint32_t bits = float_bits(top) & 0x7FFFFFFFu;
  if (bits == 0) return 0;
  const int biased = static_cast<int>(bits >> 23);
  if (biased == 0) return bits >= 0x00400000u ? -126 : kFftMinExponent;  // subnormal: 0x00400000 is 2^-127
  return biased - 126 < kFftMaxExponent ? biased - 126 : kFftMaxExponent;
}
// The largest exponent an encoder writes for a segment whose transform is scaled by `transform_scale`
// (1/sqrt(L') in float32): its unscaled bins are finite (else the segment is sent as non-finite), so
// its largest part is at most FLT_MAX times the scale. A payload's larger one is malformed: it would
// decode to parts the encoder never sends, up to 2^127, and their inverse transform to Inf.
QCCL_HD int fft_largest_auto_exponent(float transform_scale) {
  return fft_auto_exponent(3.40282347e+38f * transform_scale);
}

// One segment's shape: its values, the FFT's length (the segment zero-padded to fft_transform_length),
// the bins and the bins kept.
struct FftShape {
  size_t length;
  size_t fft_length;
  size_t bins;
  size_t keep;
};
size_t fft_transform_length(size_t length);
FftShape fft_shape(const CodecConfig& c, size_t length);
// The host FFT this build uses: "kissfft", or "fftw" (-DQCCL_FFTW=ON). Part of the fft codec's hash
// (CodecConfig::hash): the two round differently, so the ranks of a job must share one.
const char* fft_backend();
// The most bytes a segment of `length` values encodes to (K bins, the smaller index form for auto).
size_t fft_segment_capacity(const CodecConfig& c, size_t length);
// The bytes a segment's payload takes with `count` bins sent in the given index form.
size_t fft_payload_bytes(const CodecConfig& c, const FftShape& shape, size_t count, bool indices);

// What encoding saw (summed over the segments of a run).
struct FftReport {
  size_t bytes = 0;      // written
  size_t nonfinite = 0;  // values of segments that held NaN or Inf (sent as such: decoded as NaN)
  size_t clamped = 0;    // real or imaginary parts above the range, sent as its largest magnitude
  size_t kept = 0;       // bins sent
};

// FFT plans and buffers for segments up to a length; reused across calls (take_fft_workspace).
class FftWorkspace;
struct FftWorkspaceDeleter {
  void operator()(FftWorkspace* w) const;  // back to the pool
};
using FftWorkspaceHandle = std::unique_ptr<FftWorkspace, FftWorkspaceDeleter>;
FftWorkspaceHandle take_fft_workspace();

// Encodes `count` values (segments of c.segment values from in[0]; the last may be shorter) into
// out, which holds encoded_bytes(count) (the capacity). With `residual` (not overlapping in), error
// feedback's residual[i] = in[i] - the decoded value i, except over segments sent as non-finite
// (they held NaN or Inf, or a bin beyond float32), where it is left as it was.
FftReport fft_encode(const CodecConfig& c, const float* in, size_t count, void* out, FftWorkspace& ws,
                     float* residual = nullptr);
// out[i] = (or +=) the decoded value i of the run of `count` values encoded in `bytes` bytes. Returns
// how many decoded values are not finite; a payload that is malformed for this codec and count
// (another codec, a length or count out of range, indices not increasing, bytes missing) decodes to
// NaN over its segment and the rest of the run, and counts as such.
size_t fft_decode(const CodecConfig& c, const void* in, size_t bytes, size_t count, float* out, bool accumulate,
                  FftWorkspace& ws);

// spectrum = the scaled forward transforms of a run's segments (the first stage of fft_encode, in the
// layout below; for measuring the stages apart, codec_perf).
void fft_analyze(const CodecConfig& c, const float* in, size_t count, float* spectrum, FftWorkspace& ws);
// fft_encode's other two stages, for measuring them apart (codec_perf); fft_analyze, fft_select and
// fft_pack in turn write fft_encode's bytes. fft_select: per segment of the spectrum, the K bins of
// largest magnitude, kept[b] = 1 for those and 0 for the others, a byte per bin of the spectrum
// (fft_spectrum_floats / 2), or kFftNonfiniteSegment for every bin of a segment whose bins are not
// finite (fft_encode sends it as non-finite). Returns the bins kept over the run.
constexpr uint8_t kFftNonfiniteSegment = 2;
size_t fft_select(const CodecConfig& c, const float* spectrum, size_t count, uint8_t* kept, FftWorkspace& ws);
// fft_pack: the payloads of the run from its spectrum and selection (range floats and packing).
FftReport fft_pack(const CodecConfig& c, const float* spectrum, const uint8_t* kept, size_t count, void* out,
                   FftWorkspace& ws);

// Frequency-domain accumulation (spec P6): the sum of n payloads' inverse transforms is the inverse
// transform of the sum of their spectra, so a receiver adds the sparse spectra (in a fixed order, for
// the same bits everywhere) and runs one inverse FFT per segment instead of n. A run's spectrum holds
// per segment 2 (L'/2 + 1) floats (real and imaginary parts of each bin), segment after segment.
size_t fft_spectrum_floats(const CodecConfig& c, size_t count);
// spectrum = (or +=) the bins of the payloads of a run of `count` values in `bytes` bytes. Returns how
// many values decode to non-finite: a segment that held NaN or Inf, or a malformed one (as
// fft_decode), sets its spectrum to NaN, which the inverse transform spreads over the segment.
size_t fft_decode_spectrum(const CodecConfig& c, const void* in, size_t bytes, size_t count, float* spectrum,
                           bool accumulate, FftWorkspace& ws);
// out = the inverse transform of the spectrum, segment by segment (the decode of a single payload
// is fft_decode_spectrum then fft_synthesize, bit for bit).
void fft_synthesize(const CodecConfig& c, const float* spectrum, size_t count, float* out, FftWorkspace& ws);
// Error feedback over a step whose sum is NaN or Inf somewhere (spec §5.4: never commit the residual
// for that step): for each segment of `count` values whose sum holds a value that is not finite,
// residual = saved, what it held before the step's encode. A poisoned segment decodes to NaN on every
// rank, so every rank keeps its residual there, not only the rank whose input held the NaN: the
// others' encodes would otherwise keep the leftover of a contribution that no output carries.
void fft_restore_residual(const CodecConfig& c, const float* saved, const float* sum, size_t count, float* residual);

// Whether the fft all-reduce can move fewer bytes than the dense ring (spec §1.7): every rank sends
// its payloads to the n - 1 others, at most (n - 1) encoded_bytes(count), where the ring sends
// 2 (n - 1) / n count element_size. Decided from the capacity, so every rank decides alike.
inline bool fft_compression_pays(const CodecConfig& c, size_t count, int nranks, size_t element_size) {
  return static_cast<double>(nranks) * static_cast<double>(c.encoded_bytes(count)) <
         2.0 * static_cast<double>(count) * static_cast<double>(element_size);
}

// Whether the codec's time is repaid by the wire time it saves (the paper's Eq. 4 with the measured
// cost of encoding and decoding a value, seconds_per_value, in place of its 2 (2/T_m + 1/T_f + 1/T_p
// + 1/T_s), compression and decompression): M S < (M / T_comm)(1 - 1/k), i.e. k > 1 / (1 - T_comm S),
// with M the call's bytes, k their ratio to the codec's capacity, S the cost per byte. Never with a
// cost at or above the wire time.
inline bool fft_pays_at_rate(const CodecConfig& c, size_t count, size_t element_size, double link_rate,
                             double seconds_per_value) {
  const double seconds_per_byte = seconds_per_value / static_cast<double>(element_size);
  const double denominator = 1.0 - link_rate * seconds_per_byte;
  if (!(denominator > 0)) return false;
  const double k = static_cast<double>(count) * static_cast<double>(element_size) /
                   static_cast<double>(std::max<size_t>(c.encoded_bytes(count), 1));
  return k > 1.0 / denominator;
}

// The smallest compression ratio k at which compressing pays (the paper's Eq. 4): 1 / (1 - 2 T_comm
// (2 / T_m + 1 / T_f + 1 / T_p + 1 / T_s)), rates in bytes per second; +infinity when nothing pays.
double fft_break_even_ratio(double comm_rate, double quantize_rate, double fft_rate, double pack_rate,
                            double select_rate);

}  // namespace qccl::kernels
