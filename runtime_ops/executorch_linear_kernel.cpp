// ExecuTorch entries of gdn::grouped_int8_linear.out and gdn::grouped_int4_linear.out (see grouped_int8_linear.h,
// grouped_int4_linear.h).
//
// Every argument is checked here, so a bad call fails with an error instead of reading past a weight.
#include "executorch_entry.h"

#include "grouped_int4_linear.h"
#include "grouped_int8_linear.h"

namespace gdn {
namespace {

// What both grouped linears check beyond their codes (weight [N / 16, ..., K / something], already checked to give
// `tiles` and `k`): scales [tiles, K / group, 16] bfloat16 with a group of 32 to 256, x float32 [..., K], and out
// float32, resized to [..., N]. Then runs `multiply(group, rows of x)`; on any failure, fails the call instead.
template <typename Multiply>
void grouped_linear_out(KernelRuntimeContext& ctx, const char* op, Span<EValue*> stack, int64_t tiles, int64_t k,
                        Multiply multiply) {
  const Tensor& x = stack[0]->toTensor();
  const Tensor& scales = stack[2]->toTensor();
  Tensor& output = stack[3]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, scales.scalar_type() == ScalarType::BFloat16 && scales.dim() == 3 &&
                               scales.size(0) == tiles && scales.size(2) == 16 && scales.size(1) > 0 &&
                               k % scales.size(1) == 0, InvalidArgument, ,
                      "%s: scales must be a bfloat16 tensor [%zd, K / group, 16] with K = %zd", op, ssize_t(tiles),
                      ssize_t(k));
  const int64_t group = k / scales.size(1);
  ET_KERNEL_CHECK_MSG(ctx, group == 32 || group == 64 || group == 128 || group == 256, InvalidArgument, ,
                      "%s: the group (K / scales.size(1)) must be 32, 64, 128 or 256, got %zd", op, ssize_t(group));
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float &&
                               x.dim() >= 1 && x.dim() <= 8 && x.size(x.dim() - 1) == k,
                      InvalidArgument, , "%s: x must be float32 [..., %zd] and out float32", op, ssize_t(k));
  resize_output(output, x, x.dim() - 1, 16 * tiles);
  const int64_t count = x.numel() / k;
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == count * 16 * tiles, InvalidArgument, ,
                      "%s: out must hold %zd values per row of x", op, ssize_t(16 * tiles));
  const uint16_t* scale_bits = reinterpret_cast<const uint16_t*>(scales.const_data_ptr<executorch::aten::BFloat16>());
  multiply(scale_bits, group, x.const_data_ptr<float>(), count, output.mutable_data_ptr<float>());
}

// gdn::grouped_int8_linear.out(x, weight, scales, out): x [..., K] float32, weight [N / 16, K / 2, 16, 2] int8,
// scales [N / 16, K / group, 16] bfloat16 -> out [..., N] float32
void grouped_int8_linear_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.grouped_int8_linear.out";
  if (!tensor_arguments(ctx, stack, 4, kOp)) return;
  const Tensor& codes = stack[1]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, codes.scalar_type() == ScalarType::Char && codes.dim() == 4 && codes.size(2) == 16 &&
                               codes.size(3) == 2, InvalidArgument, ,
                      "%s: weight must be an int8 tensor [N / 16, K / 2, 16, 2]", kOp);
  const int64_t tiles = codes.size(0), k = 2 * codes.size(1);
  grouped_linear_out(ctx, kOp, stack, tiles, k,
                     [&](const uint16_t* scales, int64_t group, const float* x, int64_t count, float* y) {
                       grouped_int8_linear(GroupedInt8Weight{codes.const_data_ptr<int8_t>(), scales, 16 * tiles, k,
                                                             group},
                                           x, count, y, executorch_parallel_for);
                     });
}

// gdn::grouped_int4_linear.out(x, weight, scales, out): x [..., K] float32, weight [N / 16, K / 4, 32] uint8,
// scales [N / 16, K / group, 16] bfloat16 -> out [..., N] float32
void grouped_int4_linear_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.grouped_int4_linear.out";
  if (!tensor_arguments(ctx, stack, 4, kOp)) return;
  const Tensor& codes = stack[1]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, codes.scalar_type() == ScalarType::Byte && codes.dim() == 3 && codes.size(2) == 32,
                      InvalidArgument, , "%s: weight must be a uint8 tensor [N / 16, K / 4, 32]", kOp);
  const int64_t tiles = codes.size(0), k = 4 * codes.size(1);
  grouped_linear_out(ctx, kOp, stack, tiles, k,
                     [&](const uint16_t* scales, int64_t group, const float* x, int64_t count, float* y) {
                       grouped_int4_linear(GroupedInt4Weight{codes.const_data_ptr<uint8_t>(), scales, 16 * tiles, k,
                                                             group},
                                           x, count, y, executorch_parallel_for);
                     });
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::grouped_int8_linear.out", grouped_int8_linear_out),
    executorch::runtime::Kernel("gdn::grouped_int4_linear.out", grouped_int4_linear_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 2});

}  // namespace
}  // namespace gdn
