// Launch parameters of the gated delta rule kernels, shared word for word by
// the Metal shaders, the Objective-C++ host dispatch and the C++ emulation.
//
// Every field is 4 bytes (int or float) so the struct has the same layout in
// Metal, in C++ and as a packed int32 tensor (the eager MPS path binds it that
// way). Strides are in elements. The key dimension is not a field: it sizes
// each lane's registers, so it is a template argument of the kernels.
#pragma once

struct GatedDeltaRuleParams {
  int batch;
  int length;
  int num_k_heads;
  int num_v_heads;
  int value_dim;
  int per_channel_gate;  // 1: g is [B, T, Hv, Dk] (KDA); 0: [B, T, Hv] (GDA)
  int use_qk_l2norm;
  float scale;  // already resolved: 1/sqrt(Dk) when the caller gave none
  int query_strides[4];  // batch, time, head, channel
  int key_strides[4];
  int value_strides[4];
  int g_strides[4];  // the channel stride is unused for GDA
  int beta_strides[3];
  int initial_state_strides[4];  // batch, head, key row, value column
  int output_strides[4];
  int final_state_strides[4];
};

struct FusedGatedDeltaRuleParams {
  int batch;
  int length;
  int num_k_heads;
  int num_v_heads;
  int value_dim;
  float scale;
  int mixed_qkv_strides[3];  // batch, time, channel
  int a_strides[3];  // batch, time, head
  int b_strides[3];
  int A_log_stride;
  int dt_bias_stride;
  int state_strides[4];  // read as the initial state, overwritten with the final one
  int output_strides[4];
};
