// ExecuTorch entry of gdn::planes_embedding.out and gdn::planes_logits.out (see vocabulary_planes.h).
//
// Every argument is checked here, every token against the table's rows, so a bad call fails with an
// error instead of reading past the table.
#include "executorch_entry.h"

#include "vocabulary_planes.h"

namespace gdn {
namespace {

// high [rows, width / 2] uint8, low (when given) the same, row_units [rows] bfloat16,
// group_units [rows, width / group] uint8.
bool read_table(KernelRuntimeContext& ctx, const char* op, const Tensor& high, const Tensor* low,
                const Tensor& row_units, const Tensor& group_units, VocabularyPlanes& table) {
  ET_KERNEL_CHECK_MSG(ctx, high.scalar_type() == ScalarType::Byte && high.dim() == 2, InvalidArgument, false,
                      "%s: high must be a 2-d uint8 tensor [rows, width / 2]", op);
  const int64_t rows = high.size(0), width = 2 * high.size(1);
  ET_KERNEL_CHECK_MSG(ctx, row_units.scalar_type() == ScalarType::BFloat16 && row_units.dim() == 1 &&
                               row_units.size(0) == rows, InvalidArgument, false,
                      "%s: row_units must be a bfloat16 tensor [%zd]", op, ssize_t(rows));
  ET_KERNEL_CHECK_MSG(ctx, group_units.scalar_type() == ScalarType::Byte && group_units.dim() == 2, InvalidArgument,
                      false, "%s: group_units must be a 2-d uint8 tensor [rows, width / group]", op);
  const int64_t groups = group_units.size(1);
  ET_KERNEL_CHECK_MSG(ctx, width % 64 == 0 && group_units.size(0) == rows && groups > 0 && width % groups == 0 &&
                               (width / groups) % 32 == 0, InvalidArgument, false,
                      "%s: width %zd must be a multiple of 64 and group_units [%zd, groups] with groups of a "
                      "multiple of 32 weights, got group_units [%zd, %zd]", op, ssize_t(width), ssize_t(rows),
                      ssize_t(group_units.size(0)), ssize_t(groups));
  if (low != nullptr) {
    ET_KERNEL_CHECK_MSG(ctx, low->scalar_type() == ScalarType::Byte && low->dim() == 2 && low->size(0) == rows &&
                                 low->size(1) == high.size(1), InvalidArgument, false,
                        "%s: low must be uint8 [%zd, %zd] like high", op, ssize_t(rows), ssize_t(high.size(1)));
    table.low = low->const_data_ptr<uint8_t>();
  }
  table.high = high.const_data_ptr<uint8_t>();
  table.row_units = reinterpret_cast<const uint16_t*>(row_units.const_data_ptr<executorch::aten::BFloat16>());
  table.group_units = group_units.const_data_ptr<uint8_t>();
  table.rows = rows;
  table.width = width;
  table.group = width / groups;
  return true;
}

// gdn::planes_embedding.out(tokens, high, low, row_units, group_units, out): out [*tokens.shape, width] float32
void planes_embedding_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.planes_embedding.out";
  if (!tensor_arguments(ctx, stack, 6, kOp)) return;
  const Tensor& tokens = stack[0]->toTensor();
  Tensor& output = stack[5]->toTensor();
  VocabularyPlanes table;
  if (!read_table(ctx, kOp, stack[1]->toTensor(), &stack[2]->toTensor(), stack[3]->toTensor(), stack[4]->toTensor(),
                  table)) {
    return;
  }
  ET_KERNEL_CHECK_MSG(ctx, tokens.scalar_type() == ScalarType::Long && tokens.dim() < 8, InvalidArgument, ,
                      "%s: tokens must be an int64 tensor", kOp);
  ET_KERNEL_CHECK_MSG(ctx, output.scalar_type() == ScalarType::Float, InvalidArgument, , "%s: out must be float32",
                      kOp);
  resize_output(output, tokens, tokens.dim(), table.width);
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == tokens.numel() * table.width, InvalidArgument, ,
                      "%s: out must hold %zd values per token", kOp, ssize_t(table.width));
  const int64_t* ids = tokens.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens.numel(); ++t) {
    ET_KERNEL_CHECK_MSG(ctx, ids[t] >= 0 && ids[t] < table.rows, InvalidArgument, ,
                        "%s: token %zd at index %zd is outside the table's %zd rows", kOp, ssize_t(ids[t]),
                        ssize_t(t), ssize_t(table.rows));
  }
  planes_embedding(table, ids, tokens.numel(), output.mutable_data_ptr<float>(), executorch_parallel_for);
}

// gdn::planes_logits.out(x, high, row_units, group_units, fifth, out): x [..., width] float32 -> out [..., rows]
// float32; fifth None (a 4-bit head) or [rows, width / 8] uint8 (a 5-bit one). Programs exported before the
// op took `fifth` call it without (their stack: the four inputs, out, the returned out), as a 4-bit head.
void planes_logits_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  constexpr const char* kOp = "gdn.planes_logits.out";
  if (!tensor_arguments(ctx, stack, 4, kOp)) return;
  const bool takes_fifth = stack.size() >= 7;
  const size_t out_at = takes_fifth ? 5 : 4;
  ET_KERNEL_CHECK_MSG(ctx, stack.size() > out_at && stack[out_at]->isTensor() &&
                               (!takes_fifth || stack[4]->isNone() || stack[4]->isTensor()),
                      InvalidArgument, , "%s: expected x, high, row_units, group_units, fifth (None or a Tensor) "
                      "and out", kOp);
  const Tensor& x = stack[0]->toTensor();
  Tensor& output = stack[out_at]->toTensor();
  VocabularyPlanes table;
  if (!read_table(ctx, kOp, stack[1]->toTensor(), nullptr, stack[2]->toTensor(), stack[3]->toTensor(), table)) return;
  if (takes_fifth && stack[4]->isTensor()) {
    const Tensor& fifth = stack[4]->toTensor();
    ET_KERNEL_CHECK_MSG(ctx, fifth.scalar_type() == ScalarType::Byte && fifth.dim() == 2 &&
                                 fifth.size(0) == table.rows && fifth.size(1) == table.width / 8,
                        InvalidArgument, , "%s: fifth must be None or uint8 [%zd, %zd]", kOp, ssize_t(table.rows),
                        ssize_t(table.width / 8));
    table.fifth = fifth.const_data_ptr<uint8_t>();
  }
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && output.scalar_type() == ScalarType::Float &&
                               x.dim() >= 1 && x.dim() <= 8 && x.size(x.dim() - 1) == table.width,
                      InvalidArgument, , "%s: x must be float32 [..., %zd] and out float32", kOp,
                      ssize_t(table.width));
  resize_output(output, x, x.dim() - 1, table.rows);
  const int64_t count = x.numel() / table.width;
  ET_KERNEL_CHECK_MSG(ctx, output.numel() == count * table.rows, InvalidArgument, ,
                      "%s: out must hold %zd logits per row of x", kOp, ssize_t(table.rows));
  planes_logits(table, x.const_data_ptr<float>(), count, output.mutable_data_ptr<float>(), executorch_parallel_for);
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("gdn::planes_embedding.out", planes_embedding_out),
    executorch::runtime::Kernel("gdn::planes_logits.out", planes_logits_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, 2});

}  // namespace
}  // namespace gdn
