// The export's search for 4-bit group scales (gdn::fit_int4_scales): what gdn_export/ops/int4_scales.py's
// reference computes with some forty passes of tensor ops over each block of a weight, done a group at a time
// in registers. This header knows nothing of ATen or ExecuTorch.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

// scales[r, c / group] for weight [rows, columns] (float32, rows contiguous): per group, the scale s whose
// rounding clamp(round(w / s), -8, 7) * s has the least squared error among those tried, each candidate
// starting from one of divisors[0..count) and refined twice by least squares: a positive divisor d gives the
// positive scale (the group's largest magnitude) / d, a negative one (the group's weight of largest
// magnitude) / d, of the other sign, so that weight rounds to about d.
void fit_int4_scales(const float* weight, int64_t rows, int64_t columns, int64_t group, const float* divisors,
                     int64_t count, float* scales, const ParallelFor& parallel_for);

}  // namespace gdn
