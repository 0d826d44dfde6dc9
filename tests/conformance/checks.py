"""The checks of a gated delta rule result that the conformance driver and kernel-specific tests share."""

import torch

from gdn_export.ops.conformance import OpCase, relative_error


def assert_within_tolerance(case: OpCase, output, final_state, expected_output, expected_state) -> None:
    """Dtypes as the contract says, and both results within ``case.tolerance`` of the fp64 expectation."""
    assert output.dtype == case.dtype and final_state.dtype == torch.float32
    output_error = relative_error(output, expected_output)
    state_error = relative_error(final_state, expected_state)
    assert output_error <= case.tolerance, f"output error {output_error:.3g}"
    assert state_error <= case.tolerance, f"final_state error {state_error:.3g}"
