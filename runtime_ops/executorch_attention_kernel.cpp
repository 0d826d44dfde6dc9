// ExecuTorch entry of gdn::cached_attention.out (see cached_attention.h).
//
// The start position is read from input_pos inside the program, so every
// argument is checked here, the position against the cache size included: a
// bad call fails with an error instead of reading past a cache.
#include "executorch_entry.h"

#include "cached_attention.h"

namespace gdn {
namespace {

constexpr const char* kOp = "gdn.cached_attention.out";

// gdn::cached_attention.out(query, k_cache, v_cache, input_pos, scale, output)
void cached_attention_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  // The boxed stack ends with the returned alias of output, after the 6 arguments.
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 6, InvalidArgument, , "%s: expected 6 arguments, got %zu", kOp,
                      stack.size());
  for (size_t i : {0, 1, 2, 3, 5}) {
    ET_KERNEL_CHECK_MSG(ctx, stack[i]->isTensor(), InvalidArgument, , "%s: argument %zu must be a Tensor", kOp, i);
  }
  ET_KERNEL_CHECK_MSG(ctx, stack[4]->isNone() || stack[4]->isDouble(), InvalidArgument, ,
                      "%s: scale must be a float or None", kOp);
  const Tensor& query = stack[0]->toTensor();
  const Tensor& k_cache = stack[1]->toTensor();
  const Tensor& v_cache = stack[2]->toTensor();
  const Tensor& input_pos = stack[3]->toTensor();
  Tensor& output = stack[5]->toTensor();

  ET_KERNEL_CHECK_MSG(ctx,
                      query.scalar_type() == ScalarType::Float && k_cache.scalar_type() == ScalarType::Float &&
                          v_cache.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float,
                      InvalidArgument, , "%s: this kernel takes float32 query, k_cache, v_cache and output", kOp);
  ET_KERNEL_CHECK_MSG(ctx, input_pos.scalar_type() == ScalarType::Long && input_pos.numel() == 1, InvalidArgument, ,
                      "%s: input_pos must be an int64 tensor of shape [1]", kOp);
  ET_KERNEL_CHECK_MSG(ctx, query.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3 && output.dim() == 3,
                      InvalidArgument, , "%s: query [Hq, T, D], k_cache [Hkv, D, S], v_cache [Hkv, S, D] and output "
                      "[Hq, T, D] must be 3-d", kOp);
  const int64_t num_heads = query.size(0), length = query.size(1), head_dim = query.size(2);
  const int64_t num_kv_heads = k_cache.size(0), max_len = k_cache.size(2);
  ET_KERNEL_CHECK_MSG(ctx, k_cache.size(1) == head_dim, InvalidArgument, ,
                      "%s: k_cache must be [Hkv, D=%zd, S], got D=%zd", kOp, ssize_t(head_dim), ssize_t(k_cache.size(1)));
  ET_KERNEL_CHECK_MSG(ctx, v_cache.size(0) == num_kv_heads && v_cache.size(1) == max_len && v_cache.size(2) == head_dim,
                      InvalidArgument, , "%s: v_cache must be [Hkv=%zd, S=%zd, D=%zd]", kOp, ssize_t(num_kv_heads),
                      ssize_t(max_len), ssize_t(head_dim));
  ET_KERNEL_CHECK_MSG(ctx, num_kv_heads > 0 && num_heads % num_kv_heads == 0, InvalidArgument, ,
                      "%s: query's %zd heads must be a multiple of the caches' %zd", kOp, ssize_t(num_heads),
                      ssize_t(num_kv_heads));
  ET_KERNEL_CHECK_MSG(ctx, k_cache.strides()[2] == 1 && v_cache.strides()[2] == 1, InvalidArgument, ,
                      "%s: the caches need unit stride along their last dim", kOp);
  const int64_t start = input_pos.const_data_ptr<int64_t>()[0];
  ET_KERNEL_CHECK_MSG(ctx, start >= 0 && start + length <= max_len, InvalidArgument, ,
                      "%s: input_pos %zd + T %zd must lie within the caches' %zd positions", kOp, ssize_t(start),
                      ssize_t(length), ssize_t(max_len));
  // Outputs of a dynamic-shape program arrive at their upper bound; a static one must already match.
  (void)executorch::runtime::resize_tensor(output, query.sizes());
  ET_KERNEL_CHECK_MSG(ctx, output.size(0) == num_heads && output.size(1) == length && output.size(2) == head_dim,
                      InvalidArgument, , "%s: output must be [Hq=%zd, T=%zd, D=%zd]", kOp, ssize_t(num_heads),
                      ssize_t(length), ssize_t(head_dim));

  CachedAttentionProblem problem;
  problem.num_heads = num_heads;
  problem.num_kv_heads = num_kv_heads;
  problem.length = length;
  problem.head_dim = head_dim;
  problem.start = start;
  problem.scale = scale_or_default(*stack[4], head_dim);
  problem.query = query.const_data_ptr<float>();
  problem.k_cache = k_cache.const_data_ptr<float>();
  problem.v_cache = v_cache.const_data_ptr<float>();
  problem.output = output.mutable_data_ptr<float>();
  for (int d = 0; d < 3; ++d) {
    problem.query_strides[d] = query.strides()[d];
    problem.output_strides[d] = output.strides()[d];
  }
  for (int d = 0; d < 2; ++d) {
    problem.k_cache_strides[d] = k_cache.strides()[d];
    problem.v_cache_strides[d] = v_cache.strides()[d];
  }
  cached_attention(problem, executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::cached_attention.out", cached_attention_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 1});

}  // namespace
}  // namespace gdn
