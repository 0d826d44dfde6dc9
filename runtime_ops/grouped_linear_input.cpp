// See grouped_linear_input.h.
#include "grouped_linear_input.h"

#include "grouped_linear.h"  // round_rows
#include "vector_math.h"     // rms_norm_row, silu_mul_row

namespace gdn {

void grouped_linear_input(const float* x, int64_t count, int64_t k, const float* norm_weight, float norm_eps,
                          bool gated, float* out, const ParallelFor& parallel_for) {
  round_rows(count, parallel_for, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m) {
      if (gated) {
        silu_mul_row(x + m * 2 * k, x + m * 2 * k + k, k, out + m * k);
      } else {
        rms_norm_row(x + m * k, k, norm_weight, norm_eps, out + m * k);
      }
    }
  });
}

}  // namespace gdn
