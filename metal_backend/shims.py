"""The C shims of the gdn ops, as ExecuTorch's MetalBackend hands them to AOTInductor.

``C_SHIMS`` is the ``aot_inductor.custom_ops_to_c_shims`` entry: for each op
overload, the C declaration AOTInductor emits (``extern "C"``) and calls in
the generated wrapper. AOTInductor names the function ``aoti_torch_mps_<op
name>`` and passes the schema's arguments in order (Tensor -> AtenTensorHandle,
``float?`` -> ``double*``, ``bool`` -> ``int32_t``), then one
``AtenTensorHandle*`` per returned tensor; a mutated argument (the state) is
passed as its handle and updated in place. The definitions are
``runtime/c_shims.mm``; ``tests/test_metal_shims.py`` checks the two against
each other and against the schemas.

``gdn::gated_delta_rule`` (functional) is deliberately not here: its shim would
be ``aoti_torch_mps_gated_delta_rule``, a symbol ExecuTorch's Metal runtime
already defines for its own ``metal::gated_delta_rule``.
"""

from __future__ import annotations

import torch

import gdn_export.ops  # noqa: F401  (defines torch.ops.gdn)

C_SHIMS: dict = {
    torch.ops.gdn.gated_delta_rule_inplace.default: [
        "AOTITorchError aoti_torch_mps_gated_delta_rule_inplace("
        "AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, AtenTensorHandle g, "
        "AtenTensorHandle beta, AtenTensorHandle state, double* scale, int32_t use_qk_l2norm, "
        "AtenTensorHandle* ret0)"
    ],
    torch.ops.gdn.fused_gated_delta_rule.default: [
        "AOTITorchError aoti_torch_mps_fused_gated_delta_rule("
        "AtenTensorHandle mixed_qkv, AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle A_log, "
        "AtenTensorHandle dt_bias, AtenTensorHandle state, double* scale, AtenTensorHandle* ret0)"
    ],
}


def shim_function_name(op: torch._ops.OpOverload) -> str:
    """The name AOTInductor calls for ``op`` on MPS (it drops namespace and overload)."""
    return f"aoti_torch_mps_{op._schema.name.split('::')[-1]}"


def fallback_kernel_names() -> set[str]:
    """What ExecuTorch's AOTI backend must accept as supported fallbacks for these ops.

    Inductor reports a custom-op fallback both by its schema name and by its
    shim function name, depending on the code path; both must be listed.
    """
    names = set()
    for op in C_SHIMS:
        names.add(op._schema.name)
        names.add(shim_function_name(op))
    return names


def metal_ops() -> tuple:
    """The op overload packets that run on Metal through these shims."""
    return tuple(op.overloadpacket for op in C_SHIMS)
