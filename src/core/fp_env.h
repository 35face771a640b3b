// The floating-point environment of one thread for the span of a kernel.
//
// Why: attention's backward multiplies probabilities down to exp(-87) by gradients of 1e-6 and
// less inside its GEMMs (dV = P^T dO, dQ = dS K, dK = dS^T Q), so their products fall below
// 2^-126 (subnormal) even where the sums do not: 4% of the P x dO products in a SmolLM2 step
// (a count on a Zen 3). Intel cores take a microcode assist for each subnormal input or result of
// an SSE / AVX multiply or FMA unless MXCSR's DAZ (inputs as zero) and FTZ (results to zero) bits
// are set; AMD Zen cores take none.
// Measured on an Emerald Rapids host (docs/PERFORMANCE.md, "Subnormals in attention"): the fp32
// attention backward of a SmolLM2 step took half the time with the bits set, the AMX bf16 one about
// a fifth less; on a Zen 3 the same runs are unchanged. The values flushed are below 1.2e-38, far
// under what any fp32 result here resolves (torch's and TensorFlow's CPU kernels run with flushing
// too).
//
// The bits are set only inside the scope and restored when it ends: the library runs on its
// caller's threads (the master thread of every OpenMP team), whose environment is theirs.
#pragma once

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define QLFT_HAVE_MXCSR 1
#else
#define QLFT_HAVE_MXCSR 0
#endif

namespace qlft {

// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6); its low six bits are sticky
// exception flags the arithmetic sets, not controls.
inline constexpr unsigned kMxcsrFtzDaz = 0x8040u;
inline constexpr unsigned kMxcsrFlags = 0x3Fu;

// With on: sets FTZ and DAZ on this thread for the scope's life, restoring the thread's MXCSR at
// its end (a no-op where there is no MXCSR). Each thread of a parallel region makes its own.
class ScopedFlushDenormals {
 public:
#if QLFT_HAVE_MXCSR
  explicit ScopedFlushDenormals(bool on = true) : saved_(_mm_getcsr()) {
    set_ = on && (saved_ & kMxcsrFtzDaz) != kMxcsrFtzDaz;
    if (set_) _mm_setcsr(saved_ | kMxcsrFtzDaz);
  }
  ~ScopedFlushDenormals() {
    if (set_) _mm_setcsr(saved_);
  }
#else
  explicit ScopedFlushDenormals(bool = true) {}
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
#if QLFT_HAVE_MXCSR
  unsigned saved_;
  bool set_;
#endif
};

}  // namespace qlft
