"""``gdn-bench e2e --device cuda``: random-weight Qwen3.5-0.8B and 4B shapes, end to end on one GPU (issue 17).

For each shape of ``--shapes``, on one seeded random checkpoint stored in bf16
(``e2e.build_checkpoint``), so that both systems read the same weights:

* ``ours``: the checkpoint exported with ``export_qwen35(backend='cuda',
  dtype='bf16')`` (methods ``decode`` and ``prefill``, the weights in
  ``aoti_cuda_blob.ptd``), run by the C++ runner (``examples/cpp_runner``)
  with ExecuTorch's CUDA runtime (``--backend-lib``). ExecuTorch's Python
  runtime of the 1.5.1 wheel fails beside the GPU machine's torch 2.11
  (cuda_backend/README.md), so the runner is the GPU path. The prompt goes in
  calls of ``--prefill-chunk`` tokens, the length the prefill method is
  exported for; the program's context is the longest prompt (or the first
  prompt and the decode steps, if longer).
* ``ours_graph``: the same program with the runner's ``--cuda-graph``
  (CudaBackend captures ``decode`` as a CUDA graph after a few steps and
  replays it), timed at the first prompt length only; the report says whether
  it generated ``ours``' tokens.
* ``hf``: transformers eager in bf16 on the same GPU with fla-core installed:
  its Gated DeltaNet layers run fla's Triton kernels (transformers' fast path).
  The bench refuses to time it where transformers would fall back to its
  PyTorch path.

One protocol for both: for each prompt length, one untimed run, then
``--runs`` timed runs, each from an empty state: the prompt in (prefill),
then, after the first prompt length only, ``--decode-steps`` greedy tokens fed
back one at a time (decode). The runner runs them all in one process
(``--runs``, ``--timings-json``), so the untimed run pays for lazy kernel
loading and first allocations. Reported: prompt tokens over the median
prefill seconds, and the median over runs of decode steps over their seconds.

Roofline: a decode step reads every weight once (the tied embedding as the
output layer), so the weight bytes over the GPU's copy bandwidth (bytes read
+ written by a torch copy of a 4 GiB buffer, measured in the same run) bound
decode tok/s. Issue 17's floors: decode at least 40% of that bound at 0.8B and
60% at 4B; prefill at 2048 and 8192 tokens at least 1.5x transformers + fla.

Artifacts are built once per ``--workdir`` and reused, as on CPU (delete one
to rebuild it); the program's folder is named after its options. A device
call is limited to 10 minutes and an export can take longer, so
``--build-only`` builds and ``--time-only`` times what is there
(``cuda_backend/device/run_on_device.sh cuda-bench``).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Optional

from gdn_bench import UsageError, e2e
from gdn_bench.runner_timing import prompt_digest, run_runner, runner_command, summarize

# What it times: ours, ours with decode replayed as a CUDA graph (the same program, the runner's --cuda-graph;
# timed at the first prompt length only, since prefill does not change), and transformers + fla-core
# (its --only takes these alone).
SYSTEMS = e2e.CUDA_SHARED_DEFAULTS["only"]
OURS_SYSTEMS = {"ours": False, "ours_graph": True}  # system: whether decode runs as a CUDA graph
SYSTEM_LABELS = {
    "ours": "gdn-export .pte (ExecuTorch CUDA runtime, C++ runner, bf16)",
    "ours_graph": "the same, decode as a CUDA graph (--cuda-graph)",
    "hf": "transformers eager + fla-core (bf16)",
}
REPO_ROOT = Path(__file__).resolve().parents[1]
# Options of --device cuda alone (dest: flag); None or False in the parser, so that a CPU run can refuse them.
CUDA_ONLY = {"shapes": "--shapes", "prefill_chunk": "--prefill-chunk", "runs": "--runs",
             "backend_lib": "--backend-lib", "time_only": "--time-only"}
CUDA_DEFAULTS = {"shapes": tuple(e2e.SHAPES), "prefill_chunk": 2048, "runs": 3}
# Options of the CPU benchmark alone (dest: flag): given with --device cuda, a usage error.
CPU_ONLY = {"executorch_prompts": "--executorch-prompts", "threads": "--threads", "interleave": "--interleave",
            "interleave_rounds": "--interleave-rounds", "kl": "--kl", "llama_cpp": "--llama-cpp",
            "llama_repetitions": "--llama-repetitions", "prompt_cache": "--prompt-cache",
            "cache_prefix": "--cache-prefix", "cache_question": "--cache-question", "cache_rounds": "--cache-rounds"}
# Issue 17's floors: decode tok/s at least this share of the roofline, by shape ...
DECODE_ROOFLINE_FLOORS = {"0.8b": 0.40, "4b": 0.60}
# ... and prefill tok/s at least this multiple of transformers + fla's, by prompt length.
PREFILL_FLOORS = {2048: 1.5, 8192: 1.5}
DTYPE = "bf16"
BYTES_PER_WEIGHT = 2  # bf16; the recurrent states stay fp32
COPY_BYTES = 4 << 30  # a copy of 4 GiB lasts milliseconds on an H100, so timer overhead is below 1%
CUDA_DATA_FILE = "aoti_cuda_blob.ptd"


# ---------------------------------------------------------------------------
# Command line.


def _shapes(text: str) -> tuple:
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    unknown = sorted(set(names) - set(e2e.SHAPES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"takes names from {', '.join(e2e.SHAPES)}, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of --device cuda alone (``gdn_bench.e2e_cli`` adds them beside ``e2e.add_arguments``')."""
    parser.add_argument("--shapes", type=_shapes, default=None,
                        help=f"--device cuda: model shapes to build and time, comma-separated "
                             f"(default {','.join(CUDA_DEFAULTS['shapes'])})")
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help=f"--device cuda: the most tokens one prefill call takes, as exported and as the runner "
                             f"feeds the prompt (default {CUDA_DEFAULTS['prefill_chunk']})")
    parser.add_argument("--runs", type=int, default=None,
                        help=f"--device cuda: timed runs of each prompt after one untimed run; medians "
                             f"(default {CUDA_DEFAULTS['runs']})")
    parser.add_argument("--backend-lib", type=Path, default=None,
                        help="--device cuda: ExecuTorch's CUDA runtime library for the runner (default "
                             "$GDN_CUDA_RUNTIME_LIB or build/cuda_runtime/libgdn_executorch_cuda.so; "
                             "python -m cuda_backend.executorch_runtime build)")
    parser.add_argument("--time-only", action="store_true",
                        help="--device cuda: time the artifacts already in --workdir, build nothing (refused if one "
                             "is missing; --build-only builds them)")


def cpu_defaults() -> dict:
    """What ``e2e.add_arguments`` gives an option nobody set."""
    parser = argparse.ArgumentParser(add_help=False)
    e2e.add_arguments(parser)
    return vars(parser.parse_args([]))


def context_length(prompts: tuple, decode_steps: int) -> int:
    """The program's context: the longest prompt, and room for the decode steps after the first."""
    return max(max(prompts), prompts[0] + decode_steps)


def check_arguments(args) -> None:
    """Refuse bad or CPU-only options, and fill in this device's defaults; reads no file, writes nothing."""
    defaults = cpu_defaults()
    given = [flag for name, flag in CPU_ONLY.items() if getattr(args, name) != defaults[name]]
    if given:
        raise UsageError(f"{given[0]} applies to --device cpu only")
    e2e.apply_defaults(args, {**e2e.CUDA_SHARED_DEFAULTS, **CUDA_DEFAULTS})
    others = [system for system in args.only if system not in SYSTEMS]
    if others:
        raise UsageError(f"--only: --device cuda times {', '.join(SYSTEMS)}, got {others[0]}")
    for flag, value in (("--decode-steps", args.decode_steps), ("--runs", args.runs),
                        ("--prefill-chunk", args.prefill_chunk)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    context = context_length(args.prompts, args.decode_steps)
    if args.prefill_chunk > context:
        raise UsageError(f"--prefill-chunk {args.prefill_chunk} exceeds the program's context of {context} tokens "
                         f"(the longest of --prompts, or the first and --decode-steps)")
    if args.build_only and args.time_only:
        raise UsageError("--build-only and --time-only exclude each other")
    if args.plot is not None and args.plot.suffix != ".png":
        raise UsageError(f"--plot must name a .png file, got {args.plot}")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # Checked now: the plot is drawn last, after minutes of timing.
        raise UsageError(f"--plot {args.plot}: matplotlib is not installed")
    if args.runner is None:
        args.runner = REPO_ROOT / "build" / "cpp_runner" / "gdn_cpp_runner"
    if args.backend_lib is None:
        from cuda_backend.executorch_runtime import library_path

        args.backend_lib = library_path()


class Layout:
    """Where one shape's artifacts lie in the workdir: a ``e2e.Workdir`` of its own, and our program."""

    def __init__(self, root: Path, shape: str, context: int, prefill_chunk: int):
        self.shape = shape
        self.folder = root / shape
        self.checkpoint = self.folder / "checkpoint"
        self.context = context
        self.prefill_chunk = prefill_chunk
        # Named after its options, so a run with others builds a program of its own instead of timing a stale one.
        self.program_dir = self.folder / f"ours_{DTYPE}_ctx{context}_chunk{prefill_chunk}"
        self.program = self.program_dir / "model.pte"
        self.data = self.program_dir / CUDA_DATA_FILE

    def workdir(self) -> e2e.Workdir:
        return e2e.Workdir(self.folder)  # creates the folder: only once the arguments are checked


def layouts(args) -> dict:
    context = context_length(args.prompts, args.decode_steps)
    return {shape: Layout(args.workdir.resolve(), shape, context, args.prefill_chunk) for shape in args.shapes}


def check_machine(args, shapes: dict) -> None:
    """Refuse, in one line, a machine or workdir this run cannot use, before anything is written."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    if not args.time_only and "ours" in args.only:
        from gdn_export.backends import get_backend

        reason = get_backend("cuda").unavailable_reason()
        if reason:
            raise UsageError(f"--device cuda cannot export here: {reason}")
    if args.time_only:
        for layout in shapes.values():
            needed = [layout.checkpoint] + ([layout.program, layout.data] if "ours" in args.only else [])
            missing = [path for path in needed if not path.exists()]
            if missing:
                raise UsageError(f"--time-only: {missing[0]} is missing (build it first with --build-only)")
    if args.build_only:
        return
    if "ours" in args.only:
        for flag, path, hint in (
            ("--runner", args.runner, "python -m examples.cpp_runner.build, after the runtime"),
            ("--backend-lib", args.backend_lib, "python -m cuda_backend.executorch_runtime build"),
        ):
            if not Path(path).is_file():
                raise UsageError(f"{flag} {path}: no such file (build it with `{hint}`)")
    if "hf" in args.only and importlib.util.find_spec("fla") is None:
        raise UsageError("--only hf: fla-core is not installed, so transformers would run its PyTorch Gated DeltaNet "
                         "path, not the fast path the bench compares with (pip install fla-core)")


# ---------------------------------------------------------------------------
# What a decode step reads.


def decode_weight_bytes(config: dict, bytes_per_weight: int = BYTES_PER_WEIGHT) -> int:
    """Bytes of weights one decode step reads, counted from a dense Qwen3.5 text config (config.json's fields):
    every layer's weights once, the final norm, the output layer (the embedding, when tied) and the one embedding
    row the token looks up (the output layer's own, when tied)."""
    config = config.get("text_config", config)
    if config.get("num_experts"):
        raise NotImplementedError("decode_weight_bytes counts dense configs; this one has experts")
    hidden, kinds = config["hidden_size"], list(config["layer_types"])
    linear_heads = config["linear_num_value_heads"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = linear_heads * config["linear_value_head_dim"]
    conv_channels = 2 * key_dim + value_dim  # q, k and v go through the depthwise convolution together
    gated_delta_net = (
        hidden * (conv_channels + value_dim + 2 * linear_heads)  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
        + conv_channels * config["linear_conv_kernel_dim"]  # the convolution (no bias)
        + 2 * linear_heads  # A_log, dt_bias
        + config["linear_value_head_dim"]  # the gated RMSNorm, shared by the heads
        + value_dim * hidden  # out_proj
    )
    query_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    attention = (
        hidden * 2 * query_dim  # q_proj: the query and its output gate
        + 2 * hidden * kv_dim  # k_proj, v_proj
        + query_dim * hidden  # o_proj
        + 2 * config["head_dim"]  # q_norm, k_norm
    )
    per_layer = 3 * hidden * config["intermediate_size"] + 2 * hidden  # the MLP and the two RMSNorms
    layers = sum(per_layer + (gated_delta_net if kind == "linear_attention" else attention) for kind in kinds)
    output = config["vocab_size"] * hidden + (0 if config.get("tie_word_embeddings") else hidden)
    return bytes_per_weight * (layers + hidden + output)


def decode_state_bytes(config: dict, positions: int, bytes_per_element: int = BYTES_PER_WEIGHT) -> dict:
    """What else a decode step of our program moves: the KV caches' first ``positions`` positions, which its
    attention reads (``gdn_cuda::cached_attention`` walks the cache up to the step's own position), and the
    fp32 recurrent states, read and written."""
    config = config.get("text_config", config)
    kinds = list(config["layer_types"])
    kv = (kinds.count("full_attention") * 2 * config["num_key_value_heads"] * config["head_dim"] * positions
          * bytes_per_element)
    recurrent = (kinds.count("linear_attention") * config["linear_num_value_heads"] * config["linear_key_head_dim"]
                 * config["linear_value_head_dim"] * 4 * 2)
    return {"kv_cache_bytes": kv, "recurrent_state_bytes": recurrent}


# ---------------------------------------------------------------------------
# Artifacts.


def ensure_artifacts(layout: Layout, seed: int, export: bool) -> None:
    """The shape's bf16 checkpoint and, with ``export``, our program: built in children, timed (e2e.Workdir)."""
    workdir = layout.workdir()
    workdir.ensure_checkpoint(seed, layout.shape, DTYPE)
    if export:
        layout.program_dir.mkdir(exist_ok=True)
        command = e2e.export_command(layout.checkpoint, layout.program, backend="cuda", dtype=DTYPE,
                                     max_seq_len=layout.context, prefill_chunk=layout.prefill_chunk)
        workdir.build("export_ours", layout.program, command)


def program_sizes(layout: Layout) -> dict:
    """Bytes of our program's .pte and of its .ptd weight files, where built."""
    if not layout.program.is_file():
        return {}
    return {"pte_bytes": layout.program.stat().st_size,
            "ptd_bytes": sum(path.stat().st_size for path in layout.program_dir.glob("*.ptd"))}


# ---------------------------------------------------------------------------
# Timing: one protocol, in the C++ runner for ours and in Python for transformers.


def time_generation(session, prompt_ids: list, new_tokens: int) -> dict:
    """One run of the C++ runner's protocol over a reset/feed session (``e2e.HFSession``): the prompt in one
    feed (timed), then greedy tokens, each but the last fed back one at a time (timed together)."""
    session.reset()
    started = time.perf_counter()
    logits = session.feed(list(prompt_ids))
    prefill_seconds = time.perf_counter() - started
    generated = [int(logits.argmax())]
    decode_seconds = 0.0
    while len(generated) < new_tokens:
        started = time.perf_counter()
        logits = session.feed([generated[-1]])
        decode_seconds += time.perf_counter() - started
        generated.append(int(logits.argmax()))
    return {"prompt_tokens": len(prompt_ids), "prefill_seconds": prefill_seconds,
            "generated_tokens": len(generated), "decode_steps": len(generated) - 1,
            "decode_seconds": decode_seconds, "prompt_ids": list(prompt_ids), "generated_ids": generated,
            "finite": bool(logits.float().isfinite().all())}


def system_entry(measured: list) -> dict:
    """A system's results from ``[(prompt length, its runs)]``, the first length the one decode followed."""
    entry = {"prefill_tok_s": {}, "prefill_seconds": {}, "first_token": {}, "prompt_digest": {}, "runs": {},
             "runs_agree": True}
    for index, (length, runs) in enumerate(measured):
        summary = summarize(runs)
        key = str(length)
        entry["prefill_tok_s"][key] = summary["prefill_tok_s"]
        entry["prefill_seconds"][key] = summary["prefill_seconds"]
        if index == 0:
            entry["decode_prompt"] = length
            entry["decode_steps"] = runs[0]["decode_steps"]
            entry["decode_tok_s"] = summary.get("decode_tok_s")
            entry["decode_ids"] = runs[-1]["generated_ids"]
        entry["first_token"][key] = runs[-1]["generated_ids"][0]
        entry["prompt_digest"][key] = prompt_digest(runs[-1]["prompt_ids"])
        # Every run starts from an empty state, so greedy runs of one prompt generate the same tokens unless the
        # state is not reset or the arithmetic is not deterministic.
        entry["runs_agree"] &= all(run["generated_ids"] == runs[0]["generated_ids"] for run in runs)
        entry["runs"][key] = [{name: run[name] for name in ("prefill_seconds", "decode_steps", "decode_seconds")}
                              for run in runs]
    return entry


def measure_ours(args, layout: Layout, system: str = "ours") -> tuple:
    """Our program in the C++ runner at each prompt length (``ours_graph``: the first alone, decode as a CUDA
    graph); (its entry, {length: prompt ids})."""
    measured, prompts = [], {}
    cuda_graph = OURS_SYSTEMS[system]
    for index, length in enumerate(args.prompts[:1] if cuda_graph else args.prompts):
        new_tokens = args.decode_steps + 1 if index == 0 else 1  # the first token comes from the prefill
        e2e.log(f"  {system}: prompt {length}" + (f" + {args.decode_steps} decode steps" if index == 0 else "")
                + f", {args.runs} timed runs after one untimed")
        command = runner_command(args.runner, layout.program, layout.checkpoint / "tokenizer.json",
                                 prompt_tokens=length, new_tokens=new_tokens, prefill_chunk=layout.prefill_chunk,
                                 runs=args.runs + 1, seed=args.seed, data=layout.data, backend_lib=args.backend_lib,
                                 cuda_graph=cuda_graph)
        runs = run_runner(command, args.runs + 1)
        measured.append((length, runs))
        prompts[length] = runs[-1]["prompt_ids"]
        summary = summarize(runs)
        decode = f", decode {summary['decode_tok_s']:.1f} tok/s" if "decode_tok_s" in summary else ""
        e2e.log(f"    prefill {summary['prefill_tok_s']:.0f} tok/s{decode}")
    entry = system_entry(measured)
    entry.update(load_seconds=measured[0][1][0]["load_seconds"], prefill_chunk=layout.prefill_chunk,
                 context=layout.context)
    return entry, prompts


# transformers' Qwen3.5 kernel entry points (its modeling_qwen3_5's names, 5.23) by the kernel each stands for.
TRANSFORMERS_KERNEL_ENTRIES = {
    "chunk_gated_delta_rule": "torch_chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule": "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn": "causal_conv1d_fn",
    "causal_conv1d_update": "causal_conv1d_update",
}


def transformers_gdn_kernels() -> dict:
    """The function behind each of transformers' Qwen3.5 kernel entry points, as ``module.name``: fla's or
    causal-conv1d's where installed and picked up at import, else transformers' own PyTorch fallback."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    found = {}
    for kernel, name in TRANSFORMERS_KERNEL_ENTRIES.items():
        entry = getattr(modeling, name, None)
        if entry is None:
            found[kernel] = "missing"
            continue
        # transformers wraps each entry point in a closure over the implementation it chose at import;
        # the kernel packages wrap theirs in decorators, which unwrap() sees through.
        chosen = inspect.unwrap(inspect.getclosurevars(entry).nonlocals.get("implementation", entry))
        found[kernel] = f"{getattr(chosen, '__module__', '?')}.{getattr(chosen, '__name__', '?')}"
    return found


def check_fast_path(kernels: dict) -> None:
    """Raise unless transformers' Gated DeltaNet entry points call fla's kernels (its fast path)."""
    slow = {name: where for name, where in kernels.items()
            if "gated_delta_rule" in name and not where.startswith("fla.")}
    if slow:
        raise RuntimeError(f"transformers runs its PyTorch Gated DeltaNet path, not fla-core's kernels: {slow}")


def measure_transformers(checkpoint: str, prompts: list, decode_steps: int, runs: int) -> dict:
    """transformers eager + fla in bf16 on the GPU, ``time_generation`` at each ``(length, ids)`` of ``prompts``
    (runs in a fresh interpreter)."""
    import torch
    import transformers

    kernels = transformers_gdn_kernels()
    check_fast_path(kernels)
    import fla

    started = time.perf_counter()
    session = e2e.HFSession(Path(checkpoint), dtype=torch.bfloat16, device="cuda")
    load_seconds = time.perf_counter() - started
    measured, finite = [], True
    for index, (length, ids) in enumerate(prompts):
        new_tokens = decode_steps + 1 if index == 0 else 1
        e2e.log(f"  hf: prompt {length}" + (f" + {decode_steps} decode steps" if index == 0 else "")
                + f", {runs} timed runs after one untimed")
        timed = [time_generation(session, ids, new_tokens) for _ in range(runs + 1)]
        finite &= all(run["finite"] for run in timed)
        measured.append((length, timed))
        summary = summarize(timed)
        decode = f", decode {summary['decode_tok_s']:.1f} tok/s" if "decode_tok_s" in summary else ""
        e2e.log(f"    prefill {summary['prefill_tok_s']:.0f} tok/s{decode}")
    if not finite:
        raise RuntimeError("non-finite logits: the benchmark model's activations overflowed in bf16")
    return {**system_entry(measured), "load_seconds": load_seconds, "kernels": kernels,
            "versions": {"transformers": transformers.__version__, "fla": getattr(fla, "__version__", "?"),
                         "torch": torch.__version__}}


def measure_device() -> dict:
    """The GPU's name and its copy bandwidth, bytes read + written (runs in a fresh interpreter)."""
    import torch

    bandwidth = e2e.memory_bandwidth(threads=1, nbytes=COPY_BYTES, repeats=10, device="cuda")
    return {"name": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bytes": COPY_BYTES, **bandwidth}


def in_child(function, *arguments):
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


def random_prompts(lengths: tuple, vocab_size: int, seed: int) -> dict:
    """Prompt ids for transformers when ours is not timed in this run (so no first-token comparison)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {length: torch.randint(0, vocab_size, (length,), generator=generator).tolist() for length in lengths}


# ---------------------------------------------------------------------------
# Report.


def roofline(results: dict, shape: str) -> Optional[float]:
    """Decode tok/s if every weight byte moved at the measured copy bandwidth."""
    device, entry = results.get("device"), results.get(shape, {})
    if not device or "weight_bytes" not in entry:
        return None
    return device["copy_bandwidth_bytes_s"] / entry["weight_bytes"]


def floor_checks(results: dict, shapes: tuple) -> list:
    """``[(shape, what, ratio or None, floor)]`` for issue 17's floors, where the figures exist."""
    checks = []
    for shape in shapes:
        entry = results.get(shape, {})
        ours, hf = entry.get("ours"), entry.get("hf")
        bound = roofline(results, shape)
        for system in OURS_SYSTEMS:
            measured = entry.get(system)
            if measured and shape in DECODE_ROOFLINE_FLOORS:
                decode = measured.get("decode_tok_s")
                value = decode / bound if decode and bound else None
                checks.append((shape, f"decode: {system} / roofline", value, DECODE_ROOFLINE_FLOORS[shape]))
        for length, least in PREFILL_FLOORS.items():
            mine = (ours or {}).get("prefill_tok_s", {}).get(str(length))
            theirs = (hf or {}).get("prefill_tok_s", {}).get(str(length))
            if mine is None and theirs is None:
                continue
            checks.append((shape, f"prefill {length}: ours / hf", mine / theirs if mine and theirs else None, least))
    return checks


def _verdict(value: Optional[float], least: float) -> str:
    return "-" if value is None else "met" if value >= least else "NOT met"


def report(results: dict, builds: dict, sizes: dict, prompts: tuple, shapes: tuple) -> str:
    """The markdown tables: tok/s of each system by shape, issue 17's floors, first tokens, and build costs.
    ``builds`` and ``sizes``: by shape, the workdir's builds.json and ``program_sizes``."""
    device = results.get("device")
    lines = []
    if device:
        lines += [f"{device['name']} (torch {device['torch']}), {device['measured_at']}: copy bandwidth "
                  f"{device['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s (bytes read + written, "
                  f"{device['copy_bytes'] / 2**30:.0f} GiB copy).", ""]
    anchor = next((results[shape]["hf"] for shape in shapes if results.get(shape, {}).get("hf")), None)
    if anchor and "kernels" in anchor:
        versions = anchor["versions"]
        lines += [f"transformers {versions['transformers']} with fla-core {versions['fla']}, its kernel entry points: "
                  + ", ".join(f"{name} -> {where}" for name, where in anchor["kernels"].items()) + ".", ""]
    for shape in shapes:
        entry = results.get(shape, {})
        if "weight_bytes" in entry:
            bound = roofline(results, shape)
            state = entry["state_bytes"]
            lines.append(
                f"{shape}: a decode step reads {entry['weight_bytes'] / 1e9:.2f} GB of {DTYPE} weights"
                + (f": roofline {bound:.0f} tok/s" if bound else "")
                + f". Not in the roofline: our program also reads up to {state['kv_cache_bytes'] / 1e6:.0f} MB of KV "
                  f"cache (its attention reads the positions written so far, at most {entry.get('attended', entry['context'])}) and moves "
                  f"{state['recurrent_state_bytes'] / 1e6:.0f} MB of fp32 recurrent state (read + written) per step."
                + (f" It takes a prompt in calls of at most {entry['ours']['prefill_chunk']} tokens."
                   if "ours" in entry else "")
            )
    header = ["shape", "system"] + [f"prefill {p} tok/s" for p in prompts] + \
             [f"decode tok/s (after {prompts[0]})", "decode / roofline", "measured"]
    lines += ["", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for shape in shapes:
        entry = results.get(shape, {})
        bound = roofline(results, shape)
        for system in SYSTEMS:
            measured = entry.get(system)
            if not measured:
                continue
            decode = measured.get("decode_tok_s")
            share = f"{decode / bound:.3f}" if decode and bound else "-"
            row = [shape, SYSTEM_LABELS[system]] + \
                  [e2e.format_rate(measured["prefill_tok_s"].get(str(p))) for p in prompts] + \
                  [e2e.format_rate(decode), share, measured["measured_at"]]
            lines.append("| " + " | ".join(row) + " |")
    checks = floor_checks(results, shapes)
    if checks:
        lines += ["", "| shape | target | ratio | floor | met |", "|---|---|---|---|---|"]
        for shape, what, value, least in checks:
            shown = "-" if value is None else f"{value:.2f}x"
            lines.append(f"| {shape} | {what} | {shown} | {least}x | {_verdict(value, least)} |")
    agreement = []
    for shape in shapes:
        ours, hf = results.get(shape, {}).get("ours"), results.get(shape, {}).get("hf")
        if not ours or not hf:
            continue
        same_prompt = [key for key, digest in ours["prompt_digest"].items() if hf["prompt_digest"].get(key) == digest]
        if not same_prompt:
            continue
        equal = sum(ours["first_token"][key] == hf["first_token"][key] for key in same_prompt)
        agreement.append(f"{shape}: the first generated token is transformers' for {equal} of {len(same_prompt)} "
                         f"prompts (bf16: a near tie may round either way); repeated runs generate the same tokens: "
                         f"ours {'yes' if ours['runs_agree'] else 'NO'}, transformers "
                         f"{'yes' if hf['runs_agree'] else 'NO'}.")
    for shape in shapes:
        ours, graph = results.get(shape, {}).get("ours"), results.get(shape, {}).get("ours_graph")
        if ours and graph and "decode_ids" in ours and "decode_ids" in graph \
                and ours["prompt_digest"].get(str(ours["decode_prompt"])) == \
                graph["prompt_digest"].get(str(graph["decode_prompt"])):
            # One program, one prompt: replaying decode as a CUDA graph must not change a token.
            same = ours["decode_ids"] == graph["decode_ids"]
            agreement.append(f"{shape}: decode as a CUDA graph generates ours' {len(ours['decode_ids'])} tokens: "
                             f"{'yes' if same else 'NO'}.")
    if agreement:
        lines += [""] + agreement
    rows = [(shape, builds.get(shape, {}), sizes.get(shape, {})) for shape in shapes]
    if any(build for _, build, _ in rows):
        lines += ["", "| shape | build step | wall s | peak RSS GiB | .pte MiB | .ptd GiB |", "|---" * 6 + "|"]
        for shape, build, size in rows:
            for name, step in build.items():
                pte = f"{size['pte_bytes'] / 2**20:.1f}" if name == "export_ours" and size else "-"
                ptd = f"{size['ptd_bytes'] / 2**30:.2f}" if name == "export_ours" and size else "-"
                lines.append(f"| {shape} | {name} | {step['seconds']:.0f} | {step['peak_rss_bytes'] / 2**30:.2f} "
                             f"| {pte} | {ptd} |")
    return "\n".join(lines)


def plot(results: dict, prompts: tuple, shapes: tuple, path: Path) -> None:
    """One panel per shape: tok/s of each system at each prefill length and for decode (log scale), with the
    decode roofline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [shape for shape in shapes if any(system in results.get(shape, {}) for system in SYSTEMS)]
    figure, panels = plt.subplots(1, max(len(shown), 1), figsize=(6 * max(len(shown), 1), 5), squeeze=False)
    for axes, shape in zip(panels[0], shown):
        entry = results[shape]
        bound = roofline(results, shape)
        rows = {SYSTEM_LABELS[system]: entry[system] for system in SYSTEMS if system in entry}
        e2e.draw_rates(axes, rows, prompts, (bound, f"decode roofline ({bound:.0f} tok/s)") if bound else None)
        axes.set_title(f"Qwen3.5-{shape.upper()} shape, random {DTYPE} weights")
    figure.suptitle(results.get("device", {}).get("name", "GPU"))
    e2e.save_figure(figure, path)


# ---------------------------------------------------------------------------
# The run.


def run(args) -> int:
    check_arguments(args)
    shapes = layouts(args)
    check_machine(args, shapes)
    if not args.time_only:
        for layout in shapes.values():
            ensure_artifacts(layout, args.seed, export=any(system in args.only for system in OURS_SYSTEMS))
    if args.build_only:
        return 0
    root = args.workdir.resolve()
    results_path = root / "results.json"
    results = e2e.read_json(results_path)
    e2e.log("device: copy bandwidth")
    results["device"] = {**in_child(measure_device), "measured_at": time.strftime("%Y-%m-%d %H:%M")}
    e2e.write_json(results_path, results)
    for shape, layout in shapes.items():
        config = json.loads((layout.checkpoint / "config.json").read_text())
        entry = results.setdefault(shape, {})
        # A timed decode step attends over at most the first prompt and the decode steps.
        attended = args.prompts[0] + args.decode_steps
        entry.update(weight_bytes=decode_weight_bytes(config), context=layout.context, attended=attended,
                     state_bytes=decode_state_bytes(config, attended))
        prompts = {}  # {length: the runner's prompt ids}
        for system in OURS_SYSTEMS:
            if system not in args.only:
                continue
            e2e.log(f"{shape}: {system}, {layout.program}")
            ours, seen = measure_ours(args, layout, system)
            prompts = {**seen, **prompts}
            entry[system] = {**ours, "measured_at": time.strftime("%Y-%m-%d %H:%M")}
            e2e.write_json(results_path, results)
        if "hf" in args.only:
            e2e.log(f"{shape}: transformers + fla, {layout.checkpoint}")
            # The runner's prompts where it ran at that length (so first tokens compare), others drawn here.
            drawn = random_prompts(args.prompts, config.get("text_config", config)["vocab_size"], args.seed)
            prompts = {**drawn, **prompts}
            hf = in_child(measure_transformers, str(layout.checkpoint), [(p, prompts[p]) for p in args.prompts],
                          args.decode_steps, args.runs)
            entry["hf"] = {**hf, "measured_at": time.strftime("%Y-%m-%d %H:%M")}
            e2e.write_json(results_path, results)
    builds = {shape: layout.workdir().builds() for shape, layout in shapes.items()}
    sizes = {shape: program_sizes(layout) for shape, layout in shapes.items()}
    table = report(results, builds, sizes, args.prompts, args.shapes)
    print(table)
    if args.markdown is not None:
        e2e.write_atomically(args.markdown, (table + "\n").encode())
    if args.plot is not None:
        plot(results, args.prompts, args.shapes, args.plot)
        e2e.log(f"wrote {args.plot}")
    return 0
