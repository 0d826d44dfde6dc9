// ExecuTorch entries of gdn::grouped_int8_linear.out and gdn::grouped_int4_linear.out (see grouped_int8_linear.h,
// grouped_int4_linear.h).
//
// Every argument is checked here, so a bad call fails with an error instead of reading past a weight.
#include "executorch_entry.h"

#include <vector>

#include "grouped_int4_linear.h"
#include "grouped_int8_linear.h"
#include "grouped_linear_input.h"

namespace gdn {
namespace {

// A grouped linear's .out is called with (x, weight, scales, out) in programs exported before the fused arguments,
// or (x, weight, scales, norm_weight, norm_eps, gated, residual, out), each maybe followed by the returned out.
constexpr size_t kFusedArguments = 8;

// Checks that the first three arguments and out are tensors; returns whether they are.
bool grouped_linear_stack(KernelRuntimeContext& ctx, Span<EValue*> stack, const char* op) {
  ET_KERNEL_CHECK_MSG(ctx, (stack.size() >= 4 && stack.size() <= 5) || stack.size() >= kFusedArguments,
                      InvalidArgument, false, "%s: expected 4 or %zu arguments, got %zu", op, kFusedArguments,
                      stack.size());
  if (!tensor_arguments(ctx, stack, 3, op)) return false;
  ET_KERNEL_CHECK_MSG(ctx, stack[stack.size() >= kFusedArguments ? kFusedArguments - 1 : 3]->isTensor(),
                      InvalidArgument, false, "%s: out must be a Tensor", op);
  return true;
}

// What both grouped linears check beyond their codes (weight [N / 16, ..., K / something], already checked to give
// `tiles` and `k`): scales [tiles, K / group, 16] bfloat16 (or the smaller form, int8 [tiles, K / group + 4,
// 16]) with a group of 32 to 256, x float32 [..., K] ([..., 2K]
// if gated), out float32, resized to [..., N], and the fused arguments: norm_weight float32 [K] or None, gated a
// bool (not both), residual float32 shaped as out or None. Then runs `multiply(group, rows)` on the rows of x, or
// on what the fused arguments make of them, and adds the residual; on any failure, fails the call instead.
template <typename Multiply>
void grouped_linear_out(KernelRuntimeContext& ctx, const char* op, Span<EValue*> stack, int64_t tiles, int64_t k,
                        Multiply multiply) {
  const Tensor& x = stack[0]->toTensor();
  const Tensor& scales = stack[2]->toTensor();
  const bool fused = stack.size() >= kFusedArguments;
  Tensor& output = stack[fused ? kFusedArguments - 1 : 3]->toTensor();
  // The int8 form carries 4 more rows of 16: the tile's float32 multipliers (grouped_linear.h).
  const bool small = scales.scalar_type() == ScalarType::Char;
  const int64_t groups = scales.dim() == 3 ? scales.size(1) - (small ? 4 : 0) : 0;
  ET_KERNEL_CHECK_MSG(ctx, (scales.scalar_type() == ScalarType::BFloat16 || small) && scales.dim() == 3 &&
                               scales.size(0) == tiles && scales.size(2) == 16 && groups > 0 && k % groups == 0,
                      InvalidArgument, ,
                      "%s: scales must be a bfloat16 tensor [%zd, K / group, 16] or an int8 one [tiles, K / group + 4, "
                      "16] with K = %zd", op, ssize_t(tiles), ssize_t(k));
  const int64_t group = k / groups;
  ET_KERNEL_CHECK_MSG(ctx, group == 32 || group == 64 || group == 128 || group == 256, InvalidArgument, ,
                      "%s: the group must be 32, 64, 128 or 256, got %zd", op, ssize_t(group));
  const float* norm_weight = nullptr;
  const float* residual = nullptr;
  float norm_eps = 0.0f;
  bool gated = false;
  if (fused) {
    if (!stack[3]->isNone()) {
      ET_KERNEL_CHECK_MSG(ctx, stack[3]->isTensor(), InvalidArgument, , "%s: norm_weight must be a Tensor or None", op);
      const Tensor& weight = stack[3]->toTensor();
      ET_KERNEL_CHECK_MSG(ctx, weight.scalar_type() == ScalarType::Float && weight.dim() == 1 && weight.size(0) == k,
                          InvalidArgument, , "%s: norm_weight must be float32 [%zd]", op, ssize_t(k));
      norm_weight = weight.const_data_ptr<float>();
    }
    ET_KERNEL_CHECK_MSG(ctx, stack[4]->isDouble() && stack[5]->isBool(), InvalidArgument, ,
                        "%s: norm_eps must be a float and gated a bool", op);
    norm_eps = static_cast<float>(stack[4]->toDouble());
    gated = stack[5]->toBool();
    ET_KERNEL_CHECK_MSG(ctx, !(gated && norm_weight != nullptr), InvalidArgument, ,
                        "%s: norm_weight and gated cannot both be given", op);
  }
  const int64_t width = gated ? 2 * k : k;
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float &&
                               x.dim() >= 1 && x.dim() <= 8 && x.size(x.dim() - 1) == width,
                      InvalidArgument, , "%s: x must be float32 [..., %zd] and out float32", op, ssize_t(width));
  resize_output(output, x, x.dim() - 1, 16 * tiles);
  const int64_t count = x.numel() / width, n = 16 * tiles;
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == count * n, InvalidArgument, ,
                      "%s: out must hold %zd values per row of x", op, ssize_t(n));
  if (fused && !stack[6]->isNone()) {
    ET_KERNEL_CHECK_MSG(ctx, stack[6]->isTensor(), InvalidArgument, , "%s: residual must be a Tensor or None", op);
    const Tensor& added = stack[6]->toTensor();
    ET_KERNEL_CHECK_MSG(ctx, added.scalar_type() == ScalarType::Float && added.numel() == count * n &&
                                 added.size(added.dim() - 1) == n, InvalidArgument, ,
                        "%s: residual must be float32 [..., %zd] with a row per row of x", op, ssize_t(n));
    residual = added.const_data_ptr<float>();
  }
  const float* input = x.const_data_ptr<float>();
  std::vector<float> prepared;
  if (norm_weight != nullptr || gated) {
    prepared.resize(count * k);
    grouped_linear_input(input, count, k, norm_weight, norm_eps, gated, prepared.data(), executorch_parallel_for);
    input = prepared.data();
  }
  float* y = output.mutable_data_ptr<float>();
  multiply(scales.const_data_ptr(), small, group, input, count, y);
  if (residual != nullptr) {
    for (int64_t i = 0; i < count * n; ++i) y[i] += residual[i];
  }
}

// Either grouped linear's weight (GroupedInt8Weight, GroupedInt4Weight) over its codes and scales of either form.
template <typename Weight, typename Code>
Weight grouped_weight(const Tensor& codes, const void* scales, bool small, int64_t tiles, int64_t k, int64_t group) {
  Weight weight;
  weight.codes = codes.const_data_ptr<Code>();
  if (small) {
    weight.small_scales = static_cast<const int8_t*>(scales);
  } else {
    weight.scales = static_cast<const uint16_t*>(scales);
  }
  weight.n = 16 * tiles;
  weight.k = k;
  weight.group = group;
  return weight;
}

// gdn::grouped_int8_linear.out(x, weight, scales, [norm_weight, norm_eps, gated, residual,] out): x [..., K] float32, weight [N / 16, K / 2, 16, 2] int8,
// scales [N / 16, K / group, 16] bfloat16 or int8 [N / 16, K / group + 4, 16] -> out [..., N] float32
void grouped_int8_linear_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.grouped_int8_linear.out";
  if (!grouped_linear_stack(ctx, stack, kOp)) return;
  const Tensor& codes = stack[1]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, codes.scalar_type() == ScalarType::Char && codes.dim() == 4 && codes.size(2) == 16 &&
                               codes.size(3) == 2, InvalidArgument, ,
                      "%s: weight must be an int8 tensor [N / 16, K / 2, 16, 2]", kOp);
  const int64_t tiles = codes.size(0), k = 2 * codes.size(1);
  grouped_linear_out(ctx, kOp, stack, tiles, k,
                     [&](const void* scales, bool small, int64_t group, const float* x, int64_t count, float* y) {
                       grouped_int8_linear(grouped_weight<GroupedInt8Weight, int8_t>(codes, scales, small, tiles, k,
                                                                                      group),
                                           x, count, y, executorch_parallel_for);
                     });
}

// gdn::grouped_int4_linear.out(x, weight, scales, [norm_weight, norm_eps, gated, residual,] out): x [..., K] float32, weight [N / 16, K / 4, 32] uint8,
// scales [N / 16, K / group, 16] bfloat16 or int8 [N / 16, K / group + 4, 16] -> out [..., N] float32
void grouped_int4_linear_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.grouped_int4_linear.out";
  if (!grouped_linear_stack(ctx, stack, kOp)) return;
  const Tensor& codes = stack[1]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, codes.scalar_type() == ScalarType::Byte && codes.dim() == 3 && codes.size(2) == 32,
                      InvalidArgument, , "%s: weight must be a uint8 tensor [N / 16, K / 4, 32]", kOp);
  const int64_t tiles = codes.size(0), k = 4 * codes.size(1);
  grouped_linear_out(ctx, kOp, stack, tiles, k,
                     [&](const void* scales, bool small, int64_t group, const float* x, int64_t count, float* y) {
                       grouped_int4_linear(grouped_weight<GroupedInt4Weight, uint8_t>(codes, scales, small, tiles, k,
                                                                                       group),
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
