// CUDA launchers of codec_cuda.h. The kernels index, load, store and count; every number comes from
// the QCCL_HD element functions of quant.h, philox.h and half.h, exactly as in codec.cc and
// convert.cc. This file is built with --fmad=false (kernels/CMakeLists.txt): nvcc would otherwise fuse
// m.min + m.step * c and acc + v into FMAs, which round once where the host rounds twice.
//
// Work split:
//   q encode   a team of threads per bucket: one per group of 8 values, rounded up to a power of
//              two, at most 256; 256-thread blocks hold 256 / team buckets (bucket=512: 64 threads,
//              4 buckets). The team reduces the range (shuffles, plus one shared slot per warp for
//              teams wider than a warp), then each thread turns its groups of 8 values
//              into 8 codes and packs them into `bits` bytes. For buckets of up to 2048 values each
//              thread holds one group, kept in registers: every value is read from memory once.
//   q decode   one thread per group of 8 values over the whole run (grid-stride), which balances
//              whatever the bucket size.
//   casts      one thread per value (grid-stride).
//   aq         a CUDA block per tile of 32 channels of a block for the scales (rows split among its
//              threads), then a thread per group of 8 values.
// The bit width is a template parameter, so that pack8/unpack8 unroll into registers and the
// packed bytes move with the widest store the offsets allow (kBits bytes per group: 8 -> one u64).
#include "kernels/codec_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/aq_quant.h"
#include "kernels/feedback.h"
#include "kernels/half.h"
#include "kernels/int_codec.h"
#include "kernels/philox.h"
#include "kernels/quant.h"
#include "kernels/sign.h"

namespace qccl::kernels {

namespace {

constexpr unsigned kFlatThreads = 256;             // block size of the grid-stride kernels
constexpr unsigned kMaxFlatBlocks = 1u << 15;      // beyond this, threads loop
constexpr unsigned kEncodeThreads = 256;           // q encode: block size, and threads per bucket at most
constexpr unsigned kMaxEncodeBlocks = 1u << 20;    // q encode: beyond this, blocks loop over buckets
// q encode: resident blocks per multiprocessor asked of the register allocator (40 registers instead
// of 58 and 4 blocks; the stochastic and shift kernels spill a few): on an H200 at 64 MiB q8 encoded at
// 1,086-1,098 GB/s against 994-997 with 4 blocks, 5 blocks gave 1,071-1,074 and 8 blocks 1,078-1,079
// (one kernel for every rounding then); 8 blocks for the nearest kernel alone (32 registers, spilling)
// ran at its 6-block rate (docs/PERF.md).
constexpr unsigned kEncodeBlocksPerSM = 6;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// ---- Counting non-finite values --------------------------------------------------------------------

// Adds every thread's n to *counter with one atomic per warp that has something to add. Every thread
// of the block must call it: it shuffles across full warps (block sizes are multiples of 32).
__device__ void count_add(unsigned long long* counter, unsigned long long n) {
  if (counter == nullptr) return;  // the same for the whole launch
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(kFullWarp, n, o);
  if ((threadIdx.x & 31u) == 0 && n != 0) atomicAdd(counter, n);
}

// ---- q encode: the bucket's range ------------------------------------------------------------------------

// The bucket minimum and maximum as codec.cc defines them (codec-inl.h, ScanBucket): IEEE 754-2019
// order, -0 below +0, computed on integer keys, so that the meta's bits cannot depend on the order
// of the reduction. NaN and Inf land beyond every finite key (+Inf, +NaN at or above kPosInfKey,
// -Inf, -NaN at or below kNegInfKey), which makes finiteness a comparison of the two results.
constexpr int32_t kPosInfKey = 0x7F800000;
constexpr int32_t kNegInfKey = -1 - 0x7F800000;

__device__ int32_t order_key(float x) {
  const int32_t bits = __float_as_int(x);
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);  // x <= -0: -1 - |x|'s bits
}

__device__ float float_from_key(int32_t key) { return __int_as_float(key < 0 ? key ^ 0x7FFFFFFF : key); }

struct KeyRange {
  int32_t lo, hi;
};

// The KeyRange of a team's bucket, in every thread of the team. A team is `team` consecutive threads
// (a power of two, at most kEncodeThreads, aligned to its size). Every thread of the block calls it,
// equally often: it shuffles across full warps and, for teams wider than a warp, synchronizes.
__device__ KeyRange team_range(KeyRange r, unsigned team) {
  for (unsigned o = (team < 32 ? team : 32) / 2; o > 0; o >>= 1) {  // xor < team stays in the team
    r.lo = min(r.lo, __shfl_xor_sync(kFullWarp, r.lo, o));
    r.hi = max(r.hi, __shfl_xor_sync(kFullWarp, r.hi, o));
  }
  if (team > 32) {
    __shared__ KeyRange per_warp[kEncodeThreads / 32];
    const unsigned warps = team / 32, warp = threadIdx.x / 32, first = warp / warps * warps;
    if (threadIdx.x % 32 == 0) per_warp[warp] = r;
    __syncthreads();
    r = per_warp[first];
    for (unsigned w = first + 1; w < first + warps; ++w) r.lo = min(r.lo, per_warp[w].lo), r.hi = max(r.hi, per_warp[w].hi);
    __syncthreads();  // per_warp is rewritten for the block's next buckets
  }
  return r;
}

// ---- q encode/decode: moving 8 values and kBits packed bytes -------------------------------------------

__device__ uint32_t word(const PhiloxBlock& r, unsigned j) {
  j &= 3;
  return j == 0 ? r.v[0] : j == 1 ? r.v[1] : j == 2 ? r.v[2] : r.v[3];
}

// The stochastic uniforms of elements e0 .. e0+7: philox_uniform(key, e0 + i), from the 2 or 3
// Philox blocks that cover them rather than 8 calls. e0 & 3 is the same for every group of a
// launch (buckets and groups start at multiples of 8), so the branch does not diverge.
__device__ void uniforms8(const PhiloxKey& key, uint64_t e0, float u[8]) {
  const unsigned off = static_cast<unsigned>(e0 & 3);
  const PhiloxBlock r0 = philox4x32_10(key, e0 >> 2), r1 = philox4x32_10(key, (e0 >> 2) + 1);
  const PhiloxBlock r2 = off ? philox4x32_10(key, (e0 >> 2) + 2) : PhiloxBlock{{0, 0, 0, 0}};
#pragma unroll
  for (unsigned i = 0; i < 8; ++i) {
    const unsigned j = off + i;  // word j of r0, r1, r2, picked by value selects (no local array)
    u[i] = uniform_from_bits(j < 4 ? word(r0, j) : j < 8 ? word(r1, j) : word(r2, j));
  }
}

// Loads the n (<= 8) values at p, zero beyond; `vec` says p is 16-byte aligned.
__device__ void load8(const float* __restrict__ p, unsigned n, bool vec, float v[8]) {
  if (n == 8 && vec) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (unsigned i = 0; i < 8; ++i) v[i] = i < n ? p[i] : 0.0f;
}

// p[i] = v[i] (or p[i] += v[i]) for i < n; `vec` says p is 16-byte aligned.
template <bool kAccumulate>
__device__ void store8(float* __restrict__ p, unsigned n, bool vec, const float v[8]) {
  if (n == 8 && vec) {
    float4 a = make_float4(v[0], v[1], v[2], v[3]), b = make_float4(v[4], v[5], v[6], v[7]);
    if (kAccumulate) {
      const float4 pa = reinterpret_cast<const float4*>(p)[0], pb = reinterpret_cast<const float4*>(p)[1];
      a = make_float4(pa.x + a.x, pa.y + a.y, pa.z + a.z, pa.w + a.w);
      b = make_float4(pb.x + b.x, pb.y + b.y, pb.z + b.z, pb.w + b.w);
    }
    reinterpret_cast<float4*>(p)[0] = a, reinterpret_cast<float4*>(p)[1] = b;
    return;
  }
#pragma unroll
  for (unsigned i = 0; i < 8; ++i)
    if (i < n) p[i] = kAccumulate ? p[i] + v[i] : v[i];
}

// A group's kBits packed bytes start kBits * group bytes after an 8-byte boundary (the meta block
// is a multiple of 8 bytes), so they are aligned to kBits' lowest set bit: the unit moved at once.
template <int kBits>
using CodeUnit = std::conditional_t<kBits % 8 == 0, uint64_t,
                                    std::conditional_t<kBits % 4 == 0, uint32_t,
                                                       std::conditional_t<kBits % 2 == 0, uint16_t, uint8_t>>>;

// `aligned`: the encoded buffer starts on an 8-byte boundary. Otherwise codes and metas move a byte
// at a time: codec.h lets an encoded buffer start anywhere.
template <int kBits>
__device__ void store_codes(uint8_t* dst, const uint8_t packed[8], bool aligned) {
  using U = CodeUnit<kBits>;
  if (aligned) {
#pragma unroll
    for (int b = 0; b < kBits; b += static_cast<int>(sizeof(U))) {
      U u;
      memcpy(&u, packed + b, sizeof(U));
      *reinterpret_cast<U*>(dst + b) = u;
    }
    return;
  }
#pragma unroll
  for (int b = 0; b < kBits; ++b) dst[b] = packed[b];
}

template <int kBits>
__device__ void load_codes(const uint8_t* src, bool aligned, uint8_t packed[8]) {
  using U = CodeUnit<kBits>;
  if (aligned) {
#pragma unroll
    for (int b = 0; b < kBits; b += static_cast<int>(sizeof(U))) {
      const U u = *reinterpret_cast<const U*>(src + b);
      memcpy(packed + b, &u, sizeof(U));
    }
    return;
  }
#pragma unroll
  for (int b = 0; b < kBits; ++b) packed[b] = src[b];
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- q kernels -------------------------------------------------------------------------------------------

// A team of `team` threads per bucket, kEncodeThreads / team buckets per block. Thread t of a team
// takes the groups t, t + team, ... of 8 values; when that is one group (buckets of up to 8 * team
// values: the usual case) its values stay in registers between the two phases.
// Learned levels (levels.h: levels.count > 0) are looked up in a copy of the table in shared memory;
// the parameter itself stays in the constant bank (__grid_constant__), never copied per thread.
__device__ void share_levels(const LevelPositions& levels, float* shared) {
  if (levels.count == 0) return;
  for (unsigned i = threadIdx.x; i < levels.count; i += blockDim.x) shared[i] = levels.g[i];
  __syncthreads();
}

// The rounding is a template parameter: a kernel for round to nearest that carried the Philox code of
// stochastic rounding spilled registers and encoded q8 at 0.58 of a device copy on an H200, 0.70
// without it (docs/PERF.md).
template <int kBits, Rounding kRounding>
__global__ void __launch_bounds__(kEncodeThreads, kEncodeBlocksPerSM)
    encode_quant_kernel(const float* __restrict__ in, size_t count, uint8_t* __restrict__ out, unsigned bucket,
                        unsigned team, PhiloxKey key, uint64_t first, bool in_vec,
                        bool out_aligned, unsigned long long* nonfinite, const __grid_constant__ LevelPositions levels) {
  __shared__ float level_g[256];
  share_levels(levels, level_g);
  auto* metas = reinterpret_cast<BucketMeta*>(out);
  uint8_t* codes = out + quant_meta_bytes(count, bucket);
  const size_t buckets = quant_buckets(count, bucket);
  const unsigned teams = kEncodeThreads / team, t = threadIdx.x & (team - 1);
  // The loop condition is the same for the whole block (team_range may synchronize it); teams past
  // the last bucket run it with len = 0.
  for (size_t k0 = blockIdx.x * size_t{teams}; k0 < buckets; k0 += size_t{gridDim.x} * teams) {
    const size_t k = k0 + threadIdx.x / team;
    const size_t b0 = k * bucket;
    const unsigned len = k >= buckets ? 0u : count - b0 < bucket ? static_cast<unsigned>(count - b0) : bucket;
    const float* x = in + (k >= buckets ? 0 : b0);
    KeyRange r{INT32_MAX, INT32_MIN};
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (unsigned g = t; g * 8 < len; g += team) {
      const unsigned n = len - g * 8 < 8 ? len - g * 8 : 8u;
      load8(x + g * 8, n, in_vec, v);
#pragma unroll
      for (unsigned i = 0; i < 8; ++i)
        if (i < n) r.lo = min(r.lo, order_key(v[i])), r.hi = max(r.hi, order_key(v[i]));
    }
    r = team_range(r, team);
    if (len == 0) continue;
    const float lo = float_from_key(r.lo), hi = float_from_key(r.hi);
    // bucket_meta also marks a range or top code that overflows float32 as non-finite (quant.h).
    const bool finite = r.lo > kNegInfKey && r.hi < kPosInfKey;
    const BucketMeta m = bucket_meta(lo, hi, finite, kBits);
    if (t == 0) {
      if (out_aligned) metas[k] = m;
      else memcpy(out + k * sizeof(BucketMeta), &m, sizeof m);  // byte by byte
      if (meta_is_nonfinite(m) && nonfinite) atomicAdd(nonfinite, 1ull);
    }
    const bool reload = len > 8 * team;
    uint8_t* dst = codes + b0 / 8 * kBits;
    for (unsigned g = t; g * 8 < len; g += team) {
      const unsigned n = len - g * 8 < 8 ? len - g * 8 : 8u;
      if (reload) load8(x + g * 8, n, in_vec, v);
      float u[8];
      if constexpr (kRounding == Rounding::kStochastic) {
        uniforms8(key, first + b0 + g * 8, u);
      } else {
        // round=shift: the bucket's one uniform (quant.h); nearest: 1/2 (learned levels: -1, levels.h).
        const float shared = kRounding == Rounding::kShift ? philox_uniform(key, shift_uniform_index(first + b0))
                             : levels.count                ? -1.0f
                                                           : 0.5f;
#pragma unroll
        for (int i = 0; i < 8; ++i) u[i] = shared;
      }
      // The bucket's cases apart, so that a full group of even levels tests nothing per value (a test
      // per value was a branch per value). Codes past n stay 0, as do a bucket's of equal values.
      uint32_t group[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (levels.count) {
#pragma unroll
        for (unsigned i = 0; i < 8; ++i)
          if (i < n) group[i] = quantize_with_levels(v[i], m, u[i], level_g, levels.count);
      } else if (m.step > 0.0f && n == 8) {
#pragma unroll
        for (unsigned i = 0; i < 8; ++i) group[i] = quantize_stepped(v[i], m, u[i], quant_levels(kBits));
      } else if (m.step > 0.0f) {
#pragma unroll
        for (unsigned i = 0; i < 8; ++i)
          if (i < n) group[i] = quantize_stepped(v[i], m, u[i], quant_levels(kBits));
      }
      uint8_t packed[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      pack8(group, kBits, packed);
      store_codes<kBits>(dst + static_cast<size_t>(g) * kBits, packed, out_aligned);
    }
  }
}

template <int kBits, bool kAccumulate>
__global__ void decode_quant_kernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ out,
                                    unsigned bucket, bool in_aligned, bool out_vec,
                                    unsigned long long* nonfinite, const __grid_constant__ LevelPositions levels) {
  __shared__ float level_g[256];
  share_levels(levels, level_g);
  const uint8_t* codes = in + quant_meta_bytes(count, bucket);
  const size_t groups = (count + 7) / 8;
  const unsigned groups_per_bucket = bucket / 8;
  unsigned long long bad = 0;
  for (size_t gi = blockIdx.x * size_t{blockDim.x} + threadIdx.x; gi < groups; gi += size_t{gridDim.x} * blockDim.x) {
    // A 64-bit division costs several times a 32-bit one; runs of 2^35 values are rare.
    const size_t k = gi <= 0xFFFFFFFFu ? static_cast<unsigned>(gi) / groups_per_bucket : gi / groups_per_bucket;
    BucketMeta m;
    if (in_aligned) {
      const float2 meta = __ldg(reinterpret_cast<const float2*>(in) + k);
      m = BucketMeta{meta.x, meta.y};
    } else {
      memcpy(&m, in + k * sizeof(BucketMeta), sizeof m);  // byte by byte
    }
    uint8_t packed[8];
    load_codes<kBits>(codes + gi * kBits, in_aligned, packed);
    uint32_t c[8];
    unpack8(packed, kBits, c);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = levels.count ? dequantize_from_levels(c[i], m, level_g) : dequantize(c[i], m);
    const unsigned n = count - gi * 8 < 8 ? static_cast<unsigned>(count - gi * 8) : 8u;
    if (meta_is_nonfinite(m)) bad += n;
    store8<kAccumulate>(out + gi * 8, n, out_vec, v);
  }
  count_add(nonfinite, bad);
}

// ---- Cast kernels (also the conversions of convert.h) -----------------------------------------------

template <CodecKind kKind>
__device__ float widen(const void* in, size_t i) {
  if constexpr (kKind == CodecKind::kFp16) return half_to_float(static_cast<const uint16_t*>(in)[i]);
  else if constexpr (kKind == CodecKind::kBf16) return bf16_to_float(static_cast<const uint16_t*>(in)[i]);
  else return static_cast<const float*>(in)[i];
}

template <CodecKind kKind>
__global__ void encode_cast_kernel(const float* __restrict__ in, size_t n, void* __restrict__ out,
                                   unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    if constexpr (kKind == CodecKind::kNone) {
      static_cast<float*>(out)[i] = in[i];
    } else {
      static_cast<uint16_t*>(out)[i] = kKind == CodecKind::kFp16 ? float_to_half(in[i]) : float_to_bf16(in[i]);
    }
    bad += isfinite(widen<kKind>(out, i)) ? 0 : 1;  // as codec.cc: the value that was sent
  }
  count_add(nonfinite, bad);
}

template <CodecKind kKind, bool kAccumulate>
__global__ void decode_cast_kernel(const void* __restrict__ in, size_t n, float* __restrict__ out,
                                   unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float v = widen<kKind>(in, i);
    bad += isfinite(v) ? 0 : 1;
    out[i] = kAccumulate ? out[i] + v : v;
  }
  count_add(nonfinite, bad);
}

// ---- Marsit's sign codec (sign.h), a thread per value or per 32-value word ---------------------------

// A warp per 32-value word, a lane per value: the warp's loads are coalesced (a thread walking its
// own 32 values touched 32 cache lines per load instruction and ran at 2% of a copy's rate on an
// H200), and one ballot gathers lane b's sign into bit b. w is the same in the whole warp, so every
// lane reaches the ballots; lanes past n vote 0, the host's pad bits.
__global__ void pack_signs_kernel(const float* __restrict__ u, Compensation c, size_t first, size_t n,
                                  uint32_t* __restrict__ words, float* __restrict__ backup,
                                  unsigned long long* nonfinite) {
  const unsigned lane = threadIdx.x & 31u;
  const size_t warps = size_t(gridDim.x) * blockDim.x / 32;
  for (size_t w = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) / 32; w * 32 < n; w += warps) {
    const size_t i = w * 32 + lane, j = first + i;
    bool positive = false, bad = false;
    if (i < n) {
      float x = u[i];
      if (c.stored) {
        if (backup) backup[i] = c.stored[j];
        x += compensation_value(c.stored[j], c.words[j / 32], static_cast<unsigned>(j % 32), c.eta[j / 32]);
        c.stored[j] = x;
      }
      positive = sign_bit(x) != 0;
      bad = !isfinite(x);
    }
    const uint32_t word = __ballot_sync(kFullWarp, positive);
    const uint32_t bad_lanes = __ballot_sync(kFullWarp, bad);
    if (lane == 0) {
      words[w] = word;
      if (bad_lanes && nonfinite) atomicAdd(nonfinite, static_cast<unsigned long long>(__popc(bad_lanes)));
    }
  }
}

__global__ void merge_signs_kernel(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                                   PhiloxKey key, uint64_t first_word) {
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < nwords; w += size_t(gridDim.x) * blockDim.x)
    out[w] = marsit_merge(a[w], s[w], k, key, first_word + w);
}

// The decode's grid-stride loop, shared by the plain and the checked kernel.
template <bool kAccumulate>
__device__ void decode_signs_run(const uint32_t* __restrict__ words, size_t n, float eta, float* __restrict__ g,
                                 Compensation c, size_t first) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = sign_value(words[i / 32], static_cast<unsigned>(i % 32), eta);
    if (c.stored && i % 32 == 0) c.words[(first + i) / 32] = words[i / 32], c.eta[(first + i) / 32] = eta;
    g[i] = kAccumulate ? g[i] + v : v;
  }
}

template <bool kAccumulate>
__global__ void decode_signs_kernel(const uint32_t* __restrict__ words, size_t n, float eta, float* __restrict__ g,
                                    Compensation c, size_t first) {
  decode_signs_run<kAccumulate>(words, n, eta, g, c, first);
}

__global__ void decode_signs_checked_kernel(const uint32_t* __restrict__ words, size_t n, float eta,
                                            float* __restrict__ g, Compensation c, size_t first,
                                            const float* __restrict__ backup, const unsigned long long* taint,
                                            bool tainted, unsigned long long* nonfinite) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  if (tainted || (taint != nullptr && *taint != 0)) {  // a NaN or Inf in the fragment: no finite garbage, c kept
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
      g[i] = __int_as_float(0x7FC00000);
      if (c.stored) c.stored[first + i] = backup[i];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0 && nonfinite != nullptr) atomicAdd(nonfinite, static_cast<unsigned long long>(n));
    return;
  }
  decode_signs_run<false>(words, n, eta, g, c, first);
}

__global__ void add_compensation_kernel(const float* x, Compensation c, size_t first, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t j = first + i;
    const float cj = compensation_value(c.stored[j], c.words[j / 32], static_cast<unsigned>(j % 32), c.eta[j / 32]);
    out[i] = x ? x[i] + cj : cj;
  }
}

__global__ void reset_compensation_kernel(const float* __restrict__ g, Compensation c, size_t first, size_t n,
                                          unsigned long long* nonfinite) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t j = first + i;
    if (isfinite(g[i])) c.stored[j] = sign_value(c.words[j / 32], static_cast<unsigned>(j % 32), c.eta[j / 32]);
    else ++bad;
  }
  count_add(nonfinite, bad);
}

// ---- IntSGD's integer codec (int_codec.h), one thread per value ------------------------------------

template <typename TWire>
__global__ void int_encode_kernel(const float* __restrict__ x, size_t n, float alpha, bool stochastic, IntClip clip,
                                  PhiloxKey key, uint64_t first, TWire* __restrict__ out,
                                  unsigned long long* clipped, unsigned long long* nonfinite) {
  unsigned long long clips = 0, bad = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    bool c = false, nf = false;
    const float u = stochastic ? philox_uniform(key, first + i) : 0.0f;
    out[i] = static_cast<TWire>(int_encode_value(x[i], alpha, u, stochastic, clip, &c, &nf));
    clips += c, bad += nf;
  }
  count_add(clipped, clips);
  count_add(nonfinite, bad);
}

template <typename TUnsigned>
__global__ void int_add_kernel(const TUnsigned* in, TUnsigned* acc, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    acc[i] = static_cast<TUnsigned>(acc[i] + in[i]);  // modulo 2^bits, as the host's unsigned lanes
}

template <typename TWire, bool kAccumulate>
__global__ void int_decode_kernel(const TWire* __restrict__ in, size_t n, double scale, float* __restrict__ out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float v = int_decode_value(in[i], scale);
    out[i] = kAccumulate ? out[i] + v : v;
  }
}

// IntSGD's decode of one fragment's sums inside a collective: NaN where the fragment is tainted (the
// host's flag or the device's word, read here so that no host round trip decides it), else the
// decoded values and int_accumulate_sums's exact integer sums, a block's at a time: its threads' 128-bit
// sums of squares meet in shared memory and go to the counters in one pair of atomics (a carry out of
// the low word, seen as the atomic's old value wrapping, adds one to the high word), so the result is
// the host's whatever the order.
template <typename TWire>
__global__ void int_decode_sums_kernel(const TWire* __restrict__ in, size_t n, double scale, float* __restrict__ out,
                                       const unsigned long long* taint, bool tainted, unsigned long long* squares,
                                       unsigned long long* max_abs, unsigned long long* nonfinite) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  if (tainted || (taint != nullptr && *taint != 0)) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += stride) out[i] = __int_as_float(0x7FC00000);
    if (blockIdx.x == 0 && threadIdx.x == 0 && nonfinite != nullptr) atomicAdd(nonfinite, static_cast<unsigned long long>(n));
    return;
  }
  unsigned long long lo = 0, hi = 0, most = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    const long long v = in[i];
    out[i] = int_decode_value(in[i], scale);
    const auto square = static_cast<unsigned long long>(v * v);
    lo += square;
    hi += lo < square ? 1 : 0;
    const auto magnitude = static_cast<unsigned long long>(v < 0 ? -v : v);
    most = magnitude > most ? magnitude : most;
  }
  __shared__ unsigned long long block_lo[kFlatThreads], block_hi[kFlatThreads], block_most[kFlatThreads];
  block_lo[threadIdx.x] = lo, block_hi[threadIdx.x] = hi, block_most[threadIdx.x] = most;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const unsigned other = threadIdx.x + half;
      const unsigned long long sum = block_lo[threadIdx.x] + block_lo[other];
      block_hi[threadIdx.x] += block_hi[other] + (sum < block_lo[other] ? 1 : 0);
      block_lo[threadIdx.x] = sum;
      if (block_most[other] > block_most[threadIdx.x]) block_most[threadIdx.x] = block_most[other];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const unsigned long long old = atomicAdd(&squares[0], block_lo[0]);
  const unsigned long long carry = old + block_lo[0] < old ? 1 : 0;
  if (block_hi[0] + carry) atomicAdd(&squares[1], block_hi[0] + carry);
  atomicMax(max_abs, block_most[0]);
}

__global__ void add_counter_kernel(unsigned long long* acc, const unsigned long long* add) { *acc += *add; }

struct SmallBytes {
  uint8_t b[16];
};
__global__ void write_bytes_kernel(uint8_t* dst, SmallBytes bytes, unsigned n) {
  for (unsigned i = 0; i < n; ++i) dst[i] = bytes.b[i];
}

// Error feedback's miss, as the host executor computes it (feedback.h).
__global__ void feedback_residual_kernel(const float* __restrict__ acc, float* __restrict__ residual, size_t n,
                                         float factor) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    residual[i] = feedback_miss(acc[i], residual[i], factor);
}

__global__ void divide_kernel(float* x, size_t n, float divisor) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    x[i] /= divisor;
}

// ---- The fft codec's range floats (rfloat.h), one thread per value --------------------------------------

__global__ void range_float_encode_kernel(RangeFloat r, const float* __restrict__ in, size_t n,
                                          uint32_t* __restrict__ codes, unsigned long long* clamped) {
  unsigned long long beyond = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    bool c = false;
    codes[i] = range_float_encode(r, in[i], &c);
    beyond += c;
  }
  count_add(clamped, beyond);
}

__global__ void range_float_decode_kernel(RangeFloat r, const uint32_t* __restrict__ codes, size_t n,
                                          float* __restrict__ out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = range_float_decode(r, codes[i]);
}

// ---- AQ-SGD's quantizer (aq_quant.h) ---------------------------------------------------------------------

// Two launches per encode: the scales (aq_scales_kernel below), then the codes (a thread per group
// of 8 values, which fill `bits` whole bytes, as decode reads them back). Blocks
// before the last are whole, so block b starts at b times a whole block's bytes. Scales and codes are
// moved a byte at a time: a block may start at any byte.

struct AqShape {
  size_t count;        // values in the run
  size_t block;        // values per block (the last may have fewer)
  size_t block_bytes;  // bytes of a whole block
  uint32_t channels;
  int bits;
};

__device__ float aq_load_scale(const uint8_t* p, size_t ch) {
  return aq_scale_value(static_cast<uint16_t>(p[2 * ch] | (p[2 * ch + 1] << 8)));
}

// A CUDA block per (block of the run, tile of up to 32 channels): its threads are lanes (a channel
// each) times phases (rows phase, phase + phases, ...), so that a warp reads consecutive channels of
// a row, and the phases' maxima meet in shared memory. The maximum is taken on |x|'s bits as
// integers, as on the host (NaN above Inf above every finite value).
constexpr unsigned kAqScaleThreads = 256;
constexpr unsigned kAqChannelTile = 32;

__global__ void __launch_bounds__(kAqScaleThreads)
    aq_scales_kernel(const float* __restrict__ in, AqShape a, size_t tiles_per_block, uint8_t* __restrict__ out,
                     unsigned long long* nonfinite) {
  __shared__ uint32_t partial[kAqScaleThreads];
  const size_t b = blockIdx.x / tiles_per_block;
  const size_t c0 = blockIdx.x % tiles_per_block * kAqChannelTile;
  const size_t n = min(a.block, a.count - b * a.block);
  const size_t h = aq_block_scales(n, a.channels);
  if (c0 >= h) return;  // a tile past a short last block's channels (the whole CUDA block returns)
  const unsigned lanes = static_cast<unsigned>(min(size_t{kAqChannelTile}, h - c0));
  const unsigned phases = kAqScaleThreads / lanes;
  const unsigned lane = threadIdx.x % lanes, phase = threadIdx.x / lanes;
  uint32_t m = 0;
  if (phase < phases) {
    const float* x = in + b * a.block + c0 + lane;
    const size_t stride = static_cast<size_t>(phases) * a.channels;
    for (size_t j = static_cast<size_t>(phase) * a.channels; c0 + lane + j < n; j += stride)
      m = max(m, __float_as_uint(x[j]) & 0x7FFFFFFFu);
  }
  partial[threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.x < lanes) {
    for (unsigned p = 1; p < phases; ++p) m = max(m, partial[p * lanes + threadIdx.x]);
    const uint16_t s = aq_scale_bits(__uint_as_float(m));
    uint8_t* q = out + b * a.block_bytes + 2 * (c0 + threadIdx.x);
    q[0] = static_cast<uint8_t>(s), q[1] = static_cast<uint8_t>(s >> 8);
    if (aq_scale_is_nonfinite(s) && nonfinite) atomicAdd(nonfinite, 1ull);
  }
}

// Group g of a run (8 values from j of block b, n values in that block): where its block's scales
// and its codes are. False when g lies past a short last block's values.
struct AqGroup {
  size_t b, j, n, values, code_offset, scale_offset;
  __device__ bool at(const AqShape& a, size_t g) {
    const size_t groups_per_block = (a.block + 7) / 8;
    b = g / groups_per_block, j = g % groups_per_block * 8;
    n = min(a.block, a.count - b * a.block);
    if (j >= n) return false;
    values = min(size_t{8}, n - j);
    scale_offset = b * a.block_bytes;
    code_offset = scale_offset + 2 * aq_block_scales(n, a.channels) + j / 8 * a.bits;
    return true;
  }
};

__device__ size_t aq_groups(const AqShape& a) { return (a.count + a.block - 1) / a.block * ((a.block + 7) / 8); }

__global__ void aq_codes_kernel(const float* __restrict__ in, AqShape a, bool stochastic, PhiloxKey key,
                                uint64_t first, uint8_t* __restrict__ out) {
  AqGroup q;
  const size_t groups = aq_groups(a), threads = size_t(gridDim.x) * blockDim.x;
  for (size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x; g < groups; g += threads) {
    if (!q.at(a, g)) continue;
    const uint8_t* scales = out + q.scale_offset;
    uint64_t word = 0;
    for (size_t i = 0; i < q.values; ++i) {
      const size_t v = q.j + i;
      const float u = stochastic ? philox_uniform(key, first + q.b * a.block + v) : 0.0f;
      const uint32_t code = aq_quantize(in[q.b * a.block + v], aq_factor(aq_load_scale(scales, v % a.channels), a.bits),
                                        u, stochastic, a.bits);
      word |= static_cast<uint64_t>(code) << (i * a.bits);
    }
    for (size_t k = 0; k < aq_code_bytes(q.values, a.bits); ++k)
      out[q.code_offset + k] = static_cast<uint8_t>(word >> (8 * k));
  }
}

template <bool kAccumulate>
__global__ void aq_decode_kernel(const uint8_t* __restrict__ in, AqShape a, float* __restrict__ out,
                                 unsigned long long* nonfinite) {
  AqGroup q;
  const size_t groups = aq_groups(a), threads = size_t(gridDim.x) * blockDim.x;
  for (size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x; g < groups; g += threads) {
    if (!q.at(a, g)) continue;
    uint64_t word = 0;
    for (size_t k = 0; k < aq_code_bytes(q.values, a.bits); ++k)
      word |= static_cast<uint64_t>(in[q.code_offset + k]) << (8 * k);
    unsigned bad = 0;
    for (size_t i = 0; i < q.values; ++i) {
      const size_t v = q.j + i;
      const uint32_t code = static_cast<uint32_t>(word >> (i * a.bits)) & ((1u << a.bits) - 1u);
      const float x = aq_dequantize(code, aq_load_scale(in + q.scale_offset, v % a.channels), a.bits);
      bad += x != x;
      float* o = out + q.b * a.block + v;
      *o = kAccumulate ? *o + x : x;
    }
    if (bad && nonfinite) atomicAdd(nonfinite, static_cast<unsigned long long>(bad));
  }
}

// ---- AQ-SGD's delta messages (aq_delta.h) -----------------------------------------------------------------

__global__ void subtract_kernel(const float* __restrict__ x, const float* __restrict__ last, size_t n,
                                float* __restrict__ delta) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    delta[i] = x[i] - last[i];
}

// m = round_t(in), unless *flag (the launch's non-finite count) is not 0: then nothing is written.
// The roundings are encode_cast_kernel's (float_to_half, float_to_bf16), so store_float_cuda's.
template <CodecKind kKind>
__global__ void store_unless_kernel(const float* __restrict__ in, size_t n, void* __restrict__ m,
                                    const unsigned long long* flag) {
  if (*flag != 0) return;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    if constexpr (kKind == CodecKind::kNone) {
      static_cast<float*>(m)[i] = in[i];
    } else {
      static_cast<uint16_t*>(m)[i] = kKind == CodecKind::kFp16 ? float_to_half(in[i]) : float_to_bf16(in[i]);
    }
  }
}

// ---- Launching ------------------------------------------------------------------------------------------

// cudaLaunchKernelEx returns this launch's own error, where <<<>>> + cudaGetLastError could report
// an earlier call's.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), size_t blocks, unsigned threads, cudaStream_t stream,
                   Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

size_t flat_blocks(size_t items) {
  const size_t blocks = (items + kFlatThreads - 1) / kFlatThreads;
  return blocks < kMaxFlatBlocks ? blocks : kMaxFlatBlocks;
}

bool valid_quant(const CodecConfig& c) {
  return c.bits >= 1 && c.bits <= 8 && c.bucket > 0 && c.bucket % 8 == 0 &&
         (c.levels.empty() || c.levels.size() == size_t{1} << c.bits);
}

// The kernels' level table: empty (count 0) for the evenly spaced levels.
LevelPositions positions_of(const CodecConfig& c) {
  if (!c.levels.empty()) return level_positions(c);
  return LevelPositions{};
}

AqShape aq_shape(const CodecConfig& c, size_t count) {
  const size_t block = aq_block_values(c.rows, c.channels, count);
  return AqShape{count, block, aq_block_bytes(block, c.channels, c.bits), c.channels, c.bits};
}

bool valid_aq(const CodecConfig& c) { return c.bits >= 2 && c.bits <= 8 && c.channels >= 1; }

cudaError_t encode_aq(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                      uint64_t first, unsigned long long* nonfinite, cudaStream_t stream) {
  if (!valid_aq(c)) return cudaErrorInvalidValue;
  const AqShape a = aq_shape(c, count);
  const size_t blocks = (count + a.block - 1) / a.block;
  auto* bytes = static_cast<uint8_t*>(out);
  // tiles of the first (widest) block: a shorter last block leaves its missing tiles' threads idle
  const size_t tiles = (aq_block_scales(a.block, a.channels) + kAqChannelTile - 1) / kAqChannelTile;
  if (blocks * tiles > 0x7FFFFFFFu) return cudaErrorInvalidValue;  // beyond a grid's x dimension
  if (cudaError_t e = launch(aq_scales_kernel, blocks * tiles, kAqScaleThreads, stream, in, a, tiles, bytes, nonfinite);
      e != cudaSuccess)
    return e;
  return launch(aq_codes_kernel, flat_blocks(blocks * ((a.block + 7) / 8)), kFlatThreads, stream, in, a,
                c.rounding == Rounding::kStochastic, key, first, bytes);
}

template <int kBits>
cudaError_t encode_quant(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                         uint64_t first, unsigned long long* nonfinite, cudaStream_t stream) {
  unsigned team = 1;  // threads per bucket: one per group of 8, rounded up to a power of two
  while (team < c.bucket / 8 && team < kEncodeThreads) team *= 2;
  const size_t blocks = (quant_buckets(count, c.bucket) + kEncodeThreads / team - 1) / (kEncodeThreads / team);
  const auto run = [&](auto kernel) {
    return launch(kernel, blocks < kMaxEncodeBlocks ? blocks : kMaxEncodeBlocks, kEncodeThreads, stream, in, count,
                  static_cast<uint8_t*>(out), c.bucket, team, key, first, aligned_to(in, 16), aligned_to(out, 8),
                  nonfinite, positions_of(c));
  };
  switch (c.rounding) {
    case Rounding::kStochastic: return run(encode_quant_kernel<kBits, Rounding::kStochastic>);
    case Rounding::kShift: return run(encode_quant_kernel<kBits, Rounding::kShift>);
    default: return run(encode_quant_kernel<kBits, Rounding::kNearest>);  // nearest (what a q codec takes)
  }
}

template <int kBits, bool kAccumulate>
cudaError_t decode_quant(const CodecConfig& c, const void* in, size_t count, float* out,
                         unsigned long long* nonfinite, cudaStream_t stream) {
  return launch(decode_quant_kernel<kBits, kAccumulate>, flat_blocks((count + 7) / 8), kFlatThreads, stream,
                static_cast<const uint8_t*>(in), count, out, c.bucket, aligned_to(in, 8), aligned_to(out, 16),
                nonfinite, positions_of(c));
}

// codec.cc's standalone integer codec: the fixed alpha, 1 when adaptive.
float standalone_alpha(const CodecConfig& c) {
  return c.alpha_mode == IntAlpha::kFixed ? static_cast<float>(c.alpha) : 1.0f;
}

template <bool kAccumulate>
cudaError_t decode_any(const CodecConfig& c, const void* in, size_t count, float* out,
                       unsigned long long* nonfinite, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(count);
  switch (c.kind) {
    case CodecKind::kNone:
      return launch(decode_cast_kernel<CodecKind::kNone, kAccumulate>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kFp16:
      return launch(decode_cast_kernel<CodecKind::kFp16, kAccumulate>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kBf16:
      return launch(decode_cast_kernel<CodecKind::kBf16, kAccumulate>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kFft:  // variable length: fft_cuda.h's launchers
      return cudaErrorNotSupported;
    case CodecKind::kAq: {
      if (!valid_aq(c)) return cudaErrorInvalidValue;
      const AqShape a = aq_shape(c, count);
      const size_t groups = (count + a.block - 1) / a.block * ((a.block + 7) / 8);
      return launch(aq_decode_kernel<kAccumulate>, flat_blocks(groups), kFlatThreads, stream,
                    static_cast<const uint8_t*>(in), a, out, nonfinite);
    }
    case CodecKind::kSign:
      return launch(decode_signs_kernel<kAccumulate>, blocks, kFlatThreads, stream, static_cast<const uint32_t*>(in),
                    count, c.eta, out, Compensation{}, size_t{0});
    case CodecKind::kInt: {  // one rank's integers, as codec.cc's decode
      const double scale = 1.0 / standalone_alpha(c);
      switch (c.bits) {
        case 8: return launch(int_decode_kernel<int8_t, kAccumulate>, blocks, kFlatThreads, stream, static_cast<const int8_t*>(in), count, scale, out);
        case 16: return launch(int_decode_kernel<int16_t, kAccumulate>, blocks, kFlatThreads, stream, static_cast<const int16_t*>(in), count, scale, out);
        case 32: return launch(int_decode_kernel<int32_t, kAccumulate>, blocks, kFlatThreads, stream, static_cast<const int32_t*>(in), count, scale, out);
        default: return cudaErrorInvalidValue;
      }
    }
    case CodecKind::kQuant: break;
  }
  if (!valid_quant(c)) return cudaErrorInvalidValue;
  switch (c.bits) {
    case 1: return decode_quant<1, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 2: return decode_quant<2, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 3: return decode_quant<3, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 4: return decode_quant<4, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 5: return decode_quant<5, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 6: return decode_quant<6, kAccumulate>(c, in, count, out, nonfinite, stream);
    case 7: return decode_quant<7, kAccumulate>(c, in, count, out, nonfinite, stream);
    default: return decode_quant<8, kAccumulate>(c, in, count, out, nonfinite, stream);
  }
}

}  // namespace

cudaError_t encode_cuda(const CodecConfig& c, const float* in, size_t count, void* out, const PhiloxKey& key,
                        uint64_t first, unsigned long long* nonfinite, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(count);
  switch (c.kind) {
    case CodecKind::kNone:
      return launch(encode_cast_kernel<CodecKind::kNone>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kFp16:
      return launch(encode_cast_kernel<CodecKind::kFp16>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kBf16:
      return launch(encode_cast_kernel<CodecKind::kBf16>, blocks, kFlatThreads, stream, in, count, out, nonfinite);
    case CodecKind::kSign:
      return pack_signs_cuda(in, Compensation{}, 0, count, static_cast<uint32_t*>(out), nullptr, nonfinite, stream);
    case CodecKind::kFft:  // variable length: fft_cuda.h's launchers
      return cudaErrorNotSupported;
    case CodecKind::kAq:
      return encode_aq(c, in, count, out, key, first, nonfinite, stream);
    case CodecKind::kInt:
      return int_encode_cuda(c.bits, in, count, standalone_alpha(c), c.rounding == Rounding::kStochastic,
                             int_clip(c.bits, 1), key, first, out, nullptr, nonfinite, stream);
    case CodecKind::kQuant: break;
  }
  if (!valid_quant(c)) return cudaErrorInvalidValue;
  switch (c.bits) {
    case 1: return encode_quant<1>(c, in, count, out, key, first, nonfinite, stream);
    case 2: return encode_quant<2>(c, in, count, out, key, first, nonfinite, stream);
    case 3: return encode_quant<3>(c, in, count, out, key, first, nonfinite, stream);
    case 4: return encode_quant<4>(c, in, count, out, key, first, nonfinite, stream);
    case 5: return encode_quant<5>(c, in, count, out, key, first, nonfinite, stream);
    case 6: return encode_quant<6>(c, in, count, out, key, first, nonfinite, stream);
    case 7: return encode_quant<7>(c, in, count, out, key, first, nonfinite, stream);
    default: return encode_quant<8>(c, in, count, out, key, first, nonfinite, stream);
  }
}

cudaError_t decode_cuda(const CodecConfig& c, const void* in, size_t count, float* out,
                        unsigned long long* nonfinite, cudaStream_t stream) {
  return decode_any<false>(c, in, count, out, nonfinite, stream);
}

cudaError_t decode_accumulate_cuda(const CodecConfig& c, const void* in, size_t count, float* acc,
                                   unsigned long long* nonfinite, cudaStream_t stream) {
  return decode_any<true>(c, in, count, acc, nonfinite, stream);
}

cudaError_t pack_signs_cuda(const float* u, Compensation c, size_t first, size_t n, uint32_t* words, float* backup,
                            unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (u == nullptr || words == nullptr || (c.stored && first % 32)) return cudaErrorInvalidValue;
  return launch(pack_signs_kernel, flat_blocks(n), kFlatThreads, stream, u, c, first, n, words, backup, nonfinite);
}

cudaError_t merge_signs_cuda(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                             const PhiloxKey& key, uint64_t first_word, cudaStream_t stream) {
  if (nwords == 0) return cudaSuccess;
  if (a == nullptr || s == nullptr || out == nullptr) return cudaErrorInvalidValue;
  return launch(merge_signs_kernel, flat_blocks(nwords), kFlatThreads, stream, a, s, out, nwords, k, key, first_word);
}

cudaError_t decode_signs_cuda(const uint32_t* words, size_t n, float eta, float* g, Compensation c, size_t first,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (words == nullptr || g == nullptr || (c.stored && first % 32)) return cudaErrorInvalidValue;
  return launch(decode_signs_kernel<false>, flat_blocks(n), kFlatThreads, stream, words, n, eta, g, c, first);
}

cudaError_t decode_signs_checked_cuda(const uint32_t* words, size_t n, float eta, float* g, Compensation c,
                                      size_t first, const float* backup, const unsigned long long* taint, bool tainted,
                                      unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (words == nullptr || g == nullptr || (c.stored && (first % 32 || backup == nullptr))) return cudaErrorInvalidValue;
  return launch(decode_signs_checked_kernel, flat_blocks(n), kFlatThreads, stream, words, n, eta, g, c, first, backup,
                taint, tainted, nonfinite);
}

cudaError_t add_compensation_cuda(const float* x, Compensation c, size_t first, size_t n, float* out,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (c.stored == nullptr || out == nullptr) return cudaErrorInvalidValue;
  return launch(add_compensation_kernel, flat_blocks(n), kFlatThreads, stream, x, c, first, n, out);
}

cudaError_t reset_compensation_cuda(const float* g, Compensation c, size_t first, size_t n,
                                    unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (g == nullptr || c.stored == nullptr) return cudaErrorInvalidValue;
  return launch(reset_compensation_kernel, flat_blocks(n), kFlatThreads, stream, g, c, first, n, nonfinite);
}

cudaError_t int_encode_cuda(int bits, const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                            const PhiloxKey& key, uint64_t first, void* out, unsigned long long* clipped,
                            unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (bits) {
    case 8:
      return launch(int_encode_kernel<int8_t>, blocks, kFlatThreads, stream, x, n, alpha, stochastic, clip, key, first,
                    static_cast<int8_t*>(out), clipped, nonfinite);
    case 16:
      return launch(int_encode_kernel<int16_t>, blocks, kFlatThreads, stream, x, n, alpha, stochastic, clip, key, first,
                    static_cast<int16_t*>(out), clipped, nonfinite);
    case 32:
      return launch(int_encode_kernel<int32_t>, blocks, kFlatThreads, stream, x, n, alpha, stochastic, clip, key, first,
                    static_cast<int32_t*>(out), clipped, nonfinite);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t int_add_cuda(int bits, const void* in, void* acc, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || acc == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (bits) {
    case 8: return launch(int_add_kernel<uint8_t>, blocks, kFlatThreads, stream, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(acc), n);
    case 16: return launch(int_add_kernel<uint16_t>, blocks, kFlatThreads, stream, static_cast<const uint16_t*>(in), static_cast<uint16_t*>(acc), n);
    case 32: return launch(int_add_kernel<uint32_t>, blocks, kFlatThreads, stream, static_cast<const uint32_t*>(in), static_cast<uint32_t*>(acc), n);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t int_decode_cuda(int bits, const void* in, size_t n, double scale, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (bits) {
    case 8: return launch(int_decode_kernel<int8_t, false>, blocks, kFlatThreads, stream, static_cast<const int8_t*>(in), n, scale, out);
    case 16: return launch(int_decode_kernel<int16_t, false>, blocks, kFlatThreads, stream, static_cast<const int16_t*>(in), n, scale, out);
    case 32: return launch(int_decode_kernel<int32_t, false>, blocks, kFlatThreads, stream, static_cast<const int32_t*>(in), n, scale, out);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t int_decode_sums_cuda(int bits, const void* in, size_t n, double scale, float* out,
                                 const unsigned long long* taint, bool tainted, unsigned long long* squares,
                                 unsigned long long* max_abs, unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || squares == nullptr || max_abs == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (bits) {
    case 8:
      return launch(int_decode_sums_kernel<int8_t>, blocks, kFlatThreads, stream, static_cast<const int8_t*>(in), n,
                    scale, out, taint, tainted, squares, max_abs, nonfinite);
    case 16:
      return launch(int_decode_sums_kernel<int16_t>, blocks, kFlatThreads, stream, static_cast<const int16_t*>(in), n,
                    scale, out, taint, tainted, squares, max_abs, nonfinite);
    case 32:
      return launch(int_decode_sums_kernel<int32_t>, blocks, kFlatThreads, stream, static_cast<const int32_t*>(in), n,
                    scale, out, taint, tainted, squares, max_abs, nonfinite);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t write_bytes_cuda(void* dst, const void* bytes, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || bytes == nullptr || n > sizeof(SmallBytes)) return cudaErrorInvalidValue;
  SmallBytes small = {};
  memcpy(small.b, bytes, n);
  return launch(write_bytes_kernel, 1, 1, stream, static_cast<uint8_t*>(dst), small, static_cast<unsigned>(n));
}

cudaError_t add_counter_cuda(unsigned long long* acc, const unsigned long long* add, cudaStream_t stream) {
  if (acc == nullptr || add == nullptr) return cudaErrorInvalidValue;
  return launch(add_counter_kernel, 1, 1, stream, acc, add);
}

// ---- convert.h on the device: the cast kernels without the count ------------------------------------

cudaError_t load_float_cuda(DataType type, const void* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (type) {
    case DataType::kFloat32:
      return in == out ? cudaSuccess : cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case DataType::kFloat16:
      return launch(decode_cast_kernel<CodecKind::kFp16, false>, blocks, kFlatThreads, stream, in, n, out, nullptr);
    case DataType::kBfloat16:
      return launch(decode_cast_kernel<CodecKind::kBf16, false>, blocks, kFlatThreads, stream, in, n, out, nullptr);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t load_add_float_cuda(DataType type, const void* in, float* acc, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || acc == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (type) {
    case DataType::kFloat32:
      return launch(decode_cast_kernel<CodecKind::kNone, true>, blocks, kFlatThreads, stream, in, n, acc, nullptr);
    case DataType::kFloat16:
      return launch(decode_cast_kernel<CodecKind::kFp16, true>, blocks, kFlatThreads, stream, in, n, acc, nullptr);
    case DataType::kBfloat16:
      return launch(decode_cast_kernel<CodecKind::kBf16, true>, blocks, kFlatThreads, stream, in, n, acc, nullptr);
    default: return cudaErrorInvalidValue;
  }
}

namespace {
cudaError_t store_unless(DataType t, const float* in, size_t n, void* m, const unsigned long long* flag,
                         cudaStream_t stream) {
  const size_t blocks = flat_blocks(n);
  switch (t) {
    case DataType::kFloat32: return launch(store_unless_kernel<CodecKind::kNone>, blocks, kFlatThreads, stream, in, n, m, flag);
    case DataType::kFloat16: return launch(store_unless_kernel<CodecKind::kFp16>, blocks, kFlatThreads, stream, in, n, m, flag);
    case DataType::kBfloat16: return launch(store_unless_kernel<CodecKind::kBf16>, blocks, kFlatThreads, stream, in, n, m, flag);
    default: return cudaErrorInvalidValue;
  }
}

bool valid_delta_store(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBfloat16;
}
}  // namespace

cudaError_t aq_delta_send_cuda(const CodecConfig& c, const float* x, size_t n, DataType t, void* m, void* out,
                               const PhiloxKey& key, uint64_t first, float* scratch, unsigned long long* nonfinite,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (c.kind != CodecKind::kAq || !valid_aq(c) || !valid_delta_store(t) || !x || !m || !out || !scratch || !nonfinite)
    return cudaErrorInvalidValue;
  float* last = scratch;
  float* delta = scratch + n;
  cudaError_t e = load_float_cuda(t, m, last, n, stream);
  if (e == cudaSuccess)
    e = launch(subtract_kernel, flat_blocks(n), kFlatThreads, stream, x, static_cast<const float*>(last), n, delta);
  if (e == cudaSuccess) e = encode_aq(c, delta, n, out, key, first, nonfinite, stream);
  if (e == cudaSuccess) e = decode_accumulate_cuda(c, out, n, last, nullptr, stream);  // the receiver's sum
  if (e == cudaSuccess) e = store_unless(t, last, n, m, nonfinite, stream);
  return e;
}

cudaError_t aq_delta_receive_cuda(const CodecConfig& c, const void* in, size_t n, DataType t, void* m, float* x_out,
                                  unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (c.kind != CodecKind::kAq || !valid_aq(c) || !valid_delta_store(t) || !in || !m || !x_out || !nonfinite)
    return cudaErrorInvalidValue;
  cudaError_t e = load_float_cuda(t, m, x_out, n, stream);
  if (e == cudaSuccess) e = decode_accumulate_cuda(c, in, n, x_out, nonfinite, stream);
  if (e == cudaSuccess) e = store_unless(t, x_out, n, m, nonfinite, stream);
  return e;
}

cudaError_t store_float_cuda(DataType type, const float* in, void* out, size_t n, unsigned long long* nonfinite,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const size_t blocks = flat_blocks(n);
  switch (type) {
    case DataType::kFloat32:
      if (nonfinite) return launch(encode_cast_kernel<CodecKind::kNone>, blocks, kFlatThreads, stream, in, n, out, nonfinite);
      return in == out ? cudaSuccess : cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case DataType::kFloat16:
      return launch(encode_cast_kernel<CodecKind::kFp16>, blocks, kFlatThreads, stream, in, n, out, nonfinite);
    case DataType::kBfloat16:
      return launch(encode_cast_kernel<CodecKind::kBf16>, blocks, kFlatThreads, stream, in, n, out, nonfinite);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t feedback_residual_cuda(const float* acc, float* residual, size_t n, float factor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (acc == nullptr || residual == nullptr) return cudaErrorInvalidValue;
  return launch(feedback_residual_kernel, flat_blocks(n), kFlatThreads, stream, acc, residual, n, factor);
}

cudaError_t divide_float_cuda(float* x, size_t n, float divisor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr) return cudaErrorInvalidValue;
  return launch(divide_kernel, flat_blocks(n), kFlatThreads, stream, x, n, divisor);
}

cudaError_t add_float_cuda(const float* in, float* acc, size_t n, cudaStream_t stream) {
  return load_add_float_cuda(DataType::kFloat32, in, acc, n, stream);
}

cudaError_t range_float_encode_cuda(const RangeFloat& r, const float* in, size_t n, uint32_t* codes,
                                    unsigned long long* clamped, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in == nullptr || codes == nullptr) return cudaErrorInvalidValue;
  return launch(range_float_encode_kernel, flat_blocks(n), kFlatThreads, stream, r, in, n, codes, clamped);
}

cudaError_t range_float_decode_cuda(const RangeFloat& r, const uint32_t* codes, size_t n, float* out,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (codes == nullptr || out == nullptr) return cudaErrorInvalidValue;
  return launch(range_float_decode_kernel, flat_blocks(n), kFlatThreads, stream, r, codes, n, out);
}

}  // namespace qccl::kernels
