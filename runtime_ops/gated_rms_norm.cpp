// See gated_rms_norm.h.
#include "gated_rms_norm.h"

#include "vector_math.h"  // inverse_rms, silu

namespace gdn {
namespace {

// Rows below this many values in all run on the calling thread: waking the pool costs more than a decode step's
// 16 heads of 128.
constexpr int64_t kSharedValues = 1 << 14;

void gated_rows(const float* x, const float* gate, const float* weight, int64_t first, int64_t last, int64_t d,
                float eps, float* out) {
  for (int64_t r = first; r < last; ++r) {
    const float* row = x + r * d;
    const float* z = gate + r * d;
    float* y = out + r * d;
    const float inverse = inverse_rms(row, d, eps);
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
      store(y + i, load(weight + i) * (load(row + i) * inverse) * vector_silu(load(z + i)));
    }
    for (; i < d; ++i) y[i] = weight[i] * (row[i] * inverse) * silu(z[i]);
  }
}

}  // namespace

void gated_rms_norm(const float* x, const float* gate, const float* weight, int64_t rows, int64_t d, float eps,
                    float* out, const ParallelFor& parallel_for) {
  if (rows * d >= kSharedValues) {
    parallel_for(0, rows, [&](int64_t first, int64_t last) { gated_rows(x, gate, weight, first, last, d, eps, out); });
  } else {
    gated_rows(x, gate, weight, 0, rows, d, eps, out);
  }
}

}  // namespace gdn
