// The device form of a method's step kernels (plan.h's StepKernel::launch): what a kernel may enqueue
// on a device's stream, as calls of an interface that the runtime implements with the CUDA launchers
// (src/device_cuda.cc over kernels/codec_cuda.h) and the tests with the host's own functions on a
// stand-in's queue (tests/common/stand_in_device.h). A plan's numerics thus stay in collectives/
// and kernels/, and what only a GPU runs is the thin layer beneath this interface.
//
// Every pointer is device memory; counters are device words that launches add to (atomically on a
// GPU) and the host reads once, when the collective ends. Calls enqueue and return: the work runs
// later, in the order enqueued, with the same bits as the host functions named beside each call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/codec.h"
#include "kernels/int_codec.h"
#include "kernels/marsit.h"
#include "kernels/philox.h"
#include "kernels/types.h"

namespace qccl::coll {

// What one collective's device work counts, in device memory, read back when it ends. nonfinite comes
// first: the executor's own data steps count into it alone.
struct DeviceCounters {
  unsigned long long nonfinite;                // outputs that are NaN or Inf
  unsigned long long clipped;                  // IntSGD: values clipped by the encode
  unsigned long long squares_lo, squares_hi;   // IntSGD: kernels::IntSums of the decoded sums
  unsigned long long max_abs;
  unsigned long long clamped;                  // fft: parts clamped to the range's largest magnitude
};
// The squares' two words are one 128-bit counter to the kernels (codec_cuda.h's squares[0..1]).
static_assert(offsetof(DeviceCounters, squares_hi) == offsetof(DeviceCounters, squares_lo) + sizeof(unsigned long long));

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // kernels/intsgd.h's int_encode: out = clip(Int(alpha x)); the clips are added to *clipped and the
  // non-finite inputs to *nonfinite.
  virtual void int_encode(int bits, const float* x, size_t n, float alpha, bool stochastic, kernels::IntClip clip,
                          const kernels::PhiloxKey& key, uint64_t first, void* out, unsigned long long* clipped,
                          unsigned long long* nonfinite) = 0;
  // kernels/intsgd.h's int_add: acc += in, wrapping.
  virtual void int_add(int bits, const void* in, void* acc, size_t n) = 0;
  // IntSGD's decode of a fragment: when it is tainted (`tainted`, or *taint is not 0) out = NaN and n
  // is added to *nonfinite; else out = S * scale (int_decode) and the sums are added to the counters'
  // squares and max_abs (int_accumulate_sums).
  virtual void int_decode(int bits, const void* in, size_t n, double scale, float* out,
                          const unsigned long long* taint, bool tainted, DeviceCounters* counters) = 0;
  // kernels/marsit.h's sign round, c a compensation in device memory: pack_signs (the non-finite w
  // added to *nonfinite), merge_signs, and the decode of a fragment: when it is tainted (`tainted`, or
  // *taint is not 0) g = NaN, c's stored values back from `backup` and n added to *nonfinite, else
  // decode_signs recording the round in c.
  virtual void pack_signs(const float* u, kernels::Compensation c, size_t first, size_t n, uint32_t* words,
                          float* backup, unsigned long long* nonfinite) = 0;
  virtual void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                           const kernels::PhiloxKey& key, uint64_t first_word) = 0;
  virtual void decode_signs(const uint32_t* words, size_t n, float eta, float* g, kernels::Compensation c, size_t first,
                            const float* backup, const unsigned long long* taint, bool tainted,
                            unsigned long long* nonfinite) = 0;
  // The full-precision round's add_compensation and reset_compensation (non-finite g added to *nonfinite).
  virtual void add_compensation(const float* x, kernels::Compensation c, size_t first, size_t n, float* out) = 0;
  virtual void reset_compensation(const float* g, kernels::Compensation c, size_t first, size_t n,
                                  unsigned long long* nonfinite) = 0;
  // convert.h's store_float (nothing counted).
  virtual void store_float(kernels::DataType type, const float* in, void* out, size_t n) = 0;
  // The fft codec (kernels/fft_sparse.h), where the device has it (runs_fft; otherwise the runtime
  // runs fft calls on device buffers through the host's codec): fft_encode's payloads of `count`
  // values into out, their bytes into *length (device memory), the clamps added to the counters; with
  // a residual, residual[i] = in[i] - decode(out)[i] unless a segment held NaN or Inf (the fft
  // method's error feedback); fft_add_spectrum: fft_decode_spectrum of *length bytes (accumulate:
  // +=); fft_synthesize; fft_restore_residual (the residual where the sum is not finite).
  virtual bool runs_fft() const { return false; }
  // The FFT library of those kernels, as CodecConfig::hash takes it: ranks must share it (frame
  // headers carry the hash), as its rounding decides which bins are sent.
  virtual const char* fft_library() const = 0;
  virtual void fft_encode(const kernels::CodecConfig& c, const float* in, size_t count, void* out, size_t* length,
                          float* residual, DeviceCounters* counters) = 0;
  virtual void fft_add_spectrum(const kernels::CodecConfig& c, const void* in, const size_t* length, size_t count,
                                float* spectrum, bool accumulate) = 0;
  virtual void fft_synthesize(const kernels::CodecConfig& c, const float* spectrum, size_t count, float* out) = 0;
  virtual void fft_restore_residual(const kernels::CodecConfig& c, const float* saved, const float* sum, size_t count,
                                    float* residual) = 0;
  // dst = n bytes (at most 16) given now, in stream order: a small header of a message.
  virtual void write_bytes(void* dst, const void* bytes, size_t n) = 0;
  // *acc += *add: a fragment's taint, gathered from a peer's taint word (wire A carries it beside the
  // message, having no message keys).
  virtual void add_counter(unsigned long long* acc, const unsigned long long* add) = 0;
};

// What a step kernel's launch works with: the interface, the collective's counters, and the
// fragment's taint (plan.h's StepContext::tainted on the device): the taint the host knows (a
// peer's, from its message keys) and the device word that this rank's kernels and, on wire A, the
// peers' taint words add to.
struct DeviceStepContext {
  DeviceKernels* kernels;
  DeviceCounters* counters;
  unsigned long long* taint;
  bool tainted;
};

}  // namespace qccl::coll
