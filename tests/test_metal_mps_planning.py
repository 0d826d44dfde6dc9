"""The eager MPS path, as far as Linux can run it.

``metal_backend.mps_eager`` plans its ``torch.mps.compile_shader`` launches in
Python; these must be exactly what ``runtime/launch.h`` (the ExecuTorch
runtime's planner, run by the emulation tests) plans: same kernel name, grid
and parameter bytes. Calls the kernels do not cover must fall back to the
reference, visibly. The MPS dispatch itself needs Apple hardware.
"""

from __future__ import annotations

import re

import pytest
import torch

from gdn_export.ops.conformance import (
    OpCase,
    expected_outputs,
    make_fused_inputs,
    make_inputs,
    relative_error,
)
from metal_backend import conformance, emulation, mps_eager

PLAN_CASES = [
    OpCase(key_dim=64, value_dim=128),
    OpCase(key_dim=128, value_dim=64, gate="per_channel", strided=True, scale=0.3),
    OpCase(key_dim=256, value_dim=256, dtype=torch.bfloat16, use_qk_l2norm=False, batch=3),
    OpCase(key_dim=128, value_dim=128, dtype=torch.float16, num_k_heads=16, num_v_heads=32, length=1),
]


def _params_size(struct_name: str) -> int:
    return 4 * sum(count for _, _, count in mps_eager.struct_fields(struct_name))


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda case: case.name)
def test_python_plan_equals_the_runtime_plan(case, generator):
    inputs = make_inputs(case, generator)
    output = torch.empty(inputs.value.shape, dtype=case.dtype)
    final_state = torch.empty(inputs.initial_state.shape)
    args = (*inputs.as_args(), output, final_state)
    python = mps_eager.plan_gated_delta_rule(*args, case.scale, case.use_qk_l2norm)
    runtime = emulation.plan_gated_delta_rule(
        *args, scale=case.scale, use_qk_l2norm=case.use_qk_l2norm,
        params_size=_params_size("GatedDeltaRuleParams"),
    )
    assert (python.kernel_name, python.threadgroups, python.threads_per_threadgroup, python.params) == runtime


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", PLAN_CASES[:2] + PLAN_CASES[3:], ids=lambda case: case.name)
def test_python_fused_plan_equals_the_runtime_plan(case, param_dtype, generator):
    inputs = make_fused_inputs(case, generator)
    A_log, dt_bias = inputs.A_log.to(param_dtype), inputs.dt_bias.to(param_dtype)
    output = torch.empty(case.batch, case.length, case.num_v_heads, case.value_dim, dtype=case.dtype)
    args = (inputs.mixed_qkv, inputs.a, inputs.b, A_log, dt_bias, inputs.state, output)
    python = mps_eager.plan_fused_gated_delta_rule(*args, case.scale)
    runtime = emulation.plan_fused_gated_delta_rule(
        *args, scale=case.scale, params_size=_params_size("FusedGatedDeltaRuleParams")
    )
    assert (python.kernel_name, python.threadgroups, python.threads_per_threadgroup, python.params) == runtime


def test_compile_shader_source_is_self_contained():
    source = mps_eager.kernel_source()
    assert re.findall(r"#include\s*[<\"]([^>\"]+)", source) == ["metal_stdlib"]
    assert "struct GatedDeltaRuleParams" in source and "struct FusedGatedDeltaRuleParams" in source


def test_unsupported_call_falls_back_to_the_reference_with_a_warning(seed):
    """32-dim heads: no Metal kernel; the reference result comes back, with a warning naming why."""
    case = OpCase(call="out")
    inputs = make_inputs(case, torch.Generator().manual_seed(seed))
    output = torch.full(inputs.value.shape, float("nan"))
    final_state = torch.full(inputs.initial_state.shape, float("nan"))
    with pytest.warns(UserWarning, match=r"Dk=32, Dv=32.*reference"):
        mps_eager.gated_delta_rule_out(
            *inputs.as_args(), use_qk_l2norm=case.use_qk_l2norm, output=output, final_state=final_state
        )
    expected_output, expected_state = expected_outputs(case, inputs)
    assert relative_error(output, expected_output) <= case.tolerance, f"seed {seed}"
    assert relative_error(final_state, expected_state) <= case.tolerance, f"seed {seed}"


def test_unsupported_reasons():
    tensor = torch.zeros(1)
    assert mps_eager.unsupported_reason(128, 128, tensor, tensor) is None
    assert "Dk=96" in mps_eager.unsupported_reason(96, 128, tensor)
    assert "dtype" in mps_eager.unsupported_reason(128, 128, tensor, tensor.bfloat16())
    assert "dtype" in mps_eager.unsupported_reason(128, 128, tensor.double())


def test_register_is_a_no_op_without_mps():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS: registration is exercised by gdn-bench metal")
    assert mps_eager.register() is False
    assert mps_eager._registered_library is None
    assert [impl.name for impl in conformance.IMPLEMENTATIONS] == ["metal-emulation"]


def test_params_struct_layout():
    fields = mps_eager.struct_fields("GatedDeltaRuleParams")
    assert fields[0] == ("int", "batch", 1) and ("float", "scale", 1) in fields
    packed = mps_eager.pack_params(
        "GatedDeltaRuleParams", {name: [7] * count if count > 1 else 7 for _, name, count in fields}
    )
    assert len(packed) == _params_size("GatedDeltaRuleParams")
    with pytest.raises(ValueError, match="query_strides: 4 values expected"):
        mps_eager.pack_params(
            "GatedDeltaRuleParams",
            {name: [7] * (count - (name == "query_strides")) if count > 1 else 7 for _, name, count in fields},
        )
