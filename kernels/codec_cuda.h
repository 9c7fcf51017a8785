// CUDA launchers of the codecs (codec.h, marsit.h, intsgd.h), of the float32 conversions (convert.h) and of the
// reductions (reduce.h): kernels that loop over the element functions the host launchers are
// defined by (quant.h, philox.h, half.h, and reduce_ops.h for reduce.h's promise), so that a device
// and a host given the same input produce the same bits.
//
// Numerical promise: every launcher writes exactly the bytes its host counterpart writes, for every
// codec (none, fp16, bf16, q1..q8 with any rounding and even or learned levels, sign, int8..int32,
// aq2..aq8), every count, every `first` and PhiloxKey,
// and returns (through `nonfinite`) the same count. Two exceptions, both about NaN payloads only:
// an accumulation whose result is NaN (acc += NaN, Inf + -Inf) gives the GPU's canonical NaN
// (0x7FFFFFFF) where x86 keeps an operand's payload, so decode_accumulate_cuda, load_add_float_cuda
// and add_float_cuda promise "NaN where the host has NaN" rather than the same NaN bits; the same
// holds for divide_float_cuda on NaN inputs. This relies on both sides doing one IEEE operation per
// C++ operator: the .cu files are built with --fmad=false, codec.cc turns contraction off itself,
// and convert.cc must not be built with FMA contraction (no -mfma / -march).
//
// Contract shared by every function here:
//   - Pointers are device-accessible memory (cudaMalloc, managed or mapped) of the current device;
//     the caller owns every buffer. Layouts, counts and the meaning of `first` are codec.h's.
//     Floats and 16-bit values must be naturally aligned, as C++ requires of the host's too; a q
//     codec's encoded buffer may start at any byte (8-byte aligned is faster), and 16-byte aligned
//     floats are read and written as float4.
//   - Launches are asynchronous on `stream` (nullptr: the legacy default stream). Inputs must stay
//     unchanged and outputs untouched until that work is done; nothing here blocks or allocates.
//   - `nonfinite`, where taken, is a device-accessible counter the launch adds to (atomically) the
//     number the host launcher returns: for a q encode, buckets sent as non-finite (they held NaN
//     or Inf, or their range overflows float32); for the casts and for decode, non-finite values. The caller zeroes it; adding lets one counter gather the chunks
//     of a collective without a host round trip. nullptr: not counted.
//   - Result: cudaSuccess when the work is enqueued (or there is none: count == 0 launches nothing);
//     cudaErrorInvalidValue, with nothing enqueued, for a null pointer with count > 0, a q codec
//     whose bits are outside 1..8 or whose bucket is not a positive multiple of 8, or a DataType
//     the conversions do not take (convert.h's codec_input_type); otherwise the runtime's launch
//     error (which may be a sticky error of earlier work). Faults in the kernels themselves show up
//     later, at the stream's synchronization, as everywhere in CUDA. No exception leaves these calls.
//   - Thread-safe as kernel launches are: any thread, any stream; calls on one stream run in order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/codec.h"
#include "kernels/int_codec.h"
#include "kernels/marsit.h"
#include "kernels/rfloat.h"
#include "kernels/types.h"

namespace qccl::kernels {

// codec.h's encode: out receives codec.encoded_bytes(count) bytes. A q codec takes one block per
// bucket, so a launch of few buckets uses little of the GPU.
cudaError_t encode_cuda(const CodecConfig& codec, const float* in, size_t count, void* out, const PhiloxKey& key,
                        uint64_t first, unsigned long long* nonfinite, cudaStream_t stream);

// codec.h's decode: out[i] = decoded value i.
cudaError_t decode_cuda(const CodecConfig& codec, const void* in, size_t count, float* out,
                        unsigned long long* nonfinite, cudaStream_t stream);

// codec.h's decode_accumulate: acc[i] += decoded value i.
cudaError_t decode_accumulate_cuda(const CodecConfig& codec, const void* in, size_t count, float* acc,
                                   unsigned long long* nonfinite, cudaStream_t stream);

// Marsit's sign codec (marsit.h on the device, the same bits; c holds device pointers, c.stored null
// for none): the pack of n values' signs of w = u + c (stored = w, the old values to backup when it is
// not null; non-finite w counted into *nonfinite when it is not null), the merge of a hop holding k
// contributions, the decode g = eta * (2 bit - 1) recording the round in c, and the full-precision
// round's w = x + c and compensation reset. first is the run's first value in the tensor (a multiple
// of 32 for the pack and the decode with c, else cudaErrorInvalidValue).
cudaError_t pack_signs_cuda(const float* u, Compensation c, size_t first, size_t n, uint32_t* words, float* backup,
                            unsigned long long* nonfinite, cudaStream_t stream);
cudaError_t merge_signs_cuda(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                             const PhiloxKey& key, uint64_t first_word, cudaStream_t stream);
cudaError_t decode_signs_cuda(const uint32_t* words, size_t n, float eta, float* g, Compensation c, size_t first,
                              cudaStream_t stream);
// The decode of a sign round's fragment inside a collective: when `tainted` or *taint (taint may be
// null) is not 0, g = NaN (0x7FC00000, the host's quiet NaN), c's stored values first .. first + n - 1
// back from `backup` (n floats; c.stored null: nothing restored) and n added to *nonfinite; else
// decode_signs_cuda.
cudaError_t decode_signs_checked_cuda(const uint32_t* words, size_t n, float eta, float* g, Compensation c,
                                      size_t first, const float* backup, const unsigned long long* taint, bool tainted,
                                      unsigned long long* nonfinite, cudaStream_t stream);
cudaError_t add_compensation_cuda(const float* x, Compensation c, size_t first, size_t n, float* out,
                                  cudaStream_t stream);
cudaError_t reset_compensation_cuda(const float* g, Compensation c, size_t first, size_t n,
                                    unsigned long long* nonfinite, cudaStream_t stream);

// IntSGD's integer codec (intsgd.h on the device, the same bits): encode with the shared alpha and the
// rank's clip range (clipped values and non-finite inputs added to the counters that are not null),
// wrapping adds, and decode S * scale. bits is 8, 16 or 32 (else cudaErrorInvalidValue).
cudaError_t int_encode_cuda(int bits, const float* x, size_t n, float alpha, bool stochastic, IntClip clip,
                            const PhiloxKey& key, uint64_t first, void* out, unsigned long long* clipped,
                            unsigned long long* nonfinite, cudaStream_t stream);
cudaError_t int_add_cuda(int bits, const void* in, void* acc, size_t n, cudaStream_t stream);
cudaError_t int_decode_cuda(int bits, const void* in, size_t n, double scale, float* out, cudaStream_t stream);
// IntSGD's decode inside a collective: when `tainted` or *taint (taint may be null) is not 0, out = NaN
// (0x7FC00000, the host's quiet NaN) and n is added to *nonfinite; else int_decode_cuda's values, and
// int_accumulate_sums's exact sums added to squares[0..1] (the low and high words of the 128-bit sum of
// S^2) and max_abs (atomicMax) in place, the same numbers as the host's whatever the launch order.
cudaError_t int_decode_sums_cuda(int bits, const void* in, size_t n, double scale, float* out,
                                 const unsigned long long* taint, bool tainted, unsigned long long* squares,
                                 unsigned long long* max_abs, unsigned long long* nonfinite, cudaStream_t stream);
// dst = n bytes (n <= 16, else cudaErrorInvalidValue) read from host memory now, written by a kernel
// in stream order (a message's small header).
cudaError_t write_bytes_cuda(void* dst, const void* bytes, size_t n, cudaStream_t stream);
// *acc += *add, one thread: a fragment's taint words gathered on the device.
cudaError_t add_counter_cuda(unsigned long long* acc, const unsigned long long* add, cudaStream_t stream);

// The fft codec's range floats (rfloat.h), one thread per value, the same codes and values as the
// host's element functions (spec fftsparse.md P10): codes[i] = the code of in[i] (finite inputs;
// `clamped`, as `nonfinite` above, counts the values beyond the range), out[i] = the value of
// codes[i]. The fft codec's whole launchers are fft_cuda.h's (cuFFT); encode_cuda refuses the fft
// codec with cudaErrorNotSupported.
cudaError_t range_float_encode_cuda(const RangeFloat& r, const float* in, size_t n, uint32_t* codes,
                                    unsigned long long* clamped, cudaStream_t stream);
cudaError_t range_float_decode_cuda(const RangeFloat& r, const uint32_t* codes, size_t n, float* out,
                                    cudaStream_t stream);

// AQ-SGD's delta messages (aq_delta.h), the same bits as aq_delta_send / aq_delta_receive: the
// sender's m and payload, the receiver's m and x_out. c is an aq codec, t the store's type (float32,
// float16, bfloat16). `scratch` holds 2 n floats of device memory. `nonfinite` is required here and
// must be 0 when the call is enqueued (the caller zeroes it): the launches add the NaN channels
// (send) or values (receive) to it, and the last launch writes m only if it is still 0, so that a
// non-finite delta commits nothing without a host round trip.
cudaError_t aq_delta_send_cuda(const CodecConfig& c, const float* x, size_t n, DataType t, void* m, void* out,
                               const PhiloxKey& key, uint64_t first, float* scratch, unsigned long long* nonfinite,
                               cudaStream_t stream);
cudaError_t aq_delta_receive_cuda(const CodecConfig& c, const void* in, size_t n, DataType t, void* m, float* x_out,
                                  unsigned long long* nonfinite, cudaStream_t stream);

// convert.h's conversions, for DataType kFloat32, kFloat16 and kBfloat16. in == out is allowed for
// load_float_cuda and store_float_cuda with kFloat32 (nothing to do); other overlaps are not.
// store_float_cuda counts the non-finite values it writes (convert.h's count_nonfinite of out: NaN
// and Inf that reached it, and float16's overflow to Inf) into `nonfinite` when it is not null.
cudaError_t load_float_cuda(DataType type, const void* in, float* out, size_t n, cudaStream_t stream);
cudaError_t load_add_float_cuda(DataType type, const void* in, float* acc, size_t n, cudaStream_t stream);
cudaError_t store_float_cuda(DataType type, const float* in, void* out, size_t n, unsigned long long* nonfinite,
                             cudaStream_t stream);
cudaError_t divide_float_cuda(float* x, size_t n, float divisor, cudaStream_t stream);
cudaError_t add_float_cuda(const float* in, float* acc, size_t n, cudaStream_t stream);
// Error feedback's residual once it holds decode(encoded): residual[i] = factor * (acc[i] - residual[i]),
// the host executor's ErrorFeedback step bit for bit.
cudaError_t feedback_residual_cuda(const float* acc, float* residual, size_t n, float factor, cudaStream_t stream);

// reduce.h's reduce() and finish_average() (reduce_cuda.cu, over reduce_ops.h), with reduce.h's
// numerical promise bit for bit, NaNs included (every floating NaN result is the canonical one, so
// there is no payload to differ). dst may equal a or b; other overlaps are not allowed. Also
// cudaErrorInvalidValue for an unknown DataType or RedOp, or nranks < 1.
cudaError_t reduce_cuda(DataType type, RedOp op, const void* a, const void* b, void* dst, size_t count,
                        cudaStream_t stream);
cudaError_t finish_average_cuda(DataType type, void* buf, size_t count, int nranks, cudaStream_t stream);

}  // namespace qccl::kernels
