// Host arithmetic with subnormal numbers as IEEE 754 defines them, whatever mode the calling thread
// is in. A process that flushes them (x86's FTZ and DAZ bits, set by torch.set_flush_denormal(True)
// or by a library linked with -ffast-math's crtfastmath.o) would encode, sum and decode them as 0,
// where the other ranks and the device path (built without -ftz) keep them: one call, different bits
// on different ranks (a bucket's subnormal step read as 0 decodes to its minimum), and an IntSGD or
// Marsit state computed differently. The library's entry points and its progress thread hold one.
#pragma once

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace qccl::kernels {

// Clears FTZ and DAZ for its lifetime and restores the thread's mode after (other architectures keep
// the thread's mode: their flush bit is not touched).
class SubnormalsKept {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  SubnormalsKept() : saved_(_mm_getcsr()) {
    if (saved_ & kFlush) _mm_setcsr(saved_ & ~kFlush);
  }
  ~SubnormalsKept() {
    if (saved_ & kFlush) _mm_setcsr(saved_);
  }

 private:
  static constexpr unsigned kFlush = 0x8040;  // MXCSR: flush to zero (bit 15), denormals are zero (bit 6)
  unsigned saved_;
#else
  SubnormalsKept() = default;
#endif
  SubnormalsKept(const SubnormalsKept&) = delete;
  SubnormalsKept& operator=(const SubnormalsKept&) = delete;
};

}  // namespace qccl::kernels
