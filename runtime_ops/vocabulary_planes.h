// The token table of an 8da4w program, held once for the embedding lookup and the output head.
//
// Each weight is an 8-bit code c in [-128, 127] times its group's unit u: a
// row's bfloat16 unit times a uint8 per `group` weights of the row. The code's two nibbles are stored in
// two planes: `high` holds c >> 4 (+ 8, so 0..15), `low` holds c & 15. The
// lookup reads both planes (8 bits); the head reads the high plane only, as a
// 4-bit weight 16 u (high - 8 + 15/32), the middle of the codes it stands for,
// so a decode step streams half the table's bytes; or, given the `fifth` plane
// (each code's bit 3, a bit a weight), a 5-bit weight 8 u (2 high + fifth - 16 + 7/16).
// Within each run of 64 weights of a row, byte j of a nibble plane holds weight j
// in its low nibble and weight 32 + j in its high nibble; bit i of the fifth
// plane's byte k holds weight 8 k + i. gdn_export/ops/vocabulary_planes.py is the
// contract and reference; this header knows nothing of ATen or ExecuTorch.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

struct VocabularyPlanes {
  const uint8_t* high = nullptr;     // [rows, width / 2]
  const uint8_t* low = nullptr;      // [rows, width / 2]; unused by the head
  const uint8_t* fifth = nullptr;    // [rows, width / 8] or null (a 4-bit head); unused by the lookup
  const uint16_t* row_units = nullptr;   // [rows], bfloat16 bits
  const uint8_t* group_units = nullptr;  // [rows, width / group]
  int64_t rows = 0;
  int64_t width = 0;  // a multiple of 64
  int64_t group = 0;  // a multiple of 32 dividing width
};

// output[t, :] = the row of tokens[t] (every token already checked to lie in [0, rows)).
void planes_embedding(const VocabularyPlanes& table, const int64_t* tokens, int64_t count, float* output,
                      const ParallelFor& parallel_for);

// output[t, r] = sum_k head weight [r, k] * x[t, k] for count rows of x [count, width];
// each row of x is rounded to int8 (one max-abs scale) for the integer dot products. The head's weights have
// 5 bits where table.fifth is set, 4 otherwise.
void planes_logits(const VocabularyPlanes& table, const float* x, int64_t count, float* output,
                   const ParallelFor& parallel_for);

}  // namespace gdn
