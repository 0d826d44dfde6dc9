// See grouped_int4_linear.h. A tile of 16 output channels is one vector of int32 sums (two on AVX2): for each 4
// inputs a 32-byte run is split into its nibbles, 64 codes of 0..15, whose byte products with the row's 4 int8
// values, broadcast, are summed 4 at a time into each channel's lane. The codes stand for code - 8, so a group's
// sum is corrected by 8 times the sum of the row's values over the group, once a group. Up to kRows rows of x
// share each run of codes, so a prompt splits each run once per kRows rows.
#include "grouped_int4_linear.h"
#include "grouped_linear.h"
#include "vector_math.h"  // bfloat16_value, max_magnitude

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gdn {
namespace {

constexpr int64_t kTile = 16;
constexpr int64_t kRunBytes = 32;  // a run: 16 channels x 4 inputs, two codes a byte
constexpr int32_t kCodeOffset = 8;
// Rows of x per pass over a tile: AVX-512's 32 registers hold 8 rows' sums; AVX2's 16 hold the 16-bit sums of 4
// rows' two halves, beside a run's codes.
#if defined(__AVX512BW__)
constexpr int64_t kRows = 8;
#else
constexpr int64_t kRows = 4;
#endif

// One row of x in int8 with one max-abs scale (the contract's rounding: to nearest, ties to even), and per group
// kCodeOffset times the sum of its int8 values.
float quantize_row(const float* x, int64_t k, int64_t group, int8_t* out, int32_t* offsets) {
  const float scale = max_magnitude(x, k) / 127.0f;
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 by = _mm512_set1_ps(inverse);
  for (; i + 16 <= k; i += 16) {
    const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), by));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtsepi32_epi8(rounded));
  }
#elif defined(__AVX2__)
  const __m256 by = _mm256_set1_ps(inverse);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= k; i += 32) {
    __m256i quarters[4];
    for (int j = 0; j < 4; ++j) quarters[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), by));
    // The packs work within 128-bit lanes: the bytes come out as quarters' 4-value halves in the order 0, 2, 4,
    // 6 / 1, 3, 5, 7 of the 8 such halves, which the permute puts back.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(quarters[0], quarters[1]),
                                              _mm256_packs_epi32(quarters[2], quarters[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permutevar8x32_epi32(packed, order));
  }
#endif
  for (; i < k; ++i) {
    out[i] = static_cast<int8_t>(std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inverse)), -127, 127));
  }
  for (int64_t g = 0; g < k / group; ++g) {
    int32_t sum = 0;
    for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += out[j];
    offsets[g] = kCodeOffset * sum;
  }
  return scale;
}

// The arguments of one pass: kCount rows of x against one tile.
struct TileRows {
  const uint8_t* codes;     // the tile's runs
  const void* scales;       // the tile's scales: [k / group][16] bfloat16, or int8 [k / group + 4][16] (kSmall)
  const int8_t* x;          // the rows' int8 values, a row every k
  const int32_t* offsets;   // the rows' group offsets, a row every k / group
  const float* row_scales;  // the rows' scales
  int64_t k, group;
  float* y;                 // the rows' first output channel of the tile, a row every y_stride
  int64_t y_stride;
};

inline int32_t input_quad(const int8_t* x) {
  int32_t quad;
  std::memcpy(&quad, x, sizeof(quad));
  return quad;
}

#if defined(__AVX512BW__)
// acc + per 32-bit lane the sum of 4 products of unsigned codes and signed values.
inline __m512i add_quad_products(__m512i acc, __m512i codes, __m512i values) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, codes, values);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(codes, values), _mm512_set1_epi16(1)));
#endif
}

// Pins a sum to its register as it is updated: unpinned, GCC copies each of the kCount sums to another register
// and back every run, twice the instructions of the loop.
inline void keep_in_register(__m512i& sum) { asm volatile("" : "+v"(sum)); }

// The codes of a run, 16 channels x 4 inputs a 32-bit lane: the run's bytes fill both halves of a register; the low
// nibbles stay in the first (channels 0..7), the high ones move down in the second (channels 8..15).
inline __m512i run_codes(const uint8_t* run, __m512i shifts, __m512i nibble) {
  const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(run)));
  return _mm512_and_si512(_mm512_srlv_epi16(both, shifts), nibble);
}

// y[r][0..16) = row_scales[r] * sum_g scale_g * (int32 sum of group g), for kCount rows.
template <int kCount, bool kSmall>
void tile_rows(const TileRows& p) {
  const int64_t groups = p.k / p.group;
  __m512 out[kCount];
  for (int r = 0; r < kCount; ++r) out[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i sums[kCount];
    for (int r = 0; r < kCount; ++r) sums[r] = _mm512_setzero_si512();
    const uint8_t* runs = p.codes + g * p.group / 4 * kRunBytes;
    for (int64_t q = 0; q < p.group / 4; ++q) {
      const __m512i codes = run_codes(runs + kRunBytes * q, shifts, nibble);
      const int64_t at = g * p.group + 4 * q;
      for (int r = 0; r < kCount; ++r) {
        sums[r] = add_quad_products(sums[r], codes, _mm512_set1_epi32(input_quad(p.x + r * p.k + at)));
        keep_in_register(sums[r]);
      }
    }
    const __m512 scale = group_scales<kSmall>(p.scales, g);
    for (int r = 0; r < kCount; ++r) {
      const __m512i exact = _mm512_sub_epi32(sums[r], _mm512_set1_epi32(p.offsets[r * groups + g]));
      out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, out[r]);
    }
  }
  for (int r = 0; r < kCount; ++r) {
    _mm512_storeu_ps(p.y + r * p.y_stride, _mm512_mul_ps(out[r], output_scales<kSmall>(p.scales, groups, p.row_scales[r])));
  }
}

// One row (a decode step): a group's runs split among four sums, a run each in turn. With one sum, each
// multiply-add waits for the last (5 cycles on Zen 4) and the step's products ran at two thirds of the memory's
// pace; the runs of the next groups are asked for ahead, as the tile streams from memory.
template <bool kSmall>
void one_row(const TileRows& p) {
  const int64_t groups = p.k / p.group;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m512 out = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* runs = p.codes + g * p.group / 4 * kRunBytes;
    ask_ahead(runs, p.group / 4 * kRunBytes);
    const int8_t* x = p.x + g * p.group;
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    __m512i c = _mm512_setzero_si512(), d = _mm512_setzero_si512();
    for (int64_t q = 0; q < p.group / 4; q += 4) {
      a = add_quad_products(a, run_codes(runs + kRunBytes * q, shifts, nibble), _mm512_set1_epi32(input_quad(x + 4 * q)));
      b = add_quad_products(b, run_codes(runs + kRunBytes * (q + 1), shifts, nibble),
                            _mm512_set1_epi32(input_quad(x + 4 * q + 4)));
      c = add_quad_products(c, run_codes(runs + kRunBytes * (q + 2), shifts, nibble),
                            _mm512_set1_epi32(input_quad(x + 4 * q + 8)));
      d = add_quad_products(d, run_codes(runs + kRunBytes * (q + 3), shifts, nibble),
                            _mm512_set1_epi32(input_quad(x + 4 * q + 12)));
    }
    const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a, b), _mm512_add_epi32(c, d));
    const __m512i exact = _mm512_sub_epi32(sum, _mm512_set1_epi32(p.offsets[g]));
    out = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), group_scales<kSmall>(p.scales, g), out);
  }
  _mm512_storeu_ps(p.y, _mm512_mul_ps(out, output_scales<kSmall>(p.scales, groups, p.row_scales[0])));
}
#elif defined(__AVX2__)
// Pins a row's two 16-bit sums to registers as they are updated: unpinned, GCC makes all the products of a block
// first and keeps them on the stack.
inline void keep_in_registers(__m256i& first, __m256i& second) { asm volatile("" : "+x"(first), "+x"(second)); }

// As above with two 8-lane halves of the tile (channels 0..7 from a run's low nibbles, 8..15 from its high ones),
// each 32-input block summed in 16-bit lanes first: a pair of products is at most 2 * 15 * 127, and the 8 pairs of
// a block fit in int16.
template <int kCount, bool kSmall>
void tile_rows(const TileRows& p) {
  const int64_t groups = p.k / p.group;
  __m256 out[kCount][2];
  for (int r = 0; r < kCount; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sums[kCount][2];
    for (int r = 0; r < kCount; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    for (int64_t block = g * p.group / 32; block < (g + 1) * p.group / 32; ++block) {
      __m256i pairs[kCount][2];
      for (int r = 0; r < kCount; ++r) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
      const uint8_t* runs = p.codes + block * 8 * kRunBytes;
      if constexpr (kCount == 1) ask_ahead(runs, 8 * kRunBytes);  // a decode step
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(runs + kRunBytes * q));
        const __m256i low = _mm256_and_si256(packed, nibble);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
        for (int r = 0; r < kCount; ++r) {
          const __m256i values = _mm256_set1_epi32(input_quad(p.x + r * p.k + 32 * block + 4 * q));
          pairs[r][0] = _mm256_add_epi16(pairs[r][0], _mm256_maddubs_epi16(low, values));
          pairs[r][1] = _mm256_add_epi16(pairs[r][1], _mm256_maddubs_epi16(high, values));
          keep_in_registers(pairs[r][0], pairs[r][1]);
        }
      }
      for (int r = 0; r < kCount; ++r) {
        for (int half = 0; half < 2; ++half) {
          sums[r][half] = _mm256_add_epi32(sums[r][half], _mm256_madd_epi16(pairs[r][half], ones));
        }
      }
    }
    for (int half = 0; half < 2; ++half) {
      const __m256 scale = group_scales<kSmall>(p.scales, g, half);
      for (int r = 0; r < kCount; ++r) {
        const __m256i exact = _mm256_sub_epi32(sums[r][half], _mm256_set1_epi32(p.offsets[r * groups + g]));
        out[r][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), scale, out[r][half]);
      }
    }
  }
  for (int r = 0; r < kCount; ++r) {
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_ps(p.y + r * p.y_stride + 8 * half,
                       _mm256_mul_ps(out[r][half], output_scales<kSmall>(p.scales, groups, p.row_scales[r], half)));
    }
  }
}
#else
template <int kCount, bool kSmall>
void tile_rows(const TileRows& p) {
  const int64_t groups = p.k / p.group;
  for (int r = 0; r < kCount; ++r) {
    for (int64_t lane = 0; lane < kTile; ++lane) {
      float total = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * p.group; i < (g + 1) * p.group; ++i) {
          const uint8_t byte = p.codes[(i / 4) * kRunBytes + 4 * (lane % 8) + i % 4];
          sum += int32_t(lane < 8 ? byte & 0x0F : byte >> 4) * p.x[r * p.k + i];
        }
        total += float(sum - p.offsets[r * groups + g]) * group_scale<kSmall>(p.scales, g, lane);
      }
      p.y[r * p.y_stride + lane] = total * (p.row_scales[r] * channel_multiplier<kSmall>(p.scales, groups, lane));
    }
  }
}
#endif

#if defined(__AVX512BW__)
template <>
void tile_rows<1, false>(const TileRows& p) { one_row<false>(p); }
template <>
void tile_rows<1, true>(const TileRows& p) { one_row<true>(p); }
#endif

using TileRowsKernel = void (*)(const TileRows&);
// [kSmall][rows - 1]
constexpr TileRowsKernel kTileRows[2][8] = {
    {tile_rows<1, false>, tile_rows<2, false>, tile_rows<3, false>, tile_rows<4, false>, tile_rows<5, false>,
     tile_rows<6, false>, tile_rows<7, false>, tile_rows<8, false>},
    {tile_rows<1, true>, tile_rows<2, true>, tile_rows<3, true>, tile_rows<4, true>, tile_rows<5, true>,
     tile_rows<6, true>, tile_rows<7, true>, tile_rows<8, true>}};

}  // namespace

void grouped_int4_linear(const GroupedInt4Weight& weight, const float* x, int64_t count, float* y,
                         const ParallelFor& parallel_for) {
  if (count == 0) return;
  const int64_t k = weight.k, n = weight.n, groups = k / weight.group;
  std::vector<int8_t> values(count * k);
  std::vector<int32_t> offsets(count * groups);
  std::vector<float> row_scales(count);
  round_rows(count, parallel_for, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      row_scales[m] = quantize_row(x + m * k, k, weight.group, values.data() + m * k, offsets.data() + m * groups);
    }
  });
  const int64_t tile_bytes = k / 4 * kRunBytes;
  const bool small = weight.small_scales != nullptr;
  const int64_t scale_bytes = tile_scale_bytes(groups, small);
  const uint8_t* scales = small ? reinterpret_cast<const uint8_t*>(weight.small_scales)
                                : reinterpret_cast<const uint8_t*>(weight.scales);
  pass_over_tiles(n / kTile, count, kRows, parallel_for, [&](int64_t tile, int64_t m, int64_t rows) {
    kTileRows[small][rows - 1](TileRows{weight.codes + tile * tile_bytes, scales + tile * scale_bytes,
                                        values.data() + m * k, offsets.data() + m * groups, row_scales.data() + m, k,
                                        weight.group, y + m * n + tile * kTile, n});
  });
}

}  // namespace gdn
