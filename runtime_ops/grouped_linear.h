// The driver both grouped linears share (grouped_int8_linear.cpp, grouped_int4_linear.cpp): each rounds the rows
// of x to integers first, then passes its tiles of 16 output channels over the rounded rows, a few rows a pass;
// and the readers of their scales' two forms. Knows nothing of ATen or ExecuTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>

#include "gated_delta_rule.h"  // ParallelFor
#include "vector_math.h"       // bfloat16_value

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gdn {

// A tile's scales, in either of the formats' two forms: [k / group][16] bfloat16, or the smaller int8 form
// [k / group + 4][16], each group's 16 integers and then the 16 channels' float32 multipliers (4 rows of 16 bytes).
constexpr int64_t kScalesTile = 16;

// The bytes of a tile's scales.
inline int64_t tile_scale_bytes(int64_t groups, bool small) {
  return small ? (groups + 4) * kScalesTile : groups * kScalesTile * 2;
}

// Scale g of a tile's channel `lane` (times its multiplier, for the int8 form, see channel_multiplier).
template <bool kSmall>
inline float group_scale(const void* scales, int64_t g, int64_t lane) {
  if constexpr (kSmall) {
    return float(static_cast<const int8_t*>(scales)[g * kScalesTile + lane]);
  } else {
    return bfloat16_value(static_cast<const uint16_t*>(scales)[g * kScalesTile + lane]);
  }
}

// The float32 multiplier of a tile's channel `lane` (the int8 form's; 1 for bfloat16 scales).
template <bool kSmall>
inline float channel_multiplier(const void* scales, int64_t groups, int64_t lane) {
  float multiplier = 1.0f;
  if constexpr (kSmall) {
    std::memcpy(&multiplier, static_cast<const int8_t*>(scales) + groups * kScalesTile + 4 * lane, sizeof(multiplier));
  }
  return multiplier;
}

#if defined(__AVX512BW__)
// Group g's 16 scales of a tile, as above.
template <bool kSmall>
inline __m512 group_scales(const void* scales, int64_t g) {
  if constexpr (kSmall) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(scales) + g * kScalesTile))));
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(scales) + g * kScalesTile))), 16));
  }
}

// What a tile's sums are multiplied by last: the row's scale, times (kSmall) the channels' multipliers.
template <bool kSmall>
inline __m512 output_scales(const void* scales, int64_t groups, float row_scale) {
  const __m512 row = _mm512_set1_ps(row_scale);
  if constexpr (kSmall) {
    return _mm512_mul_ps(row, _mm512_loadu_ps(static_cast<const int8_t*>(scales) + groups * kScalesTile));
  } else {
    return row;
  }
}
#elif defined(__AVX2__)
// Half `half` (channels 8 half .. 8 half + 7) of group g's scales of a tile.
template <bool kSmall>
inline __m256 group_scales(const void* scales, int64_t g, int half) {
  if constexpr (kSmall) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(scales) + g * kScalesTile + 8 * half))));
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(scales) + g * kScalesTile + 8 * half))), 16));
  }
}

// As the AVX-512 output_scales, for half `half` of the tile.
template <bool kSmall>
inline __m256 output_scales(const void* scales, int64_t groups, float row_scale, int half) {
  const __m256 row = _mm256_set1_ps(row_scale);
  if constexpr (kSmall) {
    return _mm256_mul_ps(row, _mm256_loadu_ps(reinterpret_cast<const float*>(static_cast<const int8_t*>(scales) +
                                                                              groups * kScalesTile) + 8 * half));
  } else {
    return row;
  }
}
#endif

constexpr int64_t kGroupedRowBlock = 64;  // rows of x kept hot while a thread's tiles pass over them

// How far ahead of a decode step's reads both linears ask for a tile's codes: a step's tiles stream from memory,
// and with the hardware prefetcher alone the 0.8B step's linears took 1.1x to 1.5x as long (AVX2 on Zen 3, AVX2
// and AVX-512 on a Xeon). 1 to 4 KiB ahead ran alike on Zen 3; on the Xeon 3 KiB was best, 1 KiB 1.15x to 1.2x
// slower (docs/benchmarks.md run 45).
constexpr int64_t kPrefetchBytes = 3072;

// Asks the cache for the bytes [at + kPrefetchBytes, at + kPrefetchBytes + bytes), a 64-byte line at a time.
inline void ask_ahead(const void* at, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) {
    __builtin_prefetch(static_cast<const char*>(at) + kPrefetchBytes + line, 0, 3);
  }
}

// round(begin, end) over the count rows of x: across the threads for a prompt, on the calling thread for a
// single row (a decode step), which is too little to share.
inline void round_rows(int64_t count, const ParallelFor& parallel_for,
                       const std::function<void(int64_t, int64_t)>& round) {
  if (count > 1) {
    parallel_for(0, count, round);
  } else {
    round(0, 1);
  }
}

// pass(tile, first row, rows) for every tile and every run of at most rows_per_pass of the count rows: the tiles
// split across the threads, each thread taking its tiles over one block of kGroupedRowBlock rows after another.
template <typename Pass>
void pass_over_tiles(int64_t tiles, int64_t count, int64_t rows_per_pass, const ParallelFor& parallel_for,
                     const Pass& pass) {
  parallel_for(0, tiles, [&](int64_t first, int64_t last) {
    for (int64_t block = 0; block < count; block += kGroupedRowBlock) {
      const int64_t block_end = std::min(count, block + kGroupedRowBlock);
      for (int64_t tile = first; tile < last; ++tile) {
        for (int64_t m = block; m < block_end; m += rows_per_pass) pass(tile, m, std::min(rows_per_pass, block_end - m));
      }
    }
  });
}

}  // namespace gdn
