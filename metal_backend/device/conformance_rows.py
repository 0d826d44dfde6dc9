"""The Metal kernels' conformance rows on an NVIDIA GPU, through the CUDA port, against the fp64 reference.

    python -m metal_backend.device.conformance_rows [--selection all|sanitizer] [--seed S] [--timing]

Rows: every case of the conformance table (``CASES`` and ``FUSED_CASES``)
whose head dims the kernels cover, each other case once more with its head
dims raised to 64 (so the table's strided, split, in-place, extreme-gate, KDA
and bf16 variants run through the kernels), and the Qwen3.5 shapes (Hk=16,
Hv=32, Dk=Dv=128, decode and a 64-token prefill, in place) which the CPU
emulation leaves out for time; each at the table's tolerance. Cases of head
dims the kernels do not cover must be refused before writing. ``--selection
sanitizer`` is the short list that ``run_on_device.sh`` runs under
compute-sanitizer. Exit status 1 if any row fails.

``--timing`` prints microseconds per kernel at Qwen3.5's decode and prefill
shapes, with the state contiguous (the fast path) and stored transposed
(column stride Dk: the strided path); set ``GDN_CUDA_PORT_KERNEL`` to time
another revision of the .metal file the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from gdn_export.ops.conformance import (
    CASES,
    FUSED_CASES,
    OpCase,
    expected_fused_outputs,
    expected_outputs,
    make_fused_inputs,
    make_inputs,
    relative_error,
    run_case,
    run_fused_case,
)
from metal_backend.device import cuda_port
from metal_backend.mps_eager import SUPPORTED_HEAD_DIMS

QWEN = {"num_k_heads": 16, "num_v_heads": 32, "key_dim": 128, "value_dim": 128}


def covered(case: OpCase) -> bool:
    return case.key_dim in SUPPORTED_HEAD_DIMS and case.value_dim in SUPPORTED_HEAD_DIMS


def with_covered_dims(cases) -> tuple:
    """The covered cases, then each other one with its head dims raised to 64 (the smallest covered), once."""
    raised = (dataclasses.replace(c, key_dim=max(c.key_dim, 64), value_dim=max(c.value_dim, 64)) for c in cases)
    return tuple(dict.fromkeys([c for c in cases if covered(c)] + [c for c in raised]))


def selection(name: str) -> tuple[tuple, tuple, tuple]:
    """(plain cases, fused cases, cases that must be refused) of a selection."""
    if name == "all":
        return with_covered_dims(CASES), with_covered_dims(FUSED_CASES), tuple(c for c in CASES if not covered(c))
    qwen_decode = OpCase(length=1, call="out_inplace", **QWEN)
    plain = (
        qwen_decode,
        dataclasses.replace(qwen_decode, dtype=torch.bfloat16),
        dataclasses.replace(qwen_decode, length=64, call="inplace", split_at=32),
        OpCase(key_dim=128, value_dim=64, gate="per_channel", strided=True, length=1, call="out_inplace"),
        OpCase(key_dim=64, value_dim=64, use_qk_l2norm=False, scale=0.3, batch=3, length=5),
    )
    fused = (dataclasses.replace(qwen_decode, call="inplace"), OpCase(length=17, call="inplace", **QWEN))
    return plain, fused, ()


def _row(name: str, output_error: float, state_error: float, tolerance: float) -> bool:
    ok = output_error <= tolerance and state_error <= tolerance
    print(f"{'PASS' if ok else 'FAIL'}  {name:<70} output {output_error:9.2e}  state {state_error:9.2e}  "
          f"tol {tolerance:.0e}", flush=True)
    return ok


def run_rows(implementation, plain, fused, refused, seed: int) -> int:
    """Prints a row per case run by ``implementation``; returns the number of failed rows."""
    failed, device = 0, implementation.device
    for index, case in enumerate(plain):
        inputs = make_inputs(case, torch.Generator().manual_seed(seed + index), device=device)
        expected_output, expected_state = expected_outputs(case, inputs)
        output, state = run_case(implementation, case, inputs)
        failed += not _row(case.name, relative_error(output, expected_output), relative_error(state, expected_state),
                           case.tolerance)
    for index, case in enumerate(fused):
        inputs = make_fused_inputs(case, torch.Generator().manual_seed(seed + index), device=device)
        expected_output, expected_state = expected_fused_outputs(case, inputs)
        output, state = run_fused_case(implementation, case, inputs)
        failed += not _row(f"fused-{case.name}", relative_error(output, expected_output),
                           relative_error(state, expected_state), case.tolerance)
    for case in refused:
        inputs = make_inputs(case, torch.Generator().manual_seed(seed), device=device)
        output = torch.full_like(inputs.value, float("nan"))
        final_state = torch.full_like(inputs.initial_state, float("nan"))
        try:
            implementation.out(*inputs.as_args(), output=output, final_state=final_state)
            refused_ok = False
        except NotImplementedError as error:
            refused_ok = f"Dk={case.key_dim}, Dv={case.value_dim}" in str(error)
        refused_ok = refused_ok and bool(output.isnan().all()) and bool(final_state.isnan().all())
        print(f"{'PASS' if refused_ok else 'FAIL'}  {case.name:<70} refused (head dims not covered)", flush=True)
        failed += not refused_ok
    return failed


def transposed_storage(state: torch.Tensor) -> torch.Tensor:
    """The same values stored [B, Hv, Dv, Dk]: column stride Dk, the kernels' strided path."""
    return state.transpose(2, 3).contiguous().transpose(2, 3)


def print_timings(seed: int) -> None:
    print(f"kernel source: {cuda_port.kernel_source()}")
    for batch, length, dtype in ((1, 1, torch.float32), (8, 1, torch.float32), (32, 1, torch.float32),
                                 (1, 1, torch.bfloat16), (32, 1, torch.bfloat16), (1, 64, torch.float32)):
        case = OpCase(batch=batch, length=length, dtype=dtype, call="out_inplace", **QWEN)
        inputs = make_inputs(case, torch.Generator().manual_seed(seed), device="cuda")
        output = torch.empty_like(inputs.value)
        times = {}
        for layout, relayout in (("contiguous", torch.Tensor.contiguous), ("column-strided", transposed_storage)):
            state = relayout(inputs.initial_state.clone())
            times[layout] = cuda_port.time_gated_delta_rule(
                *inputs.as_args()[:5], state, use_qk_l2norm=True, output=output, final_state=state
            )
        print(f"time  B={batch:<3} T={length:<3} {str(dtype).removeprefix('torch.'):<9} state contiguous "
              f"{times['contiguous']:8.2f} us   column-strided {times['column-strided']:8.2f} us", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selection", choices=("all", "sanitizer"), default="all")
    parser.add_argument("--seed", type=int, default=None, help="base seed of the inputs (printed when drawn)")
    parser.add_argument("--timing", action="store_true")
    args = parser.parse_args(argv)
    seed = torch.seed() % (1 << 31) if args.seed is None else args.seed
    print(f"{torch.cuda.get_device_name()}; kernels {cuda_port.kernel_source().name}; inputs seed {seed}", flush=True)
    if args.timing:
        print_timings(seed)
        return 0
    plain, fused, refused = selection(args.selection)
    failed = run_rows(cuda_port.CUDA_PORT.implementation(), plain, fused, refused, seed)
    total = len(plain) + len(fused) + len(refused)
    print(f"conformance rows on {torch.cuda.get_device_name()}: {total - failed} passed, {failed} failed "
          f"({len(plain)} plain, {len(fused)} fused, {len(refused)} refused as uncovered; seed {seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
