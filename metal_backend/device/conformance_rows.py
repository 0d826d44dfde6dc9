"""The Metal kernels' conformance rows on an NVIDIA GPU, through the CUDA port, against the fp64 reference.

    python -m metal_backend.device.conformance_rows [--selection all|sanitizer] [--seed S] [--timing]

Rows: every case of the conformance table (``CASES`` and ``FUSED_CASES``) and
each one again with its head dims raised to 64 (so the table's strided, split,
in-place, extreme-gate, KDA and bf16 variants run through the kernels), as
``metal_backend.conformance.table_cases`` selects them for the emulation, plus
the Qwen3.5 shapes (Hk=16, Hv=32, Dk=Dv=128, decode and a 64-token prefill, in
place) which the CPU emulation leaves out for time. Each row is the table's
one check (``gdn_export.ops.conformance.check_case``): within the case's
tolerance, or, for head dims the kernels do not cover, refused before writing.
``--selection sanitizer`` is the short list that ``run_on_device.sh`` runs
under compute-sanitizer. Exit status 1 if any row fails.

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

from gdn_export.ops.conformance import CASES, FUSED_CASES, ConformanceError, OpCase, check_case, make_inputs
from metal_backend.conformance import table_cases
from metal_backend.device import cuda_port

QWEN = {"num_k_heads": 16, "num_v_heads": 32, "key_dim": 128, "value_dim": 128}


def selection(name: str) -> list[tuple[OpCase, bool]]:
    """The rows of a selection: (case, whether it is a case of the fused op)."""
    if name == "all":
        return [(case, False) for case in table_cases(CASES)] + [(case, True) for case in table_cases(FUSED_CASES)]
    qwen_decode = OpCase(length=1, call="out_inplace", **QWEN)
    plain = (
        qwen_decode,
        dataclasses.replace(qwen_decode, dtype=torch.bfloat16),
        dataclasses.replace(qwen_decode, length=64, call="inplace", split_at=32),
        OpCase(key_dim=128, value_dim=64, gate="per_channel", strided=True, length=1, call="out_inplace"),
        OpCase(key_dim=64, value_dim=64, use_qk_l2norm=False, scale=0.3, batch=3, length=5),
    )
    fused = (dataclasses.replace(qwen_decode, call="inplace"), OpCase(length=17, call="inplace", **QWEN))
    return [(case, False) for case in plain] + [(case, True) for case in fused]


def run_rows(implementation, rows: list[tuple[OpCase, bool]], seed: int) -> tuple[int, int]:
    """Prints a line per row run by ``implementation``; returns (failed rows, refused rows)."""
    failed = refused = 0
    for index, (case, fused) in enumerate(rows):
        name = f"{'fused-' if fused else ''}{case.name}"
        try:
            outcome = check_case(implementation, case, torch.Generator().manual_seed(seed + index), fused=fused)
        except ConformanceError as error:
            print(f"FAIL  {name:<70} {error}", flush=True)
            failed += 1
            continue
        refused += outcome.refused is not None
        print(f"PASS  {name:<70} {outcome}  tol {case.tolerance:.0e}", flush=True)
    return failed, refused


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
    rows = selection(args.selection)
    failed, refused = run_rows(cuda_port.CUDA_PORT.implementation(), rows, seed)
    fused = sum(is_fused for _, is_fused in rows)
    print(f"conformance rows on {torch.cuda.get_device_name()}: {len(rows) - failed} passed, {failed} failed "
          f"({len(rows) - fused} plain, {fused} fused, {refused} refused as uncovered; seed {seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
