"""Every launch shape of the chunked kernels in ``cuda_backend.LAUNCH_SHAPE_SWEEPS`` (what
``gdn-bench cuda --chunked-sweep`` times), checked against the fp64 reference first (a variant
that is fast but wrong is no variant).

    python -m cuda_backend.device.chunked_variants     (on a CUDA machine)
"""

from __future__ import annotations

import dataclasses
import sys

import torch


def main() -> int:
    import cuda_backend
    from gdn_export.ops import reference
    from gdn_export.ops.conformance import OpCase, make_inputs, relative_error

    qwen = OpCase(batch=1, num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, dtype=torch.bfloat16)
    cases = [
        dataclasses.replace(qwen, length=2048),
        dataclasses.replace(qwen, length=130, num_k_heads=2, num_v_heads=4, value_dim=64, strided=True),
        dataclasses.replace(qwen, length=100, num_k_heads=2, num_v_heads=4, key_dim=256, value_dim=64),
        dataclasses.replace(qwen, length=100, num_k_heads=2, num_v_heads=4, gate="per_channel"),
        # one chunk exactly, state out of place (a separate final_state)
        dataclasses.replace(qwen, length=64, num_k_heads=2, num_v_heads=4, value_dim=64, strided=True),
    ]
    failed = 0
    for case in cases:
        inputs = make_inputs(case, torch.Generator().manual_seed(1), device="cuda")
        args = [t.to(torch.float64) for t in inputs.as_args()]
        expected_output, expected_state = reference.chunked_gated_delta_rule(*args, use_qk_l2norm=True)
        for launch_shape in ({},) + cuda_backend.LAUNCH_SHAPE_SWEEPS["chunked"]:
            query, key, value, g, beta, initial_state = inputs.as_args()
            in_place = case.length != 64
            state = initial_state.clone() if in_place else torch.full_like(initial_state, float("nan"))
            output = torch.full_like(value, float("nan"))
            try:
                cuda_backend.launch_kernel("chunked", query, key, value, g, beta, state if in_place else initial_state,
                                           state, output, use_qk_l2norm=True, launch_shape=launch_shape)
                torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001  (a launch shape that does not fit is reported)
                print(f"{case.name} {launch_shape}: ERROR {type(error).__name__}: {str(error)[:200]}", flush=True)
                failed += 1
                if isinstance(error, torch.AcceleratorError):
                    return 1  # a CUDA error poisons the context: nothing after it can be trusted
                continue
            errors = relative_error(output, expected_output), relative_error(state, expected_state)
            bad = max(errors) > case.tolerance
            failed += bad
            print(f"{case.name} {launch_shape}: output {errors[0]:.2e} state {errors[1]:.2e}{'  FAIL' if bad else ''}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
