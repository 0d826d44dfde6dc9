"""Timing a program in the C++ runner (``examples/cpp_runner``): its command line and what its ``--timings-json``
and ``--print-token-ids`` lines say. ``gdn-bench e2e`` times our CUDA program this way, and our CPU programs with
``--runner`` (as an app runs them, and where ExecuTorch's Python runtime cannot load beside the machine's torch).

The runner's protocol: each run starts from an empty state, takes the prompt in (prefill, timed), then feeds back
the greedy tokens one at a time (decode, timed together, with the median step beside the sum)."""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
from pathlib import Path
from typing import Optional

RUNNER_TIMEOUT_S = 1800  # a hung runner must not hold the device call; a healthy one takes seconds to a minute


def prompt_digest(ids: list) -> str:
    """A short fingerprint of a prompt's ids: first tokens are compared only between runs of the same prompt."""
    return hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest()[:16]


def runner_command(runner: Path, program: Path, tokenizer: Path, *, prompt_tokens: int, new_tokens: int,
                   prefill_chunk: Optional[int], runs: int, seed: int, data: Optional[Path] = None,
                   backend_lib: Optional[Path] = None, cuda_graph: bool = False,
                   threads: Optional[int] = None) -> list:
    """The C++ runner, greedy from a random prompt (drawn from ``seed``) for exactly ``new_tokens``, ``runs``
    times in one process, with its timings and token ids on stderr; the prompt in calls of ``prefill_chunk`` tokens
    (None: the program's largest), on ``threads`` threads of ExecuTorch's pool (None: its own choice)."""
    command = [str(runner), "--model", str(program), "--tokenizer", str(tokenizer),
               "--random-prompt-tokens", str(prompt_tokens), "--seed", str(seed), "--max-new-tokens", str(new_tokens),
               "--ignore-eos", "--temperature", "0", "--runs", str(runs), "--timings-json", "--print-token-ids"]
    if prefill_chunk is not None:
        command += ["--prefill-chunk", str(prefill_chunk)]
    if threads is not None:
        command += ["--threads", str(threads)]
    if data is not None:
        command += ["--data", str(data)]
    if backend_lib is not None:
        command += ["--backend-lib", str(backend_lib)]
    if cuda_graph:
        command.append("--cuda-graph")
    return command


def parse_runner_output(stderr: str) -> list:
    """Each run's ``timings:`` line (``--timings-json``) with the prompt and generated ids printed after it
    (``--print-token-ids``), in the order of the runs."""
    runs = []
    for line in stderr.splitlines():
        if line.startswith("timings: "):
            runs.append(json.loads(line[len("timings: "):]))
        elif runs and line.startswith(("prompt token ids:", "generated token ids:")):
            label, _, ids = line.partition(":")
            runs[-1]["prompt_ids" if label.startswith("prompt") else "generated_ids"] = [int(i) for i in ids.split()]
    return runs


def run_runner(command: list, expected_runs: int) -> list:
    """Run the C++ runner; its runs, each checked to be whole (timings and both id lists)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    runs = parse_runner_output(done.stderr)
    whole = [run for run in runs if "prompt_ids" in run and "generated_ids" in run]
    if len(whole) != expected_runs or len(runs) != expected_runs:
        raise RuntimeError(f"{' '.join(command)}: expected {expected_runs} runs with timings and token ids, "
                           f"read {len(whole)} of {len(runs)}:\n{done.stderr[-3000:]}")
    return runs


def summarize(runs: list) -> dict:
    """Medians over the timed runs: all but the first, which pays for first calls (kernel loading, allocation)."""
    timed = runs[1:] or runs
    prefill_seconds = statistics.median(run["prefill_seconds"] for run in timed)
    summary = {"prompt_tokens": timed[0]["prompt_tokens"], "prefill_seconds": prefill_seconds,
               "prefill_tok_s": timed[0]["prompt_tokens"] / prefill_seconds}
    if timed[0]["decode_steps"]:
        summary["decode_tok_s"] = statistics.median(run["decode_steps"] / run["decode_seconds"] for run in timed)
    return summary
