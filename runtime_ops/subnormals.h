// Subnormal floats read and made as zero on the calling thread while a SubnormalsAsZero lives (x86's DAZ and FTZ
// bits of MXCSR; put back as they were when it ends). Knows nothing of ATen or ExecuTorch.
//
// Why: a Gated DeltaNet layer's decays are exponentials of gates summed over a chunk (exp(G_t - G_s)), and a
// strongly decaying head makes them tiny: vector_exp stops at exp(-87), about 1.6e-38, and its product with a score
// or a key is below FLT_MIN. Intel cores take a microcode assist for each such operand or result, about a hundred
// cycles: on a Xeon with AVX-512 (2 cores) a 0.8B prefill's conv_gated_delta_rule took 100 ms a layer for 512
// tokens where a Zen 3 core took 22 ms (docs/benchmarks.md, run 47). What they add to an output is below 1e-37,
// far under any float32 tolerance. The entries run each parallel body (and so each of the pool's threads) under one.
// Arm cores compute subnormals at full speed, so nothing is set there.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace gdn {

class SubnormalsAsZero {
 public:
#if defined(__x86_64__) || defined(__i386__)
  SubnormalsAsZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~SubnormalsAsZero() { _mm_setcsr(saved_); }
#endif
  SubnormalsAsZero(const SubnormalsAsZero&) = delete;
  SubnormalsAsZero& operator=(const SubnormalsAsZero&) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFlushToZero = 0x8000;     // results below FLT_MIN become zero
  static constexpr unsigned kDenormalsAreZero = 0x40;  // operands below FLT_MIN are read as zero
  unsigned saved_;
#endif
};

}  // namespace gdn
