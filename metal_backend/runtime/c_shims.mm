// Definitions of the AOTInductor C shims declared in c_shims.h.
//
// Each shim: reads the handles as ExecuTorch tensors, allocates the returned
// output on the GPU, plans the launch with launch.h (which validates every
// shape and dtype before anything is allocated or written) and encodes one
// dispatch. The state is the op's mutated argument: the kernel reads and
// overwrites it in place. Errors are logged and returned as error codes, never
// thrown across the C boundary.

#include "c_shims.h"

#include <executorch/backends/apple/metal/runtime/ops/common.h>

#include <optional>
#include <stdexcept>

#include "launch.h"
#include "metal_dispatch.h"

namespace gdn_metal {
namespace {

using executorch::backends::metal::aoti_torch_delete_tensor_object;
using executorch::backends::metal::aoti_torch_empty_strided;
using executorch::runtime::Error;

constexpr int32_t kMpsDeviceType = 13;  // c10::DeviceType::MPS

const EtTensor& tensor_of(AOTITensorHandle handle, const char* name) {
  if (handle == nullptr) throw std::invalid_argument(std::string("gdn metal: ") + name + " is null");
  return *reinterpret_cast<const EtTensor*>(handle);
}

std::optional<double> optional_scale(const double* scale) {
  return scale == nullptr ? std::nullopt : std::optional<double>(*scale);
}

// A contiguous [B, T, Hv, Dv] output's view, to validate before allocating it.
TensorView planned_output(int32_t dtype, int64_t batch, int64_t length, int64_t heads, int64_t dim) {
  return TensorView{"output", dtype, 4, {batch, length, heads, dim},
                    {length * heads * dim, heads * dim, dim, 1}};
}

AOTITensorHandle allocate(const TensorView& view) {
  AOTITensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(view.ndim, view.sizes, view.strides, view.dtype, kMpsDeviceType, 0,
                               &handle) != Error::Ok ||
      handle == nullptr) {
    throw std::runtime_error("gdn metal: allocating the output failed");
  }
  return handle;
}

// Encodes the dispatch; on failure deletes the output the shim just allocated, so nothing leaks.
template <typename Launch>
void encode_or_delete_output(const Launch& launch, const EtTensor* const* tensors, int count,
                             AOTITensorHandle output) {
  try {
    encode_dispatch(launch.plan, tensors, count, &launch.params, sizeof(launch.params));
  } catch (...) {
    aoti_torch_delete_tensor_object(output);
    throw;
  }
}

template <typename Body>
AOTITorchError guarded(const char* shim, Body body) {
  try {
    body();
    return Error::Ok;
  } catch (const Unsupported& e) {
    ET_LOG(Error, "%s: %s", shim, e.what());
    return Error::NotSupported;
  } catch (const std::invalid_argument& e) {
    ET_LOG(Error, "%s: %s", shim, e.what());
    return Error::InvalidArgument;
  } catch (const std::exception& e) {
    ET_LOG(Error, "%s: %s", shim, e.what());
    return Error::Internal;
  }
}

}  // namespace

extern "C" {

AOTITorchError aoti_torch_mps_gated_delta_rule_inplace(
    AOTITensorHandle query, AOTITensorHandle key, AOTITensorHandle value, AOTITensorHandle g,
    AOTITensorHandle beta, AOTITensorHandle state, double* scale, int32_t use_qk_l2norm,
    AOTITensorHandle* ret0) {
  return guarded("aoti_torch_mps_gated_delta_rule_inplace", [&] {
    if (ret0 == nullptr) throw std::invalid_argument("gdn metal: ret0 is null");
    const EtTensor* tensors[8] = {
        &tensor_of(query, "query"), &tensor_of(key, "key"), &tensor_of(value, "value"),
        &tensor_of(g, "g"), &tensor_of(beta, "beta"), &tensor_of(state, "state"),
        nullptr, &tensor_of(state, "state")};
    const TensorView value_view = tensor_view("value", *tensors[2]);
    const TensorView output_view =
        planned_output(value_view.dtype, value_view.sizes[0], value_view.sizes[1],
                       value_view.sizes[2], value_view.sizes[3]);
    const TensorView state_view = tensor_view("state", *tensors[5]);
    const GatedDeltaRuleLaunch launch = plan_gated_delta_rule_inplace(
        tensor_view("query", *tensors[0]), tensor_view("key", *tensors[1]), value_view,
        tensor_view("g", *tensors[3]), tensor_view("beta", *tensors[4]), state_view, output_view,
        optional_scale(scale), use_qk_l2norm != 0);
    AOTITensorHandle output = allocate(output_view);
    tensors[6] = reinterpret_cast<const EtTensor*>(output);
    encode_or_delete_output(launch, tensors, 8, output);
    *ret0 = output;
  });
}

AOTITorchError aoti_torch_mps_fused_gated_delta_rule(
    AOTITensorHandle mixed_qkv, AOTITensorHandle a, AOTITensorHandle b, AOTITensorHandle A_log,
    AOTITensorHandle dt_bias, AOTITensorHandle state, double* scale, AOTITensorHandle* ret0) {
  return guarded("aoti_torch_mps_fused_gated_delta_rule", [&] {
    if (ret0 == nullptr) throw std::invalid_argument("gdn metal: ret0 is null");
    const EtTensor* tensors[7] = {
        &tensor_of(mixed_qkv, "mixed_qkv"), &tensor_of(a, "a"), &tensor_of(b, "b"),
        &tensor_of(A_log, "A_log"), &tensor_of(dt_bias, "dt_bias"), &tensor_of(state, "state"),
        nullptr};
    const TensorView mixed_view = tensor_view("mixed_qkv", *tensors[0]);
    const TensorView state_view = tensor_view("state", *tensors[5]);
    if (mixed_view.ndim != 3 || state_view.ndim != 4) {
      throw std::invalid_argument(
          "gdn metal: mixed_qkv must be [B, T, channels] and state [B, Hv, Dk, Dv]");
    }
    const TensorView output_view = planned_output(mixed_view.dtype, mixed_view.sizes[0],
                                                  mixed_view.sizes[1], state_view.sizes[1],
                                                  state_view.sizes[3]);
    const FusedGatedDeltaRuleLaunch launch = plan_fused_gated_delta_rule(
        mixed_view, tensor_view("a", *tensors[1]), tensor_view("b", *tensors[2]),
        tensor_view("A_log", *tensors[3]), tensor_view("dt_bias", *tensors[4]), state_view,
        output_view, optional_scale(scale));
    AOTITensorHandle output = allocate(output_view);
    tensors[6] = reinterpret_cast<const EtTensor*>(output);
    encode_or_delete_output(launch, tensors, 7, output);
    *ret0 = output;
  });
}

}  // extern "C"

}  // namespace gdn_metal
