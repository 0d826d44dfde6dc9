// ExecuTorch entries of gdn::cached_attention.out (see cached_attention.h) and gdn::gated_attention.out
// (gated_attention.h).
//
// The start position is read from input_pos inside the program, so every
// argument is checked here, the position against the cache size included: a
// bad call fails with an error instead of reading past a cache.
#include "executorch_entry.h"

#include "cached_attention.h"
#include "gated_attention.h"

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

// Whether tensor is float32 and dense (its strides those of its sizes); fails the call naming it if not.
bool dense_float(KernelRuntimeContext& ctx, const Tensor& tensor, const char* name, const char* op) {
  int64_t expected = 1;
  bool dense = true;
  for (int64_t d = tensor.dim() - 1; d >= 0; --d) {
    if (tensor.size(d) != 1 && tensor.strides()[d] != expected) dense = false;
    expected *= tensor.size(d);
  }
  if (tensor.numel() == 0) dense = true;  // no element to place (cos and sin when nothing is rotated)
  ET_KERNEL_CHECK_MSG(ctx, tensor.scalar_type() == ScalarType::Float && dense, InvalidArgument, false,
                      "%s: %s must be a dense float32 tensor", op, name);
  return true;
}

// gdn::gated_attention.out(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache, v_cache,
// eps, output): q_gate [1, T, H * 2D], key and value [1, T, Hkv * D], the weights [D], cos and sin [T, R], input_pos
// [1] int64, k_cache [Hkv, D, S], v_cache [Hkv, S, D] -> output [1, T, H * D]; the caches are written.
void gated_attention_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* op = "gdn.gated_attention.out";
  ET_KERNEL_CHECK_MSG(ctx, stack.size() >= 12, InvalidArgument, , "%s: expected 12 arguments, got %zu", op,
                      stack.size());
  for (size_t i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11}) {
    ET_KERNEL_CHECK_MSG(ctx, stack[i]->isTensor(), InvalidArgument, , "%s: argument %zu must be a Tensor", op, i);
  }
  ET_KERNEL_CHECK_MSG(ctx, stack[10]->isDouble(), InvalidArgument, , "%s: eps must be a float", op);
  const char* names[] = {"q_gate", "key", "value", "q_norm_weight", "k_norm_weight", "cos", "sin"};
  for (size_t i = 0; i < 7; ++i) {
    if (!dense_float(ctx, stack[i]->toTensor(), names[i], op)) return;
  }
  const Tensor& q_gate = stack[0]->toTensor();
  const Tensor& key = stack[1]->toTensor();
  const Tensor& value = stack[2]->toTensor();
  const Tensor& cos = stack[5]->toTensor();
  const Tensor& input_pos = stack[7]->toTensor();
  Tensor& k_cache = stack[8]->toTensor();
  Tensor& v_cache = stack[9]->toTensor();
  Tensor& output = stack[11]->toTensor();
  ET_KERNEL_CHECK_MSG(ctx, k_cache.scalar_type() == ScalarType::Float && v_cache.scalar_type() == ScalarType::Float &&
                               k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.strides()[2] == 1 &&
                               v_cache.strides()[2] == 1,
                      InvalidArgument, , "%s: k_cache [Hkv, D, S] and v_cache [Hkv, S, D] must be float32, with unit "
                      "stride along their last dim", op);
  const int64_t kv_heads = k_cache.size(0), dim = k_cache.size(1), max_len = k_cache.size(2);
  ET_KERNEL_CHECK_MSG(ctx, v_cache.size(0) == kv_heads && v_cache.size(1) == max_len && v_cache.size(2) == dim,
                      InvalidArgument, , "%s: v_cache must be [Hkv=%zd, S=%zd, D=%zd]", op, ssize_t(kv_heads),
                      ssize_t(max_len), ssize_t(dim));
  ET_KERNEL_CHECK_MSG(ctx, q_gate.dim() == 3 && q_gate.size(0) == 1 && dim > 0 && q_gate.size(2) % (2 * dim) == 0 &&
                               q_gate.size(2) > 0,
                      InvalidArgument, , "%s: q_gate must be [1, T, H * 2D] with D=%zd", op, ssize_t(dim));
  const int64_t length = q_gate.size(1), heads = q_gate.size(2) / (2 * dim);
  ET_KERNEL_CHECK_MSG(ctx, kv_heads > 0 && heads % kv_heads == 0, InvalidArgument, ,
                      "%s: q_gate's %zd heads must be a multiple of the caches' %zd", op, ssize_t(heads),
                      ssize_t(kv_heads));
  ET_KERNEL_CHECK_MSG(ctx, key.numel() == length * kv_heads * dim && value.numel() == length * kv_heads * dim,
                      InvalidArgument, , "%s: key and value must be [1, T=%zd, Hkv * D=%zd]", op, ssize_t(length),
                      ssize_t(kv_heads * dim));
  ET_KERNEL_CHECK_MSG(ctx, stack[3]->toTensor().numel() == dim && stack[4]->toTensor().numel() == dim,
                      InvalidArgument, , "%s: q_norm_weight and k_norm_weight must be [D=%zd]", op, ssize_t(dim));
  const int64_t rotary_dim = cos.dim() == 2 ? cos.size(1) : 0;
  ET_KERNEL_CHECK_MSG(ctx, cos.dim() == 2 && cos.size(0) == length && rotary_dim % 2 == 0 && rotary_dim >= 0 &&
                               rotary_dim <= dim && stack[6]->toTensor().numel() == cos.numel(),
                      InvalidArgument, , "%s: cos and sin must be [T=%zd, R], R even from 0 to D=%zd", op,
                      ssize_t(length), ssize_t(dim));
  ET_KERNEL_CHECK_MSG(ctx, input_pos.scalar_type() == ScalarType::Long && input_pos.numel() == 1, InvalidArgument, ,
                      "%s: input_pos must be an int64 tensor of shape [1]", op);
  const int64_t start = input_pos.const_data_ptr<int64_t>()[0];
  ET_KERNEL_CHECK_MSG(ctx, start >= 0 && start + length <= max_len, InvalidArgument, ,
                      "%s: input_pos %zd + T %zd must lie within the caches' %zd positions", op, ssize_t(start),
                      ssize_t(length), ssize_t(max_len));
  resize_output(output, q_gate, 2, heads * dim);
  ET_KERNEL_CHECK_MSG(ctx, output.scalar_type() == ScalarType::Float && output.numel() == length * heads * dim,
                      InvalidArgument, , "%s: output must be float32 [1, T=%zd, H * D=%zd]", op, ssize_t(length),
                      ssize_t(heads * dim));
  if (!dense_float(ctx, output, "output", op)) return;

  GatedAttentionProblem problem;
  problem.num_heads = heads;
  problem.num_kv_heads = kv_heads;
  problem.length = length;
  problem.head_dim = dim;
  problem.rotary_dim = rotary_dim;
  problem.start = start;
  problem.eps = static_cast<float>(stack[10]->toDouble());
  problem.q_gate = q_gate.const_data_ptr<float>();
  problem.key = key.const_data_ptr<float>();
  problem.value = value.const_data_ptr<float>();
  problem.q_norm_weight = stack[3]->toTensor().const_data_ptr<float>();
  problem.k_norm_weight = stack[4]->toTensor().const_data_ptr<float>();
  problem.cos = cos.const_data_ptr<float>();
  problem.sin = stack[6]->toTensor().const_data_ptr<float>();
  problem.k_cache = k_cache.mutable_data_ptr<float>();
  problem.v_cache = v_cache.mutable_data_ptr<float>();
  for (int d = 0; d < 2; ++d) {
    problem.k_cache_strides[d] = k_cache.strides()[d];
    problem.v_cache_strides[d] = v_cache.strides()[d];
  }
  problem.output = output.mutable_data_ptr<float>();
  gated_attention(problem, executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::cached_attention.out", cached_attention_out),
    executorch::runtime::Kernel("gdn::gated_attention.out", gated_attention_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 2});

}  // namespace
}  // namespace gdn
