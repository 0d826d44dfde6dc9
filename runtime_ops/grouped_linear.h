// The driver both grouped linears share (grouped_int8_linear.cpp, grouped_int4_linear.cpp): each rounds the rows
// of x to integers first, then passes its tiles of 16 output channels over the rounded rows, a few rows a pass.
// Knows nothing of ATen or ExecuTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

constexpr int64_t kGroupedRowBlock = 64;  // rows of x kept hot while a thread's tiles pass over them

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
