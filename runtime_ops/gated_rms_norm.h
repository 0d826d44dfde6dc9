// gdn::gated_rms_norm on CPU (gdn_export/ops/gated_rms_norm.py says what it computes): the norm that ends a Gated
// DeltaNet layer's mixer. Knows nothing of ATen or ExecuTorch; float32 only.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

// out[r] = weight * (x[r] / sqrt(mean(x[r]²) + eps)) * silu(gate[r]) for each of the rows rows of d values (all
// contiguous). Across the threads for many rows (a prompt), on the calling thread for few (a decode step's heads).
void gated_rms_norm(const float* x, const float* gate, const float* weight, int64_t rows, int64_t d, float eps,
                    float* out, const ParallelFor& parallel_for);

}  // namespace gdn
