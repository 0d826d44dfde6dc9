"""``gdn-bench cuda``'s columns compute the op they are timed as.

The decode floors of the CUDA issue compare ours with ExecuTorch's kernel
launched the way the bench launches it, so each of those calls (and our
prefill column, and a launch shape of each sweep) is checked here against the
fp64 reference, from fresh random inputs the bench's own input builders make
at its head shapes.
Without a GPU this runs under Triton's interpreter in a child process
(tests/triton_interpreter.py); ExecuTorch's autotuner cannot time configs
there, so it is held to its first config.
"""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops import reference
from gdn_export.ops.conformance import OpCase, relative_error
from gdn_export.ops.fused import gating
from tests.triton_interpreter import DEVICE, INTERPRETED, ON_CUDA, rerun_module


def bound(actual: torch.Tensor) -> float:
    """Bound on max|actual - expected| / max|expected|.

    A bf16 output may be one bf16 step (2^-7) off: Triton's interpreter truncates
    to bf16 where a GPU rounds. fp32 results get the conformance table's fp32 bound
    (the inputs are exact and the reference computes the gates in fp64 too).
    """
    return 1.05 * 2.0 ** -7 if actual.dtype == torch.bfloat16 else 1e-5


BF16_CALLER_BOUND = OpCase(dtype=torch.bfloat16).tolerance


if not (INTERPRETED or ON_CUDA):

    def test_bench_columns_under_triton_interpreter():
        rerun_module(__file__)

else:
    from gdn_bench import cuda as bench

    @pytest.fixture(scope="module")
    def implementations():
        if INTERPRETED:
            kernel = bench._executorch_decode_module()._fused_deltanet_decode_kernel
            kernel.configs = kernel.configs[:1]
        return bench._decode_implementations(sweep=False)

    @pytest.fixture
    def inputs(seed):
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        return bench._decode_inputs(2, generator, device=DEVICE)

    def expected(x, from_raw_gates=True, all_tokens=False):
        # The fused kernels compute the gates from the raw a/b in fp32, so the reference does so
        # in fp64; the unfused op is handed x["g"]/x["beta"] (beta rounded to bf16) and gets those.
        query, key, value = (x[name].double() for name in ("query", "key", "value"))
        if from_raw_gates:
            g, beta = gating(*(x[name].double() for name in ("a", "b", "A_log", "dt_bias")))
        else:
            g, beta = x["g"].double(), x["beta"].double()
        output, state = reference.recurrent_gated_delta_rule(
            query, key, value, g, beta, x["state"].double(),
            scale=bench.HEAD_DIM ** -0.5, use_qk_l2norm=True,
        )
        return (output if all_tokens else output[:, 0]), state

    def test_ours_fused_updates_the_state_in_place(implementations, inputs):
        expected_output, expected_state = expected(inputs)
        output = implementations[bench.OURS_DECODE](inputs)()
        assert relative_error(output[:, 0].double(), expected_output) <= bound(output)
        assert relative_error(inputs["state"].double(), expected_state) <= bound(inputs["state"])

    def test_ours_unfused_writes_output_and_state_in_place(implementations, inputs):
        expected_output, expected_state = expected(inputs, from_raw_gates=False)
        call = implementations[bench.OURS_DECODE_UNFUSED](inputs)
        inputs["output"].fill_(float("nan"))
        call()
        assert relative_error(inputs["output"][:, 0].double(), expected_output) <= bound(inputs["output"])
        assert relative_error(inputs["state"].double(), expected_state) <= bound(inputs["state"])

    def test_executorch_rotated_writes_the_new_state_to_the_sets_buffer(implementations, inputs):
        expected_output, expected_state = expected(inputs)
        state_before = inputs["state"].clone()
        call = implementations[bench.EXECUTORCH_DECODE](inputs)
        inputs["executorch_state"].fill_(float("nan"))
        inputs["executorch_output"].fill_(float("nan"))
        call()
        assert relative_error(inputs["executorch_output"].double(), expected_output) <= bound(inputs["executorch_output"])
        assert relative_error(inputs["executorch_state"].double(), expected_state) <= bound(inputs["executorch_state"])
        assert torch.equal(inputs["state"], state_before), "the anchor must read the state, not update it"

    def test_executorch_with_copy_back_leaves_the_new_state_in_the_state_buffer(implementations, inputs):
        expected_output, expected_state = expected(inputs)
        output = implementations[bench.EXECUTORCH_DECODE_AS_RUN](inputs)()
        assert relative_error(output.double(), expected_output) <= bound(output)
        assert relative_error(inputs["state"].double(), expected_state) <= bound(inputs["state"])

    def test_ours_fused_chunked_updates_the_state_in_place(seed):
        x = bench._prefill_inputs(20, torch.Generator(device=DEVICE).manual_seed(seed), device=DEVICE)
        expected_output, expected_state = expected(x, all_tokens=True)
        output = bench._prefill_implementations()[bench.OURS_PREFILL](x)()
        # For bf16 callers the chunked kernels keep their chunk tensors in bf16 and multiply at
        # bf16 rate: the conformance table's bf16 bound, for output and state alike.
        assert relative_error(output.double(), expected_output) <= BF16_CALLER_BOUND
        assert relative_error(x["state"].double(), expected_state) <= BF16_CALLER_BOUND

    def test_decode_sweep_column_updates_the_state_in_place(inputs):
        # A launch shape other than the launcher's own (16 columns, 1 warp at this B), through cuda_backend.launch_kernel.
        expected_output, expected_state = expected(inputs)
        inputs["output"].fill_(float("nan"))
        bench._decode_implementations(sweep=True)["ours: fused decode BV=32 warps=2"](inputs)()
        assert relative_error(inputs["output"][:, 0].double(), expected_output) <= bound(inputs["output"])
        assert relative_error(inputs["state"].double(), expected_state) <= bound(inputs["state"])

    def test_chunked_sweep_column_writes_output_and_state_in_place(seed):
        # The separate output kernel, which the chunked launcher's own shape leaves out.
        x = bench._prefill_inputs(20, torch.Generator(device=DEVICE).manual_seed(seed), device=DEVICE)
        expected_output, expected_state = expected(x, from_raw_gates=False, all_tokens=True)
        x["output"].fill_(float("nan"))
        bench._prefill_implementations(sweep=True)["ours: chunked fused_output=False"](x)()
        assert relative_error(x["output"].double(), expected_output) <= BF16_CALLER_BOUND
        assert relative_error(x["state"].double(), expected_state) <= BF16_CALLER_BOUND
