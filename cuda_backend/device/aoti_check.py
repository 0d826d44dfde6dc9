"""On a GPU: the CUDA-rewritten tiny Qwen3.5, compiled with AOTInductor, loaded and matched with eager.

ExecuTorch's CUDA runtime is not on the package index, so the lowered code
path is proven by compiling the program CudaBackend compiles with
``torch._inductor.aoti_compile_and_package``, loading the package and matching
the eager reference model's logits and greedy tokens:

* ``decode``: T = 1, holds ``gdn_cuda::decode_gated_delta_net``; the
  prompt goes in one token at a time, then greedy decoding;
* ``prefill``: T dynamic, holds ``gdn_cuda::prefill_gated_delta_net``;
  the prompt and then every decode step go through it.

"The program CudaBackend compiles" is the exported program after
``cuda_backend.lowering.cuda_decompositions`` (what ``lower_to_cuda`` hands to
the partitioner): the ``gdn_cuda`` triton_ops become their Triton kernel
launches, which AOTInductor compiles into the package, so loading it needs
neither this repository nor Triton.

Each package is loaded and run in a fresh Python process that imports torch
alone (``--run``): a crash while loading is reported instead of ending the
check. On the lent H100s AOTInductor builds with /opt/gcc's g++, newer than the
libstdc++ Python loads, and the package's inlined ``std::regex`` faults at load
(cuda-gdb: ``parse_device_str`` -> ``regex_traits::transform_primary`` ->
``codecvt::do_unshift``); the check then loads it again with the compiler's own
libstdc++ preloaded (``AOTI_BACKTRACE=1`` adds cuda-gdb's backtrace of a crash).

Usage: ``python -m cuda_backend.device.aoti_check OUT_DIR``;
``--device cpu`` (without ``TRITON_INTERPRET``) is a dry run on the CPU:
export, the CUDA decompositions and the eager reference, no compile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT_LENGTH, NEW_TOKENS, MAX_PREFILL = 12, 8, 64
LOGITS_TOLERANCE = 1e-3  # max |error| / max |logit|, fp32 model
CHILD_TIMEOUT_S = 240


def _exported(model, length: int, dynamic: bool, device: str):
    tokens = torch.zeros(1, length, dtype=torch.long, device=device)
    input_pos = torch.zeros(1, dtype=torch.long, device=device)
    if not dynamic:
        with torch.no_grad():
            return torch.export.export(model, (tokens, input_pos), strict=False)
    shapes = ({1: torch.export.Dim("token_dim", min=1, max=MAX_PREFILL)}, None)
    with torch.no_grad():
        return torch.export.export(model, (tokens, input_pos), dynamic_shapes=shapes, strict=False)


def _gdn_ops(program) -> list[str]:
    return sorted({str(node.target) for node in program.graph.nodes if "gdn" in str(node.target)})


def _triton_launches(program) -> int:
    return sum("triton_kernel_wrapper" in str(node.target) for node in program.graph.nodes)


def _generate(step, prompt: torch.Tensor, one_token_at_a_time: bool):
    """Greedy decoding; returns (logits of every call [N, vocab], generated tokens)."""
    device = prompt.device
    logits, tokens = [], []
    with torch.no_grad():
        if one_token_at_a_time:
            for position in range(prompt.shape[1]):
                last = step(prompt[:, position:position + 1], torch.tensor([position], device=device))
        else:
            last = step(prompt, torch.tensor([0], device=device))
        logits.append(last[0, -1])
        position = prompt.shape[1]
        for _ in range(NEW_TOKENS):
            token = last[0, -1].argmax().view(1, 1)
            tokens.append(token.item())
            last = step(token, torch.tensor([position], device=device))
            logits.append(last[0, -1])
            position += 1
    return torch.stack(logits).float(), tokens


def _compare(name: str, logits, tokens, expected_logits, expected_tokens) -> int:
    error = ((logits.cpu() - expected_logits.cpu()).abs().max() / expected_logits.abs().max()).item()
    same = tokens == expected_tokens
    print(f"{name}: max rel logits error {error:.2e} (tolerance {LOGITS_TOLERANCE:g}), greedy tokens "
          f"{'match' if same else 'DIFFER'}: {tokens} vs {expected_tokens}", flush=True)
    return int(error > LOGITS_TOLERANCE) + int(not same)


def run_package(package: str, expected: str) -> int:
    """Child process: load an AOTInductor package with torch alone, run it, compare with the saved reference."""
    saved = torch.load(expected)
    started = time.perf_counter()
    compiled = torch._inductor.aoti_load_package(package)
    preload = os.environ.get("LD_PRELOAD")
    print(f"{saved['name']}: package loaded in {time.perf_counter() - started:.1f} s"
          + (f" (LD_PRELOAD={preload})" if preload else ""), flush=True)
    logits, tokens = _generate(lambda t, p: compiled(t, p), saved["prompt"].to(saved["device"]), saved["one_at_a_time"])
    return 1 if _compare(f"{saved['name']}: AOTI package vs eager reference", logits, tokens,
                         saved["logits"], saved["tokens"]) else 0


def _compiler_libstdcxx() -> str | None:
    """The libstdc++ of the C++ compiler AOTInductor builds with, when it is not the one Python loaded."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        found = subprocess.run([get_cpp_compiler(), "-print-file-name=libstdc++.so.6"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001  (no compiler query: nothing to preload)
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def _child(package: Path, expected: Path, preload: str | None = None, debugger: bool = False) -> int:
    command = [sys.executable, "-X", "faulthandler", "-m", "cuda_backend.device.aoti_check", "--run",
               str(package), str(expected)]
    if debugger:
        command = ["cuda-gdb", "-batch", "-ex", "run", "-ex", "bt 24", "--args"] + command
    environment = dict(os.environ)
    if preload:
        environment["LD_PRELOAD"] = ":".join(filter(None, [preload, environment.get("LD_PRELOAD")]))
    try:
        result = subprocess.run(command, timeout=CHILD_TIMEOUT_S, capture_output=True, text=True, env=environment)
    except subprocess.TimeoutExpired as error:
        print(f"child timed out after {CHILD_TIMEOUT_S} s: {(error.stdout or '')[-2000:]}", flush=True)
        return 1
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if "Warning" not in line and "from gdn_export import ops" not in line]
    if result.returncode < 0 and not debugger:  # the faulthandler dump: its first lines say where
        lines = lines[:8]
    print("\n".join(("    " + line) for line in lines[-(40 if debugger else 25):]), flush=True)
    return result.returncode


def _check_with_aoti(name: str, program, expected: Path, work: Path) -> int:
    started = time.perf_counter()
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(work / f"{name}.pt2"))
    print(f"{name}: AOTInductor compile {time.perf_counter() - started:.1f} s", flush=True)
    code = _child(Path(package), expected)
    if code >= 0:
        return int(code != 0)
    # A crash while loading: on the lent machines AOTInductor builds with a newer g++ (/opt/gcc)
    # than the libstdc++ Python loads, and the package's inlined std::regex (parse_device_str,
    # at load) then calls into the older library and faults. Loading the package with its
    # compiler's libstdc++ is what a deployment built with that compiler does.
    preload = _compiler_libstdcxx()
    print(f"{name}: the load crashed (signal {-code}); again with LD_PRELOAD={preload}", flush=True)
    if preload:
        code = _child(Path(package), expected, preload=preload)
        if code >= 0:
            return int(code != 0)
    if os.environ.get("AOTI_BACKTRACE") and shutil.which("cuda-gdb"):
        print(f"{name}: native backtrace of the crash (cuda-gdb):", flush=True)
        _child(Path(package), expected, preload=preload, debugger=True)
    return 1


def main(out_dir: str, device: str = "cuda") -> int:
    from gdn_export.loading import load_qwen35
    from gdn_export.passes import rewrite
    from gdn_export.tiny import make_tiny_checkpoint

    from cuda_backend.lowering import cuda_decompositions

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="aoti_check_"))
    checkpoint = make_tiny_checkpoint(work / "tiny", key_head_dim=64, value_head_dim=64)
    reference = load_qwen35(checkpoint, max_seq_len=128).to(device).eval()
    model = rewrite(load_qwen35(checkpoint, max_seq_len=128), "cuda").to(device).eval()
    generator = torch.Generator(device).manual_seed(0)
    prompt = torch.randint(3, 300, (1, PROMPT_LENGTH), device=device, generator=generator)
    failures = 0

    for name, length, dynamic in (("decode", 1, False), ("prefill", 4, True)):
        program = _exported(model, length, dynamic, device)
        # What lower_to_cuda hands to CudaBackend: the triton_ops replaced by their kernel launches.
        decomposed = program.run_decompositions(cuda_decompositions(), decompose_custom_triton_ops=True)
        print(f"{name}: gdn ops in the exported graph: {_gdn_ops(program)}; after the CUDA decompositions: "
              f"{_gdn_ops(decomposed) or 'none'}, {_triton_launches(decomposed)} Triton kernel launches", flush=True)
        one_at_a_time = name == "decode"
        reference.reset()
        expected_logits, expected_tokens = _generate(reference, prompt, one_at_a_time)
        if device == "cpu":
            # No AOTInductor for user Triton kernels on the CPU, and export cannot trace the
            # interpreter's kernels: the CPU dry run stops at the decomposed graph.
            failures += int(_triton_launches(decomposed) == 0)
            continue
        expected = work / f"{name}_expected.pt"
        torch.save({"name": name, "device": device, "prompt": prompt.cpu(), "one_at_a_time": one_at_a_time,
                    "logits": expected_logits.cpu(), "tokens": expected_tokens}, expected)
        failures += _check_with_aoti(name, decomposed, expected, work)

    shutil.rmtree(work, ignore_errors=True)
    print("AOTI CHECK", "PASSED" if failures == 0 else f"FAILED ({failures})", flush=True)
    return 1 if failures else 0


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m cuda_backend.device.aoti_check")
    parser.add_argument("out_dir", nargs="?", default="build/cuda_device")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--run", nargs=2, metavar=("PACKAGE", "EXPECTED"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = _arguments(sys.argv[1:])
    if arguments.run:
        sys.exit(run_package(*arguments.run))
    sys.exit(main(arguments.out_dir, arguments.device))
