// gdn::cached_attention on CPU.
//
// Work unit: one KV head and a block of up to kBlockRows query rows of its
// group (rows are (query head, token) pairs). Both products of a block are
// matrix products over packed panels of kPanel columns:
//
//   scores  [rows, positions] = (scale q)  [rows, D]         K [D, positions]
//   output  [rows, D]         = weights    [rows, positions] V [positions, D]
//
// A panel (kPanel columns of K or V, copied contiguous and zero-padded) is read
// from the cache once per block and serves every row tile of the block from L1;
// a tile of kTileRows x kPanel sums stays in registers. A block of one tile (a
// decode step) uses each cache line once, so it streams the caches a few rows
// at a time instead (the streamed loops). Only positions a row can
// see are read: row t stops at start + t, so a decode step at position p costs
// O(p), not O(S), and a long causal prefill does about half the square.
#include "cached_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace gdn {
namespace {

constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float UnalignedVec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
typedef int32_t IntVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }

constexpr int64_t kPanel = 2 * kLanes;
// 12 accumulators, 2 panel vectors and a broadcast: the 16 AVX2 registers.
constexpr int kTileRows = 6;
// Large enough that a cache panel, read once per block, serves many tiles.
constexpr int64_t kBlockRows = 8 * kTileRows;

// e^x for x <= 0 (a score minus its row's maximum), within 2e-7 relative: x = n ln2 + r
// with |r| <= ln2 / 2, e^r by its Taylor series to r^6, 2^n put into the exponent bits.
// Scalar expf would cost as much as the two products at long contexts.
inline Vec exp_nonpositive(Vec x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  x = x < -87.0f ? Vec{} - 87.0f : x;    // 2^n stays a normal float (and NaN-free for -inf)
  const Vec shifted = x * 1.44269504f + kRound;
  const Vec n = shifted - kRound;
  const Vec r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 in two parts: exact n * hi
  Vec poly = r * (1.0f / 720) + (1.0f / 120);
  poly = poly * r + (1.0f / 24);
  poly = poly * r + (1.0f / 6);
  poly = poly * r + 0.5f;
  poly = poly * r + 1.0f;
  poly = poly * r + 1.0f;
  const IntVec exponent = ((IntVec)shifted - (IntVec)(Vec{} + kRound) + 127) << 23;
  return poly * (Vec)exponent;
}

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// c[r][0, kPanel) = sum_{k < depth} a[k * kBlockRows + r] * panel[k][0, kPanel) for r < kRows.
template <int kRows>
void panel_tile(int64_t depth, const float* a, const float* panel, float* c, int64_t ldc) {
  Vec acc[kRows][2] = {};
  for (int64_t k = 0; k < depth; ++k) {
    const Vec low = load(panel + k * kPanel), high = load(panel + k * kPanel + kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec x = a[k * kBlockRows + r] - Vec{};  // broadcast (x - 0 is x, also for -0)
      acc[r][0] += x * low;
      acc[r][1] += x * high;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    store(c + r * ldc, acc[r][0]);
    store(c + r * ldc + kLanes, acc[r][1]);
  }
}

void tile(int rows, int64_t depth, const float* a, const float* panel, float* c, int64_t ldc) {
  switch (rows) {
    case 1: return panel_tile<1>(depth, a, panel, c, ldc);
    case 2: return panel_tile<2>(depth, a, panel, c, ldc);
    case 3: return panel_tile<3>(depth, a, panel, c, ldc);
    case 4: return panel_tile<4>(depth, a, panel, c, ldc);
    case 5: return panel_tile<5>(depth, a, panel, c, ldc);
    default: return panel_tile<kTileRows>(depth, a, panel, c, ldc);
  }
}

// panel[k][c] = source[k * stride + c] for k < depth and c < columns, zero up to kPanel.
void pack_panel(const float* source, int64_t stride, int64_t depth, int64_t columns, float* panel) {
  for (int64_t k = 0; k < depth; ++k) {
    float* row = panel + k * kPanel;
    std::copy(source + k * stride, source + k * stride + columns, row);
    std::fill(row + columns, row + kPanel, 0.0f);
  }
}

struct Workspace {
  std::vector<float> packed_query;    // [D][kBlockRows], scaled
  std::vector<float> panel;           // [max(D, positions)][kPanel]
  std::vector<float> scores;          // [kBlockRows][width]: scores, then unnormalized weights
  std::vector<float> packed_weights;  // [positions][kBlockRows]
  std::vector<float> sums;            // [kBlockRows][round_up(D, kPanel)]
};

// The rows of one block: which positions each sees, where its output goes.
struct Block {
  const float* keys;    // [D, S] of the KV head
  const float* values;  // [S, D]
  int64_t rows = 0;
  int64_t visible[kBlockRows];  // row i sees positions 0..visible[i]-1
  float* outputs[kBlockRows];
  int64_t longest = 0;
  int64_t width = 0;       // scores row length: longest, padded to kPanel
  int64_t padded_dim = 0;  // sums row length

  // Rows of a tile are consecutive tokens of one head, or straddle two heads: a
  // tile computes up to the longest view among its rows.
  int64_t tile_longest(int64_t first) const {
    return *std::max_element(visible + first, visible + std::min<int64_t>(first + kTileRows, rows));
  }
};

void scores_tiled(const CachedAttentionProblem& p, const Block& b, Workspace& work) {
  for (int64_t s = 0; s < b.longest; s += kPanel) {
    pack_panel(b.keys + s, p.k_cache_strides[1], p.head_dim, std::min(kPanel, b.longest - s), work.panel.data());
    for (int64_t i = 0; i < b.rows; i += kTileRows) {
      if (s >= b.tile_longest(i)) continue;
      tile(int(std::min<int64_t>(kTileRows, b.rows - i)), p.head_dim, work.packed_query.data() + i,
           work.panel.data(), work.scores.data() + i * b.width + s, b.width);
    }
  }
}

// The streamed loops take kStreamed cache rows (K rows of consecutive dims, V rows of consecutive positions) a
// pass, so that each score or sum is loaded and stored once for kStreamed products rather than once for each;
// and ask for the next pass's rows ahead: K rows lie a cache length apart, each in pages of its own, where the
// hardware prefetcher does not follow. (Together 1.3x to 1.5x faster on a decode step, docs/benchmarks.md.)
constexpr int64_t kStreamed = 4;
constexpr int64_t kPrefetchRows = kStreamed;

inline void prefetch_lines(const float* row, int64_t count) {
  for (int64_t i = 0; i < count; i += 64 / int64_t(sizeof(float))) __builtin_prefetch(row + i);
}

void scores_streamed(const CachedAttentionProblem& p, const Block& b, Workspace& work) {
  for (int64_t i = 0; i < b.rows; ++i) std::fill_n(work.scores.data() + i * b.width, b.visible[i], 0.0f);
  static_assert(kStreamed == 4, "the passes below name their four rows");
  const int64_t ld = p.k_cache_strides[1];
  for (int64_t d = 0; d < p.head_dim; d += kStreamed) {
    const int64_t count = std::min(kStreamed, p.head_dim - d);
    const float* keys[kStreamed];  // a last pass short of rows repeats its last one, with weight zero
    for (int64_t j = 0; j < kStreamed; ++j) keys[j] = b.keys + (d + std::min(j, count - 1)) * ld;
    for (int64_t j = 0; j < kStreamed; ++j) {
      if (d + kPrefetchRows + j < p.head_dim) prefetch_lines(b.keys + (d + kPrefetchRows + j) * ld, b.longest);
    }
    for (int64_t i = 0; i < b.rows; ++i) {
      float weights[kStreamed];
        for (int64_t j = 0; j < kStreamed; ++j) {
        weights[j] = j < count ? work.packed_query[(d + j) * kBlockRows + i] : 0.0f;
      }
      float* __restrict row_scores = work.scores.data() + i * b.width;
      const float *__restrict k0 = keys[0], *__restrict k1 = keys[1];
      const float *__restrict k2 = keys[2], *__restrict k3 = keys[3];
      for (int64_t s = 0; s < b.visible[i]; ++s) {
        row_scores[s] += weights[0] * k0[s] + weights[1] * k1[s] + weights[2] * k2[s] + weights[3] * k3[s];
      }
    }
  }
}

// Softmax in fp32 over each row's visible positions, in place, left unnormalized
// (the sums are divided at the end); returns each row's total.
void softmax_rows(const Block& b, Workspace& work, float* total) {
  for (int64_t i = 0; i < b.rows; ++i) {
    float* row_scores = work.scores.data() + i * b.width;
    const float peak = *std::max_element(row_scores, row_scores + b.visible[i]);
    // Whole vectors: the row is padded to `width`; lanes past visible[i] are not summed.
    Vec partial{};
    int64_t s = 0;
    for (; s + kLanes <= b.visible[i]; s += kLanes) {
      const Vec weights = exp_nonpositive(load(row_scores + s) - peak);
      store(row_scores + s, weights);
      partial += weights;
    }
    float sum = 0.0f;
    if (s < b.visible[i]) {
      store(row_scores + s, exp_nonpositive(load(row_scores + s) - peak));
      for (; s < b.visible[i]; ++s) sum += row_scores[s];
    }
    for (int l = 0; l < kLanes; ++l) sum += partial[l];
    total[i] = sum;
  }
}

void values_tiled(const CachedAttentionProblem& p, const Block& b, Workspace& work) {
  // The weights transposed, zero where a row cannot see, as the left operand.
  for (int64_t i = 0; i < b.rows; ++i) {
    const float* weights = work.scores.data() + i * b.width;
    int64_t s = 0;
    for (; s < b.visible[i]; ++s) work.packed_weights[s * kBlockRows + i] = weights[s];
    for (; s < b.longest; ++s) work.packed_weights[s * kBlockRows + i] = 0.0f;
  }
  for (int64_t d = 0; d < p.head_dim; d += kPanel) {
    pack_panel(b.values + d, p.v_cache_strides[1], b.longest, std::min(kPanel, p.head_dim - d), work.panel.data());
    for (int64_t i = 0; i < b.rows; i += kTileRows) {
      tile(int(std::min<int64_t>(kTileRows, b.rows - i)), b.tile_longest(i), work.packed_weights.data() + i,
           work.panel.data(), work.sums.data() + i * b.padded_dim + d, b.padded_dim);
    }
  }
}

void values_streamed(const CachedAttentionProblem& p, const Block& b, Workspace& work) {
  for (int64_t i = 0; i < b.rows; ++i) std::fill_n(work.sums.data() + i * b.padded_dim, p.head_dim, 0.0f);
  const int64_t ld = p.v_cache_strides[1];
  for (int64_t s = 0; s < b.longest; s += kStreamed) {
    const int64_t count = std::min(kStreamed, b.longest - s);
    const float* values[kStreamed];  // as keys above
    for (int64_t j = 0; j < kStreamed; ++j) values[j] = b.values + (s + std::min(j, count - 1)) * ld;
    for (int64_t j = 0; j < kStreamed; ++j) {
      if (s + kPrefetchRows + j < b.longest) prefetch_lines(b.values + (s + kPrefetchRows + j) * ld, p.head_dim);
    }
    for (int64_t i = 0; i < b.rows; ++i) {
      float weights[kStreamed];  // zero past what the row sees
      for (int64_t j = 0; j < kStreamed; ++j) {
        weights[j] = j < count && s + j < b.visible[i] ? work.scores[i * b.width + s + j] : 0.0f;
      }
      float* __restrict row_sums = work.sums.data() + i * b.padded_dim;
      const float *__restrict v0 = values[0], *__restrict v1 = values[1];
      const float *__restrict v2 = values[2], *__restrict v3 = values[3];
      for (int64_t d = 0; d < p.head_dim; ++d) {
        row_sums[d] += weights[0] * v0[d] + weights[1] * v1[d] + weights[2] * v2[d] + weights[3] * v3[d];
      }
    }
  }
}

// The workspace only grows: resize keeps what a smaller block leaves, so a thread's calls allocate once.
void at_least(std::vector<float>& buffer, int64_t size) {
  if (int64_t(buffer.size()) < size) buffer.resize(size);
}

void attend_block(const CachedAttentionProblem& p, int64_t kv_head, int64_t first_row, int64_t rows,
                  Workspace& work) {
  const int64_t length = p.length, dim = p.head_dim;
  Block b;
  b.keys = p.k_cache + kv_head * p.k_cache_strides[0];
  b.values = p.v_cache + kv_head * p.v_cache_strides[0];
  b.rows = rows;
  at_least(work.packed_query, dim * kBlockRows);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = first_row + i;
    const int64_t head = kv_head * (p.num_heads / p.num_kv_heads) + row / length, token = row % length;
    b.visible[i] = p.start + token + 1;
    b.longest = std::max(b.longest, b.visible[i]);
    const float* query = p.query + head * p.query_strides[0] + token * p.query_strides[1];
    for (int64_t d = 0; d < dim; ++d) work.packed_query[d * kBlockRows + i] = p.scale * query[d * p.query_strides[2]];
    b.outputs[i] = p.output + head * p.output_strides[0] + token * p.output_strides[1];
  }
  b.width = round_up(b.longest, kPanel);
  b.padded_dim = round_up(dim, kPanel);
  const bool streamed = rows <= kTileRows;
  // The streamed path needs no panels.
  if (!streamed) {
    at_least(work.panel, std::max(dim, b.longest) * kPanel);
    at_least(work.packed_weights, b.longest * kBlockRows);
  }
  at_least(work.scores, kBlockRows * b.width);
  at_least(work.sums, kBlockRows * b.padded_dim);

  streamed ? scores_streamed(p, b, work) : scores_tiled(p, b, work);
  float total[kBlockRows];
  softmax_rows(b, work, total);
  streamed ? values_streamed(p, b, work) : values_tiled(p, b, work);
  for (int64_t i = 0; i < rows; ++i) {
    const float inverse = 1.0f / total[i];
    const float* row_sums = work.sums.data() + i * b.padded_dim;
    for (int64_t d = 0; d < dim; ++d) b.outputs[i][d * p.output_strides[2]] = row_sums[d] * inverse;
  }
}

}  // namespace

void cached_attention(const CachedAttentionProblem& p, const ParallelFor& parallel_for) {
  const int64_t rows_per_kv_head = (p.num_heads / p.num_kv_heads) * p.length;
  const int64_t blocks_per_kv_head = (rows_per_kv_head + kBlockRows - 1) / kBlockRows;
  parallel_for(0, p.num_kv_heads * blocks_per_kv_head, [&](int64_t begin, int64_t end) {
    // Per thread and kept between calls: allocating it each call cost a decode step's attention more than its
    // arithmetic (fresh pages, zeroed, for 48 rows whatever the rows).
    thread_local Workspace work;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_head = task / blocks_per_kv_head;
      const int64_t first_row = (task % blocks_per_kv_head) * kBlockRows;
      attend_block(p, kv_head, first_row, std::min(kBlockRows, rows_per_kv_head - first_row), work);
    }
  });
}

}  // namespace gdn
