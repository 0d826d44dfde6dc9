// ExecuTorch entry of gdn::gated_rms_norm.out (see gated_rms_norm.h).
//
// Every argument is checked here, so a bad call fails with an error instead of reading past a tensor.
#include "executorch_entry.h"

#include "gated_rms_norm.h"

namespace gdn {
namespace {

// gdn::gated_rms_norm.out(x, gate, weight, eps, out): x, gate [..., D], weight [D], all float32 and contiguous ->
// out [..., D] float32
void gated_rms_norm_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.gated_rms_norm.out";
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 5 && stack[0]->isTensor() && stack[1]->isTensor() &&
                               stack[2]->isTensor() && stack[3]->isDouble() && stack[4]->isTensor(),
                      InvalidArgument, , "%s: expected (x, gate, weight, eps, out)", kOp);
  const Tensor& x = stack[0]->toTensor();
  const Tensor& gate = stack[1]->toTensor();
  const Tensor& weight = stack[2]->toTensor();
  Tensor& output = stack[4]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && gate.scalar_type() == ScalarType::Float &&
                               weight.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float,
                      InvalidArgument, , "%s: x, gate, weight and out must be float32", kOp);
  ET_KERNEL_CHECK_MSG(ctx, x.dim() >= 1 && x.dim() <= 8 && weight.dim() == 1 && x.size(x.dim() - 1) == weight.size(0) &&
                               weight.size(0) > 0 && gate.numel() == x.numel() &&
                               gate.size(gate.dim() - 1) == weight.size(0),
                      InvalidArgument, , "%s: x and gate must be [..., D] alike and weight [D]", kOp);
  const int64_t d = weight.size(0);
  resize_output(output, x, x.dim() - 1, d);
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == x.numel(), InvalidArgument, , "%s: out must have x's shape", kOp);
  gated_rms_norm(x.const_data_ptr<float>(), gate.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                 x.numel() / d, d, static_cast<float>(stack[3]->toDouble()), output.mutable_data_ptr<float>(),
                 executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::gated_rms_norm.out", gated_rms_norm_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 1});

}  // namespace
}  // namespace gdn
