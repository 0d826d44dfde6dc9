// Causal attention of new tokens over a KV cache (gdn::cached_attention), on CPU.
//
// Like gated_delta_rule.h, this header knows neither ATen nor ExecuTorch: the
// entry point checks its tensors and describes them as pointers plus element
// strides. See gdn_export/ops/attention.py for the op's semantics.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"  // ParallelFor

namespace gdn {

struct CachedAttentionProblem {
  int64_t num_heads = 0;     // Hq
  int64_t num_kv_heads = 0;  // Hkv, divides Hq
  int64_t length = 0;        // T new tokens
  int64_t head_dim = 0;      // D
  int64_t start = 0;         // position of the first new token; start + T <= S
  float scale = 1.0f;

  const float* query = nullptr;  // [Hq, T, D]
  int64_t query_strides[3] = {0, 0, 0};
  const float* k_cache = nullptr;  // [Hkv, D, S], unit stride along S
  int64_t k_cache_strides[2] = {0, 0};
  const float* v_cache = nullptr;  // [Hkv, S, D], unit stride along D
  int64_t v_cache_strides[2] = {0, 0};
  float* output = nullptr;  // [Hq, T, D]
  int64_t output_strides[3] = {0, 0, 0};
};

// Reads only cache positions 0..start+t for the token at row t.
void cached_attention(const CachedAttentionProblem& problem, const ParallelFor& parallel_for);

}  // namespace gdn
