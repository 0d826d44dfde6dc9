// gdn::cached_attention on CPU.
//
// Work unit: one KV head and a block of up to kRowBlock query rows of its group
// (rows are (query head, token) pairs). A block walks the keys once per head
// dimension and the values once per position, so each cache row it reads from
// memory serves every row of the block. Only positions a row can see are read:
// row t stops at start + t, so a decode step at position p costs O(p), not O(S).
#include "cached_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace gdn {
namespace {

constexpr int64_t kRowBlock = 8;

void attend_block(const CachedAttentionProblem& p, int64_t kv_head, int64_t first_row, int64_t rows,
                  std::vector<float>& scores, std::vector<float>& acc) {
  const int64_t length = p.length, dim = p.head_dim;
  const float* keys = p.k_cache + kv_head * p.k_cache_strides[0];
  const float* values = p.v_cache + kv_head * p.v_cache_strides[0];
  int64_t visible[kRowBlock];  // positions 0..visible-1 are seen by each row
  const float* queries[kRowBlock];
  float* outputs[kRowBlock];
  int64_t longest = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = first_row + i;
    const int64_t head = kv_head * (p.num_heads / p.num_kv_heads) + row / length, token = row % length;
    visible[i] = p.start + token + 1;
    longest = std::max(longest, visible[i]);
    queries[i] = p.query + head * p.query_strides[0] + token * p.query_strides[1];
    outputs[i] = p.output + head * p.output_strides[0] + token * p.output_strides[1];
  }
  scores.assign(rows * longest, 0.0f);
  // scores[i, s] = scale * sum_d q_i[d] * K[d, s]: one contiguous key row per d.
  for (int64_t d = 0; d < dim; ++d) {
    const float* __restrict key_row = keys + d * p.k_cache_strides[1];
    for (int64_t i = 0; i < rows; ++i) {
      const float weight = p.scale * queries[i][d * p.query_strides[2]];
      float* __restrict row_scores = scores.data() + i * longest;
      for (int64_t s = 0; s < visible[i]; ++s) row_scores[s] += weight * key_row[s];
    }
  }
  // Softmax in fp32 over the visible positions (unnormalized; divided at the end).
  float total[kRowBlock];
  for (int64_t i = 0; i < rows; ++i) {
    float* row_scores = scores.data() + i * longest;
    const float peak = *std::max_element(row_scores, row_scores + visible[i]);
    float sum = 0.0f;
    for (int64_t s = 0; s < visible[i]; ++s) {
      row_scores[s] = std::exp(row_scores[s] - peak);
      sum += row_scores[s];
    }
    total[i] = sum;
  }
  // out_i = sum_s w_i[s] * V[s, :]: one contiguous value row per position.
  acc.assign(rows * dim, 0.0f);
  for (int64_t s = 0; s < longest; ++s) {
    const float* __restrict value_row = values + s * p.v_cache_strides[1];
    for (int64_t i = 0; i < rows; ++i) {
      if (s >= visible[i]) continue;
      const float weight = scores[i * longest + s];
      float* __restrict row_acc = acc.data() + i * dim;
      for (int64_t d = 0; d < dim; ++d) row_acc[d] += weight * value_row[d];
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float inverse = 1.0f / total[i];
    for (int64_t d = 0; d < dim; ++d) outputs[i][d * p.output_strides[2]] = acc[i * dim + d] * inverse;
  }
}

}  // namespace

void cached_attention(const CachedAttentionProblem& p, const ParallelFor& parallel_for) {
  const int64_t rows_per_kv_head = (p.num_heads / p.num_kv_heads) * p.length;
  const int64_t blocks_per_kv_head = (rows_per_kv_head + kRowBlock - 1) / kRowBlock;
  parallel_for(0, p.num_kv_heads * blocks_per_kv_head, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;  // per thread, reused across its blocks
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_head = task / blocks_per_kv_head;
      const int64_t first_row = (task % blocks_per_kv_head) * kRowBlock;
      attend_block(p, kv_head, first_row, std::min(kRowBlock, rows_per_kv_head - first_row), scores, acc);
    }
  });
}

}  // namespace gdn
