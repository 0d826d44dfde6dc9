"""Run every implementation over the one case table (see gdn_export.ops.conformance)."""

import pytest
import torch

from gdn_export.ops.conformance import (
    CASES,
    FUSED_CASES,
    expected_fused_outputs,
    expected_outputs,
    make_fused_inputs,
    make_inputs,
    relative_error,
    run_case,
    run_fused_case,
)

from tests.conftest import UNSUPPORTED_PROPERTY

from .implementations import IMPLEMENTATIONS


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.name)
def test_case(impl, case, generator, request):
    inputs = make_inputs(case, generator, device=impl.device)
    reason = impl.unsupported(case)
    if reason is not None:
        # Unsupported is reported (see the summary) and must fail loudly, never silently.
        request.node.user_properties.append((UNSUPPORTED_PROPERTY, f"{impl.name}: {case.name}: {reason}"))
        with pytest.raises((NotImplementedError, ValueError, RuntimeError)):
            run_case(impl, case, inputs)
        return
    expected_output, expected_state = expected_outputs(case, inputs)
    untouched = [t.clone() for t in inputs.as_args()]
    output, final_state = run_case(impl, case, inputs)
    assert output.dtype == case.dtype and final_state.dtype == torch.float32
    output_error = relative_error(output, expected_output)
    state_error = relative_error(final_state, expected_state)
    assert output_error <= case.tolerance, f"output error {output_error:.3g}"
    assert state_error <= case.tolerance, f"final_state error {state_error:.3g}"
    for before, after in zip(untouched, inputs.as_args()):
        assert torch.equal(before, after), "an input was modified"


FUSED_IMPLEMENTATIONS = [impl for impl in IMPLEMENTATIONS if impl.fused is not None]


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("impl", FUSED_IMPLEMENTATIONS, ids=lambda impl: impl.name)
def test_fused_case(impl, case, generator, request):
    """gdn.fused_gated_delta_rule against the unfused reference after reference gating."""
    inputs = make_fused_inputs(case, generator, device=impl.device)
    reason = impl.unsupported(case)
    if reason is not None:
        request.node.user_properties.append((UNSUPPORTED_PROPERTY, f"{impl.name} (fused): {case.name}: {reason}"))
        with pytest.raises((NotImplementedError, ValueError, RuntimeError)):
            run_fused_case(impl, case, inputs)
        return
    expected_output, expected_state = expected_fused_outputs(case, inputs)
    output, final_state = run_fused_case(impl, case, inputs)
    assert output.dtype == case.dtype and final_state.dtype == torch.float32
    output_error = relative_error(output, expected_output)
    state_error = relative_error(final_state, expected_state)
    assert output_error <= case.tolerance, f"output error {output_error:.3g}"
    assert state_error <= case.tolerance, f"final_state error {state_error:.3g}"
