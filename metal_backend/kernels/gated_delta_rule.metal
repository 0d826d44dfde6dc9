// Metal kernels of gdn::gated_delta_rule and gdn::fused_gated_delta_rule.
//
// One dispatch runs the whole sequence: the state stays in registers from the
// first token to the last and touches memory twice (read at the start, written
// at the end), so decode and prefill share the kernel. The state is the op
// contract's [B, Hv, Dk, Dv] float32; the final state may alias the initial one
// (in-place decode) because every thread writes exactly the elements it read.
//
// Work split. A threadgroup owns one (batch, value head) and a block of value
// columns; each SIMD group owns 4 adjacent columns (one float4 per state row)
// and its 32 lanes split the Dk key rows: lane l holds rows l, l + 32, ...
// Every dot product over Dk (S^T k, S^T q, and |q|^2 with |k|^2 together) is a
// per-lane partial sum finished by one simd_sum, so no threadgroup memory or
// barrier is needed.
//
// This file is also compiled as C++ by the Linux emulation harness
// (metal_backend/emulation/) and as CUDA by metal_backend/device/: keep to
// what their metal_stdlib headers provide.

#include <metal_stdlib>
#include "gated_delta_rule_params.h"

using namespace metal;

enum : int {
  kSimdWidth = 32,
  kColumnsPerSimdgroup = 4,
};

// Matches gdn_export.ops.reference.L2NORM_EPS.
#define GDN_L2NORM_EPS 1e-6f

template <typename T>
inline float4 load_columns(const device T* base, int stride) {
  return float4(
      float(base[0]), float(base[stride]), float(base[2 * stride]), float(base[3 * stride]));
}

// Lanes 0..3 each write one of the 4 columns the SIMD group owns.
template <typename T>
inline void store_columns(device T* base, int stride, float4 columns, uint lane) {
  if (lane < uint(kColumnsPerSimdgroup)) {
    base[int(lane) * stride] = T(columns[lane]);
  }
}

// This lane's rows of the SIMD group's [Dk, 4] block of the state. When the 4
// columns are adjacent (column stride 1: the op contract's packed state) a row
// is one vector load or store; packed_float4 asks only the 4-byte alignment
// every float32 view has. The branch is uniform over the whole dispatch.
template <int Rows>
inline void load_state(thread float4* state, const device float* base, int row_stride,
                       int column_stride, uint lane) {
  for (int j = 0; j < Rows; ++j) {
    const device float* row = base + (int(lane) + j * kSimdWidth) * row_stride;
    state[j] = column_stride == 1 ? float4(*(const device packed_float4*)row)
                                  : load_columns(row, column_stride);
  }
}

template <int Rows>
inline void store_state(const thread float4* state, device float* base, int row_stride,
                        int column_stride, uint lane) {
  for (int j = 0; j < Rows; ++j) {
    device float* row = base + (int(lane) + j * kSimdWidth) * row_stride;
    if (column_stride == 1) {
      *(device packed_float4*)row = packed_float4(state[j]);
    } else {
      for (int c = 0; c < kColumnsPerSimdgroup; ++c) {
        row[c * column_stride] = state[j][c];
      }
    }
  }
}

// This lane's rows of a [Dk] vector (query or key) as float.
template <typename T, int Rows>
inline void load_rows(thread float* rows, const device T* base, int stride, uint lane) {
  for (int j = 0; j < Rows; ++j) {
    rows[j] = float(base[(int(lane) + j * kSimdWidth) * stride]);
  }
}

// The factors that turn this token's raw query and key rows into the
// recurrence's q (L2-normalized, times `scale`) and k (L2-normalized): both
// squared norms come from one simd_sum, and the factors scale the reduced dot
// products (delta_rule_step) instead of every row.
template <int Rows>
inline float2 query_key_factors(const thread float* query, const thread float* key,
                                bool l2_normalize, float scale) {
  if (!l2_normalize) {
    return float2(scale, 1.0f);
  }
  float2 partial = float2(0.0f);
  for (int j = 0; j < Rows; ++j) {
    partial += float2(query[j] * query[j], key[j] * key[j]);
  }
  const float2 squared_norms = simd_sum(partial);
  return float2(scale * precise::rsqrt(squared_norms.x + GDN_L2NORM_EPS),
                precise::rsqrt(squared_norms.y + GDN_L2NORM_EPS));
}

// One token of the recurrence on this SIMD group's [Dk, 4] block of the state,
// with q = factors.x * query and k = factors.y * key:
// S *= decay; u = beta (v - S^T k); S += k u^T; returns o = S^T q.
template <int Rows>
inline float4 delta_rule_step(thread float4* state, const thread float* key,
                              const thread float* query, float2 factors,
                              const thread float* decay, float4 value, float beta) {
  float4 predicted = float4(0.0f);
  for (int j = 0; j < Rows; ++j) {
    state[j] *= decay[j];
    predicted += state[j] * key[j];
  }
  const float4 update = beta * (value - factors.y * simd_sum(predicted));
  const float4 key_scaled_update = factors.y * update;
  float4 output = float4(0.0f);
  for (int j = 0; j < Rows; ++j) {
    state[j] += key[j] * key_scaled_update;
    output += state[j] * query[j];
  }
  return factors.x * simd_sum(output);
}

template <typename T, int KeyDim>
[[kernel]] void gated_delta_rule(
    const device T* query [[buffer(0)]],
    const device T* key [[buffer(1)]],
    const device T* value [[buffer(2)]],
    const device T* g [[buffer(3)]],
    const device T* beta [[buffer(4)]],
    const device float* initial_state [[buffer(5)]],
    device T* output [[buffer(6)]],
    device float* final_state [[buffer(7)]],
    constant GatedDeltaRuleParams& p [[buffer(8)]],
    uint3 threadgroup_position [[threadgroup_position_in_grid]],
    uint simdgroup [[simdgroup_index_in_threadgroup]],
    uint simdgroups_per_threadgroup [[simdgroups_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int kRows = KeyDim / kSimdWidth;
  const int column =
      (int(threadgroup_position.x) * int(simdgroups_per_threadgroup) + int(simdgroup)) *
      kColumnsPerSimdgroup;
  const int head = int(threadgroup_position.y);
  const int batch = int(threadgroup_position.z);
  // Value head h reads key head h / (Hv / Hk), as Hugging Face's repeat_interleave.
  const int key_head = head / (p.num_v_heads / p.num_k_heads);

  float4 state[kRows];
  load_state<kRows>(state,
                    initial_state + batch * p.initial_state_strides[0] +
                        head * p.initial_state_strides[1] + column * p.initial_state_strides[3],
                    p.initial_state_strides[2], p.initial_state_strides[3], lane);

  for (int t = 0; t < p.length; ++t) {
    float key_rows[kRows];
    float query_rows[kRows];
    float decay[kRows];
    load_rows<T, kRows>(key_rows,
                        key + batch * p.key_strides[0] + t * p.key_strides[1] +
                            key_head * p.key_strides[2],
                        p.key_strides[3], lane);
    load_rows<T, kRows>(query_rows,
                        query + batch * p.query_strides[0] + t * p.query_strides[1] +
                            key_head * p.query_strides[2],
                        p.query_strides[3], lane);
    const float2 factors =
        query_key_factors<kRows>(query_rows, key_rows, p.use_qk_l2norm != 0, p.scale);

    const device T* gate =
        g + batch * p.g_strides[0] + t * p.g_strides[1] + head * p.g_strides[2];
    if (p.per_channel_gate != 0) {
      for (int j = 0; j < kRows; ++j) {
        decay[j] = precise::exp(float(gate[(int(lane) + j * kSimdWidth) * p.g_strides[3]]));
      }
    } else {
      const float head_decay = precise::exp(float(gate[0]));
      for (int j = 0; j < kRows; ++j) {
        decay[j] = head_decay;
      }
    }
    const float beta_t =
        float(beta[batch * p.beta_strides[0] + t * p.beta_strides[1] + head * p.beta_strides[2]]);
    const float4 value_t = load_columns(
        value + batch * p.value_strides[0] + t * p.value_strides[1] + head * p.value_strides[2] +
            column * p.value_strides[3],
        p.value_strides[3]);

    const float4 output_t =
        delta_rule_step<kRows>(state, key_rows, query_rows, factors, decay, value_t, beta_t);
    store_columns(output + batch * p.output_strides[0] + t * p.output_strides[1] +
                      head * p.output_strides[2] + column * p.output_strides[3],
                  p.output_strides[3], output_t, lane);
  }

  store_state<kRows>(state,
                     final_state + batch * p.final_state_strides[0] +
                         head * p.final_state_strides[1] + column * p.final_state_strides[3],
                     p.final_state_strides[2], p.final_state_strides[3], lane);
}

// softplus with PyTorch's default threshold (linear above 20).
inline float thresholded_softplus(float x) {
  return x > 20.0f ? x : precise::log(1.0f + precise::exp(x));
}

// Qwen3.5's GatedDeltaNet around the recurrence: mixed_qkv (conv + SiLU output,
// channels q | k | v) is split here, q and k are L2-normalized, and the gates
// come from the raw projections: g = -exp(A_log) softplus(a + dt_bias),
// beta = sigmoid(b). The state is updated in place.
template <typename T, typename ParamT, int KeyDim>
[[kernel]] void fused_gated_delta_rule(
    const device T* mixed_qkv [[buffer(0)]],
    const device T* a [[buffer(1)]],
    const device T* b [[buffer(2)]],
    const device ParamT* A_log [[buffer(3)]],
    const device ParamT* dt_bias [[buffer(4)]],
    device float* state [[buffer(5)]],
    device T* output [[buffer(6)]],
    constant FusedGatedDeltaRuleParams& p [[buffer(7)]],
    uint3 threadgroup_position [[threadgroup_position_in_grid]],
    uint simdgroup [[simdgroup_index_in_threadgroup]],
    uint simdgroups_per_threadgroup [[simdgroups_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int kRows = KeyDim / kSimdWidth;
  const int column =
      (int(threadgroup_position.x) * int(simdgroups_per_threadgroup) + int(simdgroup)) *
      kColumnsPerSimdgroup;
  const int head = int(threadgroup_position.y);
  const int batch = int(threadgroup_position.z);
  const int key_head = head / (p.num_v_heads / p.num_k_heads);
  const int query_channel = key_head * KeyDim;
  const int key_channel = p.num_k_heads * KeyDim + key_head * KeyDim;
  const int value_channel = 2 * p.num_k_heads * KeyDim + head * p.value_dim + column;
  const float decay_rate = precise::exp(float(A_log[head * p.A_log_stride]));
  const float bias = float(dt_bias[head * p.dt_bias_stride]);

  device float* head_state =
      state + batch * p.state_strides[0] + head * p.state_strides[1] + column * p.state_strides[3];
  float4 state_rows[kRows];
  load_state<kRows>(state_rows, head_state, p.state_strides[2], p.state_strides[3], lane);

  for (int t = 0; t < p.length; ++t) {
    const device T* token = mixed_qkv + batch * p.mixed_qkv_strides[0] + t * p.mixed_qkv_strides[1];
    const int channel_stride = p.mixed_qkv_strides[2];
    float key_rows[kRows];
    float query_rows[kRows];
    float decay[kRows];
    load_rows<T, kRows>(key_rows, token + key_channel * channel_stride, channel_stride, lane);
    load_rows<T, kRows>(query_rows, token + query_channel * channel_stride, channel_stride, lane);
    const float2 factors = query_key_factors<kRows>(query_rows, key_rows, true, p.scale);

    const float a_t = float(a[batch * p.a_strides[0] + t * p.a_strides[1] + head * p.a_strides[2]]);
    const float b_t = float(b[batch * p.b_strides[0] + t * p.b_strides[1] + head * p.b_strides[2]]);
    const float head_decay = precise::exp(-decay_rate * thresholded_softplus(a_t + bias));
    for (int j = 0; j < kRows; ++j) {
      decay[j] = head_decay;
    }
    const float beta_t = 1.0f / (1.0f + precise::exp(-b_t));
    const float4 value_t = load_columns(token + value_channel * channel_stride, channel_stride);

    const float4 output_t =
        delta_rule_step<kRows>(state_rows, key_rows, query_rows, factors, decay, value_t,
                                beta_t);
    store_columns(output + batch * p.output_strides[0] + t * p.output_strides[1] +
                      head * p.output_strides[2] + column * p.output_strides[3],
                  p.output_strides[3], output_t, lane);
  }

  store_state<kRows>(state_rows, head_state, p.state_strides[2], p.state_strides[3], lane);
}

// Host names: gated_delta_rule_<dtype>_dk<Dk> and
// fused_gated_delta_rule_<dtype>_<parameter dtype>_dk<Dk>, the names
// metal_backend/runtime/launch.h asks for.
#define GDN_INSTANTIATE_PLAIN(TYPE, DK) \
  template [[host_name("gated_delta_rule_" #TYPE "_dk" #DK)]] [[kernel]] \
  decltype(gated_delta_rule<TYPE, DK>) gated_delta_rule<TYPE, DK>;
#define GDN_INSTANTIATE_FUSED(TYPE, PARAM_TYPE, DK) \
  template [[host_name("fused_gated_delta_rule_" #TYPE "_" #PARAM_TYPE "_dk" #DK)]] [[kernel]] \
  decltype(fused_gated_delta_rule<TYPE, PARAM_TYPE, DK>) fused_gated_delta_rule<TYPE, PARAM_TYPE, DK>;
#define GDN_INSTANTIATE_FUSED_PARAMS(TYPE, DK) \
  GDN_INSTANTIATE_FUSED(TYPE, float, DK)       \
  GDN_INSTANTIATE_FUSED(TYPE, bfloat, DK)      \
  GDN_INSTANTIATE_FUSED(TYPE, half, DK)
#define GDN_INSTANTIATE_DTYPE(TYPE)     \
  GDN_INSTANTIATE_PLAIN(TYPE, 64)       \
  GDN_INSTANTIATE_PLAIN(TYPE, 128)      \
  GDN_INSTANTIATE_PLAIN(TYPE, 256)      \
  GDN_INSTANTIATE_FUSED_PARAMS(TYPE, 64)  \
  GDN_INSTANTIATE_FUSED_PARAMS(TYPE, 128) \
  GDN_INSTANTIATE_FUSED_PARAMS(TYPE, 256)

GDN_INSTANTIATE_DTYPE(float)
GDN_INSTANTIATE_DTYPE(bfloat)
GDN_INSTANTIATE_DTYPE(half)
