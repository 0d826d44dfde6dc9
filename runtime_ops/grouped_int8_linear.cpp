// See grouped_int8_linear.h. A tile of 16 output channels is one vector of int32 sums: for each pair of inputs a
// 32-byte run of codes is widened to 16-bit and multiplied-and-added with the pair of the row's int16 values,
// broadcast. Up to kRows rows of x share each run of codes, so a prompt reads each tile once per kRows rows.
#include "grouped_int8_linear.h"
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
// Rows of x per pass over a tile. AVX-512: 8 rows' int32 and float sums in 16 of its 32 registers. AVX2, whose
// registers hold half a tile: 6 rows' 12 int32 sums, the pair's two vectors of codes, a broadcast and a product
// fill its 16 (the float sums, touched once a group, wait in memory). Against 4 rows, 6 made an AVX2 prompt's
// products 1.14x to 1.18x as fast on one Zen 3 core of a shared host while its other load slowed the core, and
// the same (about 50 billion a second) while not (docs/benchmarks.md, run 44).
#if defined(__AVX512BW__)
constexpr int64_t kRows = 8;
#elif defined(__AVX2__)
constexpr int64_t kRows = 6;
#else
constexpr int64_t kRows = 4;
#endif

// One row of x in int16 with one max-abs scale (the contract's rounding: to nearest, ties to even).
float quantize_row(const float* x, int64_t k, int16_t* out) {
  const float scale = max_magnitude(x, k) / 32767.0f;
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 by = _mm512_set1_ps(inverse);
  for (; i + 16 <= k; i += 16) {
    const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), by));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtsepi32_epi16(rounded));
  }
#endif
  for (; i < k; ++i) {
    out[i] = static_cast<int16_t>(std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inverse)), -32767, 32767));
  }
  return scale;
}

#if defined(__AVX512BW__)
// Pins a sum to its register as it is updated: unpinned, GCC 12 wrote each of the kCount products to a copy of
// its sum and moved it back, three instructions a product instead of one. "x" (zmm0-15), not "v" (zmm0-31):
// given "v", GCC 12 still moved the 6- and 8-row passes' last sum through the register of the codes and back,
// which llvm-mca put at 7.1 cycles a pair of inputs over 8 rows against 6.4 without.
inline void keep_in_register(__m512i& sum) { asm volatile("" : "+x"(sum)); }

inline __m512i add_pair_products(__m512i sum, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(sum, a, b);
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(a, b));
#endif
}

// rows (<= kRows) rows of x against one tile: y[r][0..16) = row_scales[r] * sum_g scale_g * (int32 sum of group g),
// the scales of either form (grouped_linear.h).
template <int kCount, bool kSmall>
void tile_rows(const int8_t* codes, const void* scales, const int16_t* x, const float* row_scales, int64_t k,
               int64_t group, float* y, int64_t y_stride) {
  __m512 out[kCount];
  for (int r = 0; r < kCount; ++r) out[r] = _mm512_setzero_ps();
  const int64_t pairs = group / 2;
  for (int64_t g = 0; g < k / group; ++g) {
    __m512i sums[kCount];
    for (int r = 0; r < kCount; ++r) sums[r] = _mm512_setzero_si512();
    const int8_t* run = codes + g * group * kTile;
    if constexpr (kCount == 1) ask_ahead(run, group * kTile);  // a decode step
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(run + 2 * kTile * p)));
      const int64_t at = g * group + 2 * p;
      for (int r = 0; r < kCount; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * k + at, sizeof(pair));
        sums[r] = add_pair_products(sums[r], w, _mm512_set1_epi32(pair));
        keep_in_register(sums[r]);
      }
    }
    const __m512 scale = group_scales<kSmall>(scales, g);
    for (int r = 0; r < kCount; ++r) out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scale, out[r]);
  }
  for (int r = 0; r < kCount; ++r) {
    _mm512_storeu_ps(y + r * y_stride, _mm512_mul_ps(out[r], output_scales<kSmall>(scales, k / group, row_scales[r])));
  }
}
#elif defined(__AVX2__)
// Pins a row's two sums to registers as they are updated. Unpinned, GCC makes all kCount broadcasts of a pair
// first, runs out of AVX2's 16 registers and keeps a sum on the stack (a load and a store a pair). The 16da8w
// prefill with AVX-512 hidden (gdn-bench e2e --hide-avx512) went from 140 to 155-206 tok/s at 512 tokens.
inline void keep_in_registers(__m256i& first, __m256i& second) { asm volatile("" : "+x"(first), "+x"(second)); }

// sums[r][half] += the products of one group of a tile (`pairs` pairs of inputs from `run`) with kCount rows of
// x, k apart: each pair's 32 codes widened to 16 bits once, then multiplied-and-added with each row's pair,
// broadcast.
template <int kCount>
inline void add_group_products(const int8_t* run, const int16_t* x, int64_t k, int64_t pairs,
                               __m256i (&sums)[kCount][2]) {
  for (int64_t p = 0; p < pairs; ++p) {
    const int8_t* at_codes = run + 2 * kTile * p;
    const __m256i low = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at_codes)));
    const __m256i high = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at_codes + 16)));
    for (int r = 0; r < kCount; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * k + 2 * p, sizeof(pair));
      const __m256i xs = _mm256_set1_epi32(pair);
#if defined(__AVXVNNI__)
      sums[r][0] = _mm256_dpwssd_avx_epi32(sums[r][0], low, xs);
      sums[r][1] = _mm256_dpwssd_avx_epi32(sums[r][1], high, xs);
#else
      sums[r][0] = _mm256_add_epi32(sums[r][0], _mm256_madd_epi16(low, xs));
      sums[r][1] = _mm256_add_epi32(sums[r][1], _mm256_madd_epi16(high, xs));
      keep_in_registers(sums[r][0], sums[r][1]);
#endif
    }
  }
}

#if !defined(__AVXVNNI__)
// The same for a full pass of 6 rows, in assembly: its 12 sums, the two vectors of codes, the broadcast and the
// product take all 16 registers, and GCC, given the loop above, moved each sum through a spare register after
// its add (a third more instructions a pair). At 4 rows such moves cost little: written so, that loop ran
// within 1.07x of the loop above.
template <>
inline void add_group_products<6>(const int8_t* run, const int16_t* x, int64_t k, int64_t pairs,
                                  __m256i (&sums)[6][2]) {
  const int8_t* const end = run + 2 * kTile * pairs;
  const int64_t stride = k * int64_t(sizeof(int16_t));  // bytes from one row of x to the next
  // Row r's pair: rows 0-2 at x + r * stride, rows 3-5 from rax = x + 3 * stride. Low codes (channels 0-7) in
  // ymm12 go to sums[r][0], high codes (8-15) in ymm13 to sums[r][1]. The loop runs its body before its test:
  // a group holds at least 16 pairs.
#define GDN_ROW_PAIR(address, first, second)                                   \
  "vpbroadcastd " address ", %%ymm14\n\t"                                      \
  "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"                                     \
  "vpaddd %%ymm15, %[" first "], %[" first "]\n\t"                             \
  "vpmaddwd %%ymm14, %%ymm13, %%ymm14\n\t"                                     \
  "vpaddd %%ymm14, %[" second "], %[" second "]\n\t"
  asm volatile(
      "1:\n\t"
      "vpmovsxbw (%[codes]), %%ymm12\n\t"
      "vpmovsxbw 16(%[codes]), %%ymm13\n\t"
      "lea (%[x], %[stride], 2), %%rax\n\t"
      "add %[stride], %%rax\n\t"
      GDN_ROW_PAIR("(%[x])", "s00", "s01")
      GDN_ROW_PAIR("(%[x], %[stride], 1)", "s10", "s11")
      GDN_ROW_PAIR("(%[x], %[stride], 2)", "s20", "s21")
      GDN_ROW_PAIR("(%%rax)", "s30", "s31")
      GDN_ROW_PAIR("(%%rax, %[stride], 1)", "s40", "s41")
      GDN_ROW_PAIR("(%%rax, %[stride], 2)", "s50", "s51")
      "add $32, %[codes]\n\t"
      "add $4, %[x]\n\t"
      "cmp %[end], %[codes]\n\t"
      "jb 1b\n\t"
      : [s00] "+x"(sums[0][0]), [s01] "+x"(sums[0][1]), [s10] "+x"(sums[1][0]), [s11] "+x"(sums[1][1]),
        [s20] "+x"(sums[2][0]), [s21] "+x"(sums[2][1]), [s30] "+x"(sums[3][0]), [s31] "+x"(sums[3][1]),
        [s40] "+x"(sums[4][0]), [s41] "+x"(sums[4][1]), [s50] "+x"(sums[5][0]), [s51] "+x"(sums[5][1]),
        [codes] "+r"(run), [x] "+r"(x)
      : [stride] "r"(stride), [end] "r"(end)
      : "rax", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
#undef GDN_ROW_PAIR
}
#endif

// As above with two 8-lane halves of the tile.
template <int kCount, bool kSmall>
void tile_rows(const int8_t* codes, const void* scales, const int16_t* x, const float* row_scales, int64_t k,
               int64_t group, float* y, int64_t y_stride) {
  __m256 out[kCount][2];
  for (int r = 0; r < kCount; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  const int64_t pairs = group / 2;
  for (int64_t g = 0; g < k / group; ++g) {
    __m256i sums[kCount][2];
    for (int r = 0; r < kCount; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    if constexpr (kCount == 1) ask_ahead(codes + g * group * kTile, group * kTile);  // a decode step
    add_group_products<kCount>(codes + g * group * kTile, x + g * group, k, pairs, sums);
    for (int half = 0; half < 2; ++half) {
      const __m256 scale = group_scales<kSmall>(scales, g, half);
      for (int r = 0; r < kCount; ++r) {
        out[r][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][half]), scale, out[r][half]);
      }
    }
  }
  for (int r = 0; r < kCount; ++r) {
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_ps(y + r * y_stride + 8 * half,
                       _mm256_mul_ps(out[r][half], output_scales<kSmall>(scales, k / group, row_scales[r], half)));
    }
  }
}
#else
template <int kCount, bool kSmall>
void tile_rows(const int8_t* codes, const void* scales, const int16_t* x, const float* row_scales, int64_t k,
               int64_t group, float* y, int64_t y_stride) {
  for (int r = 0; r < kCount; ++r) {
    for (int64_t lane = 0; lane < kTile; ++lane) {
      float total = 0.0f;
      for (int64_t g = 0; g < k / group; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          sum += int32_t(codes[(i / 2) * 2 * kTile + 2 * lane + i % 2]) * x[r * k + i];
        }
        total += float(sum) * group_scale<kSmall>(scales, g, lane);
      }
      y[r * y_stride + lane] = total * (row_scales[r] * channel_multiplier<kSmall>(scales, k / group, lane));
    }
  }
}
#endif

using TileRows = void (*)(const int8_t*, const void*, const int16_t*, const float*, int64_t, int64_t, float*, int64_t);
// [kSmall][rows - 1]
constexpr TileRows kTileRows[2][8] = {
    {tile_rows<1, false>, tile_rows<2, false>, tile_rows<3, false>, tile_rows<4, false>, tile_rows<5, false>,
     tile_rows<6, false>, tile_rows<7, false>, tile_rows<8, false>},
    {tile_rows<1, true>, tile_rows<2, true>, tile_rows<3, true>, tile_rows<4, true>, tile_rows<5, true>,
     tile_rows<6, true>, tile_rows<7, true>, tile_rows<8, true>}};

}  // namespace

void grouped_int8_linear(const GroupedInt8Weight& weight, const float* x, int64_t count, float* y,
                         const ParallelFor& parallel_for) {
  if (count == 0) return;
  const int64_t k = weight.k, n = weight.n;
  std::vector<int16_t> values(count * k);
  std::vector<float> row_scales(count);
  round_rows(count, parallel_for, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) row_scales[m] = quantize_row(x + m * k, k, values.data() + m * k);
  });
  const bool small = weight.small_scales != nullptr;
  const int64_t tile_bytes = k * kTile, scale_bytes = tile_scale_bytes(k / weight.group, small);
  const uint8_t* scales = small ? reinterpret_cast<const uint8_t*>(weight.small_scales)
                                : reinterpret_cast<const uint8_t*>(weight.scales);
  pass_over_tiles(n / kTile, count, kRows, parallel_for, [&](int64_t tile, int64_t m, int64_t rows) {
    kTileRows[small][rows - 1](weight.codes + tile * tile_bytes, scales + tile * scale_bytes, values.data() + m * k,
                               row_scales.data() + m, k, weight.group, y + m * n + tile * kTile, n);
  });
}

}  // namespace gdn
