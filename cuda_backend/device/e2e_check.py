"""On a GPU: CUDA programs from ``export_qwen35 --backend cuda``, run in ExecuTorch's own CUDA runtime.

The runtime must be built first (``python -m cuda_backend.executorch_runtime
build``; ``run_on_device.sh e2e`` does it). Then, for tiny random checkpoints
(dense, MoE, and Hv/Hk = 3), this check:

* exports each with the CLI (``export_main``), fp32 and the default bf16, and
  records how long each export took and where the compile time went;
* runs each program (``decode`` and ``prefill`` methods, sharing their state
  buffers) with ``gdn_export.runner`` in a child process, greedy for
  ``NEW_TOKENS`` tokens from one prompt;
* compares with transformers' ``generate`` on the GPU (its PyTorch path: fla's
  kernels are kept out), same dtype: fp32 programs must produce the same tokens
  (the check that passes or fails); bf16 agreement is reported;
* runs ``gdn-run`` itself (``cli.run_main``) on the dense program: its text must
  be the reference tokens' text;
* checks that a prompt fed in chunks of ``SMALL_CHUNK`` (the last, one token,
  through ``decode``) gives what one ``prefill`` call gives.

Every child's output goes to ``OUT/e2e.log``; the summary (PASS/FAIL lines) to
stdout and ``OUT/e2e_summary.txt``. Usage: ``python -m
cuda_backend.device.e2e_check OUT [--deadline-s S]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW_TOKENS = 32
MAX_SEQ_LEN = 128
SMALL_CHUNK = 4
PROMPT = "Once upon a time there was a little model that"
LOGITS_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}  # |error| / max |logit| of the first step
CHECKPOINTS = {  # name: make_tiny_checkpoint arguments (the CUDA kernels take head dims 64, 128, 256)
    "dense": dict(key_head_dim=64, value_head_dim=64, seed=0),
    "moe": dict(moe=True, key_head_dim=64, value_head_dim=64, seed=1),
    "ratio3": dict(num_k_heads=2, num_v_heads=6, key_head_dim=64, value_head_dim=64, seed=2),
}
CHILD_TIMEOUT_S = 300

_started = time.perf_counter()
_log_path: Path | None = None


def _elapsed() -> float:
    return time.perf_counter() - _started


def log(text: str) -> None:
    """To the log file (every child's output) and, marked with the time, to stdout."""
    with open(_log_path, "a") as handle:
        handle.write(text.rstrip("\n") + "\n")


def say(text: str) -> None:
    line = f"[{_elapsed():6.1f} s] {text}"
    print(line, flush=True)
    log(line)


def _child(arguments: list, *, env=None, timeout=CHILD_TIMEOUT_S, label: str) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-X", "faulthandler", *arguments], capture_output=True, text=True,
                                timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        stdout, stderr = (text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
                          for text in (error.stdout, error.stderr))
        log(f"--- {label}: timed out after {timeout:.0f} s\n{stdout}\n{stderr}")
        return subprocess.CompletedProcess(arguments, -9, stdout, stderr)
    log(f"--- {label}: exit {result.returncode} in {time.perf_counter() - started:.1f} s\n"
        f"{result.stdout}\n{result.stderr}")
    return result


# --- children ----------------------------------------------------------------------------------


def export_child(checkpoint: str, output: str, extra: list) -> int:
    """The CLI export, then where the compile time went (torch's compile-phase timers)."""
    from gdn_export.cli import export_main

    started = time.perf_counter()
    code = export_main(["--checkpoint", checkpoint, "--output", output, "--backend", "cuda",
                        "--max-seq-len", str(MAX_SEQ_LEN), "--verbose", *extra])
    seconds = time.perf_counter() - started
    try:
        from torch._dynamo.utils import compile_times

        print("compile phases (s):\n" + compile_times(repr="str", aggregate=True), flush=True)
    except Exception as error:  # noqa: BLE001  (diagnostics only)
        print(f"no compile phases: {error}")
    print(json.dumps({"export_seconds": seconds, "code": code}), flush=True)
    return code


def run_child(pte: str, data: str, prompt: list, new_tokens: int, chunk: int) -> int:
    """Greedy decoding through gdn_export.runner (no EOS stop); prints tokens and the first logits."""
    import torch

    from gdn_export.runner import ProgramRunner

    started = time.perf_counter()
    runner = ProgramRunner(pte, data_path=data)
    loaded = time.perf_counter() - started
    if chunk:
        runner.max_chunk = chunk
    logits = runner.feed(prompt)
    first = logits.float().tolist()
    tokens = []
    step_started = time.perf_counter()
    for _ in range(new_tokens):
        tokens.append(int(logits.argmax()))
        if len(tokens) < new_tokens:
            logits = runner.feed([tokens[-1]])
    decode_seconds = time.perf_counter() - step_started
    print(json.dumps({"tokens": tokens, "first_logits": first, "load_seconds": loaded,
                      "methods": sorted(runner.steps), "decode_tok_s": (new_tokens - 1) / decode_seconds,
                      "finite": bool(torch.isfinite(torch.tensor(first)).all())}), flush=True)
    return 0


# --- the parent ---------------------------------------------------------------------------------


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _compiler_libstdcxx() -> str | None:
    """The libstdc++ of the C++ compiler AOTInductor builds with (see aoti_check's docstring)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        found = subprocess.run([get_cpp_compiler(), "-print-file-name=libstdc++.so.6"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


class Programs:
    """Runs programs in children; after a crash while loading, again with the compiler's libstdc++."""

    def __init__(self):
        self.preload: str | None = None

    def run(self, label: str, pte: Path, prompt: list, chunk: int = 0) -> dict | None:
        arguments = ["-m", "cuda_backend.device.e2e_check", "--run", str(pte), str(pte.parent / "aoti_cuda_blob.ptd"),
                     json.dumps(prompt), str(NEW_TOKENS), str(chunk)]
        result = _child(arguments, env=self._env(), label=f"run {label}")
        if (result.returncode < 0 or "GLIBCXX" in result.stderr) and self.preload is None:
            preload = _compiler_libstdcxx()
            say(f"{label}: the run failed (exit {result.returncode}); again with LD_PRELOAD={preload}")
            if preload:
                self.preload = preload
                result = _child(arguments, env=self._env(), label=f"run {label} (preloaded)")
        if result.returncode != 0:
            tail = [line for line in (result.stdout + result.stderr).splitlines() if "Warning" not in line][-6:]
            say(f"{label}: the run failed (exit {result.returncode}):\n    " + "\n    ".join(tail))
            return None
        return _last_json(result.stdout)

    def _env(self) -> dict:
        env = dict(os.environ)
        if self.preload:
            env["LD_PRELOAD"] = ":".join(filter(None, [self.preload, env.get("LD_PRELOAD")]))
        return env


def _reference(checkpoint: Path, prompt: list, dtype: str) -> tuple[list, list]:
    """transformers' greedy generate on the GPU (its PyTorch path) and its first-step logits."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype).cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, out.logits[0][0].float().cpu().tolist()


def _prompt_argmax(checkpoint: Path, prompt: list) -> list:
    """transformers' (fp32, GPU) greedy next token after each prefix of the prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        return model(torch.tensor([prompt], device="cuda")).logits[0].argmax(-1).tolist()


def _agreement(tokens: list, expected: list) -> tuple[int, int | None]:
    same = sum(a == b for a, b in zip(tokens, expected))
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    return same, first


def _logits_error(actual: list, expected: list) -> float:
    import torch

    a, e = torch.tensor(actual), torch.tensor(expected)
    return float((a - e).abs().max() / e.abs().max())


EXPORTS = {  # name: (checkpoint, extra CLI arguments)
    "dense-fp32": ("dense", ["--dtype", "fp32"]),
    "dense-fp32-chunk4": ("dense", ["--dtype", "fp32", "--prefill-chunk", str(SMALL_CHUNK)]),
    "moe-fp32": ("moe", ["--dtype", "fp32"]),
    "ratio3-fp32": ("ratio3", ["--dtype", "fp32"]),
    "dense-bf16": ("dense", []),  # the default dtype: agreement with transformers in bf16 is reported
}
# What one call checks (each fits a 10-minute call on a fresh machine: an export of the tiny model
# takes minutes there). core: the dense model, gdn-run, and prompts in chunks; models: the others.
SETS = {"core": ("dense-fp32", "dense-fp32-chunk4"), "models": ("moe-fp32", "ratio3-fp32", "dense-bf16")}
SETS["all"] = SETS["core"] + SETS["models"]  # one call, when the exports are fast enough


def main(out: Path, deadline_s: float, selection: str = "core") -> int:
    global _log_path
    out.mkdir(parents=True, exist_ok=True)
    _log_path = out / f"e2e_{selection}.log"
    _log_path.write_text("")
    sys.modules["fla"] = None  # the reference is transformers' own PyTorch path, whatever is installed
    import torch

    from gdn_export.tiny import make_tiny_checkpoint
    from tokenizers import Tokenizer

    work = Path(tempfile.mkdtemp(prefix="gdn_e2e_"))  # not under OUT: only logs come back
    results: list[tuple[str, str]] = []  # (PASS|FAIL|INFO, line)

    def record(status: str, line: str) -> None:
        results.append((status, line))
        say(f"{status} {line}")

    say(f"GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else None}, torch {torch.__version__}")
    checkpoints = {name: make_tiny_checkpoint(work / name, **arguments) for name, arguments in CHECKPOINTS.items()}
    tokenizer = Tokenizer.from_file(str(checkpoints["dense"] / "tokenizer.json"))
    prompt = tokenizer.encode(PROMPT).ids
    # Chunks of SMALL_CHUNK leaving one token for decode at the end.
    while len(prompt) % SMALL_CHUNK != 1:
        prompt = prompt[:-1]
    say(f"prompt: {len(prompt)} tokens {prompt}; checkpoints {CHECKPOINTS}")

    # Export: dense fp32 alone first (its time is the figure to report), then the rest in parallel.
    exports = {name: EXPORTS[name] for name in SETS[selection]}
    exported: dict[str, Path] = {}

    def export(name: str) -> tuple[str, float | None]:
        checkpoint, extra = exports[name]
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        pte = folder / "model.pte"
        remaining = deadline_s - _elapsed() - 30
        if remaining < 60:
            say(f"export {name}: not started, too close to the deadline")
            return name, None
        command = ["-m", "cuda_backend.device.e2e_check", "--export", str(checkpoints[checkpoint]), str(pte),
                   json.dumps(extra)]
        # Concurrent exports share the cores: each compiles with its share of Inductor's worker threads.
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 1) // len(exports))))
        result = _child(command, env=env, timeout=remaining, label=f"export {name}")
        summary = _last_json(result.stdout) or {}
        if result.returncode == 0 and pte.is_file():
            exported[name] = pte
            ptd = folder / "aoti_cuda_blob.ptd"
            size = pte.stat().st_size + (ptd.stat().st_size if ptd.is_file() else 0)
            say(f"exported {name} in {summary.get('export_seconds', float('nan')):.1f} s "
                f"(.pte + .ptd {size / 2**20:.1f} MiB)")
            return name, summary.get("export_seconds")
        tail = [line for line in (result.stdout + result.stderr).splitlines() if "Warning" not in line][-8:]
        say(f"export {name} FAILED (exit {result.returncode}):\n    " + "\n    ".join(tail))
        return name, None

    export_seconds = {}
    alone_first = selection == "core"  # "all" starts every export at once, to fit one call
    if alone_first:  # alone first: its time is the figure to report
        name, seconds = export("dense-fp32")
        export_seconds[name] = seconds
        if seconds is None:
            record("FAIL", f"{name}: the export failed")
        else:
            record("INFO", f"export of the tiny dense model (fp32, decode + prefill, alone on the machine): "
                   f"{seconds:.1f} s")
    rest = [name for name in exports if not (alone_first and name == "dense-fp32")]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(rest)))
    futures = {name: pool.submit(export, name) for name in rest}
    pending = list(futures.values())

    programs = Programs()
    reference_cache: dict[tuple[str, str], tuple[list, list]] = {}

    def reference(checkpoint: str, dtype: str):
        if (checkpoint, dtype) not in reference_cache:
            reference_cache[checkpoint, dtype] = _reference(checkpoints[checkpoint], prompt, dtype)
        return reference_cache[checkpoint, dtype]

    def late(name: str) -> bool:
        if _elapsed() < deadline_s:
            return False
        record("FAIL", f"{name}: not run, past the deadline ({deadline_s:.0f} s)")
        return True

    def check_program(name: str) -> dict | None:
        if late(name):
            return None
        checkpoint, extra = exports[name]
        dtype = "fp32" if "fp32" in extra else "bf16"
        run = programs.run(name, exported[name], prompt)
        if run is None:
            record("FAIL", f"{name}: the program did not run in ExecuTorch's CUDA runtime")
            return None
        try:
            tokens, logits = reference(checkpoint, dtype)
        except Exception as error:  # noqa: BLE001  (reported, the other checks go on)
            record("FAIL", f"{name}: transformers' reference failed: {error!r}"[:400])
            return run
        same, first = _agreement(run["tokens"], tokens)
        error = _logits_error(run["first_logits"], logits)
        detail = (f"{same}/{NEW_TOKENS} greedy tokens equal transformers generate ({dtype}, GPU)"
                  + (f", first difference at token {first}" if first is not None else "")
                  + f"; first-step logits max rel error {error:.1e}; methods {run['methods']}; "
                  f"load {run['load_seconds']:.1f} s, decode {run['decode_tok_s']:.0f} tok/s")
        if dtype == "fp32":
            ok = same == NEW_TOKENS and error <= LOGITS_TOLERANCE[dtype] and run["finite"]
            record("PASS" if ok else "FAIL", f"{name}: {detail}")
        else:
            record("INFO", f"{name}: {detail}")
        log(f"{name} tokens {run['tokens']}\n{name} reference {tokens}")
        return run

    if not alone_first and "dense-fp32" in futures:  # first: the chunked program is compared with it
        pending.remove(futures["dense-fp32"])
        name, export_seconds[name] = futures["dense-fp32"].result()
        if export_seconds[name] is None:
            record("FAIL", f"{name}: the export failed")
    one_shot = check_program("dense-fp32") if "dense-fp32" in exported else None  # with gdn-run (below)
    if "dense-fp32" in exported:  # gdn-run itself
        tokens, _ = reference("dense", "fp32")
        eos = json.loads((checkpoints["dense"] / "generation_config.json").read_text())["eos_token_id"]
        eos_ids = {eos} if isinstance(eos, int) else set(eos)
        cut = next((i for i, token in enumerate(tokens) if token in eos_ids), None)  # gdn-run stops there
        expected_ids = tokens if cut is None else tokens[:cut + 1]
        cli = _child(["-c", "import sys; from gdn_export.cli import run_main; sys.exit(run_main())",
                      "--model", str(exported["dense-fp32"]), "--data",
                      str(exported["dense-fp32"].parent / "aoti_cuda_blob.ptd"), "--tokenizer",
                      str(checkpoints["dense"] / "tokenizer.json"), "--prompt", tokenizer.decode(prompt),
                      "--max-new-tokens", str(NEW_TOKENS)], env=programs._env(), label="gdn-run dense-fp32")
        from gdn_export.runner import TextStream

        text = cli.stdout[:-1] if cli.stdout.endswith("\n") else cli.stdout  # gdn-run ends with a newline
        stream = TextStream(tokenizer)  # what gdn-run prints for these tokens
        expected_text = "".join(stream.push(token) for token in expected_ids)
        ok = cli.returncode == 0 and text == expected_text
        stats = (cli.stderr.strip().splitlines() or [""])[-1]
        record("PASS" if ok else "FAIL", f"gdn-run dense-fp32: its text {'equals' if ok else 'DIFFERS from'} the "
               f"reference tokens' ({len(expected_ids)} tokens); {stats}")
        if not ok:
            log(f"gdn-run text {text!r}\nexpected {expected_text!r}")

    for future in concurrent.futures.as_completed(pending):
        name, seconds = future.result()
        export_seconds[name] = seconds
        if seconds is None:
            record("FAIL", f"{name}: the export failed")
            continue
        if name == "dense-fp32-chunk4":
            if late(name):
                continue
            chunked = programs.run(name, exported[name], prompt, chunk=SMALL_CHUNK)
            if chunked is None or one_shot is None:
                record("FAIL", f"{name}: prompt in chunks not compared (a program did not run)")
                continue
            same, first = _agreement(chunked["tokens"], one_shot["tokens"])
            error = _logits_error(chunked["first_logits"], one_shot["first_logits"])
            sizes = [min(SMALL_CHUNK, len(prompt) - i) for i in range(0, len(prompt), SMALL_CHUNK)]
            ok = same == NEW_TOKENS and error <= 1e-4
            record("PASS" if ok else "FAIL", f"prompt in chunks {sizes} (the last through decode) vs one prefill: "
                   f"{same}/{NEW_TOKENS} tokens equal, first-step logits max rel error {error:.1e}")
        else:
            check_program(name)
    pool.shutdown()

    times = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in export_seconds.items() if seconds)
    record("INFO", f"export times ({len(rest)} at once{' after dense-fp32 alone' if alone_first else ''}):"
                   f" {times}")
    failed = [line for status, line in results if status == "FAIL"]
    passed = sum(status == "PASS" for status, _ in results)
    lines = [f"{status} {line}" for status, line in results]
    lines.append(f"E2E {'PASSED' if not failed else 'FAILED'}: {passed} passed, {len(failed)} failed "
                 f"({_elapsed():.0f} s)")
    (out / f"e2e_{selection}_summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 1 if failed else 0


def compare_cpp(checkpoint: Path, runner_stderr: Path) -> int:
    """The C++ runner's greedy ids (``--print-token-ids``) against transformers' generate, fp32 on the GPU."""
    def ids(label: str) -> list:
        for line in runner_stderr.read_text(errors="replace").splitlines():
            if line.startswith(label):
                return [int(token) for token in line[len(label):].split()]
        raise SystemExit(f"FAIL cpp-e2e: no '{label}' line in {runner_stderr}")

    prompt, generated = ids("prompt token ids:"), ids("generated token ids:")
    expected, _ = _reference(checkpoint, prompt, "fp32")
    same, first = _agreement(generated, expected)
    # --verbose traces each call ("prefill: 4 tokens at 0 -> logits [...], argmax 7"): the prompt's calls
    # are checked one by one against transformers' argmax at their last position, so a wrong token
    # says which call went wrong first.
    calls = [re.match(r"(\w+): (\d+) tokens at (\d+) -> .*argmax (\d+)", line)
             for line in runner_stderr.read_text(errors="replace").splitlines()]
    calls = [(m[1], int(m[2]), int(m[3]), int(m[4])) for m in calls if m and int(m[3]) < len(prompt)]
    if calls:
        argmax = _prompt_argmax(checkpoint, prompt)
        for method, length, position, got in calls:
            want = argmax[position + length - 1]
            print(f"  {method} of {length} tokens at {position}: argmax {got}, transformers {want}"
                  f" {'ok' if got == want else 'WRONG'}", flush=True)
    # The runner stops at the program's EOS ids; transformers here is told to run on.
    verdict = "PASS" if generated and first is None else "FAIL"
    print(f"{verdict} cpp-e2e: {same}/{len(generated)} greedy tokens of the C++ runner (no torch in its process) "
          f"equal transformers generate (fp32, GPU){'' if first is None else f'; first difference at step {first}'}"
          f"\n  runner:       {generated}\n  transformers: {expected[:len(generated)]}", flush=True)
    return 0 if verdict == "PASS" else 1


def baseline(out: Path) -> int:
    """The dense fp32 export with CudaBackend's default compile settings, then with ours."""
    global _log_path
    out.mkdir(parents=True, exist_ok=True)
    _log_path = out / "e2e_baseline.log"
    _log_path.write_text("")
    from gdn_export.tiny import make_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="gdn_e2e_"))
    checkpoint = make_tiny_checkpoint(work / "dense", **CHECKPOINTS["dense"])
    for label, defaults in (("CudaBackend's defaults", "1"), ("ours", "0")):
        result = _child(["-m", "cuda_backend.device.e2e_check", "--export", str(checkpoint),
                         str(work / f"defaults{defaults}.pte"), json.dumps(["--dtype", "fp32"])],
                        env=dict(os.environ, GDN_CUDA_COMPILE_DEFAULTS=defaults), timeout=560, label=label)
        summary = _last_json(result.stdout) or {}
        say(f"dense fp32 export, {label} settings: exit {result.returncode}, "
            f"{summary.get('export_seconds', float('nan')):.1f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m cuda_backend.device.e2e_check")
    parser.add_argument("out", nargs="?", type=Path, default=Path("build/cuda_device"))
    parser.add_argument("--deadline-s", type=float, default=540.0, help="stop starting exports after this")
    parser.add_argument("--set", choices=tuple(SETS), default="core", help="which exports to check (see SETS)")
    parser.add_argument("--baseline", action="store_true",
                        help="only export the dense model twice, CudaBackend's default compile settings and ours, "
                             "one after the other, with where the compile time went")
    parser.add_argument("--compare-cpp", nargs=2, type=Path, metavar=("CHECKPOINT", "RUNNER_STDERR"),
                        help="compare the C++ runner's --print-token-ids output with transformers' generate")
    parser.add_argument("--export", nargs=3, metavar=("CHECKPOINT", "PTE", "EXTRA"), help=argparse.SUPPRESS)
    parser.add_argument("--run", nargs=5, metavar=("PTE", "PTD", "PROMPT", "TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.export:
        checkpoint, pte, extra = arguments.export
        sys.exit(export_child(checkpoint, pte, json.loads(extra)))
    if arguments.run:
        pte, data, prompt, tokens, chunk = arguments.run
        sys.exit(run_child(pte, data, json.loads(prompt), int(tokens), int(chunk)))
    if arguments.compare_cpp:
        sys.exit(compare_cpp(*arguments.compare_cpp))
    if arguments.baseline:
        sys.exit(baseline(arguments.out))
    sys.exit(main(arguments.out, arguments.deadline_s, arguments.set))
