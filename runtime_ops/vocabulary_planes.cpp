// See vocabulary_planes.h. The head is a decode step's largest read (248320 x 1024 weights on the 0.8B
// shape), so its loop reads each 32-byte run of the high plane once, splits it into two vectors of 32
// nibbles and takes their integer dot products with the int8 activations: AVX-512 VNNI or AVX-VNNI where
// the compiler targets them, AVX2's multiply-add pairs otherwise, plain C++ elsewhere.
#include "vocabulary_planes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gdn {
namespace {

constexpr int64_t kGroupMultiple = 32;  // a group holds a multiple of 32 weights (one 32-byte half of a run)
// A high nibble h stands for the codes 16 (h - 8) .. 16 (h - 8) + 15: the head reads their middle.
constexpr float kHighOffset = 8.0f - 15.0f / 32.0f;

inline float bfloat16_value(uint16_t bits) {
  const uint32_t widened = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// One token's activations in int8 with one max-abs scale, and per 32 values kHighOffset * their sum.
struct Int8Activations {
  std::vector<int8_t> values;       // [width]
  std::vector<float> half_offsets;  // [width / 32]
  float scale = 0.0f;
};

void quantize_activations(const float* x, int64_t width, Int8Activations& out) {
  out.values.resize(width);
  out.half_offsets.assign(width / kGroupMultiple, 0.0f);
  float largest = 0.0f;
  for (int64_t i = 0; i < width; ++i) largest = std::max(largest, std::fabs(x[i]));
  out.scale = largest / 127.0f;
  const float inverse = out.scale > 0.0f ? 1.0f / out.scale : 0.0f;
  for (int64_t i = 0; i < width; ++i) {
    const int32_t q = std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inverse)), -127, 127);
    out.values[i] = static_cast<int8_t>(q);
    out.half_offsets[i / kGroupMultiple] += kHighOffset * float(q);
  }
}

#if defined(__AVX2__)
// acc + the sums of adjacent pairs of 16-bit products, as 8 int32 lanes.
inline __m256i add_pair_products(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline int32_t horizontal_sum(__m256i v) {
  __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(sum);
}

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}
#endif

// A row's units, one per 32 weights (a group's repeated when it is wider): as floats, and as 32-bit words
// holding the unit in both 16-bit halves (a broadcast word is a vector of 16-bit units).
void row_units_per_half(const uint8_t* group_units, int64_t halves, int64_t halves_per_group, float* units,
                        int32_t* words) {
  int64_t h = 0;
#if defined(__AVX2__)
  if (halves_per_group == 1) {
    for (; h + 8 <= halves; h += 8) {
      const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group_units + h)));
      _mm256_storeu_ps(units + h, _mm256_cvtepi32_ps(wide));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + h), _mm256_or_si256(wide, _mm256_slli_epi32(wide, 16)));
    }
  }
#endif
  for (; h < halves; ++h) {
    const int32_t unit = group_units[h / halves_per_group];
    units[h] = float(unit);
    words[h] = unit | (unit << 16);
  }
}

// One row of the head against one token's int8 activations, in units of (row unit * activation scale):
// the sum over each 32 weights of unit * (sum of high nibble * value - kHighOffset * sum of values).
// Integer all the way to one conversion a row: the products of nibbles and values summed in pairs (16 bits,
// at most 2 * 15 * 127), each pair times its unit summed into 32 bits (at most 255 * 3810 * width / 2).
float head_row(const uint8_t* high, const float* units, const int32_t* words, const Int8Activations& x,
               int64_t width) {
  const int64_t runs = width / 64, halves = width / kGroupMultiple;
  const int8_t* values = x.values.data();
  const float* offsets = x.half_offsets.data();
  float sum = 0.0f;
  int64_t run = 0, h = 0;
#if defined(__AVX2__)
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 offset = _mm256_setzero_ps();
  for (; h + 8 <= halves; h += 8) {
    offset = _mm256_fmadd_ps(_mm256_loadu_ps(units + h), _mm256_loadu_ps(offsets + h), offset);
  }
  // Four independent sums: one would chain every step of the row behind the last.
  __m256i partial[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
  for (; run + 2 <= runs; run += 2) {
    for (int r = 0; r < 2; ++r) {
      const int64_t at = run + r;
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + 32 * at));
      const __m256i first = _mm256_and_si256(bytes, nibble);
      const __m256i second = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
      const __m256i first_pairs =
          _mm256_maddubs_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * at)));
      const __m256i second_pairs =
          _mm256_maddubs_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * at + 32)));
      partial[2 * r] = add_pair_products(partial[2 * r], first_pairs, _mm256_set1_epi32(words[2 * at]));
      partial[2 * r + 1] = add_pair_products(partial[2 * r + 1], second_pairs, _mm256_set1_epi32(words[2 * at + 1]));
    }
  }
  const __m256i total =
      _mm256_add_epi32(_mm256_add_epi32(partial[0], partial[1]), _mm256_add_epi32(partial[2], partial[3]));
  sum = float(horizontal_sum(total)) - horizontal_sum(offset);
#endif
  for (; h < halves; ++h) sum -= units[h] * offsets[h];
  for (; run < runs; ++run) {
    for (int half = 0; half < 2; ++half) {
      int32_t dot = 0;
      for (int64_t j = 0; j < 32; ++j) {
        const uint8_t byte = high[32 * run + j];
        dot += int32_t(half == 0 ? byte & 0x0F : byte >> 4) * values[64 * run + 32 * half + j];
      }
      sum += float(dot) * units[2 * run + half];
    }
  }
  return sum;
}

}  // namespace

void planes_embedding(const VocabularyPlanes& table, const int64_t* tokens, int64_t count, float* output,
                      const ParallelFor& parallel_for) {
  const int64_t bytes_per_row = table.width / 2;
  parallel_for(0, count, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = tokens[t];
      const uint8_t* high = table.high + row * bytes_per_row;
      const uint8_t* low = table.low + row * bytes_per_row;
      const uint8_t* units = table.group_units + row * (table.width / table.group);
      const float row_unit = bfloat16_value(table.row_units[row]);
      float* out = output + t * table.width;
      for (int64_t run = 0; run < table.width / 64; ++run) {
        const float first_unit = row_unit * float(units[64 * run / table.group]);
        const float second_unit = row_unit * float(units[(64 * run + 32) / table.group]);
        for (int64_t j = 0; j < 32; ++j) {
          const int h = high[32 * run + j], l = low[32 * run + j];
          out[64 * run + j] = first_unit * float((((h & 0x0F) << 4) | (l & 0x0F)) - 128);
          out[64 * run + 32 + j] = second_unit * float(((h >> 4) << 4 | (l >> 4)) - 128);
        }
      }
    }
  });
}

void planes_logits(const VocabularyPlanes& table, const float* x, int64_t count, float* output,
                   const ParallelFor& parallel_for) {
  std::vector<Int8Activations> activations(count);
  for (int64_t t = 0; t < count; ++t) quantize_activations(x + t * table.width, table.width, activations[t]);
  const int64_t bytes_per_row = table.width / 2, groups = table.width / table.group;
  const int64_t halves = table.width / kGroupMultiple, halves_per_group = table.group / kGroupMultiple;
  parallel_for(0, table.rows, [&](int64_t begin, int64_t end) {
    std::vector<float> units(halves);
    std::vector<int32_t> words(halves);
    for (int64_t row = begin; row < end; ++row) {
      row_units_per_half(table.group_units + row * groups, halves, halves_per_group, units.data(), words.data());
      const float row_unit = 16.0f * bfloat16_value(table.row_units[row]);
      for (int64_t t = 0; t < count; ++t) {
        const float dot = head_row(table.high + row * bytes_per_row, units.data(), words.data(), activations[t],
                                   table.width);
        output[t * table.rows + row] = row_unit * activations[t].scale * dot;
      }
    }
  });
}

}  // namespace gdn
