// See vocabulary_planes.h. The head is a decode step's largest read (248320 x 1024 weights on the 0.8B
// shape), so its loop reads each run of the high plane once, splits it into vectors of nibbles and takes
// their integer dot products with the int8 activations: two runs a 512-bit vector where the compiler targets
// AVX-512 BW and VNNI; one run a 256-bit vector with AVX-VNNI's or AVX2's multiply-add pairs otherwise;
// plain C++ elsewhere. A 5-bit head shifts each nibble up one bit and adds the fifth plane's bit (a masked
// add of mask registers loaded from the plane with AVX-512; bits spread into bytes with AVX2) before the
// same products.
#include "vocabulary_planes.h"
#include "vector_math.h"  // bfloat16_value, max_magnitude

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// The head's 512-bit loop (below) where the compiler targets AVX-512 BW and VNNI, the 256-bit one otherwise.
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GDN_WIDE_HEAD 1
#else
#define GDN_WIDE_HEAD 0
#endif

namespace gdn {
namespace {

constexpr int64_t kGroupMultiple = 32;  // a group holds a multiple of 32 weights (one 32-byte half of a run)
// A high nibble h stands for the codes 16 (h - 8) .. 16 (h - 8) + 15: the head reads their middle.
constexpr float kHighOffset = 8.0f - 15.0f / 32.0f;
// With the fifth bit b, v = 2 h + b stands for the codes 8 (v - 16) .. 8 (v - 16) + 7.
constexpr float kFifthOffset = 16.0f - 7.0f / 16.0f;

// A head weight's value (the high nibble, or with the fifth plane 2 * nibble + bit) and what it is scaled by.
template <bool kFifth>
struct HeadBits {
  static constexpr float kOffset = kFifth ? kFifthOffset : kHighOffset;
  static constexpr float kScale = kFifth ? 8.0f : 16.0f;
  // Weight `index` of a row (its plane rows at high and fifth), plainly.
  static int32_t value(const uint8_t* high, const uint8_t* fifth, int64_t index) {
    const int64_t run = index / 64, j = index % 64;
    const uint8_t byte = high[32 * run + j % 32];
    const int32_t nibble = j < 32 ? byte & 0x0F : byte >> 4;
    if constexpr (kFifth) return 2 * nibble + ((fifth[index / 8] >> (index % 8)) & 1);
    return nibble;
  }
};
// Rows ahead that either head loop asks the cache for. The table streams from memory, a row of the high plane
// at a time, and with the hardware prefetcher alone a decode step's head took a tenth to a fifth longer in
// ExecuTorch's event tracer, in both the 512-bit and the 256-bit (x86-64-v3 build) loops on Zen 4.
constexpr int64_t kPrefetchRows = 8;

// One token's activations in int8 with one max-abs scale, and the sum of each 32 of them (at most 32 * 127).
struct Int8Activations {
  std::vector<int8_t> values;      // [width]
  std::vector<int16_t> half_sums;  // [width / 32]
  float scale = 0.0f;
};

void quantize_activations(const float* x, int64_t width, Int8Activations& out) {
  out.values.resize(width);
  out.half_sums.assign(width / kGroupMultiple, 0);
  out.scale = max_magnitude(x, width) / 127.0f;
  const float inverse = out.scale > 0.0f ? 1.0f / out.scale : 0.0f;
  for (int64_t i = 0; i < width; ++i) {
    const int32_t q = std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inverse)), -127, 127);
    out.values[i] = static_cast<int8_t>(q);
    out.half_sums[i / kGroupMultiple] = int16_t(out.half_sums[i / kGroupMultiple] + q);
  }
}

#if defined(__AVX2__)
inline int64_t load_u64(const uint8_t* bytes) {
  int64_t word;
  std::memcpy(&word, bytes, sizeof(word));
  return word;
}

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

// A run's 64 bits (broadcast to every 64-bit lane) as two vectors of 32 bytes, 0 or -1: bits 0..31, then
// 32..63 (bit i of either half -> byte i).
struct RunBits {
  __m256i first, second;
};

inline RunBits run_bits(const uint8_t* bits) {
  const __m256i word = _mm256_set1_epi64x(load_u64(bits));
  const __m256i select = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  // Byte i of a half gets the word's byte i / 8 (+ 4 for the second half).
  const __m256i first = _mm256_shuffle_epi8(word, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i second = _mm256_shuffle_epi8(word, _mm256_setr_epi8(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
                                                                    6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7));
  return {_mm256_cmpeq_epi8(_mm256_and_si256(first, select), select),
          _mm256_cmpeq_epi8(_mm256_and_si256(second, select), select)};
}
#endif

#if !GDN_WIDE_HEAD
// One row of the head against one token's int8 activations, in units of (row unit * activation scale): the sum
// over each 32 weights of unit * (sum of value * activation - offset * sum of activations), a value being a high
// nibble (or 2 * nibble + fifth bit). Integer all the way to one conversion a row: the products of values and
// activations summed in pairs (16 bits, at most 2 * 31 * 127), each pair times its unit summed into 32-bit lanes
// and the lanes into 64 bits (at most 255 * 7874 * width / 2 in all), and the units times the activations' half
// sums in 32 bits (at most 255 * 4064 * width / 32). `half_units` holds the row's unit of each 32 weights.
template <bool kFifth>
float head_row(const uint8_t* high, const uint8_t* fifth, const uint8_t* half_units, const Int8Activations& x,
               int64_t width) {
  const int64_t runs = width / 64, halves = width / kGroupMultiple;
  const int8_t* values = x.values.data();
  const int16_t* half_sums = x.half_sums.data();
  int64_t products = 0, offsets = 0;
  int64_t run = 0, h = 0;
#if defined(__AVX2__)
  __m256i offset = _mm256_setzero_si256();
  for (; h + 16 <= halves; h += 16) {
    offset = add_pair_products(
        offset, _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half_units + h))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half_sums + h)));
  }
  const __m256i nibble = _mm256_set1_epi8(kFifth ? 0x1E : 0x0F);
  // Four independent sums: one would chain every step of the row behind the last.
  __m256i partial[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
  for (; run + 2 <= runs; run += 2) {
    // One prefetch a 64-byte line (two runs): one a run, a second to a line already on its way, halved this
    // loop's pace with the table in cache in a loop of its own (32 against 62 billion weights a second, one
    // Zen 4 core).
    _mm_prefetch(reinterpret_cast<const char*>(high + 32 * run + kPrefetchRows * width / 2), _MM_HINT_T0);
    for (int r = 0; r < 2; ++r) {
      const int64_t at = run + r;
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + 32 * at));
      __m256i first, second;
      if constexpr (kFifth) {  // each nibble times 2, then its bit added (a bit's byte is -1)
        if (at % 8 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(fifth + 8 * at + kPrefetchRows * width / 8), _MM_HINT_T0);
        const RunBits bits = run_bits(fifth + 8 * at);
        first = _mm256_sub_epi8(_mm256_and_si256(_mm256_slli_epi16(bytes, 1), nibble), bits.first);
        second = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(bytes, 3), nibble), bits.second);
      } else {
        first = _mm256_and_si256(bytes, nibble);
        second = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
      }
      const __m256i first_pairs =
          _mm256_maddubs_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * at)));
      const __m256i second_pairs =
          _mm256_maddubs_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * at + 32)));
      // Each half's unit is broadcast from the row's own bytes: no table of them is written before the loop.
      partial[2 * r] = add_pair_products(partial[2 * r], first_pairs, _mm256_set1_epi16(half_units[2 * at]));
      partial[2 * r + 1] =
          add_pair_products(partial[2 * r + 1], second_pairs, _mm256_set1_epi16(half_units[2 * at + 1]));
    }
  }
  const __m256i total =
      _mm256_add_epi32(_mm256_add_epi32(partial[0], partial[1]), _mm256_add_epi32(partial[2], partial[3]));
  // A lane holds an eighth of the row's products, but their sum can pass 2^31 (the bound above is 2.6e9 for a
  // 5-bit row of width 2560, the 4B shape's), so the lanes are summed in 64 bits.
  const __m256i wide = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(total)),
                                        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(total, 1)));
  const __m128i two = _mm_add_epi64(_mm256_castsi256_si128(wide), _mm256_extracti128_si256(wide, 1));
  products = _mm_cvtsi128_si64(two) + _mm_extract_epi64(two, 1);
  const __m128i four = _mm_add_epi32(_mm256_castsi256_si128(offset), _mm256_extracti128_si256(offset, 1));
  const __m128i one = _mm_hadd_epi32(_mm_hadd_epi32(four, four), four);
  offsets = _mm_cvtsi128_si32(one);
#endif
  for (; h < halves; ++h) offsets += int32_t(half_units[h]) * half_sums[h];
  for (; run < runs; ++run) {
    for (int half = 0; half < 2; ++half) {
      int32_t dot = 0;
      for (int64_t j = 0; j < 32; ++j) {
        const int64_t index = 64 * run + 32 * half + j;
        dot += HeadBits<kFifth>::value(high, fifth, index) * values[index];
      }
      products += int64_t(dot) * half_units[2 * run + half];
    }
  }
  return float(products) - HeadBits<kFifth>::kOffset * float(offsets);
}

#endif  // !GDN_WIDE_HEAD

#if GDN_WIDE_HEAD
// With AVX-512 (BW and VNNI) a row takes under half the instructions of the 256-bit loop above, whose
// arithmetic alone (about 30 ns a row on one Zen 4 core, table in cache) was as slow as streaming the row
// from memory on two cores: each 64-byte load holds two runs, the units reach the products through one
// permute per 64 weights, and a row's offsets are one integer product of its units with the activations'
// half sums. The activations are laid out once per token to match the nibbles a 64-byte load splits into.
constexpr int64_t kHalvesPerBlock = 32;  // halves whose 16-bit units fill one 512-bit vector

struct WideActivations {
  std::vector<int8_t> low_values;    // [runs / 2, 64]: values of halves 4p and 4p + 2, beside the low nibbles
  std::vector<int8_t> high_values;   // [runs / 2, 64]: values of halves 4p + 1 and 4p + 3
  std::vector<int16_t> half_sums;    // [halves rounded up to a block]: the sum of each 32 values, then zeros
  const int8_t* values = nullptr;    // [width]: for a last odd run
  float scale = 0.0f;
};

void widen_activations(const Int8Activations& x, int64_t width, WideActivations& out) {
  const int64_t pairs = width / 128, halves = width / kGroupMultiple;
  out.low_values.resize(64 * pairs);
  out.high_values.resize(64 * pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    const int8_t* v = x.values.data() + 128 * p;
    std::memcpy(&out.low_values[64 * p], v, 32);
    std::memcpy(&out.low_values[64 * p + 32], v + 64, 32);
    std::memcpy(&out.high_values[64 * p], v + 32, 32);
    std::memcpy(&out.high_values[64 * p + 32], v + 96, 32);
  }
  out.half_sums.assign((halves + kHalvesPerBlock - 1) / kHalvesPerBlock * kHalvesPerBlock, 0);
  std::copy(x.half_sums.begin(), x.half_sums.end(), out.half_sums.begin());
  out.values = x.values.data();
  out.scale = x.scale;
}

// Lane l of a pair's low (high) unit vector takes the unit of half 4k (4k + 1) for l < 16 and of half 4k + 2
// (4k + 3) after: the halves the low (high) nibbles of its two runs belong to.
struct UnitPermutes {
  alignas(64) int16_t low[kHalvesPerBlock / 4][32];
  alignas(64) int16_t high[kHalvesPerBlock / 4][32];
  UnitPermutes() {
    for (int k = 0; k < kHalvesPerBlock / 4; ++k)
      for (int lane = 0; lane < 32; ++lane) {
        low[k][lane] = int16_t(4 * k + (lane < 16 ? 0 : 2));
        high[k][lane] = int16_t(4 * k + (lane < 16 ? 1 : 3));
      }
  }
};
const UnitPermutes kUnitPermutes;

// 32 bits of a plane as a mask.
inline __mmask32 bits_mask(const uint8_t* bits) {
  uint32_t word;
  std::memcpy(&word, bits, 4);
  return _cvtu32_mask32(word);
}

// head_row's sum for one row, from half_units: the row's unit of each half of 32 weights.
template <bool kFifth>
float head_row_wide(const uint8_t* high, const uint8_t* fifth, const uint8_t* half_units, const WideActivations& x,
                    int64_t width) {
  const int64_t halves = width / kGroupMultiple, pairs = width / 128;
  const __m512i nibble = _mm512_set1_epi8(kFifth ? 0x1E : 0x0F);
  const __m512i one = _mm512_set1_epi8(1);
  __m512i low_sum = _mm512_setzero_si512(), high_sum = _mm512_setzero_si512(), offset = _mm512_setzero_si512();
  for (int64_t first = 0; first < halves; first += kHalvesPerBlock) {
    const int64_t count = std::min(kHalvesPerBlock, halves - first);
    const __mmask32 present = count == kHalvesPerBlock ? ~__mmask32(0) : (__mmask32(1) << count) - 1;
    const __m512i units = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(present, half_units + first));
    offset = _mm512_dpwssd_epi32(offset, units,
                                 _mm512_loadu_si512(reinterpret_cast<const void*>(x.half_sums.data() + first)));
    const int64_t block_pairs = std::min(kHalvesPerBlock / 4, pairs - first / 4);
    for (int64_t k = 0; k < block_pairs; ++k) {
      const int64_t p = first / 4 + k;
      _mm_prefetch(reinterpret_cast<const char*>(high + 64 * p + kPrefetchRows * width / 2), _MM_HINT_T0);
      const __m512i bytes = _mm512_loadu_si512(reinterpret_cast<const void*>(high + 64 * p));
      __m512i low, high_nibbles;
      if constexpr (kFifth) {
        // The pair's bits: runs 2p and 2p + 1, 64 each. The low vector's lanes are weights 0..31 of either run,
        // the high vector's weights 32..63: each nibble times 2, plus its bit where the mask has it.
        if (p % 4 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(fifth + 16 * p + kPrefetchRows * width / 8), _MM_HINT_T0);
        const uint8_t* bits = fifth + 16 * p;  // 32-bit words: run 2p's halves, then run 2p + 1's
        const __mmask64 low_bits = _mm512_kunpackd(bits_mask(bits + 8), bits_mask(bits));
        const __mmask64 high_bits = _mm512_kunpackd(bits_mask(bits + 12), bits_mask(bits + 4));
        low = _mm512_and_si512(_mm512_slli_epi16(bytes, 1), nibble);
        high_nibbles = _mm512_and_si512(_mm512_srli_epi16(bytes, 3), nibble);
        low = _mm512_mask_add_epi8(low, low_bits, low, one);
        high_nibbles = _mm512_mask_add_epi8(high_nibbles, high_bits, high_nibbles, one);
      } else {
        low = _mm512_and_si512(bytes, nibble);
        high_nibbles = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
      }
      const __m512i low_pairs = _mm512_maddubs_epi16(low, _mm512_loadu_si512(x.low_values.data() + 64 * p));
      const __m512i high_pairs =
          _mm512_maddubs_epi16(high_nibbles, _mm512_loadu_si512(x.high_values.data() + 64 * p));
      low_sum = _mm512_dpwssd_epi32(
          low_sum, low_pairs, _mm512_permutexvar_epi16(_mm512_load_si512(kUnitPermutes.low[k]), units));
      high_sum = _mm512_dpwssd_epi32(
          high_sum, high_pairs, _mm512_permutexvar_epi16(_mm512_load_si512(kUnitPermutes.high[k]), units));
    }
  }
  // Summed in 64 bits, as in head_row: a lane's share cannot pass 2^31, the row's total can.
  const __m512i sums = _mm512_add_epi32(low_sum, high_sum);
  int64_t products = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(sums)),
                                                              _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(sums, 1))));
  for (int64_t run = 2 * pairs; run < width / 64; ++run)  // a last run without a partner
    for (int half = 0; half < 2; ++half) {
      int32_t dot = 0;
      for (int64_t j = 0; j < 32; ++j) {
        const int64_t index = 64 * run + 32 * half + j;
        dot += HeadBits<kFifth>::value(high, fifth, index) * x.values[index];
      }
      products += int64_t(dot) * half_units[2 * run + half];
    }
  return float(products) - HeadBits<kFifth>::kOffset * float(_mm512_reduce_add_epi32(offset));
}
#endif
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

namespace {

template <bool kFifth>
void head_logits(const VocabularyPlanes& table, const float* x, int64_t count, float* output,
                 const ParallelFor& parallel_for) {
  using Bits = HeadBits<kFifth>;
  std::vector<Int8Activations> activations(count);
  for (int64_t t = 0; t < count; ++t)
    quantize_activations(x + t * table.width, table.width, activations[t]);
  const int64_t bytes_per_row = table.width / 2, groups = table.width / table.group;
  const int64_t halves = table.width / kGroupMultiple, halves_per_group = table.group / kGroupMultiple;
  const auto fifth_row = [&](int64_t row) { return kFifth ? table.fifth + row * (table.width / 8) : nullptr; };
#if GDN_WIDE_HEAD
  std::vector<WideActivations> wide(count);
  for (int64_t t = 0; t < count; ++t) widen_activations(activations[t], table.width, wide[t]);
#endif
  parallel_for(0, table.rows, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> expanded(halves_per_group == 1 ? 0 : halves);
    for (int64_t row = begin; row < end; ++row) {
      // The row's unit of each 32 weights, as both loops read them: its group units, each repeated where a
      // group is wider.
      const uint8_t* half_units = table.group_units + row * groups;
      if (halves_per_group != 1) {
        for (int64_t h = 0; h < halves; ++h) expanded[h] = half_units[h / halves_per_group];
        half_units = expanded.data();
      }
      const float row_unit = Bits::kScale * bfloat16_value(table.row_units[row]);
      for (int64_t t = 0; t < count; ++t) {
#if GDN_WIDE_HEAD
        output[t * table.rows + row] = row_unit * wide[t].scale *
            head_row_wide<kFifth>(table.high + row * bytes_per_row, fifth_row(row), half_units, wide[t], table.width);
#else
        output[t * table.rows + row] = row_unit * activations[t].scale *
            head_row<kFifth>(table.high + row * bytes_per_row, fifth_row(row), half_units, activations[t], table.width);
#endif
      }
    }
  });
}

}  // namespace

void planes_logits(const VocabularyPlanes& table, const float* x, int64_t count, float* output,
                   const ParallelFor& parallel_for) {
  if (table.fifth != nullptr) {
    head_logits<true>(table, x, count, output, parallel_for);
  } else {
    head_logits<false>(table, x, count, output, parallel_for);
  }
}

}  // namespace gdn
