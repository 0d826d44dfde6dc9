// gdn::conv_gated_delta_rule on CPU: a Gated DeltaNet layer from its input projections to its recurrence's
// output (gdn_export/ops/conv_recurrence.py says what it computes). The causal conv, its state's shift and the
// gates run here, then the recurrence's core routine (gated_delta_rule.h) reads q, k and v where the conv wrote
// them. Like that header, this one knows nothing of ATen or ExecuTorch; float32 only, but for the recurrent state,
// which may be float16.
#pragma once

#include <cstdint>

#include "gated_delta_rule.h"

namespace gdn {

struct ConvGatedDeltaRuleProblem {
  int64_t batch = 0, length = 0, channels = 0, taps = 0;  // qkv [B, T, C], conv_weight [C, 1, W], W >= 1
  int64_t num_k_heads = 0, num_v_heads = 0, key_dim = 0, value_dim = 0;
  bool starting = false;  // positions[0] == 0: the conv state counts as zeros and the first gate is raised

  // Inputs, strides in elements.
  const float* qkv = nullptr;
  int64_t qkv_strides[3] = {0, 0, 0};
  const float* a = nullptr;  // [B, T, Hv]
  int64_t a_strides[3] = {0, 0, 0};
  const float* b = nullptr;  // [B, T, Hv]
  int64_t b_strides[3] = {0, 0, 0};
  const float* conv_weight = nullptr;  // [C, 1, W]
  int64_t conv_weight_strides[3] = {0, 0, 0};
  const float* A_log = nullptr;
  int64_t A_log_stride = 0;
  const float* dt_bias = nullptr;
  int64_t dt_bias_stride = 0;

  // Read and overwritten.
  float* conv_state = nullptr;  // [B, C, W - 1]
  int64_t conv_state_strides[3] = {0, 0, 0};
  void* state = nullptr;  // [B, Hv, Dk, Dv], unit stride along Dv: float, or _Float16 when half_state
  int64_t state_strides[3] = {0, 0, 0};
  bool half_state = false;  // set by check_conv_inputs from the state's dtype

  float* output = nullptr;  // [B, T, Hv, Dv]
  int64_t output_strides[4] = {0, 0, 0, 0};

  // Points the problem at the op's checked tensors, ATen's or ExecuTorch's (strides(), const_data_ptr,
  // mutable_data_ptr); qkv with unit stride along C and state along Dv, as the kernel reads them.
  template <class Tensor>
  void point_at(const Tensor& qkv_, const Tensor& a_, const Tensor& b_, const Tensor& conv_weight_,
                const Tensor& A_log_, const Tensor& dt_bias_, Tensor& conv_state_, Tensor& state_, Tensor& output_) {
    qkv = qkv_.template const_data_ptr<float>();
    a = a_.template const_data_ptr<float>();
    b = b_.template const_data_ptr<float>();
    conv_weight = conv_weight_.template const_data_ptr<float>();
    A_log = A_log_.template const_data_ptr<float>();
    A_log_stride = A_log_.strides()[0];
    dt_bias = dt_bias_.template const_data_ptr<float>();
    dt_bias_stride = dt_bias_.strides()[0];
    conv_state = conv_state_.template mutable_data_ptr<float>();
    state = state_.mutable_data_ptr();
    output = output_.template mutable_data_ptr<float>();
    for (int d = 0; d < 3; ++d) {
      qkv_strides[d] = qkv_.strides()[d];
      a_strides[d] = a_.strides()[d];
      b_strides[d] = b_.strides()[d];
      conv_weight_strides[d] = conv_weight_.strides()[d];
      conv_state_strides[d] = conv_state_.strides()[d];
      state_strides[d] = state_.strides()[d];
    }
    for (int d = 0; d < 4; ++d) output_strides[d] = output_.strides()[d];
  }
};

// The value forget_previous_sequence raises a sequence's first a to at least (gdn_export/ops/conv_recurrence.py).
constexpr float kForgetLogDecay = 50.0f;

void conv_gated_delta_rule(const ConvGatedDeltaRuleProblem& problem, const ParallelFor& parallel_for);

// The op's tensors in schema order (qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state) against
// its contract, worded as gdn_export/ops/conv_recurrence.py's checks (in contract.cpp, beside the other ops' checks);
// on success sets the problem's sizes.
ContractError check_conv_inputs(const TensorInfo (&tensors)[9], ConvGatedDeltaRuleProblem& problem);

}  // namespace gdn
