// ExecuTorch entry of gdn::conv_gated_delta_rule.out (see conv_gated_delta_rule.h).
//
// Every argument is checked here, so a bad call fails with an error instead of reading or writing out of bounds.
#include "executorch_entry.h"

#include "conv_gated_delta_rule.h"

namespace gdn {
namespace {

// gdn::conv_gated_delta_rule.out(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state, output)
void conv_gated_delta_rule_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.conv_gated_delta_rule.out";
  if (!tensor_arguments(ctx, stack, 10, kOp)) return;
  TensorInfo infos[9];
  for (int i = 0; i < 9; ++i) infos[i] = info_of(stack[i]->toTensor());
  ConvGatedDeltaRuleProblem p;
  if (failed(ctx, check_conv_inputs(infos, p))) return;
  const Tensor& qkv = stack[0]->toTensor();
  const Tensor& a = stack[1]->toTensor();
  const Tensor& b = stack[2]->toTensor();
  const Tensor& conv_weight = stack[3]->toTensor();
  const Tensor& A_log = stack[4]->toTensor();
  const Tensor& dt_bias = stack[5]->toTensor();
  const Tensor& positions = stack[6]->toTensor();
  Tensor& conv_state = stack[7]->toTensor();
  Tensor& state = stack[8]->toTensor();
  Tensor& output = stack[9]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, qkv.strides()[2] == 1 && state.strides()[3] == 1, InvalidArgument, ,
                      "%s: qkv needs unit stride along C and state along Dv", kOp);
  ET_KERNEL_CHECK_MSG(ctx, output.scalar_type() == ScalarType::Float && output.dim() == 4, InvalidArgument, ,
                      "%s: output must be a float32 tensor [B, T, Hv, Dv]", kOp);
  const SizesType sizes[4] = {SizesType(p.batch), SizesType(p.length), SizesType(p.num_v_heads),
                              SizesType(p.value_dim)};
  (void)executorch::runtime::resize_tensor(output, {sizes, 4});
  ET_KERNEL_CHECK_MSG(ctx, output.size(0) == p.batch && output.size(1) == p.length &&
                               output.size(2) == p.num_v_heads && output.size(3) == p.value_dim,
                      InvalidArgument, , "%s: output must have shape [B, T, Hv, Dv] = [%zd, %zd, %zd, %zd]", kOp,
                      ssize_t(p.batch), ssize_t(p.length), ssize_t(p.num_v_heads), ssize_t(p.value_dim));
  p.starting = positions.const_data_ptr<int64_t>()[0] == 0;
  p.point_at(qkv, a, b, conv_weight, A_log, dt_bias, conv_state, state, output);
  conv_gated_delta_rule(p, executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::conv_gated_delta_rule.out", conv_gated_delta_rule_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 1});

}  // namespace
}  // namespace gdn
