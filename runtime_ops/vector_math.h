// Math on GCC/Clang vector-extension floats, shared by the CPU kernels. Knows nothing of ATen or ExecuTorch.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace gdn {

// The float a bfloat16's bits stand for (its 16 high bits).
inline float bfloat16_value(uint16_t bits) {
  const uint32_t widened = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// GCC/Clang vector extensions: one AVX-512 register where available, lowered
// to narrower registers elsewhere.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float UnalignedVec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
typedef int32_t IntVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }
// x - 0 is x for every float (x + 0 is not: -0 + 0 = +0), so the compiler
// broadcasts straight from memory.
inline Vec broadcast(float x) { return x - Vec{}; }

// float16 <-> float32: a recurrent state kept in half precision (gated_delta_rule.h's half_state). A vector of
// kLanes halves widened, and rounded back (to nearest, ties to even, as torch's copy_): F16C's conversions where
// the target has them (GCC 12 leaves plain loops of _Float16 scalar), a loop of lanes elsewhere.
inline Vec load_halves(const _Float16* p) {
#if defined(__AVX512F__)
  return Vec(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__)
  return Vec(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = float(p[i]);
  return v;
#endif
}
inline void store_halves(_Float16* p, Vec v) {
#if defined(__AVX512F__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(__m512(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(__m256(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int i = 0; i < kLanes; ++i) p[i] = _Float16(v[i]);
#endif
}
// n values each way.
inline void halves_to_floats(const _Float16* __restrict from, float* __restrict to, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(to + i, load_halves(from + i));
  for (; i < n; ++i) to[i] = float(from[i]);
}
inline void floats_to_halves(const float* __restrict from, _Float16* __restrict to, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store_halves(to + i, load(from + i));
  for (; i < n; ++i) to[i] = _Float16(from[i]);
}

// The largest |x[i]| of n values (0 for none): a row's scale when the kernels round it to integers. Lanes of
// vectors, then the lanes: the plain loop is a chain of dependent maxima, one value at a time.
inline float max_magnitude(const float* x, int64_t n) {
  Vec lanes = Vec{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = load(x + i);
    const Vec magnitude = v < 0 ? -v : v;
    lanes = magnitude > lanes ? magnitude : lanes;
  }
  float largest = 0.0f;
  for (int l = 0; l < kLanes; ++l) largest = lanes[l] > largest ? lanes[l] : largest;
  for (; i < n; ++i) largest = (x[i] < 0 ? -x[i] : x[i]) > largest ? (x[i] < 0 ? -x[i] : x[i]) : largest;
  return largest;
}

// 1 / sqrt(mean(x²) + eps) over one row of n values: what an RMSNorm scales its row by. The squares are summed in
// lanes of vectors, so the last bits may differ from torch's order.
inline float inverse_rms(const float* x, int64_t n, float eps) {
  Vec lanes = Vec{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = load(x + i);
    lanes += v * v;
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < n; ++i) sum += x[i] * x[i];
  return 1.0f / __builtin_sqrtf(sum / float(n) + eps);
}

// y = x * inverse_rms(x) * (1 + weight) over one row of n values: Qwen3.5's RMSNorm (zero-centered weight), as a
// grouped linear normalizes its input (gdn_export/ops/grouped_int8_linear.py).
inline void rms_norm_row(const float* x, int64_t n, const float* weight, float eps, float* y) {
  const float inverse = inverse_rms(x, n, eps);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, load(x + i) * inverse * (load(weight + i) + 1.0f));
  for (; i < n; ++i) y[i] = x[i] * inverse * (weight[i] + 1.0f);
}

// exp on a vector (Cephes-style range reduction, ~2 ulp); arguments are
// clamped to [-87, 88] so the result stays a normal float.
inline Vec vector_exp(Vec x) {
  const Vec low = broadcast(-87.0f), high = broadcast(88.0f);
  x = x < low ? low : x;
  x = x > high ? high : x;
  // floor(x / ln2 + 0.5), kept positive before the truncating conversion.
  IntVec n_int = __builtin_convertvector(x * 1.44269504088896341f + 128.5f, IntVec) - 128;
  Vec n = __builtin_convertvector(n_int, Vec);
  Vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec p = broadcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  IntVec exponent = (n_int + 127) << 23;
  return p * reinterpret_cast<Vec&>(exponent);
}

// silu(g) = g / (1 + exp(-g)), of a vector and of a float (vector_exp's ~2 ulp: the last bits may differ from
// torch's).
inline Vec vector_silu(Vec g) { return g / (1.0f + vector_exp(-g)); }
inline float silu(float g) { return g / (1.0f + __builtin_expf(-g)); }

// y = silu(gate) * up over n values: an MLP's gated input, as a grouped linear computes it
// (gdn_export/ops/grouped_int8_linear.py).
inline void silu_mul_row(const float* gate, const float* up, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, vector_silu(load(gate + i)) * load(up + i));
  for (; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

}  // namespace gdn
