// The op contract's input checks, shared by the ATen and ExecuTorch entry
// points so both reject the same inputs with the reference's wording
// (gdn_export/ops/contract.py: check_inputs, check_out_tensors).
#include <sstream>

#include "gated_delta_rule.h"

namespace gdn {
namespace {

std::string shape_string(const std::vector<int64_t>& sizes) {
  std::ostringstream text;
  text << "[";
  for (size_t i = 0; i < sizes.size(); ++i) text << (i ? ", " : "") << sizes[i];
  text << "]";
  return text.str();
}

ContractError type_error(const std::string& message) { return {ContractError::Type, message}; }
ContractError value_error(const std::string& message) { return {ContractError::Value, message}; }

}  // namespace

ContractError check_inputs(const TensorInfo& query, const TensorInfo& key, const TensorInfo& value, const TensorInfo& g,
                           const TensorInfo& beta, const TensorInfo& initial_state) {
  const std::pair<const char*, const TensorInfo*> floats[] = {
      {"query", &query}, {"key", &key}, {"value", &value}, {"g", &g}, {"beta", &beta}};
  for (const auto& [name, info] : floats) {
    if (!info->is_supported_float)
      return type_error(std::string("gdn.gated_delta_rule: ") + name + " must be float32, bfloat16 or float16, got " +
                        info->dtype_name);
  }
  if (!initial_state.is_float32)
    return type_error("gdn.gated_delta_rule: initial_state must be float32, got " + initial_state.dtype_name);
  const std::tuple<const char*, const TensorInfo*, size_t> ranks[] = {
      {"query", &query, 4}, {"key", &key, 4}, {"value", &value, 4}, {"beta", &beta, 3},
      {"initial_state", &initial_state, 4}};
  for (const auto& [name, info, rank] : ranks) {
    if (info->sizes.size() != rank)
      return value_error(std::string("gdn.gated_delta_rule: ") + name + " must have " + std::to_string(rank) +
                         " dims, got shape " + shape_string(info->sizes));
  }
  if (g.sizes.size() != 3 && g.sizes.size() != 4)
    return value_error("gdn.gated_delta_rule: g must be [B, T, Hv] (GDA) or [B, T, Hv, Dk] (KDA), got shape " +
                       shape_string(g.sizes));
  const int64_t batch = query.sizes[0], length = query.sizes[1], num_k_heads = query.sizes[2],
                key_dim = query.sizes[3];
  const int64_t num_v_heads = value.sizes[2], value_dim = value.sizes[3];
  if (num_k_heads == 0 || num_v_heads % num_k_heads != 0)
    return value_error("gdn.gated_delta_rule: value heads (Hv=" + std::to_string(num_v_heads) +
                       ") must be a multiple of query/key heads (Hk=" + std::to_string(num_k_heads) + ")");
  std::vector<int64_t> gate_shape = {batch, length, num_v_heads};
  if (g.sizes.size() == 4) gate_shape.push_back(key_dim);
  const std::tuple<const char*, const TensorInfo*, std::vector<int64_t>> shapes[] = {
      {"key", &key, {batch, length, num_k_heads, key_dim}},
      {"value", &value, {batch, length, num_v_heads, value_dim}},
      {"g", &g, gate_shape},
      {"beta", &beta, {batch, length, num_v_heads}},
      {"initial_state", &initial_state, {batch, num_v_heads, key_dim, value_dim}}};
  for (const auto& [name, info, expected] : shapes) {
    if (info->sizes != expected)
      return value_error(std::string("gdn.gated_delta_rule: ") + name + " must have shape " + shape_string(expected) +
                         " (from query " + shape_string(query.sizes) + " and value " + shape_string(value.sizes) +
                         "), got " + shape_string(info->sizes));
  }
  return {};
}

ContractError check_out_tensors(const TensorInfo& value, const TensorInfo& initial_state, const TensorInfo& output,
                                const TensorInfo& final_state) {
  const std::tuple<const char*, const TensorInfo*, const TensorInfo*> pairs[] = {
      {"output", &output, &value}, {"final_state", &final_state, &initial_state}};
  for (const auto& [name, tensor, like] : pairs) {
    if (tensor->sizes != like->sizes || tensor->dtype_name != like->dtype_name)
      return value_error(std::string("gdn.gated_delta_rule.out: ") + name + " must have shape " +
                         shape_string(like->sizes) + " and dtype " + like->dtype_name + ", got shape " +
                         shape_string(tensor->sizes) + " and dtype " + tensor->dtype_name);
  }
  return {};
}

}  // namespace gdn
