// See gated_rms_norm.h.
#include "gated_rms_norm.h"

#include "vector_math.h"  // Vec, vector_exp

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
    Vec lanes = Vec{};
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
      const Vec v = load(row + i);
      lanes += v * v;
    }
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (; i < d; ++i) sum += row[i] * row[i];
    const float inverse = 1.0f / __builtin_sqrtf(sum / float(d) + eps);
    i = 0;
    for (; i + kLanes <= d; i += kLanes) {
      const Vec g = load(z + i);
      store(y + i, load(weight + i) * (load(row + i) * inverse) * (g / (1.0f + vector_exp(-g))));
    }
    for (; i < d; ++i) y[i] = weight[i] * (row[i] * inverse) * (z[i] / (1.0f + __builtin_expf(-z[i])));
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
