"""The Metal kernels, run on the CPU by the lockstep emulator: what the conformance table does not cover.

The table's rows of the emulated kernels run in tests/conformance
(``metal-emulation``; ``make metal-check`` runs them with this file). Here:
refused head dims raise NotImplementedError naming them before anything is
written (the MPS eager op then falls back to the reference), and bad shapes
and dtypes raise clear errors.
"""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops.conformance import OpCase, make_fused_inputs, make_inputs
from metal_backend import emulation

REFUSED_HEAD_DIMS = [OpCase(key_dim=32, value_dim=32), OpCase(key_dim=64, value_dim=96, length=1),
                     OpCase(key_dim=16, value_dim=128, gate="per_channel")]


@pytest.mark.parametrize("case", REFUSED_HEAD_DIMS, ids=lambda case: case.name)
def test_unsupported_head_dims_raise_before_writing(case, generator):
    inputs = make_inputs(case, generator)
    output = torch.full(inputs.value.shape, float("nan"), dtype=case.dtype)
    final_state = torch.full(inputs.initial_state.shape, float("nan"))
    with pytest.raises(NotImplementedError, match=rf"Dk={case.key_dim}, Dv={case.value_dim}"):
        emulation.gated_delta_rule_out(
            *inputs.as_args(), scale=case.scale, use_qk_l2norm=case.use_qk_l2norm,
            output=output, final_state=final_state,
        )
    assert output.isnan().all() and final_state.isnan().all()


@pytest.mark.parametrize("case", REFUSED_HEAD_DIMS[:2], ids=lambda case: case.name)
def test_unsupported_fused_head_dims_raise_before_writing(case, generator):
    inputs = make_fused_inputs(case, generator)
    state_before = inputs.state.clone()
    output = torch.full((case.batch, case.length, case.num_v_heads, case.value_dim), float("nan"), dtype=case.dtype)
    with pytest.raises(NotImplementedError, match=rf"Dk={case.key_dim}, Dv={case.value_dim}"):
        emulation.fused_gated_delta_rule_out(*inputs.as_args(), scale=case.scale, output=output)
    assert output.isnan().all() and torch.equal(inputs.state, state_before)


def test_bad_shapes_and_dtypes_raise_clear_errors(generator):
    case = OpCase(key_dim=64, value_dim=64)
    inputs = make_inputs(case, generator)
    output = torch.full(inputs.value.shape, float("nan"))
    state = inputs.initial_state.clone()
    with pytest.raises(ValueError, match=r"beta must have shape \[1, 17, 4\]"):
        emulation.gated_delta_rule_out(
            inputs.query, inputs.key, inputs.value, inputs.g, inputs.beta[:, :, :2], state,
            output=output, final_state=state,
        )
    with pytest.raises(ValueError, match="initial_state must be float32"):
        emulation.gated_delta_rule_out(
            *inputs.as_args()[:5], inputs.initial_state.double(), output=output, final_state=state,
        )
    with pytest.raises(NotImplementedError, match="query must be float32, bfloat16 or float16"):
        emulation.gated_delta_rule_out(
            *(t.double() for t in inputs.as_args()[:5]), state, output=output.double(), final_state=state,
        )
    assert output.isnan().all()
