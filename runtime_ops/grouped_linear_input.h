// What a grouped linear reads of its input when a decoder layer's work around it is fused in (the ops' norm_weight
// and gated arguments, gdn_export/ops/grouped_int8_linear.py). Knows nothing of ATen or ExecuTorch; compiled with the
// core routines' vector extensions.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

// The count rows the product reads, each k values, into `out`: each row of x [count, k] through Qwen3.5's RMSNorm
// (weight 1 + norm_weight), or, gated, silu(gate) * up of each row of x [count, 2k] (gate first). Across the threads
// for a prompt, on the calling thread for one row.
void grouped_linear_input(const float* x, int64_t count, int64_t k, const float* norm_weight, float norm_eps,
                          bool gated, float* out, const ParallelFor& parallel_for);

}  // namespace gdn
