// What the ExecuTorch entries of the gdn kernels (executorch_kernel.cpp,
// executorch_attention_kernel.cpp, executorch_planes_kernel.cpp,
// executorch_linear_kernel.cpp, executorch_conv_kernel.cpp, executorch_norm_kernel.cpp) share: the ExecuTorch
// names they use, the core routines' parallel loop on ExecuTorch's thread pool,
// the checks of a boxed call's tensors and their contract errors, output
// resizing, and the ops' default scale. Included by those files only.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "gated_delta_rule.h"  // TensorInfo, ContractError
#include "subnormals.h"

namespace gdn {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

// The core routines take their loop as an argument (they build without
// ExecuTorch or ATen); in a program it is ExecuTorch's thread pool, each body with subnormals as zero.
inline void executorch_parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& body) {
  executorch::extension::parallel_for(begin, end, 1, [&](int64_t first, int64_t last) {
    SubnormalsAsZero flushed;
    body(first, last);
  });
}

using executorch::aten::SizesType;

// Whether the boxed stack holds at least `count` arguments, all tensors (the out tensor last); fails the call if not.
inline bool tensor_arguments(KernelRuntimeContext& ctx, Span<EValue*> stack, size_t count, const char* op) {
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= count, InvalidArgument, false, "%s: expected %zu arguments, got %zu", op,
                      count, stack.size());
  for (size_t i = 0; i < count; ++i) {
    ET_KERNEL_CHECK_MSG(ctx, stack[i]->isTensor(), InvalidArgument, false, "%s: argument %zu must be a Tensor", op, i);
  }
  return true;
}

// Resizes output to the first `kept` sizes of `like` and then `last`. Outputs of a dynamic-shape program arrive
// at their upper bound; a static one must already match (the callers check the element count afterwards).
inline void resize_output(Tensor& output, const Tensor& like, int64_t kept, int64_t last) {
  SizesType sizes[8];
  for (int64_t d = 0; d < kept; ++d) sizes[d] = like.size(d);
  sizes[kept] = static_cast<SizesType>(last);
  (void)executorch::runtime::resize_tensor(output, {sizes, size_t(kept + 1)});
}

// torch's name of an ExecuTorch dtype, as the contract's messages give it.
inline std::string dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Bool: return "torch.bool";
    default: return "torch.<scalar type " + std::to_string(static_cast<int>(type)) + ">";
  }
}

// What the contract's checks (contract.cpp, check_conv_inputs) read of a tensor.
inline TensorInfo info_of(const Tensor& tensor) {
  TensorInfo info;
  for (auto size : tensor.sizes()) info.sizes.push_back(size);
  const ScalarType type = tensor.scalar_type();
  info.is_supported_float = type == ScalarType::Float || type == ScalarType::BFloat16 || type == ScalarType::Half;
  info.is_float32 = type == ScalarType::Float;
  info.dtype_name = dtype_name(type);
  return info;
}

// Fails ctx with message (logged) when error is set; returns whether it was.
inline bool failed(KernelRuntimeContext& ctx, const ContractError& error) {
  if (!error) return false;
  ET_LOG(Error, "%s", error.message.c_str());
  ctx.fail(Error::InvalidArgument);
  return true;
}

// The ops' scale argument: None means 1 / sqrt(head dim), as in the PyTorch contract.
inline float scale_or_default(const EValue& scale, int64_t head_dim) {
  return static_cast<float>(scale.isNone() ? 1.0 / std::sqrt(double(head_dim)) : scale.toDouble());
}

}  // namespace gdn
