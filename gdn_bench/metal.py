"""``gdn-bench metal``: the Metal kernels against the op's reference, on an Apple GPU.

Shapes are Qwen3.5's larger models (Hk = 16, Hv = 32, Dk = Dv = 128; fp32
state), built by the conformance table's input maker so speed and correctness
share one definition. For decode (T = 1) at each ``--batches`` and prefill
(B = 1) at each ``--lengths`` it times, with the MPS kernels that
``import metal_backend`` registers:

* ``metal`` / ``metal fused``: ``gdn.gated_delta_rule_inplace`` and
  ``gdn.fused_gated_delta_rule`` (one Metal dispatch each, state in place);
* ``reference``: the op's pure-PyTorch reference run by PyTorch's MPS ops
  (per-token below 16 tokens, chunked above).

Each row prints the median time per call, the bytes the call must move
(inputs, output, state read and written) and the bandwidth that implies.
Off macOS it prints why it cannot run and exits with status 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

NUM_K_HEADS, NUM_V_HEADS, HEAD_DIM = 16, 32, 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="1,8,32", help="decode batch sizes (comma-separated)")
    parser.add_argument("--lengths", default="128,512,2048", help="prefill lengths (comma-separated)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="activation dtype")
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per row (median reported)")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise SystemExit(f"gdn-bench metal: {flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise SystemExit(f"gdn-bench metal: {flag} must list positive integers, got {text!r}")
    return values


def bytes_per_call(case, fused: bool) -> int:
    """Bytes one call reads and writes: inputs, output, and the fp32 state read and written."""
    element = 2 if str(case.dtype).endswith(("bfloat16", "float16")) else 4
    tokens = case.batch * case.length
    state = case.batch * case.num_v_heads * case.key_dim * case.value_dim * 4 * 2
    output = tokens * case.num_v_heads * case.value_dim * element
    qkv = tokens * (2 * case.num_k_heads * case.key_dim + case.num_v_heads * case.value_dim) * element
    gates = tokens * case.num_v_heads * 2 * element  # g and beta, or a and b
    parameters = 2 * case.num_v_heads * 4 if fused else 0  # A_log, dt_bias
    return state + output + qkv + gates + parameters


def _median_seconds(call, iterations: int) -> float:
    import torch

    call()  # compiles the pipeline / warms the caches
    torch.mps.synchronize()
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        call()
        torch.mps.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args) -> int:
    import torch

    from gdn_export.backends import get_backend

    reason = get_backend("metal").unavailable_reason()
    if reason is not None:
        print(f"gdn-bench metal needs a Mac with an Apple-silicon GPU: {reason}", file=sys.stderr)
        return 2
    if args.iterations < 1:
        print("gdn-bench metal: --iterations must be positive", file=sys.stderr)
        return 2
    import metal_backend  # noqa: F401  (registers the MPS kernels of the gdn ops)
    from gdn_export.ops.conformance import OpCase, make_fused_inputs, make_inputs
    from gdn_export.ops.contract import reference_gated_delta_rule_out

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    shapes = [("decode", batch, 1) for batch in _int_list(args.batches, "--batches")]
    shapes += [("prefill", 1, length) for length in _int_list(args.lengths, "--lengths")]
    generator = torch.Generator().manual_seed(0)
    print(f"gdn-bench metal: Hk={NUM_K_HEADS} Hv={NUM_V_HEADS} Dk=Dv={HEAD_DIM}, {args.dtype} activations, fp32 state")
    print(f"{'shape':<18} {'implementation':<14} {'time/call':>12} {'bytes/call':>12} {'GB/s':>8}")
    for kind, batch, length in shapes:
        case = OpCase(
            batch=batch, length=length, num_k_heads=NUM_K_HEADS, num_v_heads=NUM_V_HEADS,
            key_dim=HEAD_DIM, value_dim=HEAD_DIM, dtype=dtype, call="inplace",
        )
        inputs = make_inputs(case, generator, device="mps")
        fused_inputs = make_fused_inputs(case, generator, device="mps")
        output = torch.empty_like(inputs.value)
        state = inputs.initial_state.clone()
        reference_state = inputs.initial_state.clone()
        kwargs = {"use_qk_l2norm": True}
        rows = {
            "metal": (
                lambda: torch.ops.gdn.gated_delta_rule_inplace.out(*inputs.as_args()[:5], state, **kwargs, output=output),
                False,
            ),
            "metal fused": (
                lambda: torch.ops.gdn.fused_gated_delta_rule.out(*fused_inputs.as_args(), output=output), True,
            ),
            "reference": (
                lambda: reference_gated_delta_rule_out(
                    *inputs.as_args()[:5], reference_state, **kwargs, output=output, final_state=reference_state
                ),
                False,
            ),
        }
        label = f"{kind} B={batch} T={length}"
        for name, (call, fused) in rows.items():
            seconds = _median_seconds(call, args.iterations)
            moved = bytes_per_call(case, fused)
            print(f"{label:<18} {name:<14} {seconds * 1e6:>10.1f}us {moved:>12,d} {moved / seconds / 1e9:>8.1f}")
    return 0
