// Eager PyTorch entry: the CPU kernels of gdn::gated_delta_rule (+ .out), gdn::conv_gated_delta_rule (+ .out)
// and the export's gdn::fit_int4_scales.
//
// The schemas are defined in Python (gdn_export/ops/contract.py); this file
// only registers CPU implementations of them. Inputs may be any strided
// views; the state needs unit stride along Dv, so other layouts go through a
// contiguous copy.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "conv_gated_delta_rule.h"
#include "gated_delta_rule.h"
#include "int4_scales.h"
#include "subnormals.h"

namespace gdn {
namespace {

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "torch.float32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kDouble: return "torch.float64";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(type);
  }
}

TensorInfo info_of(const at::Tensor& tensor) {
  TensorInfo info;
  info.sizes = tensor.sizes().vec();
  const at::ScalarType type = tensor.scalar_type();
  info.is_supported_float = type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
  info.is_float32 = type == at::kFloat;
  info.dtype_name = dtype_name(type);
  return info;
}

// The model's kernels' loop in eager PyTorch: ATen's pool, each body with subnormals as zero (subnormals.h).
void aten_parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(begin, end, 1, [&](int64_t first, int64_t last) {
    SubnormalsAsZero flushed;
    body(first, last);
  });
}

void raise(const ContractError& error) {
  if (error.kind == ContractError::Type) TORCH_CHECK_TYPE(false, error.message);
  TORCH_CHECK_VALUE(false, error.message);
}

ElementType element_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kBFloat16: return ElementType::BFloat16;
    case at::kHalf: return ElementType::Float16;
    default: return ElementType::Float32;
  }
}

InputView view_of(const at::Tensor& tensor) {
  InputView view;
  view.data = tensor.data_ptr();
  view.type = element_type(tensor);
  for (int64_t d = 0; d < tensor.dim(); ++d) view.strides[d] = tensor.stride(d);
  return view;
}

void check_all(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
               const at::Tensor& beta, const at::Tensor& initial_state) {
  if (ContractError error = check_inputs(info_of(query), info_of(key), info_of(value), info_of(g), info_of(beta),
                                         info_of(initial_state)))
    raise(error);
  for (const at::Tensor* tensor : {&query, &key, &value, &g, &beta, &initial_state})
    TORCH_CHECK(tensor->device().is_cpu(), "gdn.gated_delta_rule: all tensors must be on one device (cpu), got ",
                tensor->device());
}

// The kernel proper, once every tensor is checked: final_state may be initial_state.
void run(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
         const at::Tensor& beta, const at::Tensor& initial_state, std::optional<double> scale, bool use_qk_l2norm,
         at::Tensor& output, at::Tensor& final_state) {
  const bool in_place = final_state.is_same(initial_state);
  // The core walks state rows with unit stride along Dv.
  const at::Tensor initial = initial_state.stride(3) == 1 ? initial_state : initial_state.contiguous();
  at::Tensor target = final_state.stride(3) == 1 ? final_state : at::empty_like(final_state, at::MemoryFormat::Contiguous);
  if (in_place && !target.is_same(final_state)) target.copy_(initial);

  GatedDeltaRuleProblem problem;
  problem.set_sizes(query, value, g);
  problem.use_qk_l2norm = use_qk_l2norm;
  problem.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(double(problem.key_dim)));
  problem.query = view_of(query);
  problem.key = view_of(key);
  problem.value = view_of(value);
  problem.g = view_of(g);
  problem.beta = view_of(beta);
  const at::Tensor& source = in_place ? target : initial;
  problem.initial_state = source.data_ptr<float>();
  problem.final_state = target.data_ptr<float>();
  for (int d = 0; d < 3; ++d) {
    problem.initial_state_strides[d] = source.stride(d);
    problem.final_state_strides[d] = target.stride(d);
  }
  problem.output = output.data_ptr();
  for (int d = 0; d < 4; ++d) problem.output_strides[d] = output.stride(d);

  gated_delta_rule(problem, aten_parallel_for);
  if (!target.is_same(final_state)) final_state.copy_(target);
}

std::tuple<at::Tensor, at::Tensor> gated_delta_rule_functional(const at::Tensor& query, const at::Tensor& key,
                                                               const at::Tensor& value, const at::Tensor& g,
                                                               const at::Tensor& beta, const at::Tensor& initial_state,
                                                               std::optional<double> scale, bool use_qk_l2norm) {
  check_all(query, key, value, g, beta, initial_state);
  at::Tensor output = at::empty_like(value, at::MemoryFormat::Contiguous);
  at::Tensor final_state = at::empty_like(initial_state, at::MemoryFormat::Contiguous);
  run(query, key, value, g, beta, initial_state, scale, use_qk_l2norm, output, final_state);
  return {output, final_state};
}

std::tuple<at::Tensor&, at::Tensor&> gated_delta_rule_out(const at::Tensor& query, const at::Tensor& key,
                                                          const at::Tensor& value, const at::Tensor& g,
                                                          const at::Tensor& beta, const at::Tensor& initial_state,
                                                          std::optional<double> scale, bool use_qk_l2norm,
                                                          at::Tensor& output, at::Tensor& final_state) {
  check_all(query, key, value, g, beta, initial_state);
  if (ContractError error = check_out_tensors(info_of(value), info_of(initial_state), info_of(output),
                                              info_of(final_state)))
    raise(error);
  for (const at::Tensor* tensor : {&output, &final_state})
    TORCH_CHECK(tensor->device().is_cpu(), "gdn.gated_delta_rule.out: output and final_state must be on cpu, got ",
                tensor->device());
  run(query, key, value, g, beta, initial_state, scale, use_qk_l2norm, output, final_state);
  return {output, final_state};
}

at::Tensor fit_int4_scales_functional(const at::Tensor& weight, int64_t group_size, at::ArrayRef<double> divisors) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "gdn.fit_int4_scales: weight must be a 2-d torch.float32 tensor on cpu, got ",
              dtype_name(weight.scalar_type()), " ", weight.sizes(), " on ", weight.device());
  TORCH_CHECK(group_size > 0 && weight.size(1) % group_size == 0,
              "gdn.fit_int4_scales: group_size must be positive and divide the ", weight.size(1),
              " columns of weight, got ", group_size);
  std::vector<float> candidates(divisors.begin(), divisors.end());
  TORCH_CHECK(!candidates.empty() && std::all_of(candidates.begin(), candidates.end(),
                                                  [](float d) { return std::isfinite(d) && d != 0; }),
              "gdn.fit_int4_scales: divisors must be one or more finite nonzero numbers, got ", divisors);
  const at::Tensor rows = weight.contiguous();
  at::Tensor scales = at::empty({weight.size(0), weight.size(1) / group_size}, weight.options());
  gdn::fit_int4_scales(rows.data_ptr<float>(), weight.size(0), weight.size(1), group_size, candidates.data(),
                       static_cast<int64_t>(candidates.size()), scales.data_ptr<float>(),
                       // The export's quantization, not a kernel of the model: IEEE arithmetic, subnormals kept.
                       [](int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& body) {
                         at::parallel_for(begin, end, 1, body);
                       });
  return scales;
}

// The problem's sizes from the op's tensors, or the contract's error (thrown before anything is written).
ConvGatedDeltaRuleProblem checked_conv_problem(const at::Tensor* (&tensors)[9]) {
  TensorInfo infos[9];
  for (int i = 0; i < 9; ++i) {
    infos[i] = info_of(*tensors[i]);
    TORCH_CHECK(tensors[i]->device().is_cpu(), "gdn.conv_gated_delta_rule: all tensors must be on cpu, got ",
                tensors[i]->device());
  }
  ConvGatedDeltaRuleProblem p;
  if (ContractError error = check_conv_inputs(infos, p)) raise(error);
  return p;
}

at::Tensor& conv_gated_delta_rule_out(const at::Tensor& qkv, const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& conv_weight, const at::Tensor& A_log, const at::Tensor& dt_bias,
                                      const at::Tensor& positions, at::Tensor& conv_state, at::Tensor& state,
                                      at::Tensor& output) {
  const at::Tensor* tensors[9] = {&qkv, &a, &b, &conv_weight, &A_log, &dt_bias, &positions, &conv_state, &state};
  ConvGatedDeltaRuleProblem p = checked_conv_problem(tensors);
  const std::vector<int64_t> out_shape = {p.batch, p.length, p.num_v_heads, p.value_dim};
  TORCH_CHECK_VALUE(output.scalar_type() == at::kFloat && output.sizes().vec() == out_shape && output.device().is_cpu(),
                    "gdn.conv_gated_delta_rule.out: output must be a float32 cpu tensor of shape ", out_shape, ", got ",
                    dtype_name(output.scalar_type()), " ", output.sizes());
  // The kernel reads qkv's channels and writes the state's rows with unit stride.
  const at::Tensor rows = qkv.stride(2) == 1 ? qkv : qkv.contiguous();
  at::Tensor target = state.stride(3) == 1 ? state : state.contiguous();
  p.starting = positions.data_ptr<int64_t>()[0] == 0;
  p.point_at(rows, a, b, conv_weight, A_log, dt_bias, conv_state, target, output);
  conv_gated_delta_rule(p, aten_parallel_for);
  if (!target.is_same(state)) state.copy_(target);
  return output;
}

at::Tensor conv_gated_delta_rule_functional(const at::Tensor& qkv, const at::Tensor& a, const at::Tensor& b,
                                            const at::Tensor& conv_weight, const at::Tensor& A_log,
                                            const at::Tensor& dt_bias, const at::Tensor& positions,
                                            at::Tensor& conv_state, at::Tensor& state) {
  const at::Tensor* tensors[9] = {&qkv, &a, &b, &conv_weight, &A_log, &dt_bias, &positions, &conv_state, &state};
  const ConvGatedDeltaRuleProblem p = checked_conv_problem(tensors);
  at::Tensor output = at::empty({p.batch, p.length, p.num_v_heads, p.value_dim}, qkv.options());
  return conv_gated_delta_rule_out(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state, output);
}

}  // namespace
}  // namespace gdn

TORCH_LIBRARY_IMPL(gdn, CPU, m) {
  m.impl("conv_gated_delta_rule", &gdn::conv_gated_delta_rule_functional);
  m.impl("conv_gated_delta_rule.out", &gdn::conv_gated_delta_rule_out);
  m.impl("fit_int4_scales", &gdn::fit_int4_scales_functional);
  m.impl("gated_delta_rule", &gdn::gated_delta_rule_functional);
  m.impl("gated_delta_rule.out", &gdn::gated_delta_rule_out);
}
