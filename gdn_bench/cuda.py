"""``gdn-bench cuda``: the Triton kernels against fla-core, ExecuTorch's kernels and the copy floor.

Shapes are Qwen3.5's larger models (Hk = 16, Hv = 32, Dk = Dv = 128; bf16
activations, fp32 state). Every implementation is timed in the same run as
CUDA-graph replays: one graph holds ``calls`` launches that cycle through
enough input/state sets to exceed the L2 cache several times, so each launch
reads from DRAM as it would in a model; the figure is graph time / calls.

* decode (T = 1) at each ``--batches``: ours (the fused op: split, norm, gating
  and recurrence, state in place; and the unfused op, state in place),
  ExecuTorch 1.5.1's decode kernel three ways (its new state sent to a buffer of
  each input set, so rotated like ours; its ``fused_deltanet_decode`` op as called,
  whose fresh state tensor gets one graph address every launch; and that op followed
  by the state copy-back its Qwen3.5 model does), fla-core
  ``fused_recurrent_gated_delta_rule`` and the copy floor (a device-to-device copy
  of the state bytes, read + write);
* prefill (B = 1) at each ``--lengths``: ours (chunked kernels, fused and
  unfused), fla-core ``chunk_gated_delta_rule``, ExecuTorch's ``chunk_gated_delta_rule``
  (fla's kernels behind a triton_op; it takes Hv heads of q/k, so they are repeated
  for it outside the timed region).

An anchor that cannot run (not installed, or it rejects the shape) is
reported with its error instead of a time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import traceback
from pathlib import Path

NUM_K_HEADS, NUM_V_HEADS, HEAD_DIM = 16, 32, 128
OURS_DECODE = "ours: fused decode (in place)"
OURS_DECODE_UNFUSED = "ours: gated_delta_rule (in place)"
COPY_FLOOR = "copy floor (state read + write)"
EXECUTORCH_DECODE = "ExecuTorch 1.5.1 decode kernel, new state to rotated buffers"
EXECUTORCH_DECODE_WRAPPER = "ExecuTorch 1.5.1 fused_deltanet_decode (its op: new state at one graph address)"
EXECUTORCH_DECODE_AS_RUN = "ExecuTorch 1.5.1 fused_deltanet_decode + state copy-back (as its model runs it)"
OURS_PREFILL = "ours: fused chunked (in place)"
FLA_PREFILL = "fla-core 0.6.0 chunk_gated_delta_rule"
ROTATION_BYTES_OVER_L2 = 4  # rotate through this many times the L2 size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="1,8,32,128", help="decode batch sizes (comma-separated)")
    parser.add_argument("--lengths", default="128,512,2048,8192", help="prefill lengths (comma-separated)")
    parser.add_argument("--calls", type=int, default=20, help="launches per captured graph")
    parser.add_argument("--replays", type=int, default=7, help="graph replays; the median is reported")
    parser.add_argument("--sweep", action="store_true", help="also time the decode kernel at other launch shapes")
    parser.add_argument("--chunked-sweep", action="store_true",
                        help="also time the chunked (prefill) kernels at other launch shapes and scratch dtypes")
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here (needs matplotlib)")


def _graph_time_us(make_call, num_sets: int, calls: int, replays: int) -> float:
    """Median microseconds per launch of ``make_call(i)()`` over a CUDA graph of ``calls`` launches."""
    import torch

    launches = [make_call(i % num_sets) for i in range(calls)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for launch in launches[: min(num_sets, 3)]:  # compile / autotune outside the graph
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(times)


def _sets_for(bytes_per_set: int, l2_bytes: int) -> int:
    return max(2, math.ceil(ROTATION_BYTES_OVER_L2 * l2_bytes / max(bytes_per_set, 1)))


def _decode_inputs(batch: int, generator, device: str = "cuda"):
    import torch
    import torch.nn.functional as F

    from gdn_export.ops.fused import gating, split_heads

    channels = 2 * NUM_K_HEADS * HEAD_DIM + NUM_V_HEADS * HEAD_DIM
    mixed_qkv = F.silu(torch.randn(batch, 1, channels, device=device, generator=generator)).bfloat16()
    a = torch.randn(batch, 1, NUM_V_HEADS, device=device, generator=generator).bfloat16()
    b = torch.randn(batch, 1, NUM_V_HEADS, device=device, generator=generator).bfloat16()
    A_log = torch.rand(NUM_V_HEADS, device=device, generator=generator) * 2.7
    dt_bias = 0.5 * torch.randn(NUM_V_HEADS, device=device, generator=generator)
    state = 0.5 * torch.randn(batch, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, device=device, generator=generator)
    _, query, key, value = split_heads(mixed_qkv, state)
    g, beta = gating(a, b, A_log, dt_bias)
    return dict(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state,
                query=query.contiguous(), key=key.contiguous(), value=value.contiguous(), g=g.contiguous(),
                beta=beta.contiguous(), output=torch.empty_like(value))


def _decode_implementations(sweep: bool):
    """name -> prepare(inputs) -> call(); with ``sweep``, ours at several launch shapes too."""
    import torch

    import cuda_backend

    impls = {}

    impls[OURS_DECODE] = lambda x: (
        lambda: cuda_backend.fused_gated_delta_rule(
            x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"]
        )
    )
    if sweep:
        from gdn_export.ops.fused import split_heads

        def fused_decode(x, final_state, launch_shape=None):
            # The fused op's launch spelled out: q/k/v are views of mixed_qkv, the gates raw a/b.
            _, query, key, value = split_heads(x["mixed_qkv"], x["state"])
            return lambda: cuda_backend.launch_kernel(
                "recurrent", query, key, value, x["a"], x["b"], x["state"], final_state, x["output"],
                use_qk_l2norm=True, A_log=x["A_log"], dt_bias=x["dt_bias"], launch_shape=launch_shape,
            )

        for shape in cuda_backend.LAUNCH_SHAPE_SWEEPS["recurrent"]:
            impls[f"ours: fused decode BV={shape['value_block']} warps={shape['num_warps']}"] = (
                lambda x, shape=shape: fused_decode(x, x["state"], shape)
            )

        shared_states = {}  # state shape -> the one buffer every input set writes to

        def to_one_buffer(x):
            # What ExecuTorch's kernel does under a CUDA graph: the new state goes to the
            # same pool address every launch, so at small B its writes can stay in L2.
            if x["state"].shape not in shared_states:
                shared_states[x["state"].shape] = torch.empty_like(x["state"])
            return fused_decode(x, shared_states[x["state"].shape])

        impls["ours: fused decode, new state to one shared buffer (diagnostic)"] = to_one_buffer

    impls[OURS_DECODE_UNFUSED] = lambda x: (
        lambda: cuda_backend.gated_delta_rule(
            x["query"], x["key"], x["value"], x["g"], x["beta"], x["state"],
            use_qk_l2norm=True, output=x["output"], final_state=x["state"],
        )
    )

    def executorch_rotated(x):
        # ExecuTorch's kernel launched the way its op launches it, but with its new state
        # sent to a buffer of this input set: rotated like every other state buffer here,
        # so it moves the DRAM bytes an in-place update moves. The floor compares with this.
        import triton

        module = _executorch_decode_module()
        qkv, alpha, beta_raw, state = x["mixed_qkv"][:, 0], x["a"][:, 0], x["b"][:, 0], x["state"]
        batch, heads, key_dim, value_dim = state.shape
        # Kept in the set, so tests can check what the anchor computes.
        destination = x["executorch_state"] = torch.empty_like(state)
        output = x["executorch_output"] = torch.empty(batch, heads, value_dim, device=state.device)
        key_channels = (qkv.shape[1] - heads * value_dim) // 2

        def grid(meta):
            return (batch * heads, triton.cdiv(value_dim, meta["BLOCK_V"]))

        return lambda: module._fused_deltanet_decode_kernel[grid](
            qkv, alpha, beta_raw, x["A_log"], x["dt_bias"], state, destination, output,
            K=key_dim, V_DIM=value_dim, KEY_DIM=key_channels, V_PER_K=heads // (key_channels // key_dim),
            SCALE=key_dim ** -0.5, L2_EPS=1e-6,
            stride_qkv_b=qkv.stride(0), stride_ab=alpha.stride(0), stride_bb=beta_raw.stride(0),
            stride_s_b=state.stride(0), stride_s_h=state.stride(1), stride_s_k=state.stride(2),
            stride_s_v=state.stride(3), stride_ob=output.stride(0), stride_oh=output.stride(1),
            stride_ov=output.stride(2),
        )

    impls[EXECUTORCH_DECODE] = executorch_rotated

    def executorch(x):
        # Its op as called: the fresh state tensor it returns gets one graph-pool address
        # for every input set, so at small B its writes stay in L2 (see docs/benchmarks.md).
        from executorch.backends.cuda.triton.kernels.fused_deltanet_decode import fused_deltanet_decode

        qkv, alpha, beta_raw = x["mixed_qkv"][:, 0], x["a"][:, 0], x["b"][:, 0]
        return lambda: fused_deltanet_decode(qkv, alpha, beta_raw, x["A_log"], x["dt_bias"], x["state"])

    impls[EXECUTORCH_DECODE_WRAPPER] = executorch

    def executorch_with_copy_back(x):
        # ExecuTorch's Qwen3.5 model copies the returned state into its state buffer.
        from executorch.backends.cuda.triton.kernels.fused_deltanet_decode import fused_deltanet_decode

        qkv, alpha, beta_raw = x["mixed_qkv"][:, 0], x["a"][:, 0], x["b"][:, 0]

        def call():
            output, new_state = fused_deltanet_decode(qkv, alpha, beta_raw, x["A_log"], x["dt_bias"], x["state"])
            x["state"].copy_(new_state)
            return output

        return call

    impls[EXECUTORCH_DECODE_AS_RUN] = executorch_with_copy_back

    def fla(x):
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return lambda: fused_recurrent_gated_delta_rule(
            x["query"], x["key"], x["value"], g=x["g"], beta=x["beta"], initial_state=x["state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )

    impls["fla-core 0.6.0 fused_recurrent"] = fla

    def copy_floor(x):
        destination = torch.empty_like(x["state"])
        return lambda: destination.copy_(x["state"])

    impls[COPY_FLOOR] = copy_floor
    return impls


def _prefill_inputs(length: int, generator, device: str = "cuda"):
    import torch
    import torch.nn.functional as F

    from gdn_export.ops.reference import l2_normalize

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=generator)

    query = randn(1, length, NUM_K_HEADS, HEAD_DIM).bfloat16()
    key = randn(1, length, NUM_K_HEADS, HEAD_DIM).bfloat16()
    value = randn(1, length, NUM_V_HEADS, HEAD_DIM).bfloat16()
    g = F.logsigmoid(randn(1, length, NUM_V_HEADS) + 2.0)
    beta = torch.sigmoid(randn(1, length, NUM_V_HEADS)).bfloat16()
    state = 0.5 * randn(1, NUM_V_HEADS, HEAD_DIM, HEAD_DIM)
    group = NUM_V_HEADS // NUM_K_HEADS
    channels = torch.cat([query.flatten(2), key.flatten(2), value.flatten(2)], dim=-1)
    return dict(
        query=query, key=key, value=value, g=g, beta=beta, state=state, output=torch.empty_like(value),
        mixed_qkv=channels, a=randn(1, length, NUM_V_HEADS).bfloat16(), b=randn(1, length, NUM_V_HEADS).bfloat16(),
        A_log=torch.rand(NUM_V_HEADS, device=device, generator=generator) * 2.7,
        dt_bias=0.5 * randn(NUM_V_HEADS),
        # ExecuTorch's chunk op takes Hv heads of normalized q/k.
        query_repeated=l2_normalize(query.float().repeat_interleave(group, 2)).bfloat16(),
        key_repeated=l2_normalize(key.float().repeat_interleave(group, 2)).bfloat16(),
    )


def _prefill_implementations(sweep: bool = False):
    import cuda_backend

    # At prefill lengths (T >= the contract's CHUNKED_MIN_LENGTH) both ops take the chunked kernels.
    impls = {}
    impls[OURS_PREFILL] = lambda x: (
        lambda: cuda_backend.fused_gated_delta_rule(
            x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"]
        )
    )
    impls["ours: gated_delta_rule (chunked, in place)"] = lambda x: (
        lambda: cuda_backend.gated_delta_rule(
            x["query"], x["key"], x["value"], x["g"], x["beta"], x["state"],
            use_qk_l2norm=True, output=x["output"], final_state=x["state"],
        )
    )

    def fla(x):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return lambda: chunk_gated_delta_rule(
            x["query"], x["key"], x["value"], g=x["g"], beta=x["beta"], initial_state=x["state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )

    impls[FLA_PREFILL] = fla

    def executorch(x):
        from executorch.backends.cuda.triton.kernels.chunk_gated_delta_rule import chunk_gated_delta_rule

        return lambda: chunk_gated_delta_rule(
            x["query_repeated"], x["key_repeated"], x["value"], x["g"], x["beta"], x["state"]
        )

    impls["ExecuTorch 1.5.1 chunk_gated_delta_rule"] = executorch
    if sweep:
        # Timed after the anchors, so a launch shape that faults cannot cost the table its references.
        def chunked(launch_shape):
            return lambda x: (
                lambda: cuda_backend.launch_kernel(
                    "chunked", x["query"], x["key"], x["value"], x["g"], x["beta"], x["state"], x["state"],
                    x["output"], use_qk_l2norm=True, launch_shape=launch_shape,
                )
            )

        for shape in cuda_backend.LAUNCH_SHAPE_SWEEPS["chunked"]:
            impls["ours: chunked " + " ".join(f"{k}={v}" for k, v in shape.items())] = chunked(shape)
    return impls


def _input_bytes(inputs: dict) -> int:
    return sum(t.numel() * t.element_size() for t in inputs.values())


def _measure(kind: str, sizes, make_inputs, implementations, args, l2_bytes) -> dict:
    import torch

    results = {}
    for size in sizes:
        generator = torch.Generator(device="cuda").manual_seed(size)
        first = make_inputs(size, generator)
        num_sets = _sets_for(_input_bytes(first), l2_bytes)
        sets = [first] + [make_inputs(size, generator) for _ in range(num_sets - 1)]
        row = {"sets": num_sets}
        for name, prepare in implementations.items():
            try:
                calls = [prepare(inputs) for inputs in sets]
                row[name] = _graph_time_us(lambda i: calls[i], num_sets, args.calls, args.replays)
            except Exception as error:  # an anchor that cannot run is reported, not fatal
                row[name] = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
                traceback.print_exc(file=sys.stderr)
            print(f"{kind} {size}: {name}: {row[name]}", flush=True)
        results[size] = row
        del sets, first
        torch.cuda.empty_cache()
    return results


def _table(title: str, size_name: str, results: dict, references) -> str:
    """Times, then the first column (ours) over each reference."""
    names = [name for name in next(iter(results.values())) if name != "sets"]
    lines = [f"### {title}", "",
             f"| {size_name} | " + " | ".join(names + [f"ours / {r}" for r in references]) + " |",
             "|" + "---|" * (len(names) + len(references) + 1)]
    for size, row in results.items():
        cells = [f"{row[n]:.2f}" if isinstance(row[n], float) else row[n] for n in names]
        ours = row[names[0]]
        for reference in references:
            both = isinstance(ours, float) and isinstance(row.get(reference), float)
            cells.append(f"{ours / row[reference]:.2f}" if both else "-")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(path: Path, decode: dict, prefill: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, results, label in ((axes[0], decode, "decode batch B (T = 1)"), (axes[1], prefill, "prefill length T (B = 1)")):
        names = [name for name in next(iter(results.values())) if name != "sets"]
        for name in names:
            points = [(size, row[name]) for size, row in results.items() if isinstance(row[name], float)]
            if points:
                axis.plot(*zip(*points), marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel("microseconds per layer call")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Gated DeltaNet on one H100: Hk=16, Hv=32, Dk=Dv=128, bf16 in, fp32 state (CUDA-graph replays)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _executorch_decode_module():
    # The package re-exports the op under the module's name, so go through importlib.
    import importlib

    return importlib.import_module("executorch.backends.cuda.triton.kernels.fused_deltanet_decode")


def _print_executorch_decode_config() -> None:
    """The launch shape ExecuTorch's autotuner settled on (one key for every B here)."""
    try:
        module = _executorch_decode_module()
    except ImportError:
        return
    config = getattr(getattr(module, "_fused_deltanet_decode_kernel", None), "best_config", None)
    print(f"ExecuTorch fused_deltanet_decode autotuned to: {config}", flush=True)


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gdn-bench cuda: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    try:
        batches = [int(x) for x in args.batches.split(",")]
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        print("gdn-bench cuda: --batches/--lengths must be comma-separated integers", file=sys.stderr)
        return 2
    properties = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(properties, "L2_cache_size", 50 * 2**20)
    print(f"{properties.name}, {properties.multi_processor_count} SMs, L2 {l2_bytes / 2**20:.0f} MiB, "
          f"torch {torch.__version__}", flush=True)
    decode = _measure("decode B", batches, _decode_inputs, _decode_implementations(args.sweep), args, l2_bytes)
    _print_executorch_decode_config()
    prefill = _measure("prefill T", lengths, _prefill_inputs, _prefill_implementations(getattr(args, "chunked_sweep", False)), args, l2_bytes)
    markdown = (
        f"Device: {properties.name}; torch {torch.__version__}; microseconds per layer call "
        f"(median of {args.replays} graph replays of {args.calls} launches).\n\n"
        + _table("Decode (T = 1)", "B", decode, [COPY_FLOOR, EXECUTORCH_DECODE, EXECUTORCH_DECODE_WRAPPER])
        + "\n"
        + _table("Prefill (B = 1)", "T", prefill, [FLA_PREFILL])
    )
    print(markdown)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": properties.name, "decode": decode, "prefill": prefill}, indent=1))
    if args.plot:
        _plot(args.plot, decode, prefill)
    return 0
