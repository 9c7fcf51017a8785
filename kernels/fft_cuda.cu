// The fft codec's CUDA launchers (fft_cuda.h): cuFFT loaded at run time, and the kernels around it.
// The layout and every decision (the scaling, the non-finite test, max=auto's exponent, the exact-K
// selection with ties to the lower bin, the range floats, the bins that underflow, the index form,
// the validation of a payload) are fft_sparse.cc's, one CUDA block per segment where the host loops
// over a segment's bins.
#include "kernels/fft_cuda.h"

#include <cufft.h>
#include <dlfcn.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/fft_sparse.h"
#include "kernels/rfloat.h"

namespace qccl::kernels {

namespace {

// ---- cuFFT, loaded at run time -------------------------------------------------------------------

struct Cufft {
  decltype(&cufftPlanMany) plan_many = nullptr;
  decltype(&cufftSetStream) set_stream = nullptr;
  decltype(&cufftExecR2C) exec_r2c = nullptr;
  decltype(&cufftExecC2R) exec_c2r = nullptr;
  decltype(&cufftDestroy) destroy = nullptr;
  const char* library = "cufft";  // "cufft12" or "cufft11" once loaded: the soname's version
  std::string error;  // why it could not be loaded (then the pointers are null)

  static const Cufft& get() {
    static const Cufft cufft = load();
    return cufft;
  }

 private:
  // The toolkit's cuFFT (CUDA 13's libcufft.so.12), else CUDA 12's (libcufft.so.11, as PyTorch's
  // wheels bring it): the five functions used here have kept their signatures, and cuFFT carries its
  // own CUDA runtime, so a driver new enough for this build runs either.
  static Cufft load() {
    Cufft c;
    const char* name = nullptr;
    void* lib = nullptr;
    for (const char* candidate : {"libcufft.so.12", "libcufft.so.11"}) {
      if ((lib = dlopen(candidate, RTLD_NOW | RTLD_LOCAL))) {
        name = candidate;
        break;
      }
      c.error += std::string(c.error.empty() ? "cannot load " : "; nor ") + candidate + ": " + dlerror();
    }
    if (!lib) return c;
    c.error.clear();
    c.library = name == std::string("libcufft.so.12") ? "cufft12" : "cufft11";
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (!fn && c.error.empty()) c.error = std::string(name) + " has no " + symbol;
    };
    sym(c.plan_many, "cufftPlanMany");
    sym(c.set_stream, "cufftSetStream");
    sym(c.exec_r2c, "cufftExecR2C");
    sym(c.exec_c2r, "cufftExecC2R");
    sym(c.destroy, "cufftDestroy");
    if (!c.error.empty()) c.plan_many = nullptr;  // unusable: available() says why
    return c;
  }
};

thread_local std::string cufft_error;  // cleared by each launcher

// Whether p may be read as a T (the kernels read a spectrum as float2, a length as size_t).
template <class T>
bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(T) == 0;
}

cudaError_t cufft_failed(const char* what, cufftResult r) {
  cufft_error = std::string(what) + " returned cufftResult " + std::to_string(static_cast<int>(r));
  return cudaErrorUnknown;
}

// ---- The segments of a call ------------------------------------------------------------------------

constexpr uint16_t kMagic = 0x5146;
constexpr uint32_t kFlagNonfinite = 1, kFlagIndices = 2;
constexpr unsigned kThreads = 512;  // per segment's block
// Bins per thread in a round of the encoder's compaction (and the decoder's bitmap walk: one bitmap
// byte), so that a segment of 65536 values takes 9 rounds, each two block-wide scans, not 65.
constexpr unsigned kItems = 8;

// The full segments, then at most one shorter tail: [0] describes a full segment, [1] the tail. Passed
// to the kernels by value.
struct Geometry {
  uint32_t n;     // segments
  uint32_t full;  // the first `full` are full
  uint32_t segment;
  uint32_t length[2], fft_length[2], bins[2], keep[2];
  float scale[2];  // 1 / sqrt(fft_length), as the host computes it
  size_t count;

  __host__ __device__ int kind(uint32_t s) const { return s < full ? 0 : 1; }
  __host__ __device__ size_t bin_offset(uint32_t s) const {
    return static_cast<size_t>(s < full ? s : full) * bins[0];
  }
  __host__ __device__ size_t real_offset(uint32_t s) const {
    return static_cast<size_t>(s < full ? s : full) * fft_length[0];
  }
  size_t bins_total() const { return bin_offset(n - 1) + bins[kind(n - 1)]; }
  size_t real_total() const { return real_offset(n - 1) + fft_length[kind(n - 1)]; }
};

Geometry geometry_of(const CodecConfig& c, size_t count) {
  Geometry g{};
  g.count = count;
  g.segment = c.segment;
  g.full = static_cast<uint32_t>(count / c.segment);
  const size_t tail = count % c.segment;
  g.n = g.full + (tail ? 1 : 0);
  const size_t lengths[2] = {c.segment, tail ? tail : c.segment};
  for (int k = 0; k < 2; ++k) {
    const FftShape shape = fft_shape(c, lengths[k]);
    g.length[k] = static_cast<uint32_t>(shape.length);
    g.fft_length[k] = static_cast<uint32_t>(shape.fft_length);
    g.bins[k] = static_cast<uint32_t>(shape.bins);
    g.keep[k] = static_cast<uint32_t>(shape.keep);
    g.scale[k] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.fft_length)));
  }
  return g;
}

// What the kernels need of the codec.
struct Params {
  RangeFloat rf;
  int bits;
  bool range_auto;
  FftIndex index;
  uint32_t hash;

  __device__ bool use_indices(uint32_t bins, size_t count) const {
    if (index != FftIndex::kAuto) return index == FftIndex::kCoo;
    return count * sizeof(uint32_t) < (bins + 7) / 8;
  }
  __device__ size_t payload_bytes(uint32_t bins, size_t count, bool indices) const {
    return kFftHeaderBytes + (indices ? count * sizeof(uint32_t) : (bins + 7) / 8) +
           (2 * count * static_cast<size_t>(bits) + 7) / 8;
  }
};

Params params_of(const CodecConfig& c, uint32_t hash) {
  return Params{make_range_float(c.bits, c.mant, c.range_max, c.rounding == Rounding::kNearest), c.bits,
                c.range_auto, c.index, hash};
}

// Payload bytes at any alignment, little-endian.
__device__ void put16(uint8_t* p, uint32_t v) { p[0] = v & 0xFF, p[1] = (v >> 8) & 0xFF; }
__device__ void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (v >> (8 * i)) & 0xFF;
}
__device__ uint32_t get16(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
__device__ uint32_t get32(const uint8_t* p) {
  return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// ---- Encoding ------------------------------------------------------------------------------------

// real[first .. total) = the segments, each zero-padded to its FFT's length.
__global__ void pad_kernel(const float* __restrict__ in, float* __restrict__ real, Geometry g, size_t first,
                           size_t total) {
  for (size_t i = first + blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t in_full = static_cast<size_t>(g.full) * g.fft_length[0];
    const uint32_t s = i < in_full ? static_cast<uint32_t>(i / g.fft_length[0]) : g.full;
    const size_t at = i - g.real_offset(s);
    real[i] = at < g.length[g.kind(s)] ? in[static_cast<size_t>(s) * g.segment + at] : 0.0f;
  }
}

using BlockScan = cub::BlockScan<uint32_t, kThreads>;
using BlockReduceU = cub::BlockReduce<uint32_t, kThreads>;
using BlockReduceL = cub::BlockReduce<unsigned long long, kThreads>;

// The k-th largest (k from 1) of the `bins` finite non-negative magnitudes, exactly as the host's
// kth_largest: a radix select on the bits (11, 11 and 10 bits, most significant first), each pass
// counting the digit of the values that share the digits chosen so far. Every thread returns it.
__device__ float block_kth_largest(const float* mag, uint32_t bins, uint32_t k) {
  __shared__ uint32_t count[2048];
  __shared__ uint32_t chosen_digit, remaining;
  constexpr int kShift[3] = {21, 10, 0};
  constexpr uint32_t kDigits[3] = {2048, 2048, 1024};
  uint32_t prefix = 0, prefix_mask = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass];
    const uint32_t digits = kDigits[pass], mask = digits - 1;
    for (uint32_t d = threadIdx.x; d < digits; d += blockDim.x) count[d] = 0;
    __syncthreads();
    // Four loads in flight before their counts (one at a time, a pass waited on memory 64 times per
    // thread at the default segment; on an H200 the selection of a 64 MiB call took 10% less. Adding
    // a warp's equal digits once, with __match_any_sync, took 12% more than plain atomics).
    for (uint32_t i0 = threadIdx.x; i0 < bins; i0 += 4 * blockDim.x) {
      uint32_t u[4];
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j) u[j] = i0 + j * blockDim.x < bins ? float_bits(mag[i0 + j * blockDim.x]) : 0u;
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j)
        if (i0 + j * blockDim.x < bins && (u[j] & prefix_mask) == prefix) atomicAdd(&count[(u[j] >> shift) & mask], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l sums the digits of the l-th range from the top; the first lane whose running sum
      // reaches k holds the digit, which it finds as the host's loop does.
      const unsigned lane = threadIdx.x, per = digits / 32;
      const uint32_t hi = digits - 1 - lane * per;
      uint32_t sum = 0;
      for (uint32_t d = hi - per + 1; d <= hi; ++d) sum += count[d];
      uint32_t running = sum;
      for (unsigned o = 1; o < 32; o <<= 1) {
        const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, running, o);
        if (lane >= o) running += up;
      }
      const unsigned first = __ffs(__ballot_sync(0xFFFFFFFFu, running >= k)) - 1;
      if (lane == first) {
        uint32_t left = k - (running - sum), d = hi;
        while (left > count[d]) left -= count[d--];
        chosen_digit = d, remaining = left;
      }
    }
    __syncthreads();
    prefix |= chosen_digit << shift, prefix_mask |= mask << shift;
    k = remaining;
    __syncthreads();  // count and the two words are rewritten by the next pass
  }
  return bits_float(prefix);
}

// One block per segment: scales its bins in place, decides whether it is finite, max=auto's exponent,
// the bins kept and the bins sent (their indices and codes compacted from the segment's first bin
// slot), and the payload's count, flags and size.
__global__ void __launch_bounds__(kThreads)
    select_kernel(float2* __restrict__ bins_all, float* __restrict__ mag_all, Geometry g, Params p,
                  uint32_t* __restrict__ sent_bin, uint16_t* __restrict__ codes, uint8_t* __restrict__ sent_flag,
                  uint32_t* __restrict__ seg_count, uint32_t* __restrict__ seg_flags,
                  unsigned long long* __restrict__ seg_bytes, unsigned long long* nonfinite,
                  unsigned long long* clamped_all) {
  __shared__ union {
    BlockScan::TempStorage scan;
    BlockReduceU::TempStorage reduce_u;
    BlockReduceL::TempStorage reduce_l;
  } temp;
  __shared__ uint32_t largest_all, above_all;
  __shared__ float top_all;
  const uint32_t s = blockIdx.x;
  const int kind = g.kind(s);
  const uint32_t bins = g.bins[kind], keep = g.keep[kind];
  const size_t off = g.bin_offset(s);
  float2* b = bins_all + off;
  float* mag = mag_all + off;

  // The scaled bins and the largest part's bits (NaN and Inf above every finite pattern). The first
  // and last bins of a real signal's transform are real: the host's FFTs write their imaginary parts
  // as exact zeros, and so does this (cuFFT need not).
  uint32_t largest = 0;
  for (uint32_t k = threadIdx.x; k < bins; k += blockDim.x) {
    float2 v = b[k];
    if (k == 0 || k == bins - 1) v.y = 0.0f;
    v.x *= g.scale[kind], v.y *= g.scale[kind];
    b[k] = v;
    largest = max(largest, max(float_bits(v.x) & 0x7FFFFFFFu, float_bits(v.y) & 0x7FFFFFFFu));
  }
  largest = BlockReduceU(temp.reduce_u).Reduce(largest, cuda::maximum<>{});
  if (threadIdx.x == 0) largest_all = largest, top_all = bits_float(largest);
  __syncthreads();
  // The magnitudes, scaled into float32's range as the host's (rfloat.h's magnitude_scale).
  const float mscale = magnitude_scale(largest_all);
  if (largest_all < 0x7F800000u)
    for (uint32_t k = threadIdx.x; k < bins; k += blockDim.x) {
      const float x = b[k].x * mscale, y = b[k].y * mscale;
      mag[k] = x * x + y * y;
    }
  __syncthreads();
  if (largest_all >= 0x7F800000u) {  // NaN or Inf reached the bins: the flag alone (no bitmap is written)
    if (threadIdx.x == 0) {
      seg_count[s] = 0, seg_flags[s] = kFlagNonfinite, seg_bytes[s] = kFftHeaderBytes;
      if (nonfinite) atomicAdd(nonfinite, static_cast<unsigned long long>(g.length[kind]));
    }
    return;
  }
  const int e = p.range_auto ? fft_auto_exponent(top_all) : 0;
  const float unscale = ldexpf(1.0f, -e);

  // The K largest magnitudes, ties to the lower bin: tau, the K-th largest; every bin above it, and
  // the first bins at it until K.
  const bool all = keep >= bins;
  const float tau = all ? 0.0f : block_kth_largest(mag, bins, keep);
  if (!all) {
    uint32_t above = 0;
    for (uint32_t k = threadIdx.x; k < bins; k += blockDim.x) above += mag[k] > tau;
    above = BlockReduceU(temp.reduce_u).Sum(above);
    if (threadIdx.x == 0) above_all = above;
    __syncthreads();
  }
  const uint32_t ties_wanted = all ? 0 : keep - above_all;

  // Bin by bin in order, kItems consecutive bins to a thread and a block's width of those at a time:
  // the ties' ranks, the codes, and the compaction of the bins sent (a bin whose two codes both
  // underflow is not sent). One bin to a thread took 65 rounds of two block-wide scans at the default
  // segment, which a segment's single block waits through: on an H200 the selection took 34% less
  // time on a 4 MiB call (16 segments, the collective's fragment under QCCL_CHUNK_BYTES=4M) and 15%
  // more on a 64 MiB call, whose 256 blocks fill the GPU and pay for a warp's loads that span kItems
  // times the cache lines (docs/PERF.md, "The fft codec on cuFFT").
  uint32_t ties_before = 0, sent_before = 0;
  unsigned long long clamps = 0;
  for (uint32_t base = 0; base < bins; base += blockDim.x * kItems) {
    const uint32_t first = base + threadIdx.x * kItems;
    float m[kItems];
    uint32_t tie[kItems], tie_rank[kItems];
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const uint32_t k = first + i;
      m[i] = k < bins ? mag[k] : 0.0f;
      tie[i] = k < bins && !all && m[i] == tau;
    }
    uint32_t ties_here;
    BlockScan(temp.scan).ExclusiveSum(tie, tie_rank, ties_here);
    __syncthreads();
    uint32_t re[kItems], im[kItems], sent[kItems], position[kItems];
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const uint32_t k = first + i;
      const bool kept = k < bins && (all || m[i] > tau || (tie[i] && ties_before + tie_rank[i] < ties_wanted));
      re[i] = im[i] = sent[i] = 0;
      if (kept) {
        bool clamp_re = false, clamp_im = false;
        const float2 v = b[k];
        re[i] = range_float_encode(p.rf, v.x * unscale, &clamp_re);
        im[i] = range_float_encode(p.rf, v.y * unscale, &clamp_im);
        sent[i] = ((re[i] | im[i]) & ~p.rf.sign) != 0;
        if (sent[i]) clamps += clamp_re + clamp_im;
      }
    }
    uint32_t sent_here;
    BlockScan(temp.scan).ExclusiveSum(sent, position, sent_here);
    __syncthreads();
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const uint32_t k = first + i;
      if (k < bins) sent_flag[off + k] = static_cast<uint8_t>(sent[i]);
      if (sent[i]) {
        const size_t j = off + sent_before + position[i];
        sent_bin[j] = k;
        codes[2 * j] = static_cast<uint16_t>(re[i]), codes[2 * j + 1] = static_cast<uint16_t>(im[i]);
      }
    }
    ties_before += ties_here, sent_before += sent_here;
  }
  const unsigned long long clamped = BlockReduceL(temp.reduce_l).Sum(clamps);
  if (threadIdx.x == 0) {
    const bool indices = p.use_indices(bins, sent_before);
    seg_count[s] = sent_before;
    seg_flags[s] = (indices ? kFlagIndices : 0u) | (uint32_t{static_cast<uint8_t>(static_cast<int8_t>(e))} << 8);
    seg_bytes[s] = p.payload_bytes(bins, sent_before, indices);
    if (clamped_all && clamped) atomicAdd(clamped_all, clamped);
  }
}

// offsets[s] = the bytes of the payloads before segment s; *length = all of them. One block.
__global__ void __launch_bounds__(1024)
    offsets_kernel(const unsigned long long* __restrict__ bytes, uint32_t n, unsigned long long* __restrict__ offsets,
                   size_t* length) {
  using Scan = cub::BlockScan<unsigned long long, 1024>;
  __shared__ Scan::TempStorage temp;
  unsigned long long before = 0;
  for (uint32_t base = 0; base < n; base += 1024) {
    const uint32_t s = base + threadIdx.x;
    unsigned long long at, here;
    Scan(temp).ExclusiveSum(s < n ? bytes[s] : 0ull, at, here);
    __syncthreads();
    if (s < n) offsets[s] = before + at;
    before += here;
  }
  if (threadIdx.x == 0) offsets[n] = before, *length = static_cast<size_t>(before);
}

// One block per segment: the payload at its offset (header, bitmap or indices, packed codes).
__global__ void write_kernel(uint8_t* __restrict__ out, const unsigned long long* __restrict__ offsets, Geometry g,
                             Params p, const uint32_t* __restrict__ sent_bin, const uint16_t* __restrict__ codes,
                             const uint8_t* __restrict__ sent_flag, const uint32_t* __restrict__ seg_count,
                             const uint32_t* __restrict__ seg_flags) {
  const uint32_t s = blockIdx.x;
  const int kind = g.kind(s);
  const uint32_t bins = g.bins[kind], flags = seg_flags[s], count = seg_count[s];
  const size_t off = g.bin_offset(s);
  uint8_t* at = out + offsets[s];
  if (threadIdx.x == 0) {
    put16(at, kMagic), put16(at + 2, flags), put32(at + 4, g.length[kind]), put32(at + 8, count);
    put32(at + 12, p.hash);
  }
  if (flags & kFlagNonfinite) return;
  at += kFftHeaderBytes;
  if (flags & kFlagIndices) {
    for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) put32(at + 4 * size_t{j}, sent_bin[off + j]);
    at += 4 * size_t{count};
  } else {
    const uint32_t bytes = (bins + 7) / 8;
    for (uint32_t q = threadIdx.x; q < bytes; q += blockDim.x) {
      uint32_t v = 0;
      for (uint32_t bit = 0; bit < 8; ++bit)
        if (8 * q + bit < bins && sent_flag[off + 8 * q + bit]) v |= 1u << bit;
      at[q] = static_cast<uint8_t>(v);
    }
    at += bytes;
  }
  // The 2 count codes of `bits` bits from bit 0 (fft_sparse.cc's pack_codes): byte q holds the bits
  // 8q .. 8q + 7 of the run, from the two or three codes that overlap them.
  const size_t n = 2 * size_t{count}, bits = static_cast<size_t>(p.bits), bytes = (n * bits + 7) / 8;
  const uint16_t* c = codes + 2 * off;
  for (size_t q = threadIdx.x; q < bytes; q += blockDim.x) {
    uint64_t v = 0;
    for (size_t j = 8 * q / bits; j < n && j * bits < 8 * q + 8; ++j) {
      const long long shift = static_cast<long long>(j * bits) - static_cast<long long>(8 * q);
      v |= shift >= 0 ? uint64_t{c[j]} << shift : uint64_t{c[j]} >> -shift;
    }
    at[q] = static_cast<uint8_t>(v);
  }
}

// The spectrum the payloads decode to (for error feedback): per segment its bins sent, decoded, the
// others zero. Segments sent as NaN or Inf are skipped (no residual is written then).
__global__ void rebuild_kernel(float2* __restrict__ bins_all, Geometry g, Params p, const uint32_t* __restrict__ sent_bin,
                               const uint16_t* __restrict__ codes, const uint32_t* __restrict__ seg_count,
                               const uint32_t* __restrict__ seg_flags) {
  const uint32_t s = blockIdx.x, flags = seg_flags[s];
  if (flags & kFlagNonfinite) return;
  const size_t off = g.bin_offset(s);
  for (uint32_t k = threadIdx.x; k < g.bins[g.kind(s)]; k += blockDim.x) bins_all[off + k] = float2{0.0f, 0.0f};
  __syncthreads();
  const float scale = ldexpf(1.0f, static_cast<int8_t>(flags >> 8));
  for (uint32_t j = threadIdx.x; j < seg_count[s]; j += blockDim.x) {
    const size_t at = off + j;
    bins_all[off + sent_bin[at]] =
        float2{range_float_decode(p.rf, codes[2 * at]) * scale, range_float_decode(p.rf, codes[2 * at + 1]) * scale};
  }
}

// residual[i] = in[i] - the decoded value i, except in segments that held NaN or Inf.
__global__ void residual_kernel(const float* __restrict__ in, const float* __restrict__ real, float* __restrict__ residual,
                                Geometry g, const uint32_t* __restrict__ seg_flags) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < g.count; i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t s = static_cast<uint32_t>(i / g.segment);
    if (seg_flags[s] & kFlagNonfinite) continue;
    const size_t at = i - static_cast<size_t>(s) * g.segment;
    residual[i] = in[i] - real[g.real_offset(s) + at] * g.scale[g.kind(s)];
  }
}

// ---- Decoding ------------------------------------------------------------------------------------

enum SegmentState : uint32_t { kReadable = 0, kSentNonfinite = 1, kMalformed = 2 };

// One thread walks the headers (each payload's size is in its header): the offset, count and flags
// of every segment, kMalformed from the first one that cannot be read, as fft_sparse.cc's
// read_segment checks it (the index part is checked per segment by unpack_kernel).
__global__ void walk_kernel(const uint8_t* __restrict__ in, const size_t* length, Geometry g, Params p,
                            unsigned long long* __restrict__ seg_offset, uint32_t* __restrict__ seg_count,
                            uint32_t* __restrict__ seg_flags, uint32_t* __restrict__ state, uint32_t* first_bad) {
  const size_t total = *length;
  size_t used = 0;
  uint32_t s = 0;
  for (; s < g.n; ++s) {
    const int kind = g.kind(s);
    const uint8_t* q = in + used;
    const size_t avail = total - used;
    if (avail < kFftHeaderBytes || get16(q) != kMagic || get32(q + 4) != g.length[kind] || get32(q + 12) != p.hash)
      break;
    const uint32_t flags = get16(q + 2), count = get32(q + 8);
    size_t bytes = kFftHeaderBytes;
    if (flags & kFlagNonfinite) {
      if (count != 0) break;
      state[s] = kSentNonfinite;
    } else {
      const bool indices = flags & kFlagIndices;
      if (count > g.keep[kind] || indices != p.use_indices(g.bins[kind], count) || (flags & 0xFC)) break;
      const int e = static_cast<int8_t>(flags >> 8);
      if (p.range_auto ? e < kFftMinExponent || e > fft_largest_auto_exponent(g.scale[kind]) : e != 0) break;
      bytes = p.payload_bytes(g.bins[kind], count, indices);
      if (avail < bytes) break;
      state[s] = kReadable;
    }
    seg_offset[s] = used, seg_count[s] = count, seg_flags[s] = flags;
    used += bytes;
  }
  *first_bad = s;
  for (; s < g.n; ++s) state[s] = kMalformed;
}

// Code j of a run packed from bit 0, reading only the run's `bytes` bytes.
__device__ uint32_t code_at(const uint8_t* run, size_t bytes, size_t j, int bits) {
  const size_t bit = j * static_cast<size_t>(bits), at = bit / 8;
  uint32_t v = 0;
  for (size_t i = 0; i < 3 && at + i < bytes; ++i) v |= uint32_t{run[at + i]} << (8 * i);
  return (v >> (bit % 8)) & ((1u << bits) - 1);
}

// One block per segment: checks its index part, then writes (or adds) its bins; a segment sent as
// NaN or Inf sets its bins to NaN. bad[s] = 1 for an index part that does not read.
__global__ void __launch_bounds__(kThreads)
    unpack_kernel(const uint8_t* __restrict__ in, Geometry g, Params p, const unsigned long long* __restrict__ seg_offset,
                  const uint32_t* __restrict__ seg_count, const uint32_t* __restrict__ seg_flags,
                  const uint32_t* __restrict__ state, float2* __restrict__ spectrum, bool accumulate,
                  uint32_t* __restrict__ bad) {
  __shared__ union {
    BlockScan::TempStorage scan;
    BlockReduceU::TempStorage reduce;
  } temp;
  __shared__ uint32_t wrong;
  const uint32_t s = blockIdx.x;
  if (state[s] == kMalformed) return;
  const int kind = g.kind(s);
  const uint32_t bins = g.bins[kind];
  float2* b = spectrum + g.bin_offset(s);
  if (state[s] == kSentNonfinite) {
    for (uint32_t k = threadIdx.x; k < bins; k += blockDim.x) b[k] = float2{NAN, NAN};
    return;
  }
  const uint8_t* at = in + seg_offset[s] + kFftHeaderBytes;
  const uint32_t flags = seg_flags[s], count = seg_count[s];
  const bool indices = flags & kFlagIndices;
  const uint32_t bitmap_bytes = (bins + 7) / 8;
  if (threadIdx.x == 0) wrong = 0;
  __syncthreads();
  if (indices) {  // increasing, below bins
    for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) {
      const uint32_t k = get32(at + 4 * size_t{j});
      if (k >= bins || (j > 0 && k <= get32(at + 4 * size_t{j - 1}))) wrong = 1;
    }
  } else {  // count bits set, none past the last bin
    uint32_t set = 0;
    for (uint32_t q = threadIdx.x; q < bitmap_bytes; q += blockDim.x) set += __popc(at[q]);
    set = BlockReduceU(temp.reduce).Sum(set);
    if (threadIdx.x == 0 && (set != count || ((bins % 8) && (at[bins / 8] >> (bins % 8))))) wrong = 1;
  }
  __syncthreads();
  if (wrong) {
    if (threadIdx.x == 0) bad[s] = 1;
    return;
  }
  if (!accumulate)
    for (uint32_t k = threadIdx.x; k < bins; k += blockDim.x) b[k] = float2{0.0f, 0.0f};
  __syncthreads();
  const float scale = ldexpf(1.0f, static_cast<int8_t>(flags >> 8));
  const uint8_t* run = at + (indices ? 4 * size_t{count} : bitmap_bytes);
  const size_t run_bytes = (2 * size_t{count} * static_cast<size_t>(p.bits) + 7) / 8;
  auto put = [&](uint32_t k, size_t j) {
    const float re = range_float_decode(p.rf, code_at(run, run_bytes, 2 * j, p.bits)) * scale;
    const float im = range_float_decode(p.rf, code_at(run, run_bytes, 2 * j + 1, p.bits)) * scale;
    float2 v = b[k];
    v.x = accumulate ? v.x + re : re;
    v.y = accumulate ? v.y + im : im;
    b[k] = v;
  };
  if (indices) {
    for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) put(get32(at + 4 * size_t{j}), j);
  } else {
    // A bitmap byte (kItems bins) to a thread, a block's width of bytes at a time (the bits past
    // the last bin were found clear above).
    static_assert(kItems == 8, "a thread walks one bitmap byte");
    uint32_t before = 0;
    for (uint32_t q0 = 0; q0 < bitmap_bytes; q0 += blockDim.x) {
      const uint32_t q = q0 + threadIdx.x;
      const uint32_t byte = q < bitmap_bytes ? at[q] : 0u;
      uint32_t position, here;
      BlockScan(temp.scan).ExclusiveSum(static_cast<uint32_t>(__popc(byte)), position, here);
      __syncthreads();
      for (uint32_t bit = 0, j = before + position; bit < 8; ++bit)
        if ((byte >> bit) & 1u) put(8 * q + bit, j++);
      before += here;
    }
  }
}

// The first segment that does not read (its header or its index part) and the values that decode
// to NaN: those of the segments sent as NaN or Inf before it, and every value from it on. One block.
__global__ void __launch_bounds__(1024)
    settle_kernel(Geometry g, const uint32_t* __restrict__ state, const uint32_t* __restrict__ bad, uint32_t* first_bad,
                  unsigned long long* nonfinite) {
  using ReduceU = cub::BlockReduce<uint32_t, 1024>;
  using ReduceL = cub::BlockReduce<unsigned long long, 1024>;
  __shared__ union {
    ReduceU::TempStorage u;
    ReduceL::TempStorage l;
  } temp;
  __shared__ uint32_t first_all;
  uint32_t first = *first_bad;
  for (uint32_t s = threadIdx.x; s < g.n; s += blockDim.x)
    if (bad[s]) first = min(first, s);
  first = ReduceU(temp.u).Reduce(first, cuda::minimum<>{});
  if (threadIdx.x == 0) first_all = first;
  __syncthreads();
  first = first_all;
  unsigned long long values = 0;
  for (uint32_t s = threadIdx.x; s < first; s += blockDim.x)
    if (state[s] == kSentNonfinite) values += g.length[g.kind(s)];
  values = ReduceL(temp.l).Sum(values);
  if (threadIdx.x == 0) {
    *first_bad = first;
    if (first < g.n) values += g.count - static_cast<size_t>(first) * g.segment;
    if (nonfinite && values) atomicAdd(nonfinite, values);
  }
}

// NaN over the spectrum from the first segment that does not read to the end.
__global__ void poison_kernel(float2* __restrict__ spectrum, Geometry g, size_t total, const uint32_t* first_bad) {
  const uint32_t first = *first_bad;
  if (first >= g.n) return;
  const size_t from = g.bin_offset(first);
  for (size_t i = from + blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x)
    spectrum[i] = float2{NAN, NAN};
}

// out[i] = the inverse transform's value i of its segment, scaled back.
__global__ void unpad_kernel(const float* __restrict__ real, float* __restrict__ out, Geometry g) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < g.count; i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t s = static_cast<uint32_t>(i / g.segment);
    out[i] = real[g.real_offset(s) + (i - static_cast<size_t>(s) * g.segment)] * g.scale[g.kind(s)];
  }
}

// residual = saved over each segment whose sum holds a value that is not finite: a block a segment.
__global__ void restore_kernel(const float* __restrict__ saved, const float* __restrict__ sum,
                               float* __restrict__ residual, size_t count, size_t segment) {
  for (size_t at = blockIdx.x * segment; at < count; at += size_t{gridDim.x} * segment) {
    const size_t end = min(count, at + segment);
    bool poisoned = false;
    for (size_t i = at + threadIdx.x; i < end; i += blockDim.x) poisoned |= !isfinite(sum[i]);
    if (!__syncthreads_or(poisoned)) continue;  // the same answer in every thread of the block
    for (size_t i = at + threadIdx.x; i < end; i += blockDim.x) residual[i] = saved[i];
  }
}

unsigned grid_for(size_t items, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<size_t>((items + threads - 1) / threads, size_t{1} << 15));
}

}  // namespace

// ---- The workspace ---------------------------------------------------------------------------------

struct FftCudaWorkspace {
  struct Plan {
    cufftType type;
    int length, batch;
    cufftHandle handle;
  };
  // Plans kept, each with its own work area in device memory: a job's calls come in a few shapes
  // (segment length, tails, batch), and one that keeps changing shape must not pile them up.
  static constexpr size_t kMaxPlans = 32;
  std::vector<Plan> plans;  // most recently used first
  void* scratch = nullptr;
  size_t capacity = 0;

  // The plan of a batched real transform, made at its first use; the least recently used goes when
  // kMaxPlans are kept, once the stream's work (which may use it) is done.
  cudaError_t plan(cufftType type, uint32_t length, uint32_t batch, cudaStream_t stream, cufftHandle* out) {
    for (size_t i = 0; i < plans.size(); ++i)
      if (plans[i].type == type && plans[i].length == static_cast<int>(length) &&
          plans[i].batch == static_cast<int>(batch)) {
        std::rotate(plans.begin(), plans.begin() + static_cast<std::ptrdiff_t>(i),
                    plans.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        *out = plans.front().handle;
        return cudaSuccess;
      }
    if (plans.size() == kMaxPlans) {
      const cudaError_t e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess) return e;
      Cufft::get().destroy(plans.back().handle);
      plans.pop_back();
    }
    int n = static_cast<int>(length);
    cufftHandle h = 0;
    const cufftResult r = Cufft::get().plan_many(&h, 1, &n, nullptr, 1, 0, nullptr, 1, 0, type, static_cast<int>(batch));
    if (r != CUFFT_SUCCESS) return cufft_failed("cufftPlanMany", r);
    plans.insert(plans.begin(), Plan{type, n, static_cast<int>(batch), h});
    *out = h;
    return cudaSuccess;
  }
  // Scratch of at least `bytes`; growing waits for the stream's work on the old scratch.
  cudaError_t reserve(size_t bytes, cudaStream_t stream) {
    if (bytes <= capacity) return cudaSuccess;
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess && scratch) e = cudaFree(scratch);
    scratch = nullptr, capacity = 0;
    if (e == cudaSuccess) e = cudaMalloc(&scratch, bytes);
    if (e == cudaSuccess) capacity = bytes;
    return e;
  }
};

FftCudaWorkspace* fft_cuda_workspace() { return new FftCudaWorkspace; }

void fft_cuda_release(FftCudaWorkspace* ws) {
  if (!ws) return;
  for (const FftCudaWorkspace::Plan& p : ws->plans) Cufft::get().destroy(p.handle);
  if (ws->scratch) cudaFree(ws->scratch);
  delete ws;
}

bool fft_cuda_available(std::string* why) {
  const Cufft& c = Cufft::get();
  if (c.plan_many) return true;
  if (why) *why = c.error;
  return false;
}

const char* fft_cuda_error() { return cufft_error.c_str(); }

const char* fft_cuda_library() { return Cufft::get().library; }

namespace {

// Scratch carved into arrays, each aligned to 256 bytes: laid out once on no memory to size it, then
// on the workspace's scratch.
class Carve {
 public:
  explicit Carve(void* base = nullptr) : base_(reinterpret_cast<uintptr_t>(base)) {}
  template <typename T>
  T* take(size_t n) {
    const size_t at = used_;
    used_ += (n * sizeof(T) + 255) / 256 * 256;
    return reinterpret_cast<T*>(base_ + at);
  }
  size_t used() const { return used_; }

 private:
  uintptr_t base_;
  size_t used_ = 0;
};

struct EncodeScratch {
  float* real;  // the padded segments, and the decode's inverse transforms (error feedback)
  float2* spectrum;
  float* magnitude;
  uint32_t* sent_bin;
  uint16_t* codes;
  uint8_t* sent_flag;
  uint32_t *seg_count, *seg_flags;
  unsigned long long *seg_bytes, *offsets;

  EncodeScratch(Carve& k, const Geometry& g)
      : real(k.take<float>(g.real_total())),
        spectrum(k.take<float2>(g.bins_total())),
        magnitude(k.take<float>(g.bins_total())),
        sent_bin(k.take<uint32_t>(g.bins_total())),
        codes(k.take<uint16_t>(2 * g.bins_total())),
        sent_flag(k.take<uint8_t>(g.bins_total())),
        seg_count(k.take<uint32_t>(g.n)),
        seg_flags(k.take<uint32_t>(g.n)),
        seg_bytes(k.take<unsigned long long>(g.n)),
        offsets(k.take<unsigned long long>(g.n + 1)) {}
};

struct DecodeScratch {
  unsigned long long* seg_offset;
  uint32_t *seg_count, *seg_flags, *state, *bad, *first_bad;

  DecodeScratch(Carve& k, const Geometry& g)
      : seg_offset(k.take<unsigned long long>(g.n)),
        seg_count(k.take<uint32_t>(g.n)),
        seg_flags(k.take<uint32_t>(g.n)),
        state(k.take<uint32_t>(g.n)),
        bad(k.take<uint32_t>(g.n)),
        first_bad(k.take<uint32_t>(1)) {}
};

struct SynthesisScratch {
  float* real;
  float2* spectrum;  // a copy: cuFFT's inverse real transform overwrites its input

  SynthesisScratch(Carve& k, const Geometry& g)
      : real(k.take<float>(g.real_total())), spectrum(k.take<float2>(g.bins_total())) {}
};

// The scratch arrays of a launcher, on the workspace's memory (grown when needed).
template <typename Scratch>
cudaError_t lay_out(FftCudaWorkspace* ws, const Geometry& g, cudaStream_t stream, std::optional<Scratch>* out) {
  Carve sizing;
  (void)Scratch(sizing, g);
  const cudaError_t e = ws->reserve(sizing.used(), stream);
  if (e != cudaSuccess) return e;
  Carve carve(ws->scratch);
  out->emplace(carve, g);
  return cudaSuccess;
}

// Runs the forward (real -> bins) or inverse (bins -> real) transforms of every segment: one batched
// plan for the full segments, one for the tail.
cudaError_t transform(FftCudaWorkspace* ws, const Geometry& g, cufftType type, float* real, float2* bins,
                      cudaStream_t stream) {
  const Cufft& cufft = Cufft::get();
  const uint32_t batches[2] = {g.full, g.n - g.full};
  for (int kind = 0; kind < 2; ++kind) {
    if (batches[kind] == 0) continue;
    cufftHandle h = 0;
    cudaError_t e = ws->plan(type, g.fft_length[kind], batches[kind], stream, &h);
    if (e != cudaSuccess) return e;
    cufftResult r = cufft.set_stream(h, stream);
    if (r != CUFFT_SUCCESS) return cufft_failed("cufftSetStream", r);
    float* re = real + g.real_offset(kind == 0 ? 0 : g.full);
    auto* cx = reinterpret_cast<cufftComplex*>(bins + g.bin_offset(kind == 0 ? 0 : g.full));
    r = type == CUFFT_R2C ? cufft.exec_r2c(h, re, cx) : cufft.exec_c2r(h, cx, re);
    if (r != CUFFT_SUCCESS) return cufft_failed(type == CUFFT_R2C ? "cufftExecR2C" : "cufftExecC2R", r);
  }
  return cudaSuccess;
}

}  // namespace

// ---- Launchers -------------------------------------------------------------------------------------

cudaError_t fft_encode_cuda(const CodecConfig& c, uint32_t hash, const float* in, size_t count, void* out,
                            size_t* length, float* residual, unsigned long long* nonfinite, unsigned long long* clamped,
                            FftCudaWorkspace* ws, cudaStream_t stream) {
  cufft_error.clear();
  if (c.kind != CodecKind::kFft || !ws || !length || (count && (!in || !out)) || !aligned<size_t>(length))
    return cudaErrorInvalidValue;
  if (count == 0) return cudaMemsetAsync(length, 0, sizeof *length, stream);
  if (!fft_cuda_available(nullptr)) return cudaErrorNotSupported;
  const Geometry g = geometry_of(c, count);
  const Params p = params_of(c, hash);
  std::optional<EncodeScratch> scratch;
  cudaError_t e = lay_out(ws, g, stream, &scratch);
  if (e != cudaSuccess) return e;
  const EncodeScratch& a = *scratch;
  // Full segments whose length is their FFT's need no padding: their part of `real` is the input's,
  // copied at the copy engine's rate; the kernel pads the rest (every segment of another length, else
  // the tail).
  size_t padded_from = 0;
  if (g.full && g.fft_length[0] == g.segment) {
    padded_from = g.real_offset(g.full);
    if ((e = cudaMemcpyAsync(a.real, in, padded_from * sizeof(float), cudaMemcpyDeviceToDevice, stream)) != cudaSuccess)
      return e;
  }
  if (padded_from < g.real_total())
    pad_kernel<<<grid_for(g.real_total() - padded_from), 256, 0, stream>>>(in, a.real, g, padded_from, g.real_total());
  if ((e = transform(ws, g, CUFFT_R2C, a.real, a.spectrum, stream)) != cudaSuccess) return e;
  select_kernel<<<g.n, kThreads, 0, stream>>>(a.spectrum, a.magnitude, g, p, a.sent_bin, a.codes, a.sent_flag,
                                              a.seg_count, a.seg_flags, a.seg_bytes, nonfinite, clamped);
  offsets_kernel<<<1, 1024, 0, stream>>>(a.seg_bytes, g.n, a.offsets, length);
  write_kernel<<<g.n, 256, 0, stream>>>(static_cast<uint8_t*>(out), a.offsets, g, p, a.sent_bin, a.codes, a.sent_flag,
                                        a.seg_count, a.seg_flags);
  if (residual) {
    rebuild_kernel<<<g.n, 256, 0, stream>>>(a.spectrum, g, p, a.sent_bin, a.codes, a.seg_count, a.seg_flags);
    if ((e = transform(ws, g, CUFFT_C2R, a.real, a.spectrum, stream)) != cudaSuccess) return e;
    residual_kernel<<<grid_for(count), 256, 0, stream>>>(in, a.real, residual, g, a.seg_flags);
  }
  return cudaGetLastError();
}

cudaError_t fft_decode_spectrum_cuda(const CodecConfig& c, uint32_t hash, const void* in, const size_t* length,
                                     size_t count, float* spectrum, bool accumulate, unsigned long long* nonfinite,
                                     FftCudaWorkspace* ws, cudaStream_t stream) {
  cufft_error.clear();
  if (c.kind != CodecKind::kFft || !ws || (count && (!in || !length || !spectrum)) || !aligned<size_t>(length) ||
      !aligned<float2>(spectrum))
    return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const Geometry g = geometry_of(c, count);
  const Params p = params_of(c, hash);
  std::optional<DecodeScratch> scratch;
  cudaError_t e = lay_out(ws, g, stream, &scratch);
  if (e != cudaSuccess) return e;
  const DecodeScratch& a = *scratch;
  if ((e = cudaMemsetAsync(a.bad, 0, g.n * sizeof *a.bad, stream)) != cudaSuccess) return e;
  auto* bins = reinterpret_cast<float2*>(spectrum);
  const auto* bytes = static_cast<const uint8_t*>(in);
  walk_kernel<<<1, 1, 0, stream>>>(bytes, length, g, p, a.seg_offset, a.seg_count, a.seg_flags, a.state, a.first_bad);
  unpack_kernel<<<g.n, kThreads, 0, stream>>>(bytes, g, p, a.seg_offset, a.seg_count, a.seg_flags, a.state, bins,
                                              accumulate, a.bad);
  settle_kernel<<<1, 1024, 0, stream>>>(g, a.state, a.bad, a.first_bad, nonfinite);
  poison_kernel<<<grid_for(g.bins_total()), 256, 0, stream>>>(bins, g, g.bins_total(), a.first_bad);
  return cudaGetLastError();
}

cudaError_t fft_synthesize_cuda(const CodecConfig& c, const float* spectrum, size_t count, float* out,
                                FftCudaWorkspace* ws, cudaStream_t stream) {
  cufft_error.clear();
  if (c.kind != CodecKind::kFft || !ws || (count && (!spectrum || !out))) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (!fft_cuda_available(nullptr)) return cudaErrorNotSupported;
  const Geometry g = geometry_of(c, count);
  std::optional<SynthesisScratch> scratch;
  cudaError_t e = lay_out(ws, g, stream, &scratch);
  if (e != cudaSuccess) return e;
  const SynthesisScratch& a = *scratch;
  e = cudaMemcpyAsync(a.spectrum, spectrum, g.bins_total() * sizeof(float2), cudaMemcpyDeviceToDevice, stream);
  if (e != cudaSuccess) return e;
  if ((e = transform(ws, g, CUFFT_C2R, a.real, a.spectrum, stream)) != cudaSuccess) return e;
  unpad_kernel<<<grid_for(count), 256, 0, stream>>>(a.real, out, g);
  return cudaGetLastError();
}

cudaError_t fft_restore_residual_cuda(const CodecConfig& c, const float* saved, const float* sum, size_t count,
                                      float* residual, cudaStream_t stream) {
  if (c.kind != CodecKind::kFft || c.segment == 0 || (count && (!saved || !sum || !residual)))
    return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  restore_kernel<<<grid_for(count, c.segment), 256, 0, stream>>>(saved, sum, residual, count, c.segment);
  return cudaGetLastError();
}

}  // namespace qccl::kernels
