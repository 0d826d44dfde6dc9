"""``gdn-bench linear``: 8da4w_avx2's 4-bit linear (our kernel) against 8da4w's (XNNPACK's), on the same weights.

A chain of Qwen3.5 MLP-shaped layers (hidden -> intermediate -> hidden, ``--pairs``
times: 176M weights at the 0.8B shape, more than the last-level cache, as a model's
layers are) is exported twice, as two ``.pte`` programs with a dynamic row count:
once with each layer a ``GroupedInt4Linear`` (``gdn::grouped_int4_linear``), once
with torchao's ``IntxUnpackedToInt8Tensor`` lowered to XNNPACK (what 8da4w runs on,
and what ExecuTorch's own llama export makes), each with the same 4-bit
codes and positive scales (``fit_int4_scales``'). The two take turns, round after round, on
the same inputs: 1 row is a decode step's products, more a prompt's. At 1 row a third turn
reads the same bytes and computes nothing (``read_layers``): the pace of the memory for
this pattern of reads, measured in the same rounds. The programs are loaded as gdn-run
loads them, onto 2 MiB pages where Linux gives them (``gdn_export.runner.read_onto_huge_pages``);
XNNPACK repacks its weights into memory of its own, and the read's copies are torch
tensors, on the pages malloc gives.

``--hide-avx512`` times them as an AVX2-only x86 runs them (gdn_bench/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from gdn_bench import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=24, help="MLP-shaped pairs of layers in the chain")
    parser.add_argument("--hidden", type=int, default=1024, help="the model's width (Qwen3.5-0.8B: 1024)")
    parser.add_argument("--intermediate", type=int, default=3584, help="the MLP's width (Qwen3.5-0.8B: 3584)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 512], help="rows per call (1 is decode)")
    parser.add_argument("--rounds", type=int, default=5, help="turns each program takes at each row count")
    parser.add_argument("--threads", type=int, default=2, help="ExecuTorch threadpool size")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the inputs")
    parser.add_argument("--hide-avx512", action="store_true",
                        help="XNNPACK told the CPU has no AVX-512 and our kernels from a library built for "
                             "x86-64-v3 (GDN_RUNTIME_OPS_LIB), as on an AVX2-only x86")


class Chain(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def float_chain(pairs: int, hidden: int, intermediate: int, seed: int = 0) -> list:
    """The float layers, seeded, scaled so the activations stay near unit size through the chain."""
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(pairs):
        for width, height in ((hidden, intermediate), (intermediate, hidden)):
            layer = nn.Linear(width, height, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(height, width, generator=generator) / width ** 0.5)
            layers.append(layer)
    return layers


def quantized_chains(layers: list) -> tuple[nn.Module, nn.Module]:
    """``(ours, xnnpack)``: the chain with each layer on our kernel, and the same codes and scales as torchao's
    tensor for XNNPACK."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from gdn_export.ops.grouped_int4_linear import float_weight, tile_scales
    from gdn_export.quantize import GroupedInt4Linear

    ours, theirs = [], []
    for layer in layers:
        grouped = GroupedInt4Linear(layer, 32, signed=False)  # positive scales, which XNNPACK takes too
        ours.append(grouped)
        # The same 4-bit values: the float weight our codes stand for, quantized again at our scales.
        scale = tile_scales(grouped.scales).permute(0, 2, 1).reshape(grouped.out_features, -1)
        weight = IntxUnpackedToInt8Tensor.from_hp(
            float_weight(grouped.weight, grouped.scales), (1, 32), torch.int4,
            activation_quantization="int8_asym_per_token", intx_choose_qparams_algorithm=None,
            custom_scale=scale.float(), custom_zero_point=torch.zeros_like(scale, dtype=torch.int8))
        weight.scale = weight.scale.to(torch.bfloat16)
        linear = nn.Linear(layer.in_features, layer.out_features, bias=False)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        theirs.append(linear)
    return Chain(ours).eval(), Chain(theirs).eval()


def layer_bytes(chain: nn.Module) -> list:
    """Per layer of our chain, its codes and scales copied into one flat int64 tensor: the bytes a one-row call
    of that layer reads."""
    return [torch.cat([layer.weight.flatten().view(torch.uint8), layer.scales.flatten().view(torch.uint8)])
            .view(torch.int64) for layer in chain.layers]


def read_layers(buffers: list) -> int:
    """Reads every byte once, layer after layer, as a decode step's calls do, computing nothing but a sum (one
    torch sum a layer, on torch's threads; exact modulo 2**64). Each layer costs a Python call besides, a few
    microseconds, so the read is if anything slower than the memory alone."""
    return sum(int(buffer.sum()) for buffer in buffers)


def lowered(module: nn.Module, hidden: int, most_rows: int):
    """``module`` as a loaded ExecuTorch method (XNNPACK partitioner; our op stays outside it), and the program
    object the method reads from, which must stay alive beside it."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime

    rows = torch.export.Dim("rows", min=1, max=max(2, most_rows))
    exported = torch.export.export(module, (torch.randn(1, 2, hidden),), dynamic_shapes=({1: rows},))
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                          compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    from gdn_export.runner import read_onto_huge_pages

    # As gdn-run loads a program: from its file, onto 2 MiB pages where Linux gives them.
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "chain.pte"
        path.write_bytes(program.buffer)
        on_huge_pages = read_onto_huge_pages(path)
        loaded = Runtime.get().load_program(path if on_huge_pages is None else on_huge_pages)
        method = loaded.load_method("forward")
    return method, (program, loaded)


def measure(args) -> dict:
    """``{rows: {"ours": ms, "xnnpack": ms, "error": relative distance of the two outputs}}``, medians of
    ``args.rounds`` turns; at 1 row also ``"read"``: ms of ``read_layers`` over the same bytes."""
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    import gdn_export  # noqa: F401  (our kernels, in the programs' runtime)

    _unsafe_reset_threadpool(args.threads)
    torch.set_num_threads(args.threads)
    layers = float_chain(args.pairs, args.hidden, args.intermediate, args.seed)
    ours, theirs = quantized_chains(layers)
    methods, alive = {}, []
    for name, module in (("ours", ours), ("xnnpack", theirs)):
        methods[name], keep = lowered(module, args.hidden, max(args.rows))
        alive.append(keep)
    buffers = layer_bytes(ours)
    generator = torch.Generator().manual_seed(args.seed + 1)
    results = {}
    for rows in args.rows:
        x = torch.randn(1, rows, args.hidden, generator=generator)
        outputs = {name: method.execute([x])[0] for name, method in methods.items()}  # and a first, untimed call
        error = ((outputs["ours"] - outputs["xnnpack"]).norm() / outputs["xnnpack"].norm()).item()
        calls = max(1, 16 // rows)
        turns = {name: (lambda method=method: method.execute([x])) for name, method in methods.items()}
        if rows == 1:
            turns["read"] = lambda: read_layers(buffers)
        times = {name: [] for name in turns}
        for _ in range(args.rounds):
            for name, turn in turns.items():
                started = time.perf_counter()
                for _ in range(calls):
                    turn()
                times[name].append(1e3 * (time.perf_counter() - started) / calls)
        results[rows] = {name: statistics.median(values) for name, values in times.items()}
        results[rows]["error"] = error
    return results


def report(results: dict, args) -> str:
    weights = 2 * args.pairs * args.hidden * args.intermediate
    lines = [f"A chain of {2 * args.pairs} layers ({args.pairs} x {args.hidden} -> {args.intermediate} -> "
             f"{args.hidden}, {weights / 1e6:.0f}M 4-bit weights in groups of 32), {args.threads} threads, medians "
             f"of {args.rounds} alternated turns:", "",
             "| rows | ours ms | XNNPACK ms | ours / XNNPACK speed | ours GB/s of codes and scales | "
             "ours GMAC/s | plain read of the same bytes ms | ours' pace / the read's | "
             "outputs' relative distance (the two int8 roundings, compounded over the chain) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rows, entry in results.items():
        bytes_read = weights * (0.5 + 2 / 32)
        # One row reads every weight for few products: its pace is the memory's. More rows reuse each read.
        pace = f"{bytes_read / entry['ours'] / 1e6:.1f}" if rows == 1 else "-"
        read = (f"{entry['read']:.2f} | {entry['read'] / entry['ours']:.2f}" if "read" in entry else "- | -")
        lines.append(f"| {rows} | {entry['ours']:.2f} | {entry['xnnpack']:.2f} | {entry['xnnpack'] / entry['ours']:.2f}x "
                     f"| {pace} | {rows * weights / entry['ours'] / 1e6:.0f} | {read} | {entry['error']:.1e} |")
    return "\n".join(lines)


def run(args) -> int:
    from gdn_bench import x86_isa

    for name in ("pairs", "hidden", "intermediate", "rounds", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(rows < 1 for rows in args.rows):
        raise UsageError(f"--rows must all be >= 1, got {args.rows}")
    for name in ("hidden", "intermediate"):
        if getattr(args, name) % 32:
            raise UsageError(f"--{name} must be a multiple of 32 (a group of 4-bit weights), got {getattr(args, name)}")
    hidden = False
    if args.hide_avx512:
        from runtime_ops.loader import library_path

        try:
            x86_isa.check_runtime_ops_library(library_path())
            x86_isa.hide_avx512()
        except x86_isa.IsaError as error:
            raise UsageError(str(error)) from None
        hidden = True
    print(f"Machine: {x86_isa.machine_line(hidden)}.\n")
    print(report(measure(args), args))
    return 0
