// ExecuTorch entry of gdn::grouped_int8_linear.out (see grouped_int8_linear.h).
//
// Every argument is checked here, so a bad call fails with an error instead of reading past a weight.
#include "executorch_entry.h"

#include "grouped_int8_linear.h"

namespace gdn {
namespace {

// gdn::grouped_int8_linear.out(x, weight, scales, out): x [..., K] float32, weight [N / 16, K / 2, 16, 2] int8,
// scales [N / 16, K / group, 16] bfloat16 -> out [..., N] float32
void grouped_int8_linear_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.grouped_int8_linear.out";
  if (!tensor_arguments(ctx, stack, 4, kOp)) return;
  const Tensor& x = stack[0]->toTensor();
  const Tensor& codes = stack[1]->toTensor();
  const Tensor& scales = stack[2]->toTensor();
  Tensor& output = stack[3]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, codes.scalar_type() == ScalarType::Char && codes.dim() == 4 && codes.size(2) == 16 &&
                               codes.size(3) == 2, InvalidArgument, ,
                      "%s: weight must be an int8 tensor [N / 16, K / 2, 16, 2]", kOp);
  const int64_t tiles = codes.size(0), k = 2 * codes.size(1);
  ET_KERNEL_CHECK_MSG(ctx, scales.scalar_type() == ScalarType::BFloat16 && scales.dim() == 3 &&
                               scales.size(0) == tiles && scales.size(2) == 16 && scales.size(1) > 0 &&
                               k % scales.size(1) == 0, InvalidArgument, ,
                      "%s: scales must be a bfloat16 tensor [%zd, K / group, 16] with K = %zd", kOp, ssize_t(tiles),
                      ssize_t(k));
  const int64_t group = k / scales.size(1);
  ET_KERNEL_CHECK_MSG(ctx, group == 32 || group == 64 || group == 128 || group == 256, InvalidArgument, ,
                      "%s: the group (K / scales.size(1)) must be 32, 64, 128 or 256, got %zd", kOp, ssize_t(group));
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float &&
                               x.dim() >= 1 && x.dim() <= 8 && x.size(x.dim() - 1) == k,
                      InvalidArgument, , "%s: x must be float32 [..., %zd] and out float32", kOp, ssize_t(k));
  const GroupedInt8Weight weight{codes.const_data_ptr<int8_t>(),
                                 reinterpret_cast<const uint16_t*>(scales.const_data_ptr<executorch::aten::BFloat16>()),
                                 16 * tiles, k, group};
  resize_output(output, x, x.dim() - 1, weight.n);
  const int64_t count = x.numel() / k;
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == count * weight.n, InvalidArgument, ,
                      "%s: out must hold %zd values per row of x", kOp, ssize_t(weight.n));
  grouped_int8_linear(weight, x.const_data_ptr<float>(), count, output.mutable_data_ptr<float>(),
                      executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::grouped_int8_linear.out", grouped_int8_linear_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 1});

}  // namespace
}  // namespace gdn
