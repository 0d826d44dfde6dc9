// The gated delta rule on CPU: one core routine behind both entry points.
//
// This header knows nothing of ATen or ExecuTorch: each entry point
// (aten_kernel.cpp, executorch_kernel.cpp) validates its tensors, describes
// them here as pointers plus element strides, and hands in its own
// parallel_for (at::parallel_for in eager PyTorch, ExecuTorch's threadpool
// inside a .pte). See gdn_export/ops/contract.py for the op's semantics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gdn {

enum class ElementType { Float32, BFloat16, Float16 };

// A read-only input of up to four dims, strides in elements.
struct InputView {
  const void* data = nullptr;
  ElementType type = ElementType::Float32;
  int64_t strides[4] = {0, 0, 0, 0};
};

struct GatedDeltaRuleProblem {
  int64_t batch = 0;
  int64_t length = 0;
  int64_t num_k_heads = 0;
  int64_t num_v_heads = 0;
  int64_t key_dim = 0;
  int64_t value_dim = 0;
  bool per_channel_gate = false;  // g is [B, T, Hv, Dk] (KDA), else [B, T, Hv] (GDA)
  bool use_qk_l2norm = false;
  float scale = 1.0f;

  InputView query, key, value, g, beta;  // [B, T, H, D] / [B, T, Hv(, Dk)]
  // fp32 states [B, Hv, Dk, Dv] with unit stride along Dv; may be the same memory.
  const float* initial_state = nullptr;
  int64_t initial_state_strides[3] = {0, 0, 0};
  float* final_state = nullptr;
  int64_t final_state_strides[3] = {0, 0, 0};
  // Or, when half_state is set, one float16 state [B, Hv, Dk, Dv] (unit stride along Dv), read and
  // overwritten, in place of both: each unit of work copies its heads' states into fp32 (cache-resident),
  // runs on the copy and writes it back rounded, so memory sees half the bytes and the arithmetic stays fp32.
  void* half_state = nullptr;
  int64_t half_state_strides[3] = {0, 0, 0};
  // [B, T, Hv, Dv] in value's element type.
  void* output = nullptr;
  int64_t output_strides[4] = {0, 0, 0, 0};

  // The sizes and the gate's kind, from checked query [B, T, Hk, Dk], value
  // [B, T, Hv, Dv] and g; Tensor is ATen's or ExecuTorch's (size(), dim()).
  template <class Tensor>
  void set_sizes(const Tensor& query, const Tensor& value, const Tensor& g) {
    batch = query.size(0);
    length = query.size(1);
    num_k_heads = query.size(2);
    key_dim = query.size(3);
    num_v_heads = value.size(2);
    value_dim = value.size(3);
    per_channel_gate = g.dim() == 4;
  }
};

// Runs body(begin, end) over [begin, end) split across the caller's threads.
using ParallelFor = std::function<void(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& body)>;

// Sequences at least this long run in the chunked (WY) form; shorter ones
// step token by token directly on the state memory.
constexpr int64_t kChunkedMinLength = 16;

void gated_delta_rule(const GatedDeltaRuleProblem& problem, const ParallelFor& parallel_for);

// What an entry point knows of a tensor before trusting it.
struct TensorInfo {
  std::vector<int64_t> sizes;
  bool is_supported_float = false;  // float32, bfloat16 or float16
  bool is_float32 = false;
  std::string dtype_name;
};

// A broken contract, worded like gdn_export/ops/contract.py's checks: a Type
// error (wrong dtype) or a Value error (wrong rank or shape).
struct ContractError {
  enum Kind { None, Type, Value } kind = None;
  std::string message;
  explicit operator bool() const { return kind != None; }
};

// query, key, value, g, beta, initial_state against the op contract.
ContractError check_inputs(const TensorInfo& query, const TensorInfo& key, const TensorInfo& value, const TensorInfo& g,
                           const TensorInfo& beta, const TensorInfo& initial_state);

// output must match value's shape and dtype, final_state initial_state's.
ContractError check_out_tensors(const TensorInfo& value, const TensorInfo& initial_state, const TensorInfo& output,
                                const TensorInfo& final_state);

}  // namespace gdn
