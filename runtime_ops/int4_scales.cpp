// See int4_scales.h. Each step mirrors one tensor op of the reference, in float32. The groups of a weight are
// consecutive runs of `group` floats; a vector's width of them are fitted side by side, a group a lane, so each
// lane sums its group in order and no sum is reordered across lanes. A group then gets the reference's scale
// but where the order of the reference's sums moves a last bit (tests/test_loading.py bounds that).
#include "int4_scales.h"

#include <algorithm>
#include <cfloat>
#include <vector>

namespace gdn {
namespace {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
// The groups fitted side by side, a group a lane, in one vector of the target's (GCC's vector extensions). A
// batch of 16 lanes on AVX2, two registers, compiled to scalar steps and stack copies between the vector ones
// and ran a tenth as fast (docs/benchmarks.md, run 45). Hence not vector_math.h's Vec, 8 lanes without AVX: in
// an SSE2 build (two 128-bit registers) the search ran a third as fast as it does in 4 lanes.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes splat(float value) { return Lanes{} + value; }

// clamp(round(w / scale), -8, 7), rounding half to even as torch.round does: adding 1.5 * 2^23 leaves no
// fraction bits, so the sum is rounded to an integer in the current (nearest-even) mode, for |w / scale| < 2^22;
// beyond, the clamp decides, and the sign of the result is still right.
inline Lanes levels(Lanes w, Lanes scale) {
  const Lanes shift = splat(12582912.0f), low = splat(-8.0f), high = splat(7.0f);
  Lanes q = (w / scale + shift) - shift;
  q = low < q ? q : low;
  return q < high ? q : high;
}

// Fits the groups first .. first + kLanes - 1 of weight (those past `total` repeat the last one, unwritten).
void fit_lanes(const float* weight, int64_t first, int64_t total, int64_t group, const float* divisors,
               int64_t count, float* scales, Lanes* columns) {
  // columns[i][l]: element i of lane l's group.
  for (int64_t l = 0; l < kLanes; ++l) {
    const float* w = weight + std::min(first + l, total - 1) * group;
    for (int64_t i = 0; i < group; ++i) columns[i][l] = w[i];
  }
  // largest: the group's largest magnitude; extreme: the first weight of that magnitude, with its sign.
  const Lanes zero = splat(0.0f), one = splat(1.0f), tiny = splat(FLT_MIN);
  Lanes largest = zero, extreme = zero;
  for (int64_t i = 0; i < group; ++i) {
    const Lanes w = columns[i], magnitude = w < zero ? -w : w;
    const auto larger = magnitude > largest;
    largest = larger ? magnitude : largest;
    extreme = larger ? w : extreme;
  }
  largest = largest < tiny ? tiny : largest;
  extreme = extreme < zero ? -largest : largest;
  Lanes best_error = zero, best_scale = zero;
  for (int64_t d = 0; d < count; ++d) {
    // A negative divisor: a scale of the other sign than the extreme weight's, which rounds to the -8 side.
    Lanes scale = (divisors[d] > 0.0f ? largest : extreme) / divisors[d];
    for (int pass = 0; pass < 2; ++pass) {
      Lanes energy = zero, product = zero;
      for (int64_t i = 0; i < group; ++i) {
        const Lanes q = levels(columns[i], scale);
        energy += q * q;
        product += columns[i] * q;
      }
      const Lanes fitted = product / (energy < one ? one : energy);
      // An all-zero rounding or a fit of the other sign (or zero) keeps the scale it had.
      scale = (energy > zero) & (fitted != zero) & ((fitted > zero) == (scale > zero)) ? fitted : scale;
    }
    Lanes error = zero;
    for (int64_t i = 0; i < group; ++i) {
      const Lanes residual = levels(columns[i], scale) * scale - columns[i];
      error += residual * residual;
    }
    if (d == 0) {
      best_error = error;
      best_scale = scale;
    } else {
      const auto better = error < best_error;
      best_error = better ? error : best_error;
      best_scale = better ? scale : best_scale;
    }
  }
  for (int64_t l = 0; l < kLanes && first + l < total; ++l) scales[first + l] = best_scale[l];
}

}  // namespace

void fit_int4_scales(const float* weight, int64_t rows, int64_t columns, int64_t group, const float* divisors,
                     int64_t count, float* scales, const ParallelFor& parallel_for) {
  const int64_t total = rows * (columns / group);  // rows are contiguous, so groups are consecutive runs
  parallel_for(0, (total + kLanes - 1) / kLanes, [&](int64_t begin, int64_t end) {
    std::vector<Lanes> lanes(group);
    for (int64_t batch = begin; batch < end; ++batch)
      fit_lanes(weight, batch * kLanes, total, group, divisors, count, scales, lanes.data());
  });
}

}  // namespace gdn
