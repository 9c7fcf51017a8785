// Host loops of the FFT-sparsifying codec (fft_sparse.h), on KissFFT's real transforms (BSD), or
// FFTW's in a build configured with -DQCCL_FFTW=ON (GPL: the library then links FFTW; 3-6x faster
// transforms on the development machine, docs/PERF.md "FFT sparsification (host)"). The two give
// other rounding in the last bits, so ranks must share the backend: it is part of the codec's hash
// (fft_backend()), and a mixed job fails with a mismatch.
#include "kernels/fft_sparse.h"

#include <kiss_fftr.h>
#if QCCL_HAVE_FFTW
#include <fftw3.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "kernels/rfloat.h"

namespace qccl::kernels {

const char* fft_backend() { return QCCL_HAVE_FFTW ? "fftw" : "kissfft"; }

// The smallest even length at or above `length` whose only prime factors are 2, 3 and 5. KissFFT
// has butterflies for those radices and runs any other prime factor p as a loop of p per value, so
// a segment's own length would make a tail of 155,658 values (2 x 3 x 25,943) cost seconds where
// 262,144 values take 40 ms (FFTW and cuFFT slow down there too, less). Such lengths lie within a
// few percent of any length, so the padding costs few bins; a power of two is its own.
size_t fft_transform_length(size_t length) {
  if (length > 2 && (length & (length - 1)) == 0) return length;  // at once for the usual segments
  size_t best = 2;
  while (best < length) best *= 2;
  for (size_t even5 = 2; even5 < best; even5 *= 5)  // 2 x 5^c
    for (size_t even35 = even5; even35 < best; even35 *= 3) {  // 2 x 3^b x 5^c
      size_t n = even35;
      while (n < length) n *= 2;
      best = std::min(best, n);
    }
  return best;
}

FftShape fft_shape(const CodecConfig& c, size_t length) {
  FftShape s;
  s.length = length;
  s.fft_length = fft_transform_length(length);  // even: KissFFT's real transform takes no other
  s.bins = s.fft_length / 2 + 1;
  // K = ceil((1 - theta) B), exactly, with theta as written (CodecConfig::keep_numerator).
  const unsigned __int128 scaled = static_cast<unsigned __int128>(c.keep_numerator) * s.bins;
  const auto keep = static_cast<size_t>((scaled + c.keep_denominator - 1) / c.keep_denominator);
  s.keep = std::min(s.bins, std::max<size_t>(1, keep));
  return s;
}

size_t fft_payload_bytes(const CodecConfig& c, const FftShape& shape, size_t count, bool indices) {
  const size_t index_bytes = indices ? count * sizeof(uint32_t) : (shape.bins + 7) / 8;
  return kFftHeaderBytes + index_bytes + (2 * count * static_cast<size_t>(c.bits) + 7) / 8;
}

namespace {

// The index form of a payload of `count` bins.
bool use_indices(const CodecConfig& c, const FftShape& shape, size_t count) {
  if (c.index != FftIndex::kAuto) return c.index == FftIndex::kCoo;
  return count * sizeof(uint32_t) < (shape.bins + 7) / 8;
}

}  // namespace

size_t fft_segment_capacity(const CodecConfig& c, size_t length) {
  const FftShape shape = fft_shape(c, length);
  // With auto, a payload of count <= K bins takes the smaller form, which grows with count.
  return fft_payload_bytes(c, shape, shape.keep, use_indices(c, shape, shape.keep));
}

// ---- Workspaces -----------------------------------------------------------------------------------

// One length's forward and inverse plans and the buffers of a segment up to that length. KissFFT's
// plans hold scratch, so a workspace serves one thread at a time; take_fft_workspace() hands out
// pooled ones so that plans are computed once per process, not per call.
class FftWorkspace {
 public:
  ~FftWorkspace() {
    for (auto& p : plans_) p.release();
  }

  struct Plans {
    size_t fft_length;
#if QCCL_HAVE_FFTW
    // Planned on the workspace's arrays and executed on arrays of the same alignment (FFTW's SIMD
    // code needs that): the workspace's own, or a caller's spectrum when it is aligned alike; other
    // spectra go through the workspace's bins. The inverse destroys its input, so it always runs on
    // the workspace's bins (a caller's spectrum is copied there: a tenth of the transform's time).
    fftwf_plan forward = nullptr, inverse = nullptr;
    int alignment = 0;  // of the arrays planned on (FFTW_UNALIGNED unless 0, which malloc gives)
    void make(float* real, kiss_fft_cpx* bins) {
      {
        const std::lock_guard<std::mutex> lock(planner_mutex());  // FFTW's planner is not thread-safe
        const int n = static_cast<int>(fft_length);
        auto* c = reinterpret_cast<fftwf_complex*>(bins);
        alignment = fftwf_alignment_of(real) | fftwf_alignment_of(reinterpret_cast<float*>(bins));
        const unsigned flags = FFTW_ESTIMATE | (alignment ? FFTW_UNALIGNED : 0u);
        forward = fftwf_plan_dft_r2c_1d(n, real, c, flags);
        inverse = fftwf_plan_dft_c2r_1d(n, c, real, flags | FFTW_DESTROY_INPUT);
      }
      if (!forward || !inverse) {
        release();
        throw std::bad_alloc();
      }
    }
    void release() {
      const std::lock_guard<std::mutex> lock(planner_mutex());
      if (forward) fftwf_destroy_plan(forward);
      if (inverse) fftwf_destroy_plan(inverse);
      forward = inverse = nullptr;
    }
    bool fits(const void* p) const { return alignment || fftwf_alignment_of(static_cast<float*>(const_cast<void*>(p))) == 0; }
    // bins = the transform of real (the workspace's), through scratch (the workspace's bins).
    void transform(float* real, kiss_fft_cpx* bins, kiss_fft_cpx* scratch) const {
      // The workspace's arrays come from operator new (malloc's alignment), as when planned.
      if (!fits(real) || !fits(scratch)) throw std::logic_error("fft: the workspace's arrays lost FFTW's alignment");
      kiss_fft_cpx* out = fits(bins) ? bins : scratch;
      fftwf_execute_dft_r2c(forward, real, reinterpret_cast<fftwf_complex*>(out));
      if (out != bins) std::memcpy(bins, out, (fft_length / 2 + 1) * sizeof(kiss_fft_cpx));
    }
    // real = the inverse transform of bins, through scratch (the workspace's bins, destroyed).
    void inverse_transform(const kiss_fft_cpx* bins, float* real, kiss_fft_cpx* scratch) const {
      if (!fits(real) || !fits(scratch)) throw std::logic_error("fft: the workspace's arrays lost FFTW's alignment");
      if (bins != scratch) std::memcpy(scratch, bins, (fft_length / 2 + 1) * sizeof(kiss_fft_cpx));
      fftwf_execute_dft_c2r(inverse, reinterpret_cast<fftwf_complex*>(scratch), real);
    }
    static std::mutex& planner_mutex() {
      static std::mutex mu;
      return mu;
    }
#else
    kiss_fftr_cfg forward = nullptr, inverse = nullptr;
    void make(float*, kiss_fft_cpx*) {
      const int n = static_cast<int>(fft_length);
      forward = kiss_fftr_alloc(n, 0, nullptr, nullptr), inverse = kiss_fftr_alloc(n, 1, nullptr, nullptr);
      if (!forward || !inverse) {
        release();
        throw std::bad_alloc();
      }
    }
    void release() {
      kiss_fftr_free(forward);
      kiss_fftr_free(inverse);
      forward = inverse = nullptr;
    }
    void transform(float* real, kiss_fft_cpx* bins, kiss_fft_cpx*) const { kiss_fftr(forward, real, bins); }
    void inverse_transform(const kiss_fft_cpx* bins, float* real, kiss_fft_cpx*) const { kiss_fftri(inverse, bins, real); }
#endif
  };
  // The plans of an FFT length (computed at the first use of the length in this workspace) and
  // buffers for it.
  const Plans& plans(size_t fft_length) {
    for (const Plans& p : plans_)
      if (p.fft_length == fft_length) return reserve(p);
    Plans p{fft_length};
    reserve(p);
    p.make(real.data(), bins.data());
    plans_.push_back(p);
    return plans_.back();
  }

  std::vector<float> real;          // the segment, zero-padded to the FFT's length
  std::vector<kiss_fft_cpx> bins;   // its spectrum
  std::vector<float> magnitude;     // |bin|^2
  std::vector<uint32_t> candidates; // selection's: the magnitudes' bits still in the running
  std::vector<uint8_t> kept;        // per bin: kept
  std::vector<uint32_t> codes;      // 2 per bin sent
  std::vector<uint32_t> sent;       // the bins sent, increasing

 private:
  const Plans& reserve(const Plans& p) {
    const size_t bins = p.fft_length / 2 + 1;
    if (real.size() < p.fft_length) real.resize(p.fft_length);
    if (this->bins.size() < bins) {
      this->bins.resize(bins);
      magnitude.resize(bins);
      candidates.resize(bins);
      kept.resize(bins);
      codes.resize(2 * bins);
      sent.resize(bins);
    }
    return p;
  }
  std::vector<Plans> plans_;
};

namespace {
std::mutex pool_mutex;
std::vector<FftWorkspace*>& pool() {
  static auto* workspaces = new std::vector<FftWorkspace*>;  // never destroyed: exit cannot race a release
  return *workspaces;
}
}  // namespace

void FftWorkspaceDeleter::operator()(FftWorkspace* w) const {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool().size() < 64) {
    pool().push_back(w);
    return;
  }
  delete w;
}

FftWorkspaceHandle take_fft_workspace() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (!pool().empty()) {
      FftWorkspace* w = pool().back();
      pool().pop_back();
      return FftWorkspaceHandle(w);
    }
  }
  return FftWorkspaceHandle(new FftWorkspace);
}

// ---- Encoding -------------------------------------------------------------------------------------

namespace {

constexpr uint16_t kMagic = 0x5146;
constexpr uint16_t kFlagNonfinite = 1, kFlagIndices = 2;

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The header's hash: the low half of the codec's, taken once per call (it digests the canonical text).
uint32_t hash32(const CodecConfig& c) { return static_cast<uint32_t>(c.hash()); }

void write_header(uint8_t* out, uint32_t hash, uint16_t flags, size_t length, size_t count) {
  put16(out, kMagic);
  put16(out + 2, flags);
  put32(out + 4, static_cast<uint32_t>(length));
  put32(out + 8, static_cast<uint32_t>(count));
  put32(out + 12, hash);
}

// Packs `count` codes of `bits` bits (at most 16, each below 2^bits) from bit 0 of out, little-endian;
// returns the bytes written. The codes gather in a 64-bit word that leaves 32 bits at a time (a
// byte at a time took a loop turn per byte).
size_t pack_codes(const uint32_t* codes, size_t count, int bits, uint8_t* out) {
  const size_t bytes = (count * static_cast<size_t>(bits) + 7) / 8;
  uint64_t acc = 0;
  int filled = 0;  // below 32 between codes
  uint8_t* at = out;
  for (size_t i = 0; i < count; ++i) {
    acc |= static_cast<uint64_t>(codes[i]) << filled;
    filled += bits;
    if (filled >= 32) {
      const auto word = static_cast<uint32_t>(acc);
      std::memcpy(at, &word, 4);  // the payload is little-endian, as this host (put32)
      at += 4;
      acc >>= 32;
      filled -= 32;
    }
  }
  for (; filled > 0; filled -= 8, acc >>= 8) *at++ = static_cast<uint8_t>(acc);
  return bytes;
}

// 1/sqrt(L') in float32, as the device's kernels take it (fft_cuda.cu's Geometry::scale).
float transform_scale(const FftShape& shape) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.fft_length)));
}

// bins = the forward transform of one segment, zero-padded to the FFT's length, scaled by
// 1/sqrt(L'): orthonormal, so the bins carry the segment's energy (Parseval) and one range serves
// any segment length.
void analyze_segment(const FftShape& shape, const float* in, kiss_fft_cpx* bins, FftWorkspace& ws) {
  const FftWorkspace::Plans& plans = ws.plans(shape.fft_length);
  std::memcpy(ws.real.data(), in, shape.length * sizeof(float));
  std::fill(ws.real.begin() + static_cast<std::ptrdiff_t>(shape.length),
            ws.real.begin() + static_cast<std::ptrdiff_t>(shape.fft_length), 0.0f);
  plans.transform(ws.real.data(), bins, ws.bins.data());
  const float scale = transform_scale(shape);
  for (size_t k = 0; k < shape.bins; ++k) bins[k].r *= scale, bins[k].i *= scale;
}

// The k-th largest (k from 1) of n finite non-negative floats. Such floats order as their bits do as
// unsigned integers, so a radix select on the bits, most significant digit first (11, 11 and 10
// bits), finds it exactly: each pass counts the digit of the values still in the running, takes the
// digit where the k-th falls, and keeps only the values with it (a small share of n after the first
// pass, which reads the magnitudes themselves). std::nth_element over a copy took a quarter of the
// encode's time. Neighbouring bins' magnitudes often share their top digit, and increments of one
// counter wait on each other through memory, so a long pass counts into four histograms in turn.
float kth_largest(const float* v, size_t n, size_t k, uint32_t* candidates) {
  constexpr int kShift[3] = {21, 10, 0};
  constexpr uint32_t kDigits[3] = {2048, 2048, 1024};
  constexpr size_t kFourWaysFrom = 8192;  // values in the running; below, one histogram
  uint32_t counts[4][2048];
  uint32_t* count = counts[0];
  uint32_t chosen = 0;
  size_t m = n;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass];
    const uint32_t mask = kDigits[pass] - 1;
    auto bits = [&](size_t i) { return pass == 0 ? float_bits(v[i]) : candidates[i]; };
    auto digit = [&](size_t i) { return (bits(i) >> shift) & mask; };
    const size_t ways = m >= kFourWaysFrom ? 4 : 1;
    for (size_t w = 0; w < ways; ++w) std::fill(counts[w], counts[w] + kDigits[pass], 0u);
    size_t at = 0;
    if (ways == 4)
      for (; at + 4 <= m; at += 4) {
        ++counts[0][digit(at)], ++counts[1][digit(at + 1)];
        ++counts[2][digit(at + 2)], ++counts[3][digit(at + 3)];
      }
    for (; at < m; ++at) ++count[digit(at)];
    if (ways == 4)
      for (uint32_t d = 0; d < kDigits[pass]; ++d) count[d] += counts[1][d] + counts[2][d] + counts[3][d];
    uint32_t d = mask;
    while (k > count[d]) k -= count[d--];  // the digits above d hold fewer than k values
    chosen |= d << shift;
    if (pass == 2) break;
    size_t kept = 0;  // (in place from the second pass on: kept <= i)
    for (size_t i = 0; i < m; ++i) {
      const uint32_t b = bits(i);
      candidates[kept] = b;
      kept += ((b >> shift) & mask) == d;
    }
    m = kept;
  }
  return bits_float(chosen);
}

// The selection: the magnitudes of a segment's bins, and in kept (a byte per bin) the K of largest
// magnitude, ties to the lower index (exact K, whatever the values). False (kept left as it was)
// when a part is not finite: a NaN or Inf in the segment reaches every bin (each is a sum over all
// the values), so the parts tell (the largest one's bit pattern, as an integer, is then Inf's or
// above). The magnitudes are scaled by a power of two (magnitude_scale), so that every finite
// segment is ranked, whatever its scale.
bool select_bins(const FftShape& shape, const kiss_fft_cpx* bins, uint8_t* kept, FftWorkspace& ws) {
  uint32_t largest = 0;  // the largest |part|'s bit pattern: NaN and Inf above every finite one
  for (size_t k = 0; k < shape.bins; ++k)
    largest = std::max({largest, float_bits(bins[k].r) & 0x7FFFFFFFu, float_bits(bins[k].i) & 0x7FFFFFFFu});
  if (largest >= 0x7F800000u) return false;
  const float scale = magnitude_scale(largest);
  for (size_t k = 0; k < shape.bins; ++k) {
    const float r = bins[k].r * scale, i = bins[k].i * scale;
    ws.magnitude[k] = r * r + i * i;
  }
  // The K-th largest magnitude tau (finite here, and not negative), then every bin above tau and
  // the lowest-indexed bins at tau until K are kept: every bin at tau or above is marked, and where
  // ties make that more than K (rarely), the highest-indexed bins at tau are unmarked. The bounds
  // are locals: a store through uint8_t* may alias anything, and a bound read from memory at every
  // iteration kept the marking loop from being vectorised.
  const float* mag = ws.magnitude.data();
  const size_t nbins = shape.bins, keep = shape.keep;
  if (keep < nbins) {
    const float tau = kth_largest(mag, nbins, keep, ws.candidates.data());
    size_t marked = 0;
    for (size_t k = 0; k < nbins; ++k) {
      const uint8_t at_or_above = mag[k] >= tau;
      kept[k] = at_or_above;
      marked += at_or_above;
    }
    for (size_t k = nbins; marked > keep; --k)  // marked > keep: some bin at tau lies below k
      if (mag[k - 1] == tau) kept[k - 1] = 0, --marked;
  } else {
    std::memset(kept, 1, nbins);
  }
  return true;
}

// The range floats and the packing of a segment whose bins and selection are given; returns the
// payload's bytes.
size_t pack_segment(const CodecConfig& c, const RangeFloat& rf, uint32_t hash, const FftShape& shape, size_t length,
                    const kiss_fft_cpx* bins, const uint8_t* kept, uint8_t* out, FftWorkspace& ws, FftReport* report) {
  // max=auto: the parts are sent divided by 2^e, the power of two at or above the largest (so that
  // nothing clamps); a power of two scales exactly (fft_auto_exponent).
  int e = 0;
  if (c.range_auto) {
    float top = 0;
    for (size_t k = 0; k < shape.bins; ++k) top = std::max(top, std::max(std::fabs(bins[k].r), std::fabs(bins[k].i)));
    e = fft_auto_exponent(top);
  }
  const float unscale = std::ldexp(1.0f, -e);

  // Codes in bin order; a bin whose two parts both underflow is not sent. The bins kept are listed
  // first, then compacted in place to those sent. The listing takes 64 bins at a time: eight kept
  // bytes become eight bits of a mask with one multiply (each byte's low bit moves to bit 56 + its
  // index; 1 kept, 0 not: fft_select's kFftNonfiniteSegment never reaches here), and the mask's set
  // bits are listed (a branch per bin would mispredict at every kept bin; a store per bin, without a
  // branch, took a fifth of the packing).
  size_t listed = 0, k = 0;
  for (; k + 64 <= shape.bins; k += 64) {
    uint64_t mask = 0;
    for (int b = 0; b < 8; ++b) {
      uint64_t word;
      std::memcpy(&word, kept + k + 8 * b, 8);
      mask |= (((word & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56) << (8 * b);
    }
    for (; mask; mask &= mask - 1) ws.sent[listed++] = static_cast<uint32_t>(k + __builtin_ctzll(mask));
  }
  for (; k < shape.bins; ++k) {
    ws.sent[listed] = static_cast<uint32_t>(k);
    listed += kept[k] & 1u;
  }
  size_t count = 0;
  for (size_t j = 0; j < listed; ++j) {
    const size_t k = ws.sent[j];
    bool clamp_re = false, clamp_im = false;
    const uint32_t re = range_float_encode(rf, bins[k].r * unscale, &clamp_re);
    const uint32_t im = range_float_encode(rf, bins[k].i * unscale, &clamp_im);
    if ((re | im) & ~rf.sign) {  // index bits nonzero in either part
      report->clamped += clamp_re + clamp_im;
      ws.codes[2 * count] = re, ws.codes[2 * count + 1] = im;
      ws.sent[count++] = static_cast<uint32_t>(k);
    }
  }
  const bool indices = use_indices(c, shape, count);
  const auto exponent = static_cast<uint16_t>(static_cast<uint8_t>(static_cast<int8_t>(e)) << 8);
  write_header(out, hash, static_cast<uint16_t>((indices ? kFlagIndices : 0) | exponent), length, count);
  uint8_t* at = out + kFftHeaderBytes;
  if (indices) {
    for (size_t j = 0; j < count; ++j, at += 4) put32(at, ws.sent[j]);
  } else {
    const size_t bitmap = (shape.bins + 7) / 8;
    std::memset(at, 0, bitmap);
    for (size_t j = 0; j < count; ++j) at[ws.sent[j] / 8] |= static_cast<uint8_t>(1u << (ws.sent[j] % 8));
    at += bitmap;
  }
  at += pack_codes(ws.codes.data(), 2 * count, c.bits, at);
  report->kept += count;
  return static_cast<size_t>(at - out);
}

// A segment sent as non-finite: the header alone, with the flag; returns its bytes.
size_t write_nonfinite(uint8_t* out, uint32_t hash, size_t length, FftReport* report) {
  write_header(out, hash, kFlagNonfinite, length, 0);
  report->nonfinite += length;
  return kFftHeaderBytes;
}

// Encodes one segment; returns the payload's bytes.
size_t encode_segment(const CodecConfig& c, const RangeFloat& rf, uint32_t hash, const float* in, size_t length,
                      uint8_t* out, FftWorkspace& ws, FftReport* report) {
  const FftShape shape = fft_shape(c, length);
  ws.plans(shape.fft_length);  // sizes the buffers before ws.bins is taken
  analyze_segment(shape, in, ws.bins.data(), ws);
  if (!select_bins(shape, ws.bins.data(), ws.kept.data(), ws)) return write_nonfinite(out, hash, length, report);
  return pack_segment(c, rf, hash, shape, length, ws.bins.data(), ws.kept.data(), out, ws, report);
}

// Reads one segment's payload of `length` values from `avail` bytes and adds (or writes) its bins into
// `bins` (fft_length / 2 + 1 complex values). Returns the bytes it took, or 0 when the payload is
// malformed; *nonfinite_segment is set for a segment sent as NaN or Inf (bins untouched).
size_t read_segment(const CodecConfig& c, const RangeFloat& rf, uint32_t hash, const uint8_t* in, size_t avail,
                    const FftShape& shape, kiss_fft_cpx* bins, bool accumulate, FftWorkspace& ws,
                    bool* nonfinite_segment) {
  *nonfinite_segment = false;
  if (avail < kFftHeaderBytes || get16(in) != kMagic || get32(in + 4) != shape.length || get32(in + 12) != hash)
    return 0;
  const uint16_t flags = get16(in + 2);
  const size_t count = get32(in + 8);
  if (flags & kFlagNonfinite) {
    if (count != 0) return 0;
    *nonfinite_segment = true;
    return kFftHeaderBytes;
  }
  const bool indices = flags & kFlagIndices;
  if (count > shape.keep || indices != use_indices(c, shape, count) || (flags & 0xFC)) return 0;
  const int e = static_cast<int8_t>(flags >> 8);
  if (c.range_auto ? e < kFftMinExponent || e > fft_largest_auto_exponent(transform_scale(shape)) : e != 0) return 0;
  const float scale = std::ldexp(1.0f, e);
  const size_t bytes = fft_payload_bytes(c, shape, count, indices);
  if (avail < bytes) return 0;

  // The bins sent, increasing.
  const uint8_t* at = in + kFftHeaderBytes;
  size_t found = 0;
  if (indices) {
    for (size_t j = 0; j < count; ++j, at += 4) {
      const uint32_t k = get32(at);
      if (k >= shape.bins || (j > 0 && k <= ws.sent[j - 1])) return 0;
      ws.sent[j] = k;
    }
    found = count;
  } else {
    // The set bits in increasing order, 64 at a time (a test per bin mispredicts at every sent bin).
    const size_t bitmap = (shape.bins + 7) / 8;
    for (size_t byte = 0; byte < bitmap; byte += 8) {
      uint64_t word = 0;
      std::memcpy(&word, at + byte, std::min<size_t>(8, bitmap - byte));  // little-endian: bin byte * 8 is bit 0
      if (byte * 8 + 64 > shape.bins) word &= (uint64_t{1} << (shape.bins - byte * 8)) - 1;  // (padding: below)
      for (; word != 0; word &= word - 1) {
        if (found == count) return 0;
        ws.sent[found++] = static_cast<uint32_t>(byte * 8 + static_cast<size_t>(__builtin_ctzll(word)));
      }
    }
    if ((shape.bins % 8) && (at[shape.bins / 8] >> (shape.bins % 8))) return 0;  // bits past the last bin
    at += bitmap;
  }
  if (found != count) return 0;

  if (!accumulate) std::memset(bins, 0, shape.bins * sizeof(kiss_fft_cpx));
  const uint32_t mask = (1u << c.bits) - 1;
  const uint8_t* const end = in + bytes;
  uint64_t acc = 0;
  int filled = 0;  // below c.bits (at most 16) before a refill
  auto next_code = [&]() {
    if (filled < c.bits && end - at >= 4) {  // 32 bits at a time where the payload has them
      uint32_t word;
      std::memcpy(&word, at, 4);  // little-endian, as pack_codes wrote it
      acc |= static_cast<uint64_t>(word) << filled;
      filled += 32;
      at += 4;
    }
    while (filled < c.bits) {
      acc |= static_cast<uint64_t>(*at++) << filled;
      filled += 8;
    }
    const uint32_t code = static_cast<uint32_t>(acc) & mask;
    acc >>= c.bits;
    filled -= c.bits;
    return code;
  };
  for (size_t j = 0; j < count; ++j) {
    kiss_fft_cpx& b = bins[ws.sent[j]];
    const float re = range_float_decode(rf, next_code()) * scale, im = range_float_decode(rf, next_code()) * scale;
    b.r = accumulate ? b.r + re : re;
    b.i = accumulate ? b.i + im : im;
  }
  return bytes;
}

// out (+)= the inverse transform of one segment's bins, scaled back by 1/sqrt(L').
void synthesize_segment(const FftShape& shape, const kiss_fft_cpx* bins, float* out, bool accumulate,
                        FftWorkspace& ws) {
  const FftWorkspace::Plans& plans = ws.plans(shape.fft_length);
  plans.inverse_transform(bins, ws.real.data(), ws.bins.data());
  const float scale = transform_scale(shape);
  for (size_t i = 0; i < shape.length; ++i) {
    const float v = ws.real[i] * scale;
    out[i] = accumulate ? out[i] + v : v;
  }
}

void fill_nan(float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = std::numeric_limits<float>::quiet_NaN();
}

RangeFloat range_float_of(const CodecConfig& c) {
  return make_range_float(c.bits, c.mant, c.range_max, c.rounding == Rounding::kNearest);
}

}  // namespace

void fft_analyze(const CodecConfig& c, const float* in, size_t count, float* spectrum, FftWorkspace& ws) {
  for (size_t at = 0; at < count; at += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
    analyze_segment(shape, in + at, reinterpret_cast<kiss_fft_cpx*>(spectrum), ws);
    spectrum += 2 * shape.bins;
  }
}

size_t fft_select(const CodecConfig& c, const float* spectrum, size_t count, uint8_t* kept, FftWorkspace& ws) {
  size_t total = 0;
  for (size_t at = 0; at < count; at += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
    ws.plans(shape.fft_length);  // sizes the selection's buffers
    if (select_bins(shape, reinterpret_cast<const kiss_fft_cpx*>(spectrum), kept, ws))
      total += shape.keep;
    else
      std::memset(kept, kFftNonfiniteSegment, shape.bins);
    spectrum += 2 * shape.bins;
    kept += shape.bins;
  }
  return total;
}

FftReport fft_pack(const CodecConfig& c, const float* spectrum, const uint8_t* kept, size_t count, void* out,
                   FftWorkspace& ws) {
  FftReport report;
  const RangeFloat rf = range_float_of(c);
  const uint32_t hash = hash32(c);
  auto* bytes = static_cast<uint8_t*>(out);
  for (size_t at = 0; at < count; at += c.segment) {
    const size_t length = std::min<size_t>(c.segment, count - at);
    const FftShape shape = fft_shape(c, length);
    ws.plans(shape.fft_length);  // sizes the packing's buffers
    uint8_t* payload = bytes + report.bytes;
    report.bytes += kept[0] == kFftNonfiniteSegment
                        ? write_nonfinite(payload, hash, length, &report)
                        : pack_segment(c, rf, hash, shape, length, reinterpret_cast<const kiss_fft_cpx*>(spectrum),
                                       kept, payload, ws, &report);
    spectrum += 2 * shape.bins;
    kept += shape.bins;
  }
  return report;
}

FftReport fft_encode(const CodecConfig& c, const float* in, size_t count, void* out, FftWorkspace& ws,
                     float* residual) {
  FftReport report;
  const RangeFloat rf = range_float_of(c);
  const uint32_t hash = hash32(c);
  auto* bytes = static_cast<uint8_t*>(out);
  for (size_t at = 0; at < count; at += c.segment) {
    const size_t length = std::min<size_t>(c.segment, count - at);
    const size_t nonfinite = report.nonfinite;
    uint8_t* payload = bytes + report.bytes;
    const size_t written = encode_segment(c, rf, hash, in + at, length, payload, ws, &report);
    report.bytes += written;
    if (!residual || report.nonfinite != nonfinite) continue;
    // The segment's own decode, written where its residual goes and taken from the input there.
    const FftShape shape = fft_shape(c, length);
    bool poisoned = false;
    read_segment(c, rf, hash, payload, written, shape, ws.bins.data(), false, ws, &poisoned);
    synthesize_segment(shape, ws.bins.data(), residual + at, false, ws);
    for (size_t i = 0; i < length; ++i) residual[at + i] = in[at + i] - residual[at + i];
  }
  return report;
}

size_t fft_decode(const CodecConfig& c, const void* in, size_t bytes, size_t count, float* out, bool accumulate,
                  FftWorkspace& ws) {
  const RangeFloat rf = range_float_of(c);
  const uint32_t hash = hash32(c);
  const auto* p = static_cast<const uint8_t*>(in);
  size_t used = 0, nonfinite = 0;
  for (size_t at = 0; at < count; at += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
    ws.plans(shape.fft_length);  // sizes the buffers
    bool poisoned = false;
    const size_t took = read_segment(c, rf, hash, p + used, bytes - used, shape, ws.bins.data(), false, ws, &poisoned);
    if (took == 0) {  // malformed: NaN from here on
      fill_nan(out + at, count - at);
      return nonfinite + (count - at);
    }
    used += took;
    if (poisoned) {
      fill_nan(out + at, shape.length);
      nonfinite += shape.length;
    } else {
      synthesize_segment(shape, ws.bins.data(), out + at, accumulate, ws);
    }
  }
  return nonfinite;
}

size_t fft_spectrum_floats(const CodecConfig& c, size_t count) {
  size_t floats = 0;
  for (size_t at = 0; at < count; at += c.segment) floats += 2 * fft_shape(c, std::min<size_t>(c.segment, count - at)).bins;
  return floats;
}

size_t fft_decode_spectrum(const CodecConfig& c, const void* in, size_t bytes, size_t count, float* spectrum,
                           bool accumulate, FftWorkspace& ws) {
  const RangeFloat rf = range_float_of(c);
  const uint32_t hash = hash32(c);
  const auto* p = static_cast<const uint8_t*>(in);
  size_t used = 0, nonfinite = 0;
  for (size_t at = 0; at < count; at += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
    ws.plans(shape.fft_length);
    auto* bins = reinterpret_cast<kiss_fft_cpx*>(spectrum);
    bool poisoned = false;
    const size_t took = read_segment(c, rf, hash, p + used, bytes - used, shape, bins, accumulate, ws, &poisoned);
    if (took == 0) {  // malformed: NaN from here on
      fill_nan(spectrum, fft_spectrum_floats(c, count - at));
      return nonfinite + (count - at);
    }
    used += took;
    if (poisoned) {
      fill_nan(spectrum, 2 * shape.bins);
      nonfinite += shape.length;
    }
    spectrum += 2 * shape.bins;
  }
  return nonfinite;
}

void fft_synthesize(const CodecConfig& c, const float* spectrum, size_t count, float* out, FftWorkspace& ws) {
  for (size_t at = 0; at < count; at += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
    synthesize_segment(shape, reinterpret_cast<const kiss_fft_cpx*>(spectrum), out + at, false, ws);
    spectrum += 2 * shape.bins;
  }
}

void fft_restore_residual(const CodecConfig& c, const float* saved, const float* sum, size_t count, float* residual) {
  for (size_t at = 0; at < count; at += c.segment) {
    const size_t length = std::min<size_t>(c.segment, count - at);
    if (std::all_of(sum + at, sum + at + length, [](float v) { return std::isfinite(v); })) continue;
    std::copy(saved + at, saved + at + length, residual + at);
  }
}

double fft_break_even_ratio(double comm_rate, double quantize_rate, double fft_rate, double pack_rate,
                            double select_rate) {
  const double denominator = 1.0 - 2.0 * comm_rate * (2.0 / quantize_rate + 1.0 / fft_rate + 1.0 / pack_rate + 1.0 / select_rate);
  return denominator > 0 ? 1.0 / denominator : std::numeric_limits<double>::infinity();
}

}  // namespace qccl::kernels
