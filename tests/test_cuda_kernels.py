"""cuda_backend's Triton kernels against the reference.

Without a GPU the kernels run under Triton's interpreter, in a child process
(tests/triton_interpreter.py). In that child, or on a machine with CUDA, the
real tests below run: a subset of the conformance table (decode and prefill,
GDA and KDA, Hv/Hk = 2, Dk != Dv, in-place state, bf16, strided inputs, the
fused op), error cases, and on CUDA the full-size cases.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdn_export.ops import reference
from gdn_export.ops.conformance import (
    OpCase,
    expected_fused_outputs,
    expected_outputs,
    make_fused_inputs,
    make_inputs,
    relative_error,
    run_case,
    run_fused_case,
)
from tests.triton_interpreter import DEVICE, INTERPRETED, ON_CUDA, rerun_module


if not (INTERPRETED or ON_CUDA):

    def test_kernels_under_triton_interpreter():
        rerun_module(__file__)

else:
    from tests.conformance.triton_implementations import triton_implementation

    IMPLEMENTATION = triton_implementation(DEVICE)
    base = OpCase(batch=2, num_k_heads=2, num_v_heads=4, key_dim=64, value_dim=128, call="out_inplace")
    KERNEL_CASES = [
        # decode (per-token kernel)
        dataclasses.replace(base, length=1),
        dataclasses.replace(base, length=1, gate="per_channel", call="inplace"),
        dataclasses.replace(base, length=1, key_dim=128, value_dim=64, dtype=torch.bfloat16),
        dataclasses.replace(base, length=5, gate="per_channel", strided=True, call="out", use_qk_l2norm=False),
        dataclasses.replace(base, length=3, num_k_heads=1, num_v_heads=1, key_dim=256, value_dim=64,
                            call="functional", scale=0.3),
        # prefill (chunked kernels): partial last chunk, both gate kinds, split calls, bf16
        dataclasses.replace(base, length=70, batch=1, call="functional"),
        dataclasses.replace(base, length=40, batch=1, gate="per_channel", call="inplace"),
        dataclasses.replace(base, length=70, batch=1, split_at=20, extreme="g_min"),
        dataclasses.replace(base, length=64, batch=1, key_dim=128, value_dim=64, dtype=torch.bfloat16,
                            strided=True, call="out"),
    ]

    def _check(case, output, final_state, expected_output, expected_state, seed):
        assert output.dtype == case.dtype and final_state.dtype == torch.float32
        output_error = relative_error(output, expected_output)
        state_error = relative_error(final_state, expected_state)
        assert output_error <= case.tolerance, f"output error {output_error:.3g} (seed {seed})"
        assert state_error <= case.tolerance, f"final_state error {state_error:.3g} (seed {seed})"

    @pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda case: case.name)
    def test_gated_delta_rule(case):
        seed = torch.seed()
        inputs = make_inputs(case, torch.Generator().manual_seed(seed), device=DEVICE)
        expected_output, expected_state = expected_outputs(case, inputs)
        untouched = [t.clone() for t in inputs.as_args()]
        output, final_state = run_case(IMPLEMENTATION, case, inputs)
        _check(case, output, final_state, expected_output, expected_state, seed)
        for before, after in zip(untouched, inputs.as_args()):
            assert torch.equal(before, after), "an input was modified"

    def test_in_place_state_is_the_callers_tensor():
        """final_state=initial_state: the kernel writes the caller's buffer itself (no copy)."""
        seed = torch.seed()
        case = dataclasses.replace(base, length=1)
        inputs = make_inputs(case, torch.Generator().manual_seed(seed), device=DEVICE)
        expected_output, expected_state = expected_outputs(case, inputs)
        state = inputs.initial_state
        pointer = state.data_ptr()
        output, final_state = IMPLEMENTATION.functional(
            *inputs.as_args()[:5], state, use_qk_l2norm=True, final_state=state
        )
        assert final_state is state and state.data_ptr() == pointer
        _check(case, output, state, expected_output, expected_state, seed)

    FUSED_KERNEL_CASES = [
        dataclasses.replace(base, length=1, call="inplace"),
        dataclasses.replace(base, length=1, call="inplace", dtype=torch.bfloat16, key_dim=128, value_dim=128),
        dataclasses.replace(base, length=40, batch=1, call="inplace", split_at=33),
    ]

    @pytest.mark.parametrize("case", FUSED_KERNEL_CASES, ids=lambda case: case.name)
    def test_fused_gated_delta_rule(case):
        """The fused op against the unfused reference after reference gating."""
        seed = torch.seed()
        inputs = make_fused_inputs(case, torch.Generator().manual_seed(seed), device=DEVICE)
        expected_output, expected_state = expected_fused_outputs(case, inputs)
        output, final_state = run_fused_case(IMPLEMENTATION, case, inputs)
        _check(case, output, final_state, expected_output, expected_state, seed)

    def test_unsupported_head_size_raises_before_writing():
        case = dataclasses.replace(base, key_dim=32, length=1)
        inputs = make_inputs(case, torch.Generator().manual_seed(torch.seed()), device=DEVICE)
        state = inputs.initial_state.clone()
        with pytest.raises(NotImplementedError, match="Dk=32"):
            IMPLEMENTATION.functional(*inputs.as_args()[:5], state, final_state=state)
        assert torch.equal(state, inputs.initial_state)

    def test_bad_shapes_raise_before_writing():
        inputs = make_inputs(dataclasses.replace(base, length=1), torch.Generator().manual_seed(torch.seed()), device=DEVICE)
        state = inputs.initial_state.clone()
        with pytest.raises(ValueError, match="beta"):
            IMPLEMENTATION.functional(*inputs.as_args()[:4], inputs.beta[:, :, :2], state, final_state=state)
        with pytest.raises(ValueError, match="output"):
            IMPLEMENTATION.functional(
                *inputs.as_args()[:5], state, output=inputs.value[:, :, :2].clone(), final_state=state
            )
        assert torch.equal(state, inputs.initial_state)

    if ON_CUDA:
        # Full size on the GPU: Qwen3.5's larger models (Hk = 16, Hv = 32, Dk = Dv = 128).
        qwen = OpCase(num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, call="out_inplace")
        FULL_SIZE_CASES = [
            dataclasses.replace(qwen, batch=batch, length=1, dtype=dtype)
            for batch in (1, 8, 32, 128) for dtype in (torch.float32, torch.bfloat16)
        ] + [
            dataclasses.replace(qwen, batch=1, length=length, dtype=dtype)
            for length in (128, 512, 2048, 8192) for dtype in (torch.float32, torch.bfloat16)
        ] + [dataclasses.replace(qwen, batch=4, length=1000, gate="per_channel")]

        @pytest.mark.parametrize("case", FULL_SIZE_CASES, ids=lambda case: case.name)
        def test_full_size_on_cuda(case):
            seed = torch.seed()
            inputs = make_inputs(case, torch.Generator().manual_seed(seed), device="cuda")
            # fp64 chunked reference on the GPU (the per-token form would take minutes at T = 8192).
            args = [t.to(torch.float64) for t in inputs.as_args()]
            expected_output, expected_state = reference.chunked_gated_delta_rule(*args, use_qk_l2norm=True)
            output = torch.full_like(inputs.value, float("nan"))
            state = inputs.initial_state.clone()
            torch.ops.gdn.gated_delta_rule.out(
                *inputs.as_args()[:5], state, use_qk_l2norm=True, output=output, final_state=state
            )
            _check(case, output, state, expected_output, expected_state, seed)
