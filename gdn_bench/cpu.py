"""``gdn-bench cpu``: the C++ kernel against ExecuTorch 1.5.1's ``llama::gated_delta_rule``.

Both run eagerly through their ATen entries on the same inputs, microseconds
per token, next to the memory floor measured in the same run (copying a
state-sized buffer: decode reads and writes the whole state once per token).
Every call gets the next of a ring of states larger than the last-level cache,
as a model's layers do, so decode is timed from memory rather than from cache.
ExecuTorch's op wants [B, H, T, D] inputs with one head per state, exponentiated
gates and normalized, scaled queries: that conversion happens once, outside the
timed region.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from gdn_export.ops import reference
from runtime_ops import loader as runtime_ops

STATE_RING_BYTES = 96 << 20  # above the last-level cache of the machines we bench on


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 16, 128, 512, 2048],
                        help="tokens per call (1 is decode)")
    parser.add_argument("--num-v-heads", type=int, default=32, help="value heads (Hv)")
    parser.add_argument("--num-k-heads", type=int, default=16, help="query/key heads (Hk); Hv must be a multiple")
    parser.add_argument("--head-dim", type=int, default=128, help="Dk = Dv")
    parser.add_argument("--gate", choices=["scalar", "per_channel"], default="scalar",
                        help="the decay gate: one per head (Qwen3.5) or one per key channel")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--min-seconds", type=float, default=0.5, help="time spent per measurement")


def _median_seconds(call, ring: int, min_seconds: float) -> float:
    """Median over rounds of one call per ring entry; at least five rounds."""
    for _ in range(2):  # warm up, and fault in every buffer
        for index in range(ring):
            call(index)
    rounds = []
    started = time.perf_counter()
    while len(rounds) < 5 or time.perf_counter() - started < min_seconds:
        begin = time.perf_counter()
        for index in range(ring):
            call(index)
        rounds.append((time.perf_counter() - begin) / ring)
    return statistics.median(rounds)


@contextlib.contextmanager
def _quiet_native_stderr():
    """Upstream's kernel logs a line per call to the process's stderr; keep the table readable."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _upstream_op():
    try:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers llama::*
    except (ImportError, OSError) as error:
        print(f"gdn-bench cpu: ExecuTorch's custom ops are unavailable ({error}); timing ours only")
        return None
    return torch.ops.llama.gated_delta_rule.default


def run(args) -> int:
    if not runtime_ops.is_loaded():
        print("gdn-bench cpu: the C++ kernels are not built; run `python -m runtime_ops.build`")
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    upstream = _upstream_op()
    heads, key_heads, dim = args.num_v_heads, args.num_k_heads, args.head_dim
    state_shape = (1, heads, dim, dim)
    ring = max(2, STATE_RING_BYTES // (heads * dim * dim * 4))
    states = [0.5 * torch.randn(state_shape) for _ in range(ring)]
    copies = [torch.empty(state_shape) for _ in range(ring)]
    floor = _median_seconds(lambda i: copies[i].copy_(states[i]), ring, args.min_seconds)

    print(
        f"gdn-bench cpu: B=1, Hk={key_heads}, Hv={heads}, Dk=Dv={dim}, {args.gate} gate, fp32, "
        f"{torch.get_num_threads()} threads, ring of {ring} states"
    )
    print(f"memory floor (state-sized copy): {floor * 1e6:.1f} us")
    print()
    print("| T | ours (us/token) | ExecuTorch llama::gated_delta_rule (us/token) | ours / upstream |")
    print("|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for length in args.lengths:
        query = torch.randn(1, length, key_heads, dim, generator=generator)
        key = torch.randn(1, length, key_heads, dim, generator=generator)
        value = torch.randn(1, length, heads, dim, generator=generator)
        gate_shape = (1, length, heads) if args.gate == "scalar" else (1, length, heads, dim)
        g = F.logsigmoid(torch.randn(gate_shape, generator=generator) + 2.0)
        beta = torch.rand(1, length, heads, generator=generator)
        output = torch.empty_like(value)
        # Long prefills keep their state in cache anyway; fewer states keep the run short.
        length_ring = max(2, min(ring, 8192 // length))

        def ours(i):
            torch.ops.gdn.gated_delta_rule.out(
                query, key, value, g, beta, states[i], use_qk_l2norm=True, output=output, final_state=states[i]
            )

        ours_us = _median_seconds(ours, length_ring, args.min_seconds) * 1e6 / length
        upstream_text, ratio_text = "n/a", "n/a"
        if upstream is not None:
            # The same computation in upstream's layout: one head per state, gates exponentiated.
            q, k, v, gate, b, _ = reference.prepare_inputs(query, key, value, g, beta, states[0], None, True)
            q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            decay = gate.exp().transpose(1, 2).contiguous()
            decay = decay[..., 0].contiguous() if args.gate == "scalar" else decay
            b = b.transpose(1, 2).contiguous()
            with _quiet_native_stderr():
                upstream_us = _median_seconds(
                    lambda i: upstream(q, k, v, decay, b, states[i]), length_ring, args.min_seconds
                )
            upstream_us *= 1e6 / length
            upstream_text, ratio_text = f"{upstream_us:.1f}", f"{ours_us / upstream_us:.2f}x"
        print(f"| {length} | {ours_us:.1f} | {upstream_text} | {ratio_text} |")
    return 0
