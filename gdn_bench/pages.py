"""``gdn-bench pages``: one program's decode steps from its mapped file (4 KiB pages) against from 2 MiB pages.

ExecuTorch's runtime maps a ``.pte`` and runs it in place, in 4 KiB pages; gdn-run reads it
onto 2 MiB pages where Linux gives them (``gdn_export.runner.read_onto_huge_pages``). Both
loadings of the same program sit in one process and take turns, round after round: each
prefills ``--prompt`` seeded random tokens, then decodes ``--steps`` tokens, each step timed.
A turn's figure is its median step; the table gives the median turn of each loading and,
round by round, how many times longer the mapped program's step took.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from gdn_bench import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", type=Path, required=True, help="a CPU .pte from export_qwen35 (forward method)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens before each turn's decode steps")
    parser.add_argument("--steps", type=int, default=16, help="decode steps a turn")
    parser.add_argument("--rounds", type=int, default=10, help="turns each loading takes")
    parser.add_argument("--threads", type=int, default=2, help="ExecuTorch threadpool size")
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompt")


LOADINGS = {"mapped": False, "huge pages": True}  # name: ProgramRunner's huge_pages


def measure(args) -> dict:
    """``{"mapped": [ms a step, a turn each round], "huge pages": [...], "tokens": {loading: greedy tokens of the
    first turn}}``."""
    from gdn_bench.e2e import timed_decode_steps, use_threads
    from gdn_export.runner import ProgramRunner

    use_threads("ours", args.threads)
    runners = {name: ProgramRunner(args.program, huge_pages=huge) for name, huge in LOADINGS.items()}
    first = runners["mapped"]
    if "forward" not in first.steps:
        raise UsageError(f"--program {args.program}: a CPU program with a forward method expected")
    if args.prompt + args.steps > first.max_context:
        raise UsageError(f"--prompt {args.prompt} and --steps {args.steps}: the program's context holds "
                         f"{first.max_context} tokens")
    vocabulary = int(first.metadata.get("get_vocab_size", [256])[0])
    prompt = torch.randint(0, vocabulary, (args.prompt,), generator=torch.Generator().manual_seed(args.seed)).tolist()
    results = {name: [] for name in runners}
    results["tokens"] = {}
    for turn in range(args.rounds):
        order = list(runners) if turn % 2 == 0 else list(runners)[::-1]
        for name in order:
            runner = runners[name]
            runner.reset()
            _, steps, tokens = timed_decode_steps(runner, runner.feed(prompt), args.steps)
            results[name].append(statistics.median(steps))
            results["tokens"].setdefault(name, tokens)
    return results


def report(results: dict, args) -> str:
    lines = [f"`{args.program}`, {args.threads} threads: {args.rounds} rounds, each loading's turn {args.steps} "
             f"decode steps after a prompt of {args.prompt}:", "",
             "| loading | decode step ms (median turn) | tok/s | turns, slowest to fastest |", "|---|---|---|---|"]
    for name in LOADINGS:
        turns = results[name]
        median = statistics.median(turns)
        lines.append(f"| {name} | {median:.2f} | {1e3 / median:.1f} | {max(turns):.2f} to {min(turns):.2f} |")
    ratios = [mapped / huge for mapped, huge in zip(results["mapped"], results["huge pages"])]
    lines += ["", f"mapped / huge pages, round by round: median {statistics.median(ratios):.3f}x "
                  f"({min(ratios):.3f}x to {max(ratios):.3f}x)"]
    return "\n".join(lines)


def run(args) -> int:
    from gdn_bench import x86_isa
    from gdn_export.runner import RunnerError, huge_pages_on_request

    for name in ("prompt", "steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.program.is_file():
        raise UsageError(f"--program {args.program}: no such file")
    if not huge_pages_on_request():
        raise UsageError("this machine gives no 2 MiB pages on request (transparent huge pages off, or not Linux): "
                         "there is nothing to compare")
    print(f"Machine: {x86_isa.machine_line(False)}.\n")
    try:
        results = measure(args)
    except RunnerError as error:
        raise UsageError(str(error)) from None
    print(report(results, args))
    return 0
