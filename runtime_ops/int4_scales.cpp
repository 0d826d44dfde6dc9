// See int4_scales.h. Each step mirrors one tensor op of the reference, in float32. The groups of a weight are
// consecutive runs of `group` floats; sixteen of them are fitted side by side, one per vector lane, so each
// lane sums its group in order and no sum is reordered across lanes. A group then gets the reference's scale
// but where the order of the reference's sums moves a last bit (tests/test_loading.py bounds that).
#include "int4_scales.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace gdn {
namespace {

constexpr int64_t kLanes = 16;

// clamp(round(w / scale), -8, 7), rounding half to even as torch.round does.
inline float level(float w, float scale) { return std::min(7.0f, std::max(-8.0f, std::nearbyint(w / scale))); }

// Fits the groups first .. first + kLanes - 1 of weight (those past `total` repeat the last one, unwritten).
void fit_lanes(const float* weight, int64_t first, int64_t total, int64_t group, const float* divisors,
               int64_t count, float* scales, float* columns) {
  // columns[i * kLanes + l]: element i of lane l's group.
  for (int64_t l = 0; l < kLanes; ++l) {
    const float* w = weight + std::min(first + l, total - 1) * group;
    for (int64_t i = 0; i < group; ++i) columns[i * kLanes + l] = w[i];
  }
  // largest: the group's largest magnitude; extreme: the first weight of that magnitude, with its sign.
  float largest[kLanes], extreme[kLanes], scale[kLanes], energy[kLanes], product[kLanes], error[kLanes];
  float best_error[kLanes], best_scale[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) largest[l] = extreme[l] = 0.0f;
  for (int64_t i = 0; i < group; ++i)
    for (int64_t l = 0; l < kLanes; ++l) {
      const float w = columns[i * kLanes + l];
      const bool larger = std::fabs(w) > largest[l];
      largest[l] = larger ? std::fabs(w) : largest[l];
      extreme[l] = larger ? w : extreme[l];
    }
  for (int64_t l = 0; l < kLanes; ++l) {
    largest[l] = std::max(largest[l], FLT_MIN);
    extreme[l] = extreme[l] < 0.0f ? -largest[l] : largest[l];
  }
  for (int64_t d = 0; d < count; ++d) {
    // A negative divisor: a scale of the other sign than the extreme weight's, which rounds to the -8 side.
    for (int64_t l = 0; l < kLanes; ++l) scale[l] = (divisors[d] > 0.0f ? largest[l] : extreme[l]) / divisors[d];
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t l = 0; l < kLanes; ++l) energy[l] = product[l] = 0.0f;
      for (int64_t i = 0; i < group; ++i)
        for (int64_t l = 0; l < kLanes; ++l) {
          const float w = columns[i * kLanes + l];
          const float q = level(w, scale[l]);
          energy[l] += q * q;
          product[l] += w * q;
        }
      for (int64_t l = 0; l < kLanes; ++l) {
        const float fitted = product[l] / std::max(energy[l], 1.0f);
        // An all-zero rounding or a fit of the other sign (or zero) keeps the scale it had.
        scale[l] = energy[l] > 0.0f && fitted != 0.0f && (fitted > 0.0f) == (scale[l] > 0.0f) ? fitted : scale[l];
      }
    }
    for (int64_t l = 0; l < kLanes; ++l) error[l] = 0.0f;
    for (int64_t i = 0; i < group; ++i)
      for (int64_t l = 0; l < kLanes; ++l) {
        const float w = columns[i * kLanes + l];
        const float residual = level(w, scale[l]) * scale[l] - w;
        error[l] += residual * residual;
      }
    for (int64_t l = 0; l < kLanes; ++l) {
      const bool better = d == 0 || error[l] < best_error[l];
      best_error[l] = better ? error[l] : best_error[l];
      best_scale[l] = better ? scale[l] : best_scale[l];
    }
  }
  for (int64_t l = 0; l < kLanes && first + l < total; ++l) scales[first + l] = best_scale[l];
}

}  // namespace

void fit_int4_scales(const float* weight, int64_t rows, int64_t columns, int64_t group, const float* divisors,
                     int64_t count, float* scales, const ParallelFor& parallel_for) {
  const int64_t total = rows * (columns / group);  // rows are contiguous, so groups are consecutive runs
  parallel_for(0, (total + kLanes - 1) / kLanes, [&](int64_t begin, int64_t end) {
    std::vector<float> lanes(group * kLanes);
    for (int64_t batch = begin; batch < end; ++batch)
      fit_lanes(weight, batch * kLanes, total, group, divisors, count, scales, lanes.data());
  });
}

}  // namespace gdn
