// AOTInductor C shims of the gdn ops for ExecuTorch's Metal backend.
//
// AOTInductor calls a custom op through `aoti_torch_mps_<op name>` with the
// schema's arguments in order (Tensor -> handle, float? -> double*,
// bool -> int32_t) followed by one out-pointer per returned tensor. The
// declarations AOTInductor is given live in metal_backend/shims.py; a test
// parses both files and checks them against the op schemas.
//
// gdn::gated_delta_rule (functional) has no shim on purpose: its name would be
// aoti_torch_mps_gated_delta_rule, which ExecuTorch's Metal runtime already
// defines for its own metal::gated_delta_rule with another signature. Programs
// reach the Metal kernels through the two ops below, which are what the Metal
// rewrite of Qwen3.5 emits.
#pragma once

#include <executorch/backends/apple/metal/runtime/shims/types.h>

namespace gdn_metal {

using executorch::backends::metal::AOTITensorHandle;
using executorch::backends::metal::AOTITorchError;

extern "C" {

// gdn::gated_delta_rule_inplace(Tensor query, Tensor key, Tensor value, Tensor g,
//     Tensor beta, Tensor(a!) state, *, float? scale=None, bool use_qk_l2norm=False) -> Tensor
AOTITorchError aoti_torch_mps_gated_delta_rule_inplace(
    AOTITensorHandle query, AOTITensorHandle key, AOTITensorHandle value, AOTITensorHandle g,
    AOTITensorHandle beta, AOTITensorHandle state, double* scale, int32_t use_qk_l2norm,
    AOTITensorHandle* ret0);

// gdn::fused_gated_delta_rule(Tensor mixed_qkv, Tensor a, Tensor b, Tensor A_log,
//     Tensor dt_bias, Tensor(a!) state, *, float? scale=None) -> Tensor
AOTITorchError aoti_torch_mps_fused_gated_delta_rule(
    AOTITensorHandle mixed_qkv, AOTITensorHandle a, AOTITensorHandle b, AOTITensorHandle A_log,
    AOTITensorHandle dt_bias, AOTITensorHandle state, double* scale, AOTITensorHandle* ret0);

}  // extern "C"

}  // namespace gdn_metal
