// What the ExecuTorch entries of the gdn kernels (executorch_kernel.cpp,
// executorch_attention_kernel.cpp, executorch_planes_kernel.cpp) share: the
// ExecuTorch names they use, the core routines' parallel loop on ExecuTorch's
// thread pool, and the ops' default scale. Included by those files only.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <cmath>
#include <cstdint>
#include <functional>


namespace gdn {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

// The core routines take their loop as an argument (they build without
// ExecuTorch or ATen); in a program it is ExecuTorch's thread pool.
inline void executorch_parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& body) {
  executorch::extension::parallel_for(begin, end, 1, [&](int64_t first, int64_t last) { body(first, last); });
}

// The ops' scale argument: None means 1 / sqrt(head dim), as in the PyTorch contract.
inline float scale_or_default(const EValue& scale, int64_t head_dim) {
  return static_cast<float>(scale.isNone() ? 1.0 / std::sqrt(double(head_dim)) : scale.toDouble());
}

}  // namespace gdn
