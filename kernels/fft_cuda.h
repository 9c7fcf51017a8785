// The fft codec (fft_sparse.h) on CUDA devices: cuFFT's batched real transforms, one CUDA block per
// segment for the scaling, the exact-K selection (a radix select on the magnitudes' bits, ties to
// the lower bin, as the host's kth_largest), the range floats (rfloat.h's element functions) and the
// compaction of the bins sent (CUB block scans), then the payloads written back to back at offsets
// scanned from their sizes. The bytes follow fft_sparse.h's layout, so the host decodes what the
// device encodes and the other way round. cuFFT (libcufft.so.12 of the CUDA toolkit, or CUDA 12's
// libcufft.so.11) is loaded at the first use, as the runtime loads NCCL, so that a CUDA build runs
// where it is missing.
//
// cuFFT rounds otherwise than the host's FFTs (KissFFT, FFTW): the transforms' bits, and so which
// bins a near tie keeps, are not the host's. The header's hash is therefore the caller's (`hash`: the
// low 32 bits written into, and expected from, every header), so that a caller can keep the two
// backends' payloads apart as the host keeps KissFFT's and FFTW's (CodecConfig::hash).
//
// Every launcher enqueues on `stream` and returns the first CUDA error (cudaErrorNotSupported when
// cuFFT cannot be loaded: fft_cuda_available says why; a cuFFT failure is cudaErrorUnknown, and
// fft_cuda_error() names it). Pointers are device memory except the configuration; a spectrum is
// read as float2 and a length as size_t, so they must be aligned as those (else cudaErrorInvalidValue).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/codec.h"

namespace qccl::kernels {

// cuFFT plans (per length and batch) and scratch for one stream's calls at a time, grown as calls
// need; fft_cuda_release frees them (after the stream's work that uses them).
struct FftCudaWorkspace;
FftCudaWorkspace* fft_cuda_workspace();
void fft_cuda_release(FftCudaWorkspace* ws);

// Whether cuFFT can be loaded in this process; else *why says why.
bool fft_cuda_available(std::string* why);
// What the cuFFT call that failed the last launcher this thread ran said ("" when none did).
const char* fft_cuda_error();
// The cuFFT this process loads, as CodecConfig::hash takes an FFT library: "cufft12" (CUDA 13's
// libcufft.so.12) or "cufft11" (CUDA 12's), "cufft" where none loads. Versions may round apart, so
// ranks must share one.
const char* fft_cuda_library();

// out = the payloads of `count` values of `in` (segments of c.segment values), *length = their
// bytes (at most c.encoded_bytes(count)). With `residual`, residual[i] = in[i] - the decoded value i,
// except over the segments sent as non-finite (NaN or Inf, or a bin beyond float32),
// where residual is left as it was (the fft method's error feedback). Device counters, each may be
// null: *nonfinite += the values of the segments sent as non-finite, *clamped += the parts clamped to
// the range's largest magnitude.
cudaError_t fft_encode_cuda(const CodecConfig& c, uint32_t hash, const float* in, size_t count, void* out,
                            size_t* length, float* residual, unsigned long long* nonfinite, unsigned long long* clamped,
                            FftCudaWorkspace* ws, cudaStream_t stream);
// spectrum = (accumulate: +=) the bins of the payloads of `count` values in the *length bytes at
// `in`, as fft_decode_spectrum: a segment sent as NaN or Inf, or a malformed payload and every
// segment after it, set their bins to NaN; *nonfinite (may be null) += the values that decode so.
cudaError_t fft_decode_spectrum_cuda(const CodecConfig& c, uint32_t hash, const void* in, const size_t* length,
                                     size_t count, float* spectrum, bool accumulate, unsigned long long* nonfinite,
                                     FftCudaWorkspace* ws, cudaStream_t stream);
// out = the inverse transforms of the spectrum (fft_spectrum_floats(c, count) floats, left as they
// are), segment by segment, as fft_synthesize.
cudaError_t fft_synthesize_cuda(const CodecConfig& c, const float* spectrum, size_t count, float* out,
                                FftCudaWorkspace* ws, cudaStream_t stream);
// residual = saved over each segment whose sum holds NaN or Inf, as fft_restore_residual (no cuFFT).
cudaError_t fft_restore_residual_cuda(const CodecConfig& c, const float* saved, const float* sum, size_t count,
                                      float* residual, cudaStream_t stream);

}  // namespace qccl::kernels
