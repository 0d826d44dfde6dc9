// How a call of the gdn ops becomes one Metal dispatch: input validation,
// kernel selection, kernel parameters and threadgroup sizing.
//
// Plain C++17 with no Metal or ExecuTorch types, so the very same code serves
// the Objective-C++ host dispatch (metal_dispatch.mm, behind the AOTI C shims)
// and the Linux emulation harness that runs the kernels on the CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "../kernels/gated_delta_rule_params.h"

namespace gdn_metal {

// The values are c10::ScalarType's, which AOTI tensor handles report.
enum class ScalarType : int32_t { Float16 = 5, Float32 = 6, BFloat16 = 15 };

// A Metal-kernel-sized problem outside what the kernels cover (head dims other
// than 64/128/256, dtypes Metal cannot compute in): callers fall back or fail.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor as the launch planning sees it: dtype, sizes and strides (elements).
struct TensorView {
  const char* name;
  int32_t dtype;
  int64_t ndim;
  int64_t sizes[4];
  int64_t strides[4];
};

struct Dim3 {
  uint32_t x, y, z;
};

struct DispatchPlan {
  std::string kernel_name;
  Dim3 threadgroups;
  Dim3 threads_per_threadgroup;
};

constexpr int kSimdWidth = 32;
constexpr int kColumnsPerSimdgroup = 4;  // one float4 of value columns per SIMD group
// 4 SIMD groups (128 threads, 16 value columns) per threadgroup: enough
// threadgroups for the GPU even at batch 1 (Dv/16 * Hv of them), and few
// enough registers per thread (Dk/32 float4s of state) at Dk = 256.
constexpr int kSimdgroupsPerThreadgroup = 4;
constexpr int kColumnsPerThreadgroup = kColumnsPerSimdgroup * kSimdgroupsPerThreadgroup;

inline bool is_supported_head_dim(int64_t dim) { return dim == 64 || dim == 128 || dim == 256; }

inline const char* metal_type_name(int32_t dtype, const char* tensor_name) {
  switch (static_cast<ScalarType>(dtype)) {
    case ScalarType::Float32:
      return "float";
    case ScalarType::BFloat16:
      return "bfloat";
    case ScalarType::Float16:
      return "half";
  }
  throw Unsupported(std::string("gdn metal: ") + tensor_name +
                    " must be float32, bfloat16 or float16, got ScalarType " +
                    std::to_string(dtype));
}

namespace detail {

inline std::string shape_string(const TensorView& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.ndim; ++d) text += (d ? ", " : "") + std::to_string(t.sizes[d]);
  return text + "]";
}

inline void expect_shape(const char* op, const TensorView& t, std::initializer_list<int64_t> shape) {
  bool same = t.ndim == static_cast<int64_t>(shape.size());
  int64_t d = 0;
  for (int64_t size : shape) same = same && t.sizes[d++] == size;
  if (!same) {
    std::string expected = "[";
    d = 0;
    for (int64_t size : shape) expected += (d++ ? ", " : "") + std::to_string(size);
    throw std::invalid_argument(std::string(op) + ": " + t.name + " must have shape " + expected +
                                "], got " + shape_string(t));
  }
}

inline void expect_rank(const char* op, const TensorView& t, int64_t rank, const char* layout) {
  if (t.ndim != rank) {
    throw std::invalid_argument(std::string(op) + ": " + t.name + " must be " + layout +
                                ", got shape " + shape_string(t));
  }
}

inline void expect_dtype(const char* op, const TensorView& t, int32_t dtype, const char* what) {
  if (t.dtype != dtype) {
    throw std::invalid_argument(std::string(op) + ": " + t.name + " must be " + what +
                                ", got ScalarType " + std::to_string(t.dtype));
  }
}

// Strides as the kernels' 32-bit ints; offsets are 32-bit in the kernels too.
inline void copy_strides(const char* op, const TensorView& t, int* out) {
  int64_t last_offset = 0;
  for (int64_t d = 0; d < t.ndim; ++d) {
    if (t.sizes[d] > 0) last_offset += (t.sizes[d] - 1) * std::llabs(t.strides[d]);
    out[d] = static_cast<int>(t.strides[d]);
  }
  if (last_offset >= (int64_t{1} << 31)) {
    throw Unsupported(std::string(op) + ": " + t.name +
                      " spans more than 2^31 elements, beyond the kernels' 32-bit indexing");
  }
}

inline void check_head_dims(const char* op, int64_t key_dim, int64_t value_dim) {
  if (!is_supported_head_dim(key_dim) || !is_supported_head_dim(value_dim)) {
    throw Unsupported(std::string(op) + ": the Metal kernels support head dims Dk, Dv in "
                      "{64, 128, 256}, got Dk=" + std::to_string(key_dim) +
                      ", Dv=" + std::to_string(value_dim));
  }
}

// ExecuTorch's Metal runtime gives a view whose elements do not tile its
// extent (a slice with holes) a temporary packed copy of its own
// (aoti_torch__reinterpret_tensor), so an in-place kernel would update the
// copy and the caller's state would silently keep its old values. Packed
// views, permuted ones included, keep the caller's buffer; others are refused.
inline void expect_packed_in_place_state(const char* op, const TensorView& state) {
  int64_t elements = 1, extent = 1;
  for (int64_t d = 0; d < state.ndim; ++d) {
    elements *= state.sizes[d];
    if (state.sizes[d] > 1) extent += (state.sizes[d] - 1) * std::llabs(state.strides[d]);
  }
  if (elements > 1 && extent != elements) {
    std::string strides = "[";
    for (int64_t d = 0; d < state.ndim; ++d) strides += (d ? ", " : "") + std::to_string(state.strides[d]);
    throw Unsupported(std::string(op) + ": " + state.name + " is updated in place but is a non-packed view " +
                      "(shape " + shape_string(state) + ", strides " + strides + "]): ExecuTorch's Metal " +
                      "runtime hands such a view a temporary packed copy, so the update would be lost. " +
                      "Pass the whole state buffer or a packed view of it");
  }
}

inline void expect_heads_multiple(const char* op, int64_t num_v_heads, int64_t num_k_heads) {
  if (num_k_heads == 0 || num_v_heads % num_k_heads != 0) {
    throw std::invalid_argument(std::string(op) + ": value heads (Hv=" + std::to_string(num_v_heads) +
                                ") must be a multiple of query/key heads (Hk=" +
                                std::to_string(num_k_heads) + ")");
  }
}

// The fields both params structs open with (gated_delta_rule_params.h), the scale
// resolved to 1/sqrt(Dk) when the caller gave none.
template <typename Params>
void set_problem_sizes(Params& p, int64_t batch, int64_t length, int64_t num_k_heads, int64_t num_v_heads,
                       int64_t key_dim, int64_t value_dim, std::optional<double> scale) {
  p.batch = static_cast<int>(batch);
  p.length = static_cast<int>(length);
  p.num_k_heads = static_cast<int>(num_k_heads);
  p.num_v_heads = static_cast<int>(num_v_heads);
  p.value_dim = static_cast<int>(value_dim);
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(key_dim)));
}

// Both kernels: one threadgroup per (column block, value head, sequence) of
// kSimdgroupsPerThreadgroup simdgroups.
inline DispatchPlan dispatch_plan(std::string kernel_name, int64_t value_dim, int64_t num_v_heads, int64_t batch) {
  return {std::move(kernel_name),
          {static_cast<uint32_t>(value_dim / kColumnsPerThreadgroup), static_cast<uint32_t>(num_v_heads),
           static_cast<uint32_t>(batch)},
          {kSimdWidth, kSimdgroupsPerThreadgroup, 1}};
}

}  // namespace detail

// What a C shim encodes: the kernel's params struct and its dispatch.
struct GatedDeltaRuleLaunch { GatedDeltaRuleParams params; DispatchPlan plan; };
struct FusedGatedDeltaRuleLaunch { FusedGatedDeltaRuleParams params; DispatchPlan plan; };

// gdn::gated_delta_rule with outputs: validates the contract's shapes and
// dtypes, then plans the dispatch. final_state may alias initial_state.
inline GatedDeltaRuleLaunch plan_gated_delta_rule(
    const TensorView& query, const TensorView& key, const TensorView& value, const TensorView& g,
    const TensorView& beta, const TensorView& initial_state, const TensorView& output,
    const TensorView& final_state, std::optional<double> scale, bool use_qk_l2norm) {
  const char* op = "gdn.gated_delta_rule (metal)";
  using namespace detail;
  expect_rank(op, query, 4, "[B, T, Hk, Dk]");
  expect_rank(op, value, 4, "[B, T, Hv, Dv]");
  const int64_t batch = query.sizes[0], length = query.sizes[1], num_k_heads = query.sizes[2],
                key_dim = query.sizes[3], num_v_heads = value.sizes[2], value_dim = value.sizes[3];
  expect_heads_multiple(op, num_v_heads, num_k_heads);
  expect_shape(op, key, {batch, length, num_k_heads, key_dim});
  expect_shape(op, value, {batch, length, num_v_heads, value_dim});
  const bool per_channel_gate = g.ndim == 4;
  if (per_channel_gate) {
    expect_shape(op, g, {batch, length, num_v_heads, key_dim});
  } else {
    expect_shape(op, g, {batch, length, num_v_heads});
  }
  expect_shape(op, beta, {batch, length, num_v_heads});
  expect_shape(op, initial_state, {batch, num_v_heads, key_dim, value_dim});
  expect_shape(op, output, {batch, length, num_v_heads, value_dim});
  expect_shape(op, final_state, {batch, num_v_heads, key_dim, value_dim});
  const char* type = metal_type_name(query.dtype, query.name);
  for (const TensorView* t : {&key, &value, &g, &beta, &output}) {
    expect_dtype(op, *t, query.dtype, "the query's dtype (the Metal kernel reads one input dtype)");
  }
  expect_dtype(op, initial_state, static_cast<int32_t>(ScalarType::Float32), "float32");
  expect_dtype(op, final_state, static_cast<int32_t>(ScalarType::Float32), "float32");
  check_head_dims(op, key_dim, value_dim);

  GatedDeltaRuleLaunch launch{};
  GatedDeltaRuleParams& p = launch.params;
  set_problem_sizes(p, batch, length, num_k_heads, num_v_heads, key_dim, value_dim, scale);
  p.per_channel_gate = per_channel_gate ? 1 : 0;
  p.use_qk_l2norm = use_qk_l2norm ? 1 : 0;
  copy_strides(op, query, p.query_strides);
  copy_strides(op, key, p.key_strides);
  copy_strides(op, value, p.value_strides);
  copy_strides(op, g, p.g_strides);
  if (!per_channel_gate) p.g_strides[3] = 0;
  copy_strides(op, beta, p.beta_strides);
  copy_strides(op, initial_state, p.initial_state_strides);
  copy_strides(op, output, p.output_strides);
  copy_strides(op, final_state, p.final_state_strides);
  launch.plan = dispatch_plan(std::string("gated_delta_rule_") + type + "_dk" + std::to_string(key_dim),
                              value_dim, num_v_heads, batch);
  return launch;
}

// gdn::fused_gated_delta_rule with its output: Hv, Dk and Dv come from the
// state, Hk from mixed_qkv's channel count (2*Hk*Dk + Hv*Dv).
inline FusedGatedDeltaRuleLaunch plan_fused_gated_delta_rule(
    const TensorView& mixed_qkv, const TensorView& a, const TensorView& b, const TensorView& A_log,
    const TensorView& dt_bias, const TensorView& state, const TensorView& output,
    std::optional<double> scale) {
  const char* op = "gdn.fused_gated_delta_rule (metal)";
  using namespace detail;
  expect_rank(op, mixed_qkv, 3, "[B, T, channels]");
  expect_rank(op, state, 4, "[B, Hv, Dk, Dv]");
  const int64_t batch = mixed_qkv.sizes[0], length = mixed_qkv.sizes[1],
                channels = mixed_qkv.sizes[2], num_v_heads = state.sizes[1],
                key_dim = state.sizes[2], value_dim = state.sizes[3];
  const int64_t key_channels = channels - num_v_heads * value_dim;
  if (key_channels <= 0 || key_dim <= 0 || key_channels % (2 * key_dim) != 0) {
    throw std::invalid_argument(
        std::string(op) + ": mixed_qkv's last dim must be 2*Hk*Dk + Hv*Dv with Hv=" +
        std::to_string(num_v_heads) + ", Dk=" + std::to_string(key_dim) + ", Dv=" +
        std::to_string(value_dim) + " (from state " + shape_string(state) + "), got " +
        std::to_string(channels));
  }
  const int64_t num_k_heads = key_channels / (2 * key_dim);
  expect_heads_multiple(op, num_v_heads, num_k_heads);
  expect_shape(op, a, {batch, length, num_v_heads});
  expect_shape(op, b, {batch, length, num_v_heads});
  expect_shape(op, A_log, {num_v_heads});
  expect_shape(op, dt_bias, {num_v_heads});
  expect_shape(op, state, {batch, num_v_heads, key_dim, value_dim});
  expect_shape(op, output, {batch, length, num_v_heads, value_dim});
  const char* type = metal_type_name(mixed_qkv.dtype, mixed_qkv.name);
  for (const TensorView* t : {&a, &b, &output}) {
    expect_dtype(op, *t, mixed_qkv.dtype, "mixed_qkv's dtype");
  }
  const char* param_type = metal_type_name(A_log.dtype, A_log.name);
  expect_dtype(op, dt_bias, A_log.dtype, "A_log's dtype");
  expect_dtype(op, state, static_cast<int32_t>(ScalarType::Float32), "float32");
  check_head_dims(op, key_dim, value_dim);
  expect_packed_in_place_state(op, state);

  FusedGatedDeltaRuleLaunch launch{};
  FusedGatedDeltaRuleParams& p = launch.params;
  set_problem_sizes(p, batch, length, num_k_heads, num_v_heads, key_dim, value_dim, scale);
  copy_strides(op, mixed_qkv, p.mixed_qkv_strides);
  copy_strides(op, a, p.a_strides);
  copy_strides(op, b, p.b_strides);
  copy_strides(op, A_log, &p.A_log_stride);
  copy_strides(op, dt_bias, &p.dt_bias_stride);
  copy_strides(op, state, p.state_strides);
  copy_strides(op, output, p.output_strides);
  launch.plan = dispatch_plan(
      std::string("fused_gated_delta_rule_") + type + "_" + param_type + "_dk" + std::to_string(key_dim),
      value_dim, num_v_heads, batch);
  return launch;
}

// gdn::gated_delta_rule_inplace (the C shim), or the .out form given the same
// tensor as initial and final state: plan_gated_delta_rule on one state that
// must also be packed (see detail::expect_packed_in_place_state).
inline GatedDeltaRuleLaunch plan_gated_delta_rule_inplace(
    const TensorView& query, const TensorView& key, const TensorView& value, const TensorView& g,
    const TensorView& beta, const TensorView& state, const TensorView& output,
    std::optional<double> scale, bool use_qk_l2norm) {
  GatedDeltaRuleLaunch launch = plan_gated_delta_rule(query, key, value, g, beta, state, output, state,
                                                      scale, use_qk_l2norm);
  detail::expect_packed_in_place_state("gdn.gated_delta_rule_inplace (metal)", state);
  return launch;
}

// What a compiled pipeline must offer for `plan`: 32-lane SIMD groups (the
// kernels' simd_sum reductions span 32 lanes; every Apple GPU has them) and room
// for the planned threadgroup (a pipeline's limit can be below the device's
// 1024 when the kernel needs many registers).
inline void check_pipeline_fits(const DispatchPlan& plan, uint64_t max_total_threads_per_threadgroup,
                                uint64_t thread_execution_width) {
  const uint64_t planned = uint64_t{plan.threads_per_threadgroup.x} * plan.threads_per_threadgroup.y *
                           plan.threads_per_threadgroup.z;
  if (thread_execution_width != kSimdWidth) {
    throw Unsupported("gdn metal: " + plan.kernel_name + " needs 32-wide SIMD groups, this GPU's pipeline has " +
                      std::to_string(thread_execution_width));
  }
  if (planned > max_total_threads_per_threadgroup) {
    throw Unsupported("gdn metal: " + plan.kernel_name + " is planned with " + std::to_string(planned) +
                      " threads per threadgroup, but its pipeline allows at most " +
                      std::to_string(max_total_threads_per_threadgroup));
  }
}

}  // namespace gdn_metal
