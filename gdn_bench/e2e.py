"""``gdn-bench e2e``: a random-weight Qwen3.5-0.8B-shaped model, end to end on CPU.

``--device cuda`` runs the GPU benchmark instead (``gdn_bench.e2e_cuda``, which
``gdn_bench.e2e_cli`` sends it to): the 0.8B and 4B shapes in bf16, our
program in ExecuTorch's CUDA runtime against transformers with fla-core's
kernels. What follows describes the CPU one; its helpers (shapes, checkpoints,
the workdir, the plot) serve both.

One command builds (or reuses, from ``--workdir``) every artifact and times
every system on the same weights in the same run:

* ``checkpoint``: a Hugging Face folder of the published Qwen3.5-0.8B text shape
  with seeded random weights (``Qwen3_5ForCausalLM``, fp32, tied embeddings);
* ``ours`` / ``ours_8da4w`` / ``ours_8da4w_avx2`` / ``ours_8da8w`` / ``ours_int8wo`` / ``ours_16da8w``: our
  ``.pte`` (XNNPACK, fp32, 8da4w, 8da4w_avx2, 8da8w, int8wo and 16da8w), run with ``ProgramRunner``;
* ``hf``: transformers eager on the checkpoint (its pure-PyTorch GDN path);
* ``executorch``: ExecuTorch's own Qwen3.5 flow (``convert_weights`` then
  ``export_llm`` with its ``qwen3_5_xnnpack_fp32.yaml``), static shapes, so
  its prompts go in one token per call.

``--prompt-cache`` times our fp32 ``.pte``'s prompt cache instead
(``gdn_export.session``): time to first token for a shared prefix plus a
question, the prefix's state restored from a file vs prefilled again.

Exports run in child processes, so their wall time and peak RSS are theirs
alone (``os.wait4``); they are kept in ``builds.json`` and reported again when
an artifact is reused. Each system is timed in a fresh interpreter, so no two
models share a process's memory. Measured figures accumulate in
``results.json``; the table says when each row was measured, because ratios are
only meaningful between rows of the same run.

``--kl`` also scores each quantized program: the mean KL divergence of its
next-token distributions from the fp32 model's (our eager model) over a fixed
512-token text (``gdn_export.tiny.CORPUS``), teacher-forced one token a call.

``--llama-cpp DIR`` adds llama.cpp as an anchor (``gdn_bench.llama_cpp``): the
checkpoint converted by its own converter to an F32 GGUF, quantized to Q8_0 and
Q4_0 by ``llama-quantize``, timed by ``llama-bench`` at the same prompt lengths,
decode steps and threads; with ``--kl``, ``llama-perplexity``'s KL divergence of
Q8_0 and Q4_0 from F32 over the same 512 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from gdn_bench import UsageError, llama_cpp, runner_timing, x86_isa

SYSTEMS = ("ours", "ours_8da4w", "ours_8da4w_avx2", "ours_8da8w", "ours_int8wo", "ours_16da8w", "hf", "executorch")
# llama.cpp's GGUF files (--llama-cpp), reported after ours.
LLAMA_SYSTEMS = tuple(llama_cpp.GGUF_TYPES)
REPORTED = SYSTEMS + LLAMA_SYSTEMS
# Systems that read fp32 weights, whose decode is set against the fp32 memory floor.
FP32_SYSTEMS = ("ours", "hf", "executorch", "llama_f32")
# Our programs and the --quantize each is exported with.
OURS = {"ours": "none", "ours_8da4w": "8da4w", "ours_8da4w_avx2": "8da4w_avx2", "ours_8da8w": "8da8w",
        "ours_int8wo": "int8wo", "ours_16da8w": "16da8w"}
KL_TOKENS = 512
# The positions llama-perplexity scores in a context of KL_TOKENS: from the middle (its first = n_ctx / 2)
# to the one before the last (whose next token is in the context). Position p's distribution predicts token p + 1.
LLAMA_KL_POSITIONS = range(KL_TOKENS // 2, KL_TOKENS - 1)
# Our quantized programs and the llama.cpp file of the same bit width.
KL_PAIRS = (("4-bit", "ours_8da4w", "llama_q4_0"), ("4-bit", "ours_8da4w_avx2", "llama_q4_0"),
            ("8-bit", "ours_8da8w", "llama_q8_0"),
            ("8-bit", "ours_int8wo", "llama_q8_0"), ("8-bit", "ours_16da8w", "llama_q8_0"))
SYSTEM_LABELS = {
    "ours": "gdn-export .pte (XNNPACK fp32)",
    "ours_8da4w": "gdn-export .pte (XNNPACK 8da4w)",
    "ours_8da4w_avx2": "gdn-export .pte (8da4w_avx2: our 4-bit linears)",
    "ours_8da8w": "gdn-export .pte (XNNPACK 8da8w)",
    "ours_int8wo": "gdn-export .pte (XNNPACK int8wo)",
    "ours_16da8w": "gdn-export .pte (16da8w: our grouped int8 linears, 5-bit planes head)",
    "hf": "transformers eager (fp32)",
    "executorch": "ExecuTorch export_llm flow (XNNPACK fp32)",
    **{system: f"llama.cpp {file_type}" for system, file_type in llama_cpp.GGUF_TYPES.items()},
}
# The published Qwen3.5-0.8B text config (see /work/shared/anchors.md), as
# ``Qwen3_5TextConfig`` keyword arguments.
QWEN35_0_8B = dict(
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=262144,
    bos_token_id=248045,
    eos_token_id=[248046, 248044],
)
# The published Qwen3.5-4B text config (anchors.md; ExecuTorch's examples/models/qwen3_5/config/4b_config.json):
# wider, 32 layers, twice the attention heads and Gated DeltaNet value heads of the 0.8B.
QWEN35_4B = dict(
    QWEN35_0_8B,
    hidden_size=2560,
    intermediate_size=9216,
    num_hidden_layers=32,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 8,
    num_attention_heads=16,
    num_key_value_heads=4,
    linear_num_value_heads=32,
)
# The benchmark shapes by name (``--shapes``); the CPU benchmark uses the first.
SHAPES = {"0.8b": QWEN35_0_8B, "4b": QWEN35_4B}
# Small enough that 24 residual layers keep activations and logits of order one.
INIT_STD = 0.02
ET_MODEL_CLASS = "qwen3_5_0_8b"
# The floors: (numerator, denominator, measure, least ratio).
TARGETS = (
    ("ours", "executorch", "decode", 1.2),
    ("ours", "hf", "decode", 2.0),
    ("ours", "hf", "prefill 512", 1.3),
    # issue 20: against llama.cpp on the same weights.
    ("ours", "llama_f32", "decode", 1.0),
    ("ours", "llama_f32", "prefill 512", 1.5),
    ("ours_8da4w", "llama_q4_0", "decode", 1.5),
    ("ours_8da4w", "llama_q4_0", "prefill 512", 1.5),
    ("ours_8da4w", "llama_q4_0", "prefill 2048", 1.5),
    ("ours_8da4w_avx2", "llama_q4_0", "decode", 1.5),
    ("ours_8da4w_avx2", "llama_q4_0", "prefill 512", 1.5),
    ("ours_8da4w_avx2", "llama_q4_0", "prefill 2048", 1.5),
    ("ours_8da8w", "llama_q8_0", "decode", 1.5),
    ("ours_8da8w", "llama_q8_0", "prefill 512", 1.5),
    ("ours_8da8w", "llama_q8_0", "prefill 2048", 1.5),
    ("ours_int8wo", "llama_q8_0", "decode", 1.5),
    ("ours_int8wo", "llama_q8_0", "prefill 512", 1.5),
    ("ours_int8wo", "llama_q8_0", "prefill 2048", 1.5),
    ("ours_16da8w", "llama_q8_0", "decode", 1.5),
    ("ours_16da8w", "llama_q8_0", "prefill 512", 1.5),
    ("ours_16da8w", "llama_q8_0", "prefill 2048", 1.5),
)
# issue 20: a program at most this multiple of the GGUF file of the same bit width.
SIZE_FLOOR = (("ours_8da4w", "llama_q4_0", 1.1), ("ours_8da4w_avx2", "llama_q4_0", 1.1), ("ours_8da8w", "llama_q8_0", 1.1),
              ("ours_int8wo", "llama_q8_0", 1.1), ("ours_16da8w", "llama_q8_0", 1.1))
# The floor for --prompt-cache: cached time to first token at most this share of uncached.
PROMPT_CACHE_FLOOR = 0.1


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def qwen35_config(shape: str):
    """``Qwen3_5TextConfig`` of a benchmark shape (a key of ``SHAPES``)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(initializer_range=INIT_STD, **SHAPES[shape])


def executorch_params(config: dict) -> dict:
    """ExecuTorch's llama ``ModelArgs`` (its params JSON) for a Hugging Face Qwen3.5 config.json."""
    config = config.get("text_config", config)  # the multimodal checkpoints nest the text model's config
    rope = config.get("rope_parameters") or {}
    return {
        "dim": config["hidden_size"],
        "hidden_dim": config["intermediate_size"],
        "n_heads": config["num_attention_heads"],
        "n_kv_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "n_layers": config["num_hidden_layers"],
        "norm_eps": config["rms_norm_eps"],
        "rope_theta": rope.get("rope_theta", config.get("rope_theta")),
        "partial_rotary_factor": rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)),
        "use_scaled_rope": False,
        "use_hf_rope": True,
        "vocab_size": config["vocab_size"],
        "attention_qkv_bias": config.get("attention_bias", False),
        # Qwen3.5's full attention: RMSNorm on q and k before RoPE, a sigmoid output
        # gate packed into q_proj, and (1 + weight) RMSNorms everywhere but the GDN output.
        "use_qk_norm": True,
        "qk_norm_before_rope": True,
        "use_q_gate": True,
        "rms_norm_add_unit_offset": True,
        "attention_type": "mha",
        "linear_conv_kernel_dim": config["linear_conv_kernel_dim"],
        "linear_key_head_dim": config["linear_key_head_dim"],
        "linear_value_head_dim": config["linear_value_head_dim"],
        "linear_num_key_heads": config["linear_num_key_heads"],
        "linear_num_value_heads": config["linear_num_value_heads"],
        "layer_types": list(config["layer_types"]),
    }


def write_atomically(path: Path, data: bytes) -> None:
    """Through a hidden file renamed into place, so a run cut off mid-write leaves the previous file whole."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def write_json(path: Path, value) -> None:
    write_atomically(path, json.dumps(value, indent=2).encode())


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


# ---------------------------------------------------------------------------
# Artifacts: built in child processes, timed, and reused from the workdir.


@dataclass
class ChildRun:
    seconds: float
    peak_rss_bytes: int
    returncode: int


def run_child(command: list, log_path: Path, cwd: Optional[Path] = None) -> ChildRun:
    """Run ``command`` with its output in ``log_path``; wall time and the peak RSS of that child alone."""
    started = time.perf_counter()
    with open(log_path, "wb") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=cwd)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is in KiB on Linux.
    return ChildRun(time.perf_counter() - started, usage.ru_maxrss * 1024, child.returncode)


class Workdir:
    """The artifacts of one benchmark folder and the record of how each was built."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self.root / "checkpoint"
        self.tokenizer = self.checkpoint / "tokenizer.json"
        self.ours = {system: self.root / f"ours_{quantize if quantize != 'none' else 'fp32'}.pte"
                     for system, quantize in OURS.items()}
        # Not named "executorch": export_llm imports differently when its working folder is.
        self.executorch_dir = self.root / "executorch_flow"
        self.executorch_params = self.executorch_dir / "params.json"
        self.executorch_weights = self.executorch_dir / "weights.pth"
        self.executorch_pte = self.executorch_dir / f"{ET_MODEL_CLASS}_fp32.pte"
        self.llama_dir = self.root / "llama_cpp"
        self.gguf = {system: self.llama_dir / f"model-{file_type.lower()}.gguf"
                     for system, file_type in llama_cpp.GGUF_TYPES.items()}
        self.builds_path = self.root / "builds.json"
        self.results_path = self.root / "results.json"

    def builds(self) -> dict:
        return read_json(self.builds_path)

    def build(self, name: str, output: Path, command: list, cwd: Optional[Path] = None,
              writes_to: Optional[Path] = None) -> None:
        """Run ``command`` unless ``output`` exists; record its time, peak RSS and output size.

        ``writes_to``: where a command that does not write atomically itself writes; renamed to ``output``
        once it succeeds, so an interrupted build is never reused."""
        if output.exists():
            log(f"{name}: reusing {output}")
            return
        log_path = self.root / f"{name}.log"
        log(f"{name}: building {output} (log: {log_path})")
        child = run_child(command, log_path, cwd)
        if writes_to is not None and child.returncode == 0 and writes_to.exists():
            os.replace(writes_to, output)
        if child.returncode != 0 or not output.exists():
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name}: {' '.join(map(str, command))} failed ({child.returncode}):\n{tail}")
        size = sum(p.stat().st_size for p in output.rglob("*")) if output.is_dir() else output.stat().st_size
        builds = self.builds()
        builds[name] = {
            "seconds": round(child.seconds, 1),
            "peak_rss_bytes": child.peak_rss_bytes,
            "size_bytes": size,
            "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        write_json(self.builds_path, builds)
        log(f"{name}: {child.seconds:.0f} s, peak RSS {child.peak_rss_bytes / 2**30:.2f} GiB")

    def ensure_checkpoint(self, seed: int, shape: str = "0.8b", dtype: str = "fp32") -> None:
        code = (f"from gdn_bench.e2e import build_checkpoint; "
                f"build_checkpoint({str(self.checkpoint)!r}, {seed}, {shape!r}, {dtype!r})")
        self.build("checkpoint", self.checkpoint, [sys.executable, "-c", code])

    def ensure_ours(self, system: str) -> None:
        command = export_command(self.checkpoint, self.ours[system], backend="xnnpack", dtype="fp32",
                                 quantize=OURS[system])
        self.build(f"export_{system}", self.ours[system], command)

    def ensure_executorch(self) -> None:
        from executorch.examples.models import qwen3_5

        self.executorch_dir.mkdir(exist_ok=True)
        if not self.executorch_params.exists():
            params = executorch_params(json.loads((self.checkpoint / "config.json").read_text()))
            write_json(self.executorch_params, params)
        self.build(
            "executorch_convert_weights", self.executorch_weights,
            [sys.executable, "-m", "executorch.examples.models.qwen3_5.convert_weights",
             str(self.checkpoint), str(self.executorch_weights)],
        )
        config = Path(qwen3_5.__file__).parent / "config" / "qwen3_5_xnnpack_fp32.yaml"
        command = [
            sys.executable, "-m", "executorch.extension.llm.export.export_llm", "--config", str(config),
            f"+base.model_class={ET_MODEL_CLASS}",
            f"+base.checkpoint={self.executorch_weights}",
            f"+base.params={self.executorch_params}",
            f"+export.output_dir={self.executorch_dir}",
            f"+export.output_name={self.executorch_pte.name}",
            # Hydra would otherwise leave an outputs/ folder in the working directory.
            f"hydra.run.dir={self.executorch_dir / 'hydra'}",
        ]
        self.build("executorch_export_llm", self.executorch_pte, command, cwd=self.executorch_dir)

    def ensure_gguf(self, llama: llama_cpp.LlamaCpp, threads: int) -> None:
        """The F32 GGUF by llama.cpp's converter, then its Q8_0 and Q4_0 by llama-quantize."""
        self.llama_dir.mkdir(exist_ok=True)
        f32 = self.gguf["llama_f32"]
        for system, file_type in llama_cpp.GGUF_TYPES.items():
            output = self.gguf[system]
            partial = output.with_name(f".{output.name}.partial")
            if system == "llama_f32":
                command = llama_cpp.convert_command(llama, self.checkpoint, partial)
            else:
                command = llama_cpp.quantize_command(llama, f32, partial, file_type, threads)
            self.build(f"gguf_{file_type.lower()}", output, command, writes_to=partial)


def export_command(checkpoint: Path, output: Path, **options) -> list:
    """The child process that exports ``checkpoint`` to ``output`` with ``export_qwen35(**options)``."""
    code = (
        "import json, sys; from gdn_export import export_qwen35; "
        "print(export_qwen35(*sys.argv[1:3], progress=print, **json.loads(sys.argv[3])).describe())"
    )
    return [sys.executable, "-c", code, str(checkpoint), str(output), json.dumps(options)]


def build_checkpoint(folder: str, seed: int, shape: str = "0.8b", dtype: str = "fp32") -> None:
    """A seeded random-weight checkpoint of a benchmark shape (``SHAPES``) with a small byte-level tokenizer,
    written atomically; ``dtype`` (fp32 or bf16) is how its weights are stored, drawn in fp32 either way."""
    import shutil
    import tempfile

    from transformers import Qwen3_5ForCausalLM

    from gdn_export.tiny import build_tokenizer

    folder = Path(folder)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(qwen35_config(shape)).eval()
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        staging.chmod(0o755)
        model.save_pretrained(staging)
        # Our exporter wants a tokenizer.json; token ids of the small tokenizer are a prefix of the model's vocab.
        build_tokenizer().save(str(staging / "tokenizer.json"))
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------
# Timing: one protocol for every system.


@dataclass(frozen=True)
class Plan:
    prompts: tuple
    decode_steps: int
    vocab_size: int
    seed: int
    threads: int


class HFSession:
    """transformers eager with its own cache: the reset/feed surface of ProgramRunner."""

    def __init__(self, checkpoint: Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import Qwen3_5ForCausalLM

        self.device = torch.device(device)
        self.model = Qwen3_5ForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(self.device).eval()
        self.cache = None

    def reset(self) -> None:
        self.cache = None

    def feed(self, tokens: list) -> torch.Tensor:
        with torch.inference_mode():
            output = self.model(
                input_ids=torch.tensor([tokens], device=self.device), past_key_values=self.cache, use_cache=True,
                logits_to_keep=1,
            )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # launches are asynchronous: a timed feed ends when its work does
        self.cache = output.past_key_values
        return output.logits[0, -1]


class ExecuTorchFlowSession:
    """A program from ExecuTorch's export_llm: static ``forward(tokens [1, 1], input_pos [1])``, one token per call."""

    def __init__(self, pte: Path):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (its sdpa / cache ops)
        from executorch.runtime import Runtime

        self.forward = Runtime.get().load_program(pte).load_method("forward")
        self.position = 0

    def reset(self) -> None:
        self.position = 0

    def feed(self, tokens: list) -> torch.Tensor:
        for token in tokens:
            (logits,) = self.forward.execute(
                [torch.tensor([[token]], dtype=torch.long), torch.tensor([self.position], dtype=torch.long)]
            )
            self.position += 1
        return logits.reshape(-1, logits.shape[-1])[-1]


def timed_decode_steps(session, logits, steps: int) -> tuple:
    """Decode ``steps`` tokens greedily from ``logits``, each one-token feed timed: ``(the last logits, ms a step,
    the tokens)``."""
    tokens, times = [], []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        started = time.perf_counter()
        logits = session.feed(tokens[-1:])
        times.append(1e3 * (time.perf_counter() - started))
    return logits, times, tokens


def time_session(session, plan: Plan) -> dict:
    """Prefill tok/s per prompt length (one feed after reset) and decode tok/s (median single-token step)."""
    generator = torch.Generator().manual_seed(plan.seed)

    def random_tokens(count: int) -> list:
        return torch.randint(0, plan.vocab_size, (count,), generator=generator).tolist()

    session.reset()
    # Warm-up with a prompt as long as the first timed one: first calls allocate and
    # pack, and transformers' first long prompt is 20x slower than the next.
    session.feed(random_tokens(min(plan.prompts)))
    session.feed(random_tokens(1))
    prefill = {}
    decode_steps_ms = []
    for index, length in enumerate(plan.prompts):
        session.reset()
        started = time.perf_counter()
        logits = session.feed(random_tokens(length))
        seconds = time.perf_counter() - started
        prefill[str(length)] = length / seconds
        log(f"  prefill {length}: {seconds:.2f} s, {length / seconds:.1f} tok/s")
        if index == 0:
            # Decode right after the first prompt, greedily, as generation does.
            logits, decode_steps_ms, _ = timed_decode_steps(session, logits, plan.decode_steps)
            median = statistics.median(decode_steps_ms)
            log(f"  decode {plan.decode_steps} steps after {length}: median {median:.1f} ms, {1e3 / median:.2f} tok/s")
    if not all(math.isfinite(float(v)) for v in logits.float()[:8]):
        raise RuntimeError("non-finite logits: the benchmark model's activations overflowed")
    return {
        "prefill_tok_s": prefill,
        "decode_tok_s": 1e3 / statistics.median(decode_steps_ms) if decode_steps_ms else None,
        "decode_steps_ms": [round(v, 2) for v in decode_steps_ms],
    }


def open_session(system: str, artifact: str):
    if system == "hf":
        return HFSession(Path(artifact))
    if system == "executorch":
        return ExecuTorchFlowSession(Path(artifact))
    from gdn_export.runner import ProgramRunner

    return ProgramRunner(artifact)


def use_threads(system: str, threads: int) -> None:
    """Every system computes on ``threads`` threads: transformers on PyTorch's intra-op pool, the programs on
    ExecuTorch's (XNNPACK's and our kernels'). A program's process keeps PyTorch, which only picks the next
    token there, to one thread, as gdn-run does (``gdn_export.runner.leave_the_cores_to_programs``)."""
    x86_isa.apply_requested()  # before ExecuTorch's libraries load: XNNPACK reads the CPU's features once
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    from gdn_export.runner import leave_the_cores_to_programs

    _unsafe_reset_threadpool(threads)
    if system == "hf":
        torch.set_num_threads(threads)
    else:
        leave_the_cores_to_programs()


def measure(system: str, artifact: str, plan: Plan) -> dict:
    """Load one system and time it (runs in a fresh interpreter)."""
    # The machine is shared: the 1-minute load average says how quiet it was.
    load_before = os.getloadavg()[0]
    use_threads(system, plan.threads)
    started = time.perf_counter()
    session = open_session(system, artifact)
    load_seconds = time.perf_counter() - started
    log(f"  loaded in {load_seconds:.1f} s")
    timings = time_session(session, plan)
    return {
        "load_seconds": load_seconds, "threads": plan.threads, "load_average": [load_before, os.getloadavg()[0]],
        **timings,
    }


def measure_in_child(system: str, artifact: Path, plan: Plan) -> dict:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(measure, system, str(artifact), plan).result()


def measure_in_runner(runner: Path, program: Path, tokenizer: Path, plan: Plan) -> dict:
    """Our program in the C++ runner (``--runner``), ``time_session``'s protocol in the runner's terms: for each
    prompt length a process that runs it twice from an empty state, the first untimed; the second gives the prefill
    tok/s, and after the first length the decode tok/s (its median step of ``plan.decode_steps``)."""
    load_before = os.getloadavg()[0]
    prefill, decode, load_seconds = {}, None, None
    for index, length in enumerate(plan.prompts):
        new_tokens = plan.decode_steps + 1 if index == 0 else 1  # the first token comes from the prefill
        command = runner_timing.runner_command(runner, program, tokenizer, prompt_tokens=length, new_tokens=new_tokens,
                                               prefill_chunk=None, runs=2, seed=plan.seed, threads=plan.threads)
        untimed, timed = runner_timing.run_runner(command, 2)
        prefill[str(length)] = length / timed["prefill_seconds"]
        log(f"  prefill {length}: {timed['prefill_seconds']:.2f} s, {prefill[str(length)]:.1f} tok/s")
        if index == 0:
            load_seconds = untimed["load_seconds"]
            decode = 1 / timed["decode_median_step_seconds"]
            log(f"  decode {plan.decode_steps} steps after {length}: median "
                f"{1e3 * timed['decode_median_step_seconds']:.1f} ms, {decode:.2f} tok/s")
    return {"load_seconds": load_seconds, "threads": plan.threads, "runner": str(runner),
            "load_average": [load_before, os.getloadavg()[0]], "prefill_tok_s": prefill, "decode_tok_s": decode}


# ---------------------------------------------------------------------------
# Quality: how far each quantized program's next-token distributions are from the fp32 model's.


def quality_tokens(checkpoint: Path, count: int = KL_TOKENS) -> list:
    """The first ``count`` tokens of the built-in text, repeated as needed, in the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    from gdn_export.tiny import CORPUS

    ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(CORPUS).ids
    return (ids * (count // len(ids) + 1))[:count]


def measure_kl(checkpoint: str, programs: dict, threads: int) -> dict:
    """Mean KL(fp32 || program) of the next-token distribution at each position of ``quality_tokens``, and the
    share of positions whose most likely token agrees (runs in a fresh interpreter).

    The reference is our eager fp32 model over the whole text in one call; each
    program is fed the same text one token a call (it returns the last position's logits).
    """
    x86_isa.apply_requested()
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    from gdn_export import load_qwen35, rewrite
    from gdn_export.runner import ProgramRunner

    torch.set_num_threads(threads)
    _unsafe_reset_threadpool(threads)
    tokens = quality_tokens(Path(checkpoint))
    model = rewrite(load_qwen35(checkpoint, max_seq_len=len(tokens)), backend="xnnpack")
    model.all_logits = True
    with torch.inference_mode():
        reference = torch.log_softmax(model(torch.tensor([tokens]), torch.tensor([0]))[0].float(), dim=-1)
    del model
    scores = {}
    for system, program in programs.items():
        runner = ProgramRunner(program)
        runner.reset()
        divergences, agreements = [], 0
        for position, token in enumerate(tokens):
            log_probs = torch.log_softmax(runner.feed([token]).float(), dim=-1)
            expected = reference[position]
            divergences.append(float((expected.exp() * (expected - log_probs)).sum()))
            agreements += int(log_probs.argmax() == expected.argmax())
        del runner
        scores[system] = {
            "mean_kl": statistics.fmean(divergences), "top1_agreement": agreements / len(tokens), "tokens": len(tokens),
            # The same positions as llama-perplexity's score, for the side-by-side table.
            "mean_kl_llama_positions": statistics.fmean(divergences[p] for p in LLAMA_KL_POSITIONS),
        }
        log(f"  {system}: mean KL {scores[system]['mean_kl']:.4f}, same top token {agreements / len(tokens):.1%}")
    return scores


# ---------------------------------------------------------------------------
# llama.cpp (``--llama-cpp``): its tools time and score its GGUF files of the same checkpoint.


def run_tool(command: list) -> subprocess.CompletedProcess:
    """Run one of llama.cpp's tools, its output captured; an error with the end of its output if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done


def measure_llama(llama: llama_cpp.LlamaCpp, gguf: Path, plan: Plan, repetitions: int) -> dict:
    """llama-bench's prefill tok/s at each prompt length and decode tok/s after the first (median of repetitions)."""
    load_before = os.getloadavg()[0]
    commands = llama_cpp.bench_commands(llama, gguf, plan.prompts, plan.decode_steps, plan.threads, repetitions)
    entry = llama_cpp.parse_bench([run_tool(command).stdout for command in commands])  # JSON on stdout, logs on stderr
    for length, rate in entry["prefill_tok_s"].items():
        log(f"  prefill {length}: {rate:.1f} tok/s")
    log(f"  decode {plan.decode_steps} tokens after {plan.prompts[0]}: {entry['decode_tok_s']:.2f} tok/s")
    return {**entry, "threads": plan.threads, "load_average": [load_before, os.getloadavg()[0]]}


def measure_llama_kl(llama: llama_cpp.LlamaCpp, workdir: Workdir, threads: int) -> dict:
    """llama-perplexity's mean KL(F32 || Q) of Q8_0 and Q4_0 over our KL text's first KL_TOKENS tokens, one
    context without BOS, scored at LLAMA_KL_POSITIONS; refuses to score if llama.cpp tokenizes the text
    differently from our tokenizer."""
    from tokenizers import Tokenizer

    # llama-perplexity wants twice the context's tokens of text even for its one chunk.
    tokens = quality_tokens(workdir.checkpoint, 2 * KL_TOKENS)
    text = workdir.llama_dir / "kl_text.txt"
    write_atomically(text, Tokenizer.from_file(str(workdir.tokenizer)).decode(tokens).encode())
    base = workdir.llama_dir / "kl_base_f32.bin"
    run_tool(llama_cpp.perplexity_base_command(llama, workdir.gguf["llama_f32"], text, base, KL_TOKENS, threads))
    evaluated = llama_cpp.base_tokens(base)
    if evaluated != tokens[:KL_TOKENS]:
        first = next((i for i, (a, b) in enumerate(zip(evaluated, tokens)) if a != b), min(len(evaluated), KL_TOKENS))
        raise RuntimeError(f"llama.cpp tokenized the KL text differently from our tokenizer (from token {first} "
                           f"on), so its KL would not be over the same tokens")
    scores = {}
    for system in dict.fromkeys(llama for _, _, llama in KL_PAIRS):
        done = run_tool(llama_cpp.perplexity_kl_command(llama, workdir.gguf[system], base, KL_TOKENS, threads))
        scores[system] = {**llama_cpp.parse_kl(done.stdout + done.stderr), "tokens": len(LLAMA_KL_POSITIONS)}
        log(f"  {system}: mean KL {scores[system]['mean_kl']:.4f} over positions {LLAMA_KL_POSITIONS.start}-"
            f"{LLAMA_KL_POSITIONS.stop - 1}")
    return scores


# ---------------------------------------------------------------------------
# Prompt cache (``--prompt-cache``): time to first token for a shared prefix plus
# a question, with the prefix's state restored from a file or prefilled again.


@dataclass(frozen=True)
class CachePlan:
    prefix: int
    question: int
    rounds: int
    vocab_size: int
    seed: int
    threads: int


def time_prompt_cache(artifact: str, plan: CachePlan, cache_path: str) -> dict:
    """TTFT (prompt in, first token sampled) of ``plan.rounds`` questions after one shared prefix, uncached
    (one feed of the whole prompt) and cached (``Session.feed_with_prompt_cache`` from a file of the prefix's
    state), and the state file's size and save and load times."""
    from gdn_export.runner import ProgramRunner
    from gdn_export.session import Session

    generator = torch.Generator().manual_seed(plan.seed)

    def random_tokens(count: int) -> list:
        return torch.randint(0, plan.vocab_size, (count,), generator=generator).tolist()

    from gdn_export.runner import RunnerError

    started = time.perf_counter()
    try:
        session = Session(ProgramRunner(artifact))
    except RunnerError as error:
        raise RuntimeError(f"{error} (delete {artifact} and run again to rebuild it)") from None
    log(f"  loaded in {time.perf_counter() - started:.1f} s")
    session.feed(random_tokens(plan.question))  # warm-up: first calls allocate and pack
    prefix = random_tokens(plan.prefix)
    session.reset()
    session.feed(prefix)
    started = time.perf_counter()
    size = session.save(cache_path)
    save_seconds = time.perf_counter() - started
    log(f"  state file {size / 2**20:.1f} MiB, saved in {save_seconds:.3f} s")
    uncached, cached, loads, same_first, logits_gap = [], [], [], [], []
    for _ in range(plan.rounds):
        prompt = prefix + random_tokens(plan.question)
        session.reset()
        started = time.perf_counter()
        expected = int(session.feed(prompt).argmax())
        uncached.append(time.perf_counter() - started)
        reference = session.logits.clone()
        session.reset()
        started = time.perf_counter()
        reused = session.feed_with_prompt_cache(prompt, cache_path)
        first = int(session.logits.argmax())
        cached.append(time.perf_counter() - started)
        if reused != plan.prefix:
            raise RuntimeError(f"the prompt cache reused {reused} tokens, expected the {plan.prefix} of the prefix")
        same_first.append(first == expected)
        logits_gap.append(float((session.logits.float() - reference.float()).abs().max()))
        session.reset()
        started = time.perf_counter()
        session.load(cache_path)
        loads.append(time.perf_counter() - started)
        log(f"  TTFT uncached {uncached[-1]:.2f} s, cached {cached[-1]:.3f} s (load {loads[-1]:.3f} s)")
    return {
        "prefix": plan.prefix, "question": plan.question, "rounds": plan.rounds,
        "ttft_uncached_s": statistics.median(uncached), "ttft_cached_s": statistics.median(cached),
        "state_file_bytes": size, "save_s": save_seconds, "load_s": statistics.median(loads),
        "first_token_equal": all(same_first), "max_logits_gap": max(logits_gap),
    }


def measure_prompt_cache(artifact: str, plan: CachePlan, cache_path: str) -> dict:
    """``time_prompt_cache`` with the plan's threads (runs in a fresh interpreter)."""
    load_before = os.getloadavg()[0]
    use_threads("ours", plan.threads)
    timings = time_prompt_cache(artifact, plan, cache_path)
    return {**timings, "threads": plan.threads, "load_average": [load_before, os.getloadavg()[0]]}


def prompt_cache_report(entry: dict) -> str:
    """The markdown table of a ``--prompt-cache`` run, with the issue's floor."""
    ratio_value = entry["ttft_cached_s"] / entry["ttft_uncached_s"]
    load = " to ".join(f"{value:.1f}" for value in entry["load_average"])
    return "\n".join([
        f"| prompt (prefix + question) | TTFT uncached s | TTFT cached s | cached / uncached | floor | met | "
        "state file MiB | save s | load s | first token equal (max logits gap) | threads | measured (load average) |",
        "|---" * 12 + "|",
        f"| {entry['prefix']} + {entry['question']} | {entry['ttft_uncached_s']:.2f} | {entry['ttft_cached_s']:.3f} "
        f"| {ratio_value:.3f}x | {PROMPT_CACHE_FLOOR}x | {'yes' if ratio_value <= PROMPT_CACHE_FLOOR else 'NO'} "
        f"| {entry['state_file_bytes'] / 2**20:.1f} | {entry['save_s']:.3f} | {entry['load_s']:.3f} "
        f"| {'yes' if entry['first_token_equal'] else 'NO'} ({entry['max_logits_gap']:.1e}) | {entry['threads']} "
        f"| {entry['measured_at']} ({load}) |",
    ])


def run_prompt_cache(args, workdir: Workdir) -> int:
    workdir.ensure_ours("ours")
    plan = CachePlan(args.cache_prefix, args.cache_question, args.cache_rounds, QWEN35_0_8B["vocab_size"],
                     args.seed, args.threads)
    log(f"ours: prompt cache, {plan.prefix}-token prefix + {plan.question}-token questions, {plan.rounds} rounds")
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        entry = pool.submit(measure_prompt_cache, str(workdir.ours["ours"]), plan,
                            str(workdir.root / "prompt_cache.state")).result()
    entry["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
    results = read_json(workdir.results_path)
    results["prompt_cache"] = entry
    write_json(workdir.results_path, results)
    table = prompt_cache_report(entry)
    print(table)
    if args.markdown is not None:
        write_atomically(args.markdown, (table + "\n").encode())
    return 0


# ---------------------------------------------------------------------------
# Interleaved decode: the machine's memory bandwidth drifts by tens of percent
# over minutes, and decode is bound by it, so two systems timed one after the
# other can differ by the drift alone. Here each system lives in its own process,
# all loaded at once, and they take turns: a few decode steps each, round after
# round, while the others wait.


def decode_turns(system: str, artifact: str, plan: Plan, connection) -> None:
    """Child: load, prefill the first prompt, then run the decode steps each turn asks for and send their times.

    A turn is ``(steps, from_prompt)``: going on from where the last turn stopped, or from the prompt again,
    prefilled untimed, so that every turn decodes at the same depth (as llama-bench's ``-d`` does)."""
    use_threads(system, plan.threads)
    session = open_session(system, artifact)
    generator = torch.Generator().manual_seed(plan.seed)
    prompt = torch.randint(0, plan.vocab_size, (plan.prompts[0],), generator=generator).tolist()
    session.reset()
    logits = session.feed(prompt)
    connection.send("ready")
    while (turn := connection.recv()) is not None:
        steps, from_prompt = turn
        if from_prompt:
            session.reset()
            logits = session.feed(prompt)
        logits, times, _ = timed_decode_steps(session, logits, steps)
        connection.send(times)


@contextlib.contextmanager
def decoding_workers(artifacts: dict, plan: Plan) -> Iterator[dict]:
    """``{system: connection}`` to one ``decode_turns`` process per program, each loaded and prefilled in turn
    (one load at a time: the peaks of memory do not add up); all told to stop on the way out."""
    context = get_context("spawn")
    workers = {}
    try:
        for system, artifact in artifacts.items():
            parent, child = context.Pipe()
            process = context.Process(target=decode_turns, args=(system, str(artifact), plan, child))
            process.start()
            workers[system] = (process, parent)
            if parent.recv() != "ready":
                raise RuntimeError(f"decode turns: {system} did not start")
            log(f"  decode turns: {system} loaded")
        yield {system: connection for system, (_, connection) in workers.items()}
    finally:
        for process, connection in workers.values():
            if process.is_alive():
                connection.send(None)
                process.join(timeout=60)


def worker_turn(connection, steps: int) -> float:
    """One decode turn of a ``decode_turns`` process: ``steps`` tokens after its prompt, prefilled again; tok/s."""
    connection.send((steps, True))
    return 1e3 * steps / sum(connection.recv())


def runner_turn(runner: Path, program: Path, tokenizer: Path, plan: Plan) -> float:
    """One decode turn in the C++ runner: a process that prefills the first prompt and decodes ``plan.decode_steps``
    tokens after it; tok/s."""
    command = runner_timing.runner_command(runner, program, tokenizer, prompt_tokens=plan.prompts[0],
                                           new_tokens=plan.decode_steps + 1, prefill_chunk=None, runs=1,
                                           seed=plan.seed, threads=plan.threads)
    (run,) = runner_timing.run_runner(command, 1)
    return run["decode_steps"] / run["decode_seconds"]


def alternated_with_llama(artifacts: dict, ggufs: dict, llama: llama_cpp.LlamaCpp, plan: Plan, rounds: int,
                          runner: Optional[Path] = None, tokenizer: Optional[Path] = None) -> dict:
    """Decode tok/s of our programs (``artifacts``) and llama.cpp's files (``ggufs``) in alternation: each round,
    every system decodes ``plan.decode_steps`` tokens after the first prompt, one after the other (ours in its
    process, loaded once, or with ``runner`` (the C++ runner, given the checkpoint's ``tokenizer``) in a runner
    process each turn; llama.cpp in one llama-bench run at that depth). A system's rate is the median over rounds
    of its turn's tokens per second, so both sides meet the host's drift in the same rounds.
    Returns ``{system: {"decode_tok_s": median, "turns_tok_s": [...]}}``."""
    turns = {system: [] for system in (*artifacts, *ggufs)}
    with decoding_workers({} if runner else artifacts, plan) as workers:
        if runner is None:
            ours = {system: functools.partial(worker_turn, connection, plan.decode_steps)
                    for system, connection in workers.items()}
        else:
            ours = {system: functools.partial(runner_turn, runner, Path(program), tokenizer, plan)
                    for system, program in artifacts.items()}
        for round_index in range(rounds):
            for system, turn in ours.items():
                turns[system].append(turn())
            for system, gguf in ggufs.items():
                command = llama_cpp.decode_turn_command(llama, gguf, plan.prompts[0], plan.decode_steps, plan.threads)
                turns[system].append(llama_cpp.parse_bench([run_tool(command).stdout])["decode_tok_s"])
            log(f"  round {round_index + 1}: " + ", ".join(f"{s} {rates[-1]:.1f}" for s, rates in turns.items()))
    return {system: {"decode_tok_s": statistics.median(rates), "turns_tok_s": rates}
            for system, rates in turns.items()}


def interleaved_decode(artifacts: dict, plan: Plan, rounds: int, steps: int) -> dict:
    """Median decode step (ms) and tok/s of each system, the systems taking turns of ``steps`` steps."""
    times = {system: [] for system in artifacts}
    with decoding_workers(artifacts, plan) as workers:
        for _ in range(rounds):
            for system, connection in workers.items():
                connection.send((steps, False))
                times[system] += connection.recv()
    return {
        system: {"decode_tok_s": 1e3 / statistics.median(steps_ms), "decode_steps_ms": [round(v, 2) for v in steps_ms]}
        for system, steps_ms in times.items()
    }


# ---------------------------------------------------------------------------
# Memory floor: weight bytes read per decoded token over the copy bandwidth.


def memory_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 5, device: str = "cpu") -> dict:
    """Best-of-``repeats`` bandwidth of a large tensor copy (bytes read + written) and of a sum (bytes read),
    in the memory of ``device`` (``cuda``: the GPU's, each timing ending when the GPU's work does)."""
    torch.set_num_threads(threads)
    source = torch.ones(nbytes // 4, device=device)
    target = torch.empty_like(source)
    synchronize = torch.cuda.synchronize if source.is_cuda else (lambda: None)

    def best_seconds(work: Callable[[], object]) -> float:
        work()  # the first call pays for the kernel's loading, on a GPU
        best = math.inf
        for _ in range(repeats):
            synchronize()
            started = time.perf_counter()
            work()
            synchronize()
            best = min(best, time.perf_counter() - started)
        return best

    return {
        "copy_bandwidth_bytes_s": 2 * nbytes / best_seconds(lambda: target.copy_(source)),
        "read_bandwidth_bytes_s": nbytes / best_seconds(source.sum),
    }


def recurrent_state_traffic(config: dict, state_bytes: int = 4) -> int:
    """Bytes a decode step moves through the Gated DeltaNet layers' states (conv and recurrent), each read and
    written once: fp32 in every system, llama.cpp's included, but the recurrent state of our quantized programs,
    float16 (``state_bytes`` 2: export_qwen35's --state-dtype default for them)."""
    layers = sum(kind == "linear_attention" for kind in config["layer_types"])
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    state = config["linear_num_value_heads"] * config["linear_key_head_dim"] * config["linear_value_head_dim"]
    conv_state = (2 * keys + values) * (config["linear_conv_kernel_dim"] - 1)
    return 2 * layers * (state_bytes * state + 4 * conv_state)


def system_state_traffic(system: str) -> int:
    """``recurrent_state_traffic`` of the bench's checkpoint in ``system``."""
    return recurrent_state_traffic(QWEN35_0_8B, 2 if OURS.get(system, "none") != "none" else 4)


def decode_weight_bytes(checkpoint: Path) -> int:
    """fp32 bytes of the weights every decode step reads: all parameters, the tied embedding once (as lm_head)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                total += math.prod(view.get_shape()) * 4
    return total


def decode_read_bytes(workdir: "Workdir", llama: Optional[llama_cpp.LlamaCpp]) -> dict:
    """The weight bytes each of our programs and llama.cpp's quantized files on disk streams a decode step (see
    ``report``): a program's file but what only its token lookup reads, a GGUF's tensors but an untied table."""
    from gdn_export.quantize import lookup_only_bytes

    config = QWEN35_0_8B  # the bench's checkpoint
    streamed = {
        system: path.stat().st_size - lookup_only_bytes(
            OURS[system], config["vocab_size"], config["hidden_size"], config["tie_word_embeddings"])
        for system, path in workdir.ours.items() if path.is_file()
    }
    if llama is not None:
        streamed.update({system: llama_cpp.decode_read_bytes(llama, path)
                         for system, path in workdir.gguf.items() if system not in FP32_SYSTEMS and path.is_file()})
    return streamed


# ---------------------------------------------------------------------------
# Report.


def ratio(results: dict, numerator: str, denominator: str, measure_name: str) -> Optional[float]:
    def value(system):
        entry = results.get(system)
        if not entry:
            return None
        if measure_name == "decode":
            return entry.get("decode_tok_s")
        return entry.get("prefill_tok_s", {}).get(measure_name.split()[1])

    top, bottom = value(numerator), value(denominator)
    return top / bottom if top and bottom else None


def _kl(entry: Optional[dict], key: str) -> str:
    return "-" if not entry or entry.get(key) is None else f"{entry[key]:.4f}"


def format_rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def short_rate(value: float) -> str:
    """A bar's label, short: 76086.5 -> 76.1k, 323.04 -> 323, 19.91 -> 19.9."""
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def decode_targets_among(systems) -> list:
    """``(numerator, denominator, least)`` of each decode target whose two systems are both among ``systems``."""
    return [(numerator, denominator, least) for numerator, denominator, measure_name, least in TARGETS
            if measure_name == "decode" and {numerator, denominator} <= set(systems)]


def floor_verdict(value: float, least: float) -> str:
    return "met" if value >= least else "NOT met"


def report(results: dict, builds: dict, floor: dict, prompts: tuple, sizes: Optional[dict] = None,
           read_bytes: Optional[dict] = None) -> str:
    """The markdown tables: tok/s, ratios against the issue's floors, sizes against llama.cpp's files
    (``sizes``: bytes by system), quality, and build costs. ``read_bytes`` (by system) are the weight bytes
    a system's decode step streams; each system's memory floor is the copy bandwidth over them (an fp32
    system without them: over the checkpoint's fp32 weights)."""
    state = recurrent_state_traffic(QWEN35_0_8B)
    read_floor = floor["read_bandwidth_bytes_s"] / (floor["weight_bytes"] + state)
    streamed = {system: weights + system_state_traffic(system) for system, weights in
                {**{system: floor["weight_bytes"] for system in FP32_SYSTEMS}, **(read_bytes or {})}.items()}

    def floor_tok_s(system: str) -> Optional[float]:
        return floor["copy_bandwidth_bytes_s"] / streamed[system] if system in streamed else None

    lines = [
        f"A decode step reads {floor['weight_bytes'] / 1e9:.2f} GB of fp32 weights and moves "
        f"{state / 1e9:.3f} GB of recurrent state (read and written; our quantized programs keep it in float16, "
        f"{system_state_traffic('ours_8da4w') / 1e9:.3f} GB). Copy bandwidth "
        f"{floor['copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (read + written): fp32 memory floor "
        f"{floor['floor_tok_s']:.2f} tok/s. Read bandwidth (a sum) "
        f"{floor['read_bandwidth_bytes_s'] / 1e9:.1f} GB/s: {read_floor:.2f} tok/s. Each system's floor "
        "is the copy bandwidth over its step's bytes: the weights it reads (where its file is measured, the file "
        "but what only the token lookup reads) and the state; decode / floor is the share of it a system reaches.",
        "",
        "| system | " + " | ".join(f"prefill {p} tok/s" for p in prompts)
        + " | decode tok/s | GB a step | decode / floor | threads | measured (load average) |",
        "|---" * (len(prompts) + 6) + "|",
    ]
    for system in REPORTED:
        entry = results.get(system)
        if not entry:
            continue
        prefill = [format_rate(entry["prefill_tok_s"].get(str(p))) for p in prompts]
        decode = entry.get("decode_tok_s")
        step_floor = floor_tok_s(system)
        share = f"{decode / step_floor:.2f}" if decode and step_floor else "-"
        gigabytes = f"{streamed[system] / 1e9:.3f}" if system in streamed else "-"
        load = " to ".join(f"{value:.1f}" for value in entry.get("load_average", ()))
        threads = f"{entry.get('threads', '-')}" + (", C++ runner" if "runner" in entry else "")
        lines.append(
            f"| {SYSTEM_LABELS[system]} | " + " | ".join(prefill) + f" | {format_rate(decode)} | {gigabytes} "
            f"| {share} | {threads} | {entry['measured_at']} ({load}) |"
        )
    lines += ["", "| target | ratio | floor | met | the floor asks of the numerator's memory floor |",
              "|---|---|---|---|---|"]
    for numerator, denominator, measure_name, least in TARGETS:
        if numerator not in results or denominator not in results:
            continue  # a pair not measured (llama.cpp without --llama-cpp, say)
        value = ratio(results, numerator, denominator, measure_name)
        shown = "-" if value is None else f"{value:.2f}x"
        met = "-" if value is None else "yes" if value >= least else "NO"
        # Above 1.0 of the numerator's memory floor, a decode floor asks more than the bench's bandwidth test
        # reached (a system can still get there: llama.cpp's F32 once read 1.04 of its floor, docs/benchmarks.md).
        asked = "-"
        theirs, step_floor = results[denominator].get("decode_tok_s"), floor_tok_s(numerator)
        if measure_name == "decode" and theirs and step_floor:
            asked = f"{least * theirs / step_floor:.2f}"
        lines.append(f"| {measure_name}: {numerator} / {denominator} | {shown} | {least}x | {met} | {asked} |")
    interleaved = results.get("interleaved_decode")
    if interleaved:
        systems = [system for system in SYSTEMS if system in interleaved["systems"]]
        lines += [
            "",
            f"Decode interleaved ({interleaved['rounds']} rounds of {interleaved['steps']} steps, the systems taking "
            f"turns; {interleaved['measured_at']}):",
            "",
            "| system | decode tok/s (median step) |",
            "|---|---|",
        ]
        lines += [f"| {SYSTEM_LABELS[s]} | {format_rate(interleaved['systems'][s]['decode_tok_s'])} |" for s in systems]
        for numerator, denominator, least in decode_targets_among(systems):
            value = interleaved["systems"][numerator]["decode_tok_s"] / interleaved["systems"][denominator]["decode_tok_s"]
            lines.append(f"\ninterleaved decode {numerator} / {denominator}: {value:.2f}x "
                         f"(floor {least}x: {floor_verdict(value, least)})")
    alternated = results.get("llama_alternated")
    if alternated:
        systems = [system for system in REPORTED if system in alternated["systems"]]
        lines += [
            "",
            f"Decode alternated with llama.cpp ({alternated['rounds']} rounds; in each, every system decodes "
            f"{alternated['tokens']} tokens after {alternated['depth']}, one after the other; "
            f"{alternated['measured_at']}):",
            "",
            "| system | decode tok/s (median turn) | turns: slowest to fastest |",
            "|---|---|---|",
        ]
        for system in systems:
            entry = alternated["systems"][system]
            lines.append(f"| {SYSTEM_LABELS[system]} | {format_rate(entry['decode_tok_s'])} | "
                         f"{format_rate(min(entry['turns_tok_s']))} to {format_rate(max(entry['turns_tok_s']))} |")
        for numerator, denominator, least in decode_targets_among(systems):
            ours, theirs = alternated["systems"][numerator], alternated["systems"][denominator]
            value = ours["decode_tok_s"] / theirs["decode_tok_s"]
            rounds = [a / b for a, b in zip(ours["turns_tok_s"], theirs["turns_tok_s"])]
            lines.append(f"\nalternated decode {numerator} / {denominator}: {value:.2f}x (floor {least}x: "
                         f"{floor_verdict(value, least)}; round by round {min(rounds):.2f}x to {max(rounds):.2f}x)")
    quality = results.get("quality")
    if quality:
        lines += [
            "",
            f"| program | mean KL from fp32 ({KL_TOKENS} tokens) | same top token | measured |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {SYSTEM_LABELS[s]} | {quality[s]['mean_kl']:.4f} | {100 * quality[s]['top1_agreement']:.1f}% "
            f"| {quality[s]['measured_at']} |"
            for s in SYSTEMS if s in quality
        ]
        pairs = [(bits, ours, llama) for bits, ours, llama in KL_PAIRS if ours in quality or llama in quality]
        if any(llama in quality for _, _, llama in pairs):
            window = f"positions {LLAMA_KL_POSITIONS.start}-{LLAMA_KL_POSITIONS.stop - 1}"
            lines += [
                "",
                f"| weights | ours | ours: mean KL, all {KL_TOKENS} positions | ours: mean KL, {window} | llama.cpp "
                f"| llama.cpp: mean KL, {window} (± s.e.) | ours / llama.cpp ({window}) | ours ≤ llama.cpp |",
                "|---" * 8 + "|",
            ]
            for bits, ours, llama in pairs:
                mine, theirs = quality.get(ours), quality.get(llama)
                windowed = mine.get("mean_kl_llama_positions") if mine else None
                versus = windowed / theirs["mean_kl"] if windowed is not None and theirs and theirs["mean_kl"] else None
                stderr = f" ± {theirs['mean_kl_stderr']:.1e}" if theirs else ""
                lines.append(
                    f"| {bits} | {SYSTEM_LABELS[ours]} | {_kl(mine, 'mean_kl')} | {_kl(mine, 'mean_kl_llama_positions')} "
                    f"| {SYSTEM_LABELS[llama]} | {_kl(theirs, 'mean_kl')}{stderr} "
                    f"| {'-' if versus is None else f'{versus:.2f}x'} | {'-' if versus is None else 'yes' if versus <= 1 else 'NO'} |"
                )
    if sizes:
        rows = [(ours, llama, least) for ours, llama, least in SIZE_FLOOR if ours in sizes and llama in sizes]
        if rows:
            lines += ["", "| program | size MiB | llama.cpp file | size MiB | ratio | floor | met |", "|---" * 7 + "|"]
            for ours, llama, least in rows:
                value = sizes[ours] / sizes[llama]
                lines.append(
                    f"| {SYSTEM_LABELS[ours]} | {sizes[ours] / 2**20:.1f} | {SYSTEM_LABELS[llama]} "
                    f"| {sizes[llama] / 2**20:.1f} | {value:.2f}x | {least}x | {'yes' if value <= least else 'NO'} |"
                )
    if builds:
        lines += [
            "",
            f"| build step | wall s | peak RSS GiB | peak RSS / fp32 weights ({floor['weight_bytes'] / 2**30:.2f} GiB) "
            "| output GiB |",
            "|---|---|---|---|---|",
        ]
        for name, entry in builds.items():
            lines.append(
                f"| {name} | {entry['seconds']:.0f} | {entry['peak_rss_bytes'] / 2**30:.2f} | "
                f"{entry['peak_rss_bytes'] / floor['weight_bytes']:.1f}x | {entry['size_bytes'] / 2**30:.2f} |"
            )
    return "\n".join(lines)


def draw_rates(axes, rows: dict, prompts: tuple, line: Optional[tuple] = None) -> None:
    """Grouped bars on ``axes`` (log scale): ``rows`` maps a label to its results entry (``prefill_tok_s`` by
    prompt, ``decode_tok_s``); ``line`` = (tok/s, label) is drawn across the decode group."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    measures = [f"prefill {p}" for p in prompts] + ["decode"]
    width = 0.8 / max(len(rows), 1)
    for index, (label, entry) in enumerate(rows.items()):
        values = [entry["prefill_tok_s"].get(str(p)) for p in prompts] + [entry.get("decode_tok_s")]
        positions = [m + (index - (len(rows) - 1) / 2) * width for m in range(len(measures))]
        bars = axes.bar(positions, [v or 0 for v in values], width, label=label)
        axes.bar_label(bars, labels=[short_rate(v) if v else "" for v in values], fontsize=7)
    if line is not None:
        decode = len(measures) - 1
        axes.hlines(line[0], decode - 0.45, decode + 0.45, colors="black", linestyles="dashed", label=line[1])
    axes.set_xticks(range(len(measures)), measures)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(ScalarFormatter())
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_ylabel("tokens / s (log scale)")
    # Below the bars: inside, matplotlib's best place covered the decode line.
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08))


def save_figure(figure, path: Path) -> None:
    """``figure`` as a PNG at ``path``, written atomically, and closed."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=120)
    write_atomically(path, png.getvalue())
    plt.close(figure)


def plot(results: dict, prompts: tuple, floor: dict, path: Path) -> None:
    """Grouped bars (log scale): tok/s of each system at each prefill length and for decode, with the decode floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in REPORTED if s in results]
    figure, axes = plt.subplots(figsize=(10, 5))
    draw_rates(axes, {SYSTEM_LABELS[system]: results[system] for system in systems}, prompts,
               (floor["floor_tok_s"], f"fp32 decode memory floor ({floor['floor_tok_s']:.1f} tok/s)"))
    threads = sorted({str(results[s].get("threads", "?")) for s in systems})
    axes.set_title(f"Qwen3.5-0.8B shape, random weights, CPU, {'/'.join(threads)} thread(s)")
    save_figure(figure, path)


# ---------------------------------------------------------------------------
# Command line.


def _int_list(text: str) -> tuple:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _systems(text: str) -> tuple:
    # Either device's systems; each device's run refuses the other's.
    known = SYSTEMS + tuple(name for name in CUDA_SHARED_DEFAULTS["only"] if name not in SYSTEMS)
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"takes names from {', '.join(known)}, got {text!r}")
    return names


def _optional_systems(text: str) -> tuple:
    return _systems(text) if text.strip() else ()


# The defaults of the options both devices take; None in the parser, so that run() can tell them from a choice.
CPU_DEFAULTS = {"workdir": Path("build/e2e"), "only": SYSTEMS, "prompts": (128, 512, 2048), "decode_steps": 32}
# The same for --device cuda (gdn_bench.e2e_cuda), whose systems are ours (also with decode as a CUDA graph) and
# transformers + fla-core.
CUDA_SHARED_DEFAULTS = {"workdir": Path("build/e2e_cuda"), "only": ("ours", "ours_graph", "hf"),
                        "prompts": (512, 2048, 8192), "decode_steps": 128}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, the options both devices take, and those of the CPU benchmark (``gdn_bench.e2e_cli`` adds
    --device cuda's own)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the 0.8B shape against transformers, ExecuTorch's flow and llama.cpp; cuda: "
                             "the 0.8B and 4B shapes in bf16 through ExecuTorch's CUDA runtime against transformers "
                             "with fla-core (gdn_bench/e2e_cuda.py) (default %(default)s)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help=f"artifacts and results, reused across runs (default {CPU_DEFAULTS['workdir']}, "
                             f"with --device cuda {CUDA_SHARED_DEFAULTS['workdir']})")
    parser.add_argument("--only", type=_systems, default=None,
                        help=f"systems to build and time this run, comma-separated (default "
                             f"{','.join(CPU_DEFAULTS['only'])}; with --device cuda "
                             f"{','.join(CUDA_SHARED_DEFAULTS['only'])}, the only ones it takes)")
    parser.add_argument("--prompts", type=_int_list, default=None,
                        help=f"prefill prompt lengths; decode is timed after the first (default "
                             f"{_csv(CPU_DEFAULTS['prompts'])}, with --device cuda "
                             f"{_csv(CUDA_SHARED_DEFAULTS['prompts'])})")
    parser.add_argument("--executorch-prompts", type=_int_list, default=(128,),
                        help="prompt lengths for ExecuTorch's flow, which prefills one token per call "
                             "(default %(default)s)")
    parser.add_argument("--decode-steps", type=int, default=None,
                        help=f"timed decode steps (default {CPU_DEFAULTS['decode_steps']}, with --device cuda "
                             f"{CUDA_SHARED_DEFAULTS['decode_steps']})")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for every system (default: the CPU count, %(default)s); on a busy machine "
                             "fewer threads than cores avoids threads waiting on each other")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompt tokens (default %(default)s)")
    parser.add_argument("--runner", type=Path, default=None,
                        help="the C++ runner (python -m examples.cpp_runner.build). --device cuda: it times our "
                             "program (default build/cpp_runner/gdn_cpp_runner). --device cpu: if given, it times our "
                             "programs, on --threads threads, instead of ExecuTorch's Python runtime: as an app runs "
                             "them, and where that runtime cannot load beside the machine's torch")
    parser.add_argument("--interleave", type=_optional_systems, default=("ours", "executorch"),
                        help="systems whose decode is also timed in turns, all loaded at once, among those of --only "
                             "(default %(default)s; an empty string skips it)")
    parser.add_argument("--interleave-rounds", type=int, default=8, help="turns per system (default %(default)s)")
    parser.add_argument("--llama-rounds", type=int, default=0,
                        help="with --llama-cpp: also time the decode of our programs and llama.cpp's files in "
                             "alternation, this many rounds, each system decoding --decode-steps tokens after the "
                             "first prompt in every round (default %(default)s: not)")
    parser.add_argument("--build-only", action="store_true", help="build the artifacts, time nothing")
    parser.add_argument("--kl", action="store_true",
                        help=f"also score the quantized programs among --only: mean KL divergence from the fp32 "
                             f"model over a fixed {KL_TOKENS}-token text")
    parser.add_argument("--llama-cpp", type=llama_cpp.llama_cpp_dir, default=None, metavar="DIR",
                        help="also convert the checkpoint with llama.cpp and time its F32, Q8_0 and Q4_0 files in this "
                             "run (with --kl, score Q8_0 and Q4_0 against F32). DIR: a llama.cpp source folder, built "
                             "in place with CMake: its convert_hf_to_gguf.py and gguf-py/, and build/bin/ with "
                             "llama-bench, llama-quantize and llama-perplexity (gdn_bench/README.md says how)")
    parser.add_argument("--llama-repetitions", type=int, default=3,
                        help="--llama-cpp: llama-bench repetitions of each test; medians (default %(default)s)")
    parser.add_argument("--hide-avx512", action="store_true",
                        help="time our programs as an AVX2-only x86 machine runs them: XNNPACK told the CPU has no "
                             "AVX-512, our kernels from $GDN_RUNTIME_OPS_LIB built with --march x86-64-v3, PyTorch at "
                             "ATEN_CPU_CAPABILITY=avx2; --llama-cpp must then be a build without AVX-512 "
                             "(gdn_bench/README.md). Results go to their own file in --workdir")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG bar plot here (needs matplotlib)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here as markdown")
    parser.add_argument("--prompt-cache", action="store_true",
                        help="time the prompt cache of our fp32 .pte instead: time to first token for a shared "
                             "prefix plus a question, the prefix's state restored from a file vs prefilled, and the "
                             "state file's size and save and load times")
    parser.add_argument("--cache-prefix", type=int, default=2048,
                        help="--prompt-cache: tokens of the shared prefix (default %(default)s)")
    parser.add_argument("--cache-question", type=int, default=32,
                        help="--prompt-cache: tokens of each question after it (default %(default)s)")
    parser.add_argument("--cache-rounds", type=int, default=3,
                        help="--prompt-cache: questions timed, cached and uncached; medians (default %(default)s)")


def _csv(values: tuple) -> str:
    return ",".join(map(str, values))


def apply_defaults(args, defaults: dict) -> None:
    """Give the options left unset (None) the device's defaults."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def hide_avx512_in_children(llama: Optional[llama_cpp.LlamaCpp]) -> None:
    """--hide-avx512: check that every part can run as on an AVX2-only CPU (UsageError naming what cannot), then
    ask the processes this run spawns to hide AVX-512 (``gdn_bench.x86_isa``)."""
    from runtime_ops.loader import library_path

    try:
        x86_isa.check_runtime_ops_library(library_path())
        if llama is not None and llama_cpp.builds_avx512(llama) is not False:
            raise x86_isa.IsaError(
                f"--hide-avx512: the llama.cpp build in {llama.root / 'build'} may use AVX-512 (its CMakeCache.txt "
                "does not say GGML_NATIVE=OFF and GGML_AVX512=OFF); build one without (gdn_bench/README.md)")
        # The table's layout, checked here before anything is timed or written; only the children hide.
        x86_isa.check_layout(x86_isa.cpuinfo_table(), x86_isa.cpu_flags())
    except x86_isa.IsaError as error:
        raise UsageError(str(error)) from None
    os.environ[x86_isa.ENV_VAR] = "1"
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"


def check_cpu_runner(args) -> None:
    """--runner with --device cpu: a file, and no option that times our programs in ExecuTorch's Python runtime."""
    if not args.runner.is_file() or not os.access(args.runner, os.X_OK):
        raise UsageError(f"--runner {args.runner}: not an executable file (python -m examples.cpp_runner.build "
                         "builds build/cpp_runner/gdn_cpp_runner)")
    if args.hide_avx512:
        raise UsageError("--runner: --hide-avx512 hides AVX-512 from programs in ExecuTorch's Python runtime only")
    if args.prompt_cache:
        raise UsageError("--runner: --prompt-cache times the Python runner's state files, not the C++ runner")
    interleaved = [system for system in args.interleave if system in args.only]
    if len(interleaved) >= 2 and any(system in OURS for system in interleaved):
        raise UsageError("--runner: --interleave loads our programs in ExecuTorch's Python runtime, all at once; "
                         "pass --interleave '' with --runner")


def run(args) -> int:
    """The CPU benchmark (``gdn_bench.e2e_cli`` sends --device cuda to ``gdn_bench.e2e_cuda``)."""
    apply_defaults(args, CPU_DEFAULTS)
    others = [system for system in args.only if system not in SYSTEMS]
    if others:
        raise UsageError(f"--only: --device cpu times {', '.join(SYSTEMS)}, got {others[0]}")
    if args.decode_steps < 1:
        raise UsageError(f"--decode-steps must be >= 1, got {args.decode_steps}")
    if args.interleave_rounds < 1:
        raise UsageError(f"--interleave-rounds must be >= 1, got {args.interleave_rounds}")
    if args.llama_rounds < 0:
        raise UsageError(f"--llama-rounds must be >= 0, got {args.llama_rounds}")
    if args.llama_rounds and args.llama_cpp is None:
        raise UsageError("--llama-rounds needs --llama-cpp DIR: the llama.cpp build whose files take turns")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.llama_repetitions < 1:
        raise UsageError(f"--llama-repetitions must be >= 1, got {args.llama_repetitions}")
    if args.plot is not None and args.plot.suffix != ".png":
        raise UsageError(f"--plot must name a .png file, got {args.plot}")
    for flag, value in (("--cache-prefix", args.cache_prefix), ("--cache-question", args.cache_question),
                        ("--cache-rounds", args.cache_rounds)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.runner is not None:
        check_cpu_runner(args)
    if args.hide_avx512:
        hide_avx512_in_children(args.llama_cpp)
    workdir = Workdir(args.workdir)
    if args.hide_avx512:  # never reported beside the same systems timed with AVX-512
        workdir.results_path = workdir.root / "results_avx512_hidden.json"
    workdir.ensure_checkpoint(args.seed)
    if args.prompt_cache:
        return run_prompt_cache(args, workdir)
    artifacts = {"hf": workdir.checkpoint, "executorch": workdir.executorch_pte, **workdir.ours}
    builders: dict[str, Callable[[], None]] = {
        "hf": lambda: None,
        "executorch": workdir.ensure_executorch,
        **{system: (lambda system=system: workdir.ensure_ours(system)) for system in OURS},
    }
    results = read_json(workdir.results_path)
    floor = results.get("memory_floor", {})
    if not args.build_only:
        log(f"measuring memory bandwidth ({args.threads} threads) and decode weight bytes")
        floor = memory_bandwidth(args.threads)
        floor["weight_bytes"] = decode_weight_bytes(workdir.checkpoint)
        step_bytes = floor["weight_bytes"] + recurrent_state_traffic(QWEN35_0_8B)
        floor["floor_tok_s"] = floor["copy_bandwidth_bytes_s"] / step_bytes
        results["memory_floor"] = floor
    stamp = time.strftime("%Y-%m-%d %H:%M")
    vocab_size = QWEN35_0_8B["vocab_size"]
    for system in args.only:
        builders[system]()
        if args.build_only:
            continue
        prompts = args.executorch_prompts if system == "executorch" else args.prompts
        log(f"{system}: timing prompts {', '.join(map(str, prompts))} and {args.decode_steps} decode steps")
        plan = Plan(tuple(prompts), args.decode_steps, vocab_size, args.seed, args.threads)
        if args.runner is not None and system in OURS:
            measured = measure_in_runner(args.runner, artifacts[system], workdir.tokenizer, plan)
        else:
            measured = measure_in_child(system, artifacts[system], plan)
        results[system] = {**measured, "measured_at": stamp}
        write_json(workdir.results_path, results)
    if args.llama_cpp is not None:
        workdir.ensure_gguf(args.llama_cpp, args.threads)
        for system in LLAMA_SYSTEMS:
            if args.build_only:
                break
            log(f"{system}: llama-bench, prompts {', '.join(map(str, args.prompts))} and {args.decode_steps} "
                f"decode steps, {args.llama_repetitions} repetitions")
            plan = Plan(tuple(args.prompts), args.decode_steps, vocab_size, args.seed, args.threads)
            results[system] = {**measure_llama(args.llama_cpp, workdir.gguf[system], plan, args.llama_repetitions),
                               "measured_at": stamp}
            write_json(workdir.results_path, results)
    # Decode pairs of the targets, ours against llama.cpp, timed again in alternation.
    pairs = [(numerator, denominator) for numerator, denominator, measure_name, _ in TARGETS
             if measure_name == "decode" and numerator in args.only and numerator in OURS and denominator in LLAMA_SYSTEMS]
    if args.llama_rounds and pairs and not args.build_only:
        ours_side = [system for system in SYSTEMS if system in {numerator for numerator, _ in pairs}]
        llama_side = [system for system in LLAMA_SYSTEMS if system in {denominator for _, denominator in pairs}]
        log(f"decode alternated with llama.cpp: {', '.join(ours_side + llama_side)}, {args.llama_rounds} rounds of "
            f"{args.decode_steps} tokens after {args.prompts[0]}")
        plan = Plan(tuple(args.prompts[:1]), args.decode_steps, vocab_size, args.seed, args.threads)
        results["llama_alternated"] = {
            "systems": alternated_with_llama({s: artifacts[s] for s in ours_side},
                                             {s: workdir.gguf[s] for s in llama_side}, args.llama_cpp, plan,
                                             args.llama_rounds, args.runner, workdir.tokenizer),
            "rounds": args.llama_rounds, "tokens": args.decode_steps, "depth": args.prompts[0],
            "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        }
        write_json(workdir.results_path, results)
    scored = {system: str(artifacts[system]) for system in args.only if OURS.get(system, "none") != "none"}
    if args.kl and scored and not args.build_only:
        log(f"quality: KL divergence from the fp32 model, {', '.join(scored)}")
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            scores = pool.submit(measure_kl, str(workdir.checkpoint), scored, args.threads).result()
        for system, score in scores.items():
            results.setdefault("quality", {})[system] = {**score, "measured_at": time.strftime("%Y-%m-%d %H:%M")}
        write_json(workdir.results_path, results)
    if args.kl and args.llama_cpp is not None and not args.build_only:
        log("quality: llama.cpp's KL divergence of Q8_0 and Q4_0 from its F32 (llama-perplexity)")
        for system, score in measure_llama_kl(args.llama_cpp, workdir, args.threads).items():
            results.setdefault("quality", {})[system] = {**score, "measured_at": time.strftime("%Y-%m-%d %H:%M")}
        write_json(workdir.results_path, results)
    interleave = [system for system in args.interleave if system in args.only]
    if len(interleave) >= 2 and not args.build_only:
        log(f"decode interleaved: {', '.join(interleave)}, {args.interleave_rounds} rounds of 4 steps")
        plan = Plan(tuple(args.prompts[:1]), 4, vocab_size, args.seed, args.threads)
        results["interleaved_decode"] = {
            "systems": interleaved_decode({s: artifacts[s] for s in interleave}, plan, args.interleave_rounds, 4),
            "rounds": args.interleave_rounds, "steps": 4, "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        }
        write_json(workdir.results_path, results)
    if not floor:
        return 0
    systems = {s: results[s] for s in REPORTED if s in results}
    for extra in ("interleaved_decode", "llama_alternated", "quality"):
        if extra in results:
            systems[extra] = results[extra]
    sizes = {system: path.stat().st_size for system, path in {**workdir.ours, **workdir.gguf}.items() if path.is_file()}
    table = report(systems, workdir.builds(), floor, args.prompts, sizes, decode_read_bytes(workdir, args.llama_cpp))
    table = f"Machine: {x86_isa.machine_line(args.hide_avx512)}.\n\n{table}"
    print(table)
    if args.markdown is not None:
        write_atomically(args.markdown, (table + "\n").encode())
    if args.plot is not None:
        plot(systems, args.prompts, floor, args.plot)
        log(f"wrote {args.plot}")
    return 0
