// A linear layer with 4-bit weights and a bfloat16 scale per group of inputs (gdn::grouped_int4_linear).
//
// W[n, k] = (code[n, k] - 8) * scale[n, k / group], codes in [0, 15]. The codes come in tiles of 16 output
// channels, a run of 32 bytes for each 4 inputs: byte 4c + t of run q holds the code of channel c, input 4q + t in
// its low nibble and of channel c + 8, same input, in its high one. The scales come as
// scales[n / 16][k / group][16], bfloat16; or, the smaller form, as int8 small_scales[n / 16][k / group + 4][16]:
// a tile's group scales as integers, then the 64 bytes of its 16 channels' float32 multipliers, scale[n, g] =
// small_scales[n / 16][g][n % 16] * multiplier[n]. Each row of x is rounded to int8 with one max-abs scale, so a run's products are
// byte multiply-adds of 4 (AVX-512 VNNI's vpdpbusd: 64 a cycle; AVX2's vpmaddubsw: 32), summed exactly in
// integers over a group and converted to float once a group. gdn_export/ops/grouped_int4_linear.py is the
// contract and reference; this header knows nothing of ATen or ExecuTorch.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

struct GroupedInt4Weight {
  const uint8_t* codes = nullptr;    // [n / 16][k / 4][32]
  const uint16_t* scales = nullptr;  // [n / 16][k / group][16], bfloat16 bits; or nullptr, and
  const int8_t* small_scales = nullptr;  // [n / 16][k / group + 4][16], the tail float32 multipliers
  int64_t n = 0;      // a multiple of 16
  int64_t k = 0;      // a multiple of group
  int64_t group = 0;  // 32, 64, 128 or 256
};

// y[m, :] = W x[m, :] for count rows of x [count, k] into y [count, n].
void grouped_int4_linear(const GroupedInt4Weight& weight, const float* x, int64_t count, float* y,
                         const ParallelFor& parallel_for);

}  // namespace gdn
