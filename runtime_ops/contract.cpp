// The ops' input checks, shared by the ATen and ExecuTorch entry points so both
// reject the same inputs with the reference's wording (gdn_export/ops/contract.py:
// check_inputs, check_out_tensors; gdn_export/ops/conv_recurrence.py: check_conv_inputs).
#include <sstream>

#include "conv_gated_delta_rule.h"
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

ContractError check_conv_inputs(const TensorInfo (&tensors)[9], ConvGatedDeltaRuleProblem& p) {
  static const char* const kNames[9] = {"qkv", "a", "b", "conv_weight", "A_log", "dt_bias", "positions",
                                        "conv_state", "state"};
  const std::string op = "gdn.conv_gated_delta_rule: ";
  for (int i = 0; i < 8; ++i) {
    const bool positions = i == 6;
    if (positions ? tensors[i].dtype_name != "torch.int64" : !tensors[i].is_float32)
      return type_error(op + kNames[i] + " must be " + (positions ? "torch.int64" : "torch.float32") +
          ", got " + tensors[i].dtype_name);
  }
  p.half_state = tensors[8].dtype_name == "torch.float16";
  if (!tensors[8].is_float32 && !p.half_state)
    return type_error(op + "state must be torch.float32 or torch.float16, got " + tensors[8].dtype_name);
  const auto& qkv = tensors[0].sizes;
  const auto& weight = tensors[3].sizes;
  const auto& state = tensors[8].sizes;
  if (qkv.size() != 3 || state.size() != 4 || weight.size() != 3 || weight[1] != 1 || weight[2] < 1)
    return value_error(op + "qkv must be [B, T, C], conv_weight [C, 1, W] with W >= 1 and state "
        "[B, Hv, Dk, Dv], got " + shape_string(qkv) + ", " + shape_string(weight) +
        " and " + shape_string(state));
  const int64_t batch = qkv[0], length = qkv[1], channels = qkv[2], heads = state[1], taps = weight[2];
  const std::vector<int64_t> expected[9] = {qkv, {batch, length, heads}, {batch, length, heads}, {channels, 1, taps},
                                            {heads}, {heads}, {length}, {batch, channels, taps - 1},
                                            {batch, heads, state[2], state[3]}};
  for (int i = 1; i < 9; ++i)
    if (tensors[i].sizes != expected[i])
      return value_error(op + kNames[i] + " must have shape " + shape_string(expected[i]) + " (from qkv " +
          shape_string(qkv) + ", conv_weight " + shape_string(weight) + " and state " +
          shape_string(state) + "), got " + shape_string(tensors[i].sizes));
  if (length < 1) return value_error(op + "qkv must hold at least one token, got T = 0");
  const int64_t key_channels = channels - heads * state[3];
  if (key_channels <= 0 || key_channels % (2 * state[2]) != 0 || heads % (key_channels / (2 * state[2])) != 0)
    return value_error(op + "qkv's last dim must be 2*Hk*Dk + Hv*Dv with Hv a multiple of Hk (Hv=" +
        std::to_string(heads) + ", Dk=" + std::to_string(state[2]) + ", Dv=" +
        std::to_string(state[3]) + " from state), got " + std::to_string(channels));
  p.batch = batch;
  p.length = length;
  p.channels = channels;
  p.taps = taps;
  p.num_v_heads = heads;
  p.key_dim = state[2];
  p.value_dim = state[3];
  p.num_k_heads = key_channels / (2 * state[2]);
  return {};
}

}  // namespace gdn
