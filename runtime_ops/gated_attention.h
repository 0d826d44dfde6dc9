// gdn::gated_attention on CPU (gdn_export/ops/gated_attention.py says what it computes): a Qwen3.5 full-attention
// layer between its projections, on cached_attention's kernel. Knows nothing of ATen or ExecuTorch; float32 only.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

struct GatedAttentionProblem {
  int64_t num_heads = 0;     // H
  int64_t num_kv_heads = 0;  // Hkv, divides H
  int64_t length = 0;        // T new tokens
  int64_t head_dim = 0;      // D
  int64_t rotary_dim = 0;    // R, even: the first R channels of each query and key head are rotated
  int64_t start = 0;         // position of the first new token; start + T <= the caches' positions
  float eps = 0.0f;          // both head norms'

  const float* q_gate = nullptr;         // [T, H, 2D]: each head's query, then its gate
  const float* key = nullptr;            // [T, Hkv, D]
  const float* value = nullptr;          // [T, Hkv, D]
  const float* q_norm_weight = nullptr;  // [D]
  const float* k_norm_weight = nullptr;  // [D]
  const float* cos = nullptr;            // [T, R]
  const float* sin = nullptr;            // [T, R]
  float* k_cache = nullptr;              // [Hkv, D, S], unit stride along S
  int64_t k_cache_strides[2] = {0, 0};
  float* v_cache = nullptr;              // [Hkv, S, D], unit stride along D
  int64_t v_cache_strides[2] = {0, 0};
  float* output = nullptr;               // [T, H * D]
};
// All but the caches dense.

// Writes the new tokens' keys and values into the caches, then output = attention * sigmoid(gate).
void gated_attention(const GatedAttentionProblem& problem, const ParallelFor& parallel_for);

}  // namespace gdn
