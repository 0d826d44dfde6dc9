"""On a GPU: where a decode step of our CUDA program spends its time, kernel by kernel, with Nsight Compute.

Runs the C++ runner on a built program under ``ncu`` (only each kernel's
duration is collected, caches and clocks left alone), feeding a short prompt
one token per call through ``decode``, and profiles ``--launches`` kernels
after skipping ``--skip`` (the first calls, which include CudaBackend's warm-up).
Then sums the durations by kernel name per decode step: how many launches a
step makes, which kernels take the time, and how much of the step the weights'
matrix-vector products are. ncu runs kernels one at a time, so the sum is GPU
time without launch gaps; the bench's decode tok/s has those.

Usage: ``python -m cuda_backend.device.profile_decode --program DIR --tokenizer TOKENIZER.json
[--runner build/cpp_runner/gdn_cpp_runner] [--backend-lib build/cuda_runtime/libgdn_executorch_cuda.so]
[--steps 3] [--skip-steps 4] [--out FILE.csv]``
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

DURATION = "gpu__time_duration.sum"


def profile(program: Path, tokenizer: Path, runner: Path, backend_lib: Path, new_tokens: int,
            launches: tuple = ()) -> str:
    """ncu's --csv --page raw output for the runner generating ``new_tokens`` after a 4-token prompt fed one
    token per call (``launches``: ncu's --launch-skip/--launch-count arguments, or all launches)."""
    command = ["ncu", "--clock-control", "none", "--cache-control", "none", "--metrics", DURATION, "--csv",
               "--page", "raw", "--print-units", "base", *launches, str(runner), "--model", str(program / "model.pte"),
               "--data", str(program / "aoti_cuda_blob.ptd"), "--backend-lib", str(backend_lib),
               "--tokenizer", str(tokenizer), "--random-prompt-tokens", "4", "--max-new-tokens", str(new_tokens),
               "--temperature", "0", "--prefill-chunk", "1", "--ignore-eos"]
    result = subprocess.run(command, capture_output=True, text=True)
    if not kernel_rows(result.stdout):
        print(f"ncu reported no kernels (rc {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def kernel_rows(output: str) -> list[dict]:
    """ncu's --csv --page raw rows (one per kernel launch), after its own log lines."""
    start = output.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.DictReader(io.StringIO(output[start:])))
    # ncu writes its numbers with thousands separators ("9,008").
    for row in rows:
        row[DURATION] = row.get(DURATION, "").replace(",", "")
    return [row for row in rows if row[DURATION].replace(".", "", 1).isdigit()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, required=True, help="folder with model.pte and aoti_cuda_blob.ptd")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--runner", type=Path, default=Path("build/cpp_runner/gdn_cpp_runner"))
    parser.add_argument("--backend-lib", type=Path, default=Path("build/cuda_runtime/libgdn_executorch_cuda.so"))
    parser.add_argument("--steps", type=int, default=3, help="decode steps to profile")
    parser.add_argument("--skip-steps", type=int, default=4, help="decode steps to run before profiling")
    parser.add_argument("--out", type=Path, help="also write the raw per-launch CSV here")
    args = parser.parse_args()
    where = (args.program, args.tokenizer, args.runner, args.backend_lib)
    # A step's launches: the difference between runs that generate 2 and 3 tokens.
    per_step = len(kernel_rows(profile(*where, 3))) - len(kernel_rows(profile(*where, 2)))
    if per_step <= 0:
        print(f"could not count a decode step's launches ({per_step}); is ncu on the PATH?")
        return 1
    print(f"a decode step launches {per_step} kernels")
    output = profile(*where, args.skip_steps + args.steps + 2,
                     ("--launch-skip", str(per_step * args.skip_steps), "--launch-count", str(per_step * args.steps)))
    rows = kernel_rows(output)
    if args.out:
        args.out.write_text(output)
    if not rows:
        return 1
    by_name = defaultdict(lambda: [0, 0.0])
    for row in rows:
        name = row.get("Kernel Name", "?")
        by_name[name][0] += 1
        by_name[name][1] += float(row[DURATION])
    steps = len(rows) / per_step
    total_us = sum(time for _, time in by_name.values()) / 1e3 / steps
    print(f"{len(rows)} launches profiled ({steps:.1f} steps): {total_us:.0f} us of kernel time a step")
    print("| kernel | launches a step | us a step | share |\n|---|---|---|---|")
    for name, (count, time) in sorted(by_name.items(), key=lambda item: -item[1][1]):
        print(f"| {name[:90]} | {count / steps:.1f} | {time / 1e3 / steps:.1f} | {time / 1e3 / steps / total_us:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
