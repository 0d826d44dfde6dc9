// See gated_attention.h. Three passes: each new token's query heads normed and rotated into a [H, T, D] buffer and
// its key and value heads (the key normed and rotated) into the caches; cached_attention's kernel writing [T, H, D]
// straight into the output; the gate applied in place. A decode step's passes are a few rows of D values: the
// first and last run on the calling thread, where waking the thread pool would cost more than the rows.
#include "gated_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cached_attention.h"
#include "vector_math.h"  // rms_norm_row, vector_exp

namespace gdn {
namespace {

// Rows of D values below which a pass stays on the calling thread.
constexpr int64_t kRowsToShare = 64;

void rows_across_threads(int64_t rows, const ParallelFor& parallel_for,
                         const std::function<void(int64_t, int64_t)>& body) {
  if (rows >= kRowsToShare) {
    parallel_for(0, rows, body);
  } else {
    body(0, rows);
  }
}

// y = Qwen3.5's RMSNorm of x (n values), its first r rotated, halves layout: channel i < r / 2 becomes
// x_i cos_i - x_{i + r/2} sin_i, channel i + r/2 becomes x_{i + r/2} cos_{i + r/2} + x_i sin_{i + r/2}.
void norm_and_rotate(const float* x, int64_t n, const float* weight, float eps, const float* cos, const float* sin,
                     int64_t r, float* y) {
  rms_norm_row(x, n, weight, eps, y);
  const int64_t half = r / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float first = y[i], second = y[i + half];
    y[i] = first * cos[i] - second * sin[i];
    y[i + half] = second * cos[i + half] + first * sin[i + half];
  }
}

// x[i] *= sigmoid(gate[i]) over n values.
void gate_row(const float* gate, int64_t n, float* x) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(x + i, load(x + i) / (1.0f + vector_exp(-load(gate + i))));
  for (; i < n; ++i) x[i] = x[i] / (1.0f + __builtin_expf(-gate[i]));
}

}  // namespace

void gated_attention(const GatedAttentionProblem& p, const ParallelFor& parallel_for) {
  const int64_t heads = p.num_heads, kv_heads = p.num_kv_heads, length = p.length, dim = p.head_dim;
  // The queries, [H, T, D] as cached_attention reads them. Kept between calls: a decode step's is 8 KiB on the
  // 0.8B shape, and a fresh one each call would be a fresh allocation.
  thread_local std::vector<float> query_buffer;
  if (int64_t(query_buffer.size()) < heads * length * dim) query_buffer.resize(heads * length * dim);
  float* const queries = query_buffer.data();  // the calling thread's buffer, which the pool's threads fill too
  rows_across_threads(length * (heads + kv_heads), parallel_for, [&](int64_t begin, int64_t end) {
    std::vector<float> key(dim);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / (heads + kv_heads), head = row % (heads + kv_heads);
      const float* cos = p.cos + t * p.rotary_dim;
      const float* sin = p.sin + t * p.rotary_dim;
      if (head < heads) {
        norm_and_rotate(p.q_gate + (t * heads + head) * 2 * dim, dim, p.q_norm_weight, p.eps, cos, sin, p.rotary_dim,
                        queries + (head * length + t) * dim);
        continue;
      }
      const int64_t kv_head = head - heads, position = p.start + t;
      norm_and_rotate(p.key + (t * kv_heads + kv_head) * dim, dim, p.k_norm_weight, p.eps, cos, sin, p.rotary_dim,
                      key.data());
      float* keys = p.k_cache + kv_head * p.k_cache_strides[0] + position;
      for (int64_t d = 0; d < dim; ++d) keys[d * p.k_cache_strides[1]] = key[d];
      std::copy_n(p.value + (t * kv_heads + kv_head) * dim, dim,
                  p.v_cache + kv_head * p.v_cache_strides[0] + position * p.v_cache_strides[1]);
    }
  });

  CachedAttentionProblem attention;
  attention.num_heads = heads;
  attention.num_kv_heads = kv_heads;
  attention.length = length;
  attention.head_dim = dim;
  attention.start = p.start;
  attention.scale = static_cast<float>(1.0 / std::sqrt(double(dim)));  // the contract's default scale
  attention.query = queries;
  attention.query_strides[0] = length * dim;
  attention.query_strides[1] = dim;
  attention.query_strides[2] = 1;
  attention.k_cache = p.k_cache;
  attention.v_cache = p.v_cache;
  for (int d = 0; d < 2; ++d) {
    attention.k_cache_strides[d] = p.k_cache_strides[d];
    attention.v_cache_strides[d] = p.v_cache_strides[d];
  }
  attention.output = p.output;  // [T, H * D]: head h of token t at t * H * D + h * D
  attention.output_strides[0] = dim;
  attention.output_strides[1] = heads * dim;
  attention.output_strides[2] = 1;
  cached_attention(attention, parallel_for);

  rows_across_threads(length * heads, parallel_for, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) gate_row(p.q_gate + row * 2 * dim + dim, dim, p.output + row * dim);
  });
}

}  // namespace gdn
