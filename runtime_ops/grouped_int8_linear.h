// A linear layer with int8 weights and a scale per group of inputs (gdn::grouped_int8_linear).
//
// W[n, k] = code[n, k] * scale[n, k / group]. The codes come in tiles of 16 output channels, the codes of each
// pair of inputs side by side: codes[n / 16][k / 2][n % 16][k % 2]; the scales as bfloat16
// scales[n / 16][k / group][n % 16], or in the smaller int8 form small_scales[n / 16][k / group + 4][16], a tile's
// integers and then its channels' float32 multipliers: scale[n, g] = small_scales[n / 16][g][n % 16] * multiplier[n].
// Each row of x is rounded to int16 with one max-abs scale, so a tile's products are integer multiply-adds of
// pairs (AVX-512 VNNI's vpdpwssd: 32 a cycle, twice float FMA's 16), summed exactly in int32 over a group and
// converted to float once a group. gdn_export/ops/grouped_int8_linear.py is the contract and reference; this
// header knows nothing of ATen or ExecuTorch.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

struct GroupedInt8Weight {
  const int8_t* codes = nullptr;     // [n / 16][k / 2][16][2]
  const uint16_t* scales = nullptr;  // [n / 16][k / group][16], bfloat16 bits
  const int8_t* small_scales = nullptr;  // or [n / 16][k / group + 4][16], the tail float32 multipliers
  int64_t n = 0;      // a multiple of 16
  int64_t k = 0;      // a multiple of group
  int64_t group = 0;  // 32, 64, 128 or 256
};

// y[m, :] = W x[m, :] for count rows of x [count, k] into y [count, n].
void grouped_int8_linear(const GroupedInt8Weight& weight, const float* x, int64_t count, float* y,
                         const ParallelFor& parallel_for);

}  // namespace gdn
