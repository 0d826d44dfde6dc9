"""On a GPU: where a decode step of our CUDA program spends its time, kernel by kernel, with Nsight Compute.

Runs the C++ runner on a built program under ``ncu`` (only each kernel's
duration is collected, caches and clocks left alone), feeding a short prompt
one token per call through ``decode``, and profiles ``--launches`` kernels
after skipping ``--skip`` (the first calls, which include CudaBackend's warm-up).
Then sums the durations by kernel name per decode step: how many launches a
step makes, which kernels take the time, and how much of the step the weights'
matrix-vector products are. ncu runs kernels one at a time, so the sum is GPU
time without launch gaps; the bench's decode tok/s has those.

With ``--prefill-tokens N`` it profiles a prefill instead: one call of the
prefill method on a random prompt of N tokens (the whole run: that call and
the token it samples), summed the same way and by kernel family (AOTInductor's
GEMM templates, its fused pointwise and reduction kernels, ours).

Usage: ``python -m cuda_backend.device.profile_decode --program DIR --tokenizer TOKENIZER.json
[--runner build/cpp_runner/gdn_cpp_runner] [--backend-lib build/cuda_runtime/libgdn_executorch_cuda.so]
[--steps 3] [--skip-steps 4] [--prefill-tokens N] [--out FILE.csv]``
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
            launches: tuple = (), prompt_tokens: int = 4, prefill_chunk: int = 1) -> str:
    """ncu's --csv --page raw output for the runner generating ``new_tokens`` after a random prompt of
    ``prompt_tokens`` fed ``prefill_chunk`` tokens a call (``launches``: ncu's --launch-skip/--launch-count
    arguments, or all launches)."""
    command = ["ncu", "--clock-control", "none", "--cache-control", "none", "--metrics", DURATION, "--csv",
               "--page", "raw", "--print-units", "base", *launches, str(runner), "--model", str(program / "model.pte"),
               "--data", str(program / "aoti_cuda_blob.ptd"), "--backend-lib", str(backend_lib),
               "--tokenizer", str(tokenizer), "--random-prompt-tokens", str(prompt_tokens),
               "--max-new-tokens", str(new_tokens), "--temperature", "0", "--prefill-chunk", str(prefill_chunk),
               "--ignore-eos"]
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


# Kernel families by name: AOTInductor names its GEMM templates triton_tem_*, its fused pointwise and reduction
# kernels triton_poi_/triton_red_/triton_per_*; cuBLAS's kernels (the products AOTInductor hands to our cuBLAS shim)
# are nvjet_* on Hopper, *xmma*/cutlass* on others; every other kernel is one of ours (cuda_backend.kernels).
FAMILIES = (("AOTInductor GEMM templates", ("triton_tem_",)),
            ("AOTInductor pointwise and reductions", ("triton_poi_", "triton_red_", "triton_per_")),
            ("cuBLAS", ("nvjet_", "sm90_xmma", "sm80_xmma", "cutlass", "ampere_", "gemm")))


def family(name: str) -> str:
    return next((label for label, prefixes in FAMILIES if name.startswith(prefixes)), "ours (cuda_backend.kernels)")


def summarize(rows: list[dict], steps: float, unit: str) -> None:
    """Print the kernel time of ``rows`` per ``unit`` (``steps`` of them), by kernel family and by kernel."""
    by_name = defaultdict(lambda: [0, 0.0])
    for row in rows:
        name = row.get("Kernel Name", "?")
        by_name[name][0] += 1
        by_name[name][1] += float(row[DURATION])
    total_us = sum(time for _, time in by_name.values()) / 1e3 / steps
    print(f"{len(rows)} launches profiled ({steps:.1f} {unit}s): {total_us:.0f} us of kernel time a {unit}")
    by_family = defaultdict(lambda: [0, 0.0])
    for name, (count, time) in by_name.items():
        by_family[family(name)][0] += count
        by_family[family(name)][1] += time
    print(f"| kernel family | launches a {unit} | us a {unit} | share |\n|---|---|---|---|")
    for label, (count, time) in sorted(by_family.items(), key=lambda item: -item[1][1]):
        print(f"| {label} | {count / steps:.1f} | {time / 1e3 / steps:.1f} | {time / 1e3 / steps / total_us:.1%} |")
    print(f"| kernel | launches a {unit} | us a {unit} | share |\n|---|---|---|---|")
    for name, (count, time) in sorted(by_name.items(), key=lambda item: -item[1][1]):
        print(f"| {name[:90]} | {count / steps:.1f} | {time / 1e3 / steps:.1f} | {time / 1e3 / steps / total_us:.1%} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, required=True, help="folder with model.pte and aoti_cuda_blob.ptd")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--runner", type=Path, default=Path("build/cpp_runner/gdn_cpp_runner"))
    parser.add_argument("--backend-lib", type=Path, default=Path("build/cuda_runtime/libgdn_executorch_cuda.so"))
    parser.add_argument("--steps", type=int, default=3, help="decode steps to profile")
    parser.add_argument("--skip-steps", type=int, default=4, help="decode steps to run before profiling")
    parser.add_argument("--prefill-tokens", type=int, default=0,
                        help="profile one prefill call of this many tokens instead (at most the program's "
                             "prefill chunk), its first call at position 0, and the token it samples")
    parser.add_argument("--out", type=Path, help="also write the raw per-launch CSV here")
    args = parser.parse_args()
    if args.prefill_tokens < 0:
        parser.error(f"--prefill-tokens must be a token count (0: profile decode), got {args.prefill_tokens}")
    where = (args.program, args.tokenizer, args.runner, args.backend_lib)
    if args.prefill_tokens:
        output = profile(*where, 1, prompt_tokens=args.prefill_tokens, prefill_chunk=args.prefill_tokens)
        rows, per_step, unit = kernel_rows(output), None, "prefill call"
    else:
        # A step's launches: the difference between runs that generate 2 and 3 tokens.
        per_step = len(kernel_rows(profile(*where, 3))) - len(kernel_rows(profile(*where, 2)))
        if per_step <= 0:
            print(f"could not count a decode step's launches ({per_step}); is ncu on the PATH?")
            return 1
        print(f"a decode step launches {per_step} kernels")
        output = profile(*where, args.skip_steps + args.steps + 2,
                         ("--launch-skip", str(per_step * args.skip_steps), "--launch-count",
                          str(per_step * args.steps)))
        rows, unit = kernel_rows(output), "decode step"
    if args.out:
        args.out.write_text(output)
    if not rows:
        return 1
    summarize(rows, len(rows) / per_step if per_step else 1, unit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
