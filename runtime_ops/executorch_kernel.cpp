// ExecuTorch entry: the kernels of gdn::gated_delta_rule.out and
// gdn::gated_delta_rule_inplace.out inside .pte programs.
//
// A program can be fed anything, so every argument is checked here (kinds,
// dtypes, shapes, out sizes) and a bad one fails the kernel call with an error
// instead of crashing or writing out of bounds. The kernels are registered
// boxed: the unboxing helper of ExecuTorch 1.5.1 takes a single out tensor,
// and gated_delta_rule.out has two.
#include "executorch_entry.h"

#include "gated_delta_rule.h"

namespace gdn {
namespace {

InputView view_of(const Tensor& tensor) {
  InputView view;
  view.data = tensor.const_data_ptr();
  switch (tensor.scalar_type()) {
    case ScalarType::BFloat16: view.type = ElementType::BFloat16; break;
    case ScalarType::Half: view.type = ElementType::Float16; break;
    default: view.type = ElementType::Float32; break;
  }
  for (ssize_t d = 0; d < tensor.dim(); ++d) view.strides[d] = tensor.strides()[d];
  return view;
}

// The argument kinds a boxed call must carry before any of them is read.
bool check_stack(KernelRuntimeContext& ctx, Span<EValue*> stack, size_t num_args, const char* op) {
  if (stack.size() < num_args) {
    ET_LOG(Error, "%s: expected %zu arguments, got %zu", op, num_args, stack.size());
    ctx.fail(Error::InvalidArgument);
    return false;
  }
  for (size_t i = 0; i < 6; ++i) {
    ET_KERNEL_CHECK_MSG(ctx, stack[i]->isTensor(), InvalidArgument, false, "%s: argument %zu must be a Tensor", op, i);
  }
  ET_KERNEL_CHECK_MSG(ctx, stack[6]->isNone() || stack[6]->isDouble(), InvalidArgument, false,
                      "%s: scale must be a float or None", op);
  ET_KERNEL_CHECK_MSG(ctx, stack[7]->isBool(), InvalidArgument, false, "%s: use_qk_l2norm must be a bool", op);
  for (size_t i = 8; i < num_args; ++i) {
    ET_KERNEL_CHECK_MSG(ctx, stack[i]->isTensor(), InvalidArgument, false, "%s: out argument %zu must be a Tensor",
                        op, i);
  }
  return true;
}

// Checks everything, sizes dynamic-shape outputs, then runs the core routine.
void run(KernelRuntimeContext& ctx, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& g,
         const Tensor& beta, const Tensor& initial_state, const EValue& scale, bool use_qk_l2norm, Tensor& output,
         Tensor& final_state) {
  if (failed(ctx, check_inputs(info_of(query), info_of(key), info_of(value), info_of(g), info_of(beta),
                               info_of(initial_state))))
    return;
  // Outputs of a dynamic-shape program arrive at their upper bound; a static one must already match.
  if (output.dim() == value.dim()) (void)executorch::runtime::resize_tensor(output, value.sizes());
  if (failed(ctx, check_out_tensors(info_of(value), info_of(initial_state), info_of(output), info_of(final_state))))
    return;
  ET_KERNEL_CHECK_MSG(ctx, initial_state.strides()[3] == 1 && final_state.strides()[3] == 1, InvalidArgument, ,
                      "gdn.gated_delta_rule.out: states need unit stride along Dv");

  GatedDeltaRuleProblem problem;
  problem.set_sizes(query, value, g);
  problem.use_qk_l2norm = use_qk_l2norm;
  problem.scale = scale_or_default(scale, problem.key_dim);
  problem.query = view_of(query);
  problem.key = view_of(key);
  problem.value = view_of(value);
  problem.g = view_of(g);
  problem.beta = view_of(beta);
  problem.initial_state = initial_state.const_data_ptr<float>();
  problem.final_state = final_state.mutable_data_ptr<float>();
  for (int d = 0; d < 3; ++d) {
    problem.initial_state_strides[d] = initial_state.strides()[d];
    problem.final_state_strides[d] = final_state.strides()[d];
  }
  problem.output = output.mutable_data_ptr();
  for (int d = 0; d < 4; ++d) problem.output_strides[d] = output.strides()[d];

  gated_delta_rule(problem, executorch_parallel_for);
}

// gdn::gated_delta_rule.out(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, output, final_state)
void gated_delta_rule_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  if (!check_stack(ctx, stack, 10, "gdn.gated_delta_rule.out")) return;
  run(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(), stack[3]->toTensor(),
      stack[4]->toTensor(), stack[5]->toTensor(), *stack[6], stack[7]->toBool(), stack[8]->toTensor(),
      stack[9]->toTensor());
}

// gdn::gated_delta_rule_inplace.out(q, k, v, g, beta, state, scale, use_qk_l2norm, output)
void gated_delta_rule_inplace_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  if (!check_stack(ctx, stack, 9, "gdn.gated_delta_rule_inplace.out")) return;
  Tensor& state = stack[5]->toTensor();
  run(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(), stack[3]->toTensor(),
      stack[4]->toTensor(), state, *stack[6], stack[7]->toBool(), stack[8]->toTensor(), state);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::gated_delta_rule.out", gated_delta_rule_out),
    executorch::runtime::Kernel("gdn::gated_delta_rule_inplace.out", gated_delta_rule_inplace_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 2});

}  // namespace
}  // namespace gdn
