// Subnormal floats read and made as zero on the calling thread while a SubnormalsAsZero lives (x86's DAZ and FTZ
// bits of MXCSR; put back as they were when it ends). Knows nothing of ATen or ExecuTorch.
//
// Why: a Gated DeltaNet layer's decays are exponentials of gates summed over a chunk (exp(G_t - G_s)), and a
// strongly decaying head makes them tiny: vector_exp stops at exp(-87), about 1.6e-38, and its products with scores,
// keys and the state fall under FLT_MIN. In the random-weight benchmark checkpoint 54% of a chunk's (t, s) pairs and
// 94% of its chunk-end decays are past exp(-87). Intel cores take a microcode assist for each subnormal operand or
// result (about a hundred cycles); on a Zen 3 host the programs ran as fast with these bits set as without. On
// the GPU machine's Xeon (AVX-512, AMX, 2 cores) conv_gated_delta_rule took 96 to 112 ms a layer for 512 tokens,
// against 22 ms on a Zen 3 core whose linears were slower (docs/benchmarks.md, run 47). What such values add to
// an output is below 1e-37, under any float32 tolerance. The entries of the model's kernels run each parallel body
// (and so each of the pool's threads) under one; the export's fit_int4_scales does not (an all-zero group's scale
// is a subnormal). Elsewhere (Arm, whose cores mostly handle subnormals in hardware) nothing is set.
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
