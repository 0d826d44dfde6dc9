"""Generate text from a ``.pte`` written by ``export_qwen35``, with ExecuTorch's Python runtime.

A plain loop in the style of gpt-fast's ``generate.py``: prefill the prompt
(in chunks of the program's ``get_max_seq_len``), then decode one token at a
time, streaming text and timing both phases. Importing ``gdn_export`` first
loads our C++ kernels into the runtime's registry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import gdn_export  # noqa: F401  (registers the gdn kernels with ExecuTorch)

METADATA_METHODS = (
    "get_max_seq_len", "get_max_context_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
)


class RunnerError(ValueError):
    """A missing or unusable program or tokenizer file; the message names it."""


class ProgramRunner:
    """A program's step methods, and where in the context it stands.

    A CPU program has ``forward(tokens, input_pos)`` for any chunk length; a CUDA
    program has ``prefill`` (2 or more tokens) and ``decode`` (one token), which
    share its state buffers.
    """

    def __init__(self, model_path, data_path=None):
        from executorch.runtime import Runtime

        model_path = Path(model_path)
        if not model_path.is_file():
            raise RunnerError(f"--model {model_path}: no such file")
        if data_path is not None and not Path(data_path).is_file():
            raise RunnerError(f"--data {data_path}: no such file")
        with open(model_path, "rb") as handle:
            # A program's flatbuffer identifier ("ET" and a version) follows its 4-byte root offset.
            if handle.read(8)[4:6] != b"ET":
                raise RunnerError(f"--model {model_path}: not an ExecuTorch program (.pte)")
        if _uses_cuda_backend(model_path):
            _prepare_cuda_runtime()
        try:
            self.program = Runtime.get().load_program(model_path, data_path=data_path)
            names = self.program.method_names
            # prefill before decode: the first method loaded uploads the shared weights and states.
            self.steps = {name: self.program.load_method(name) for name in ("prefill", "decode", "forward")
                          if name in names}
        except RuntimeError as error:
            raise RunnerError(f"--model {model_path}: ExecuTorch could not load it ({error})") from None
        self.metadata = {
            name: list(self.program.load_method(name).execute([]))
            for name in METADATA_METHODS
            if name in self.program.method_names
        }
        missing = {"get_max_seq_len", "get_max_context_len", "get_eos_ids"} - set(self.metadata)
        if "forward" not in self.steps and "decode" not in self.steps:
            missing.add("forward or decode")
        if missing:
            raise RunnerError(f"--model {model_path}: not an LLM program (no {', '.join(sorted(missing))} method)")
        self.max_chunk = int(self.metadata["get_max_seq_len"][0])
        self.max_context = int(self.metadata["get_max_context_len"][0])
        self.eos_ids = {int(i) for i in self.metadata["get_eos_ids"]}
        self.position = 0

    def reset(self) -> None:
        """Start a new sequence: the program restarts its states at position 0."""
        self.position = 0

    def feed(self, tokens: list) -> torch.Tensor:
        """Run ``tokens`` from the current position; returns the last position's logits [vocab]."""
        if not tokens:
            raise ValueError("feed: tokens must not be empty")
        if self.position + len(tokens) > self.max_context:
            raise ValueError(
                f"the context holds {self.max_context} tokens; {self.position} used, {len(tokens)} more asked"
            )
        for start in range(0, len(tokens), self.max_chunk):
            chunk = tokens[start:start + self.max_chunk]
            (logits,) = self._step(len(chunk)).execute(
                [torch.tensor([chunk], dtype=torch.long), torch.tensor([self.position], dtype=torch.long)]
            )
            self.position += len(chunk)
        return logits[0, -1]

    def _step(self, length: int):
        """The method that runs a chunk of ``length`` tokens."""
        if "forward" in self.steps:
            return self.steps["forward"]
        return self.steps["decode"] if length == 1 or "prefill" not in self.steps else self.steps["prefill"]


def _uses_cuda_backend(model_path: Path) -> bool:
    from cuda_backend.executorch_runtime import program_uses_cuda_backend

    return program_uses_cuda_backend(model_path)


def _prepare_cuda_runtime() -> None:
    """Load ExecuTorch's CUDA runtime (CudaBackend) before the program, methods sharing their states."""
    from cuda_backend.executorch_runtime import CudaRuntimeUnavailable, prepare_for_programs

    try:
        prepare_for_programs()
    except CudaRuntimeUnavailable as error:
        raise RunnerError(f"the program runs on CUDA: {error}") from None


@dataclass
class Generation:
    prompt_tokens: list
    tokens: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_tokens) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first new token comes from the prefill's logits; the rest from decode steps.
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def sample(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probabilities = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


def generate(
    runner: ProgramRunner,
    prompt_tokens: list,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    on_token: Callable[[int], None] = lambda token: None,
    seed: Optional[int] = None,
) -> Generation:
    """Greedy (temperature 0) or sampled generation; stops at an EOS id or the context's end."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    result = Generation(prompt_tokens=list(prompt_tokens))
    runner.reset()
    started = time.perf_counter()
    logits = runner.feed(result.prompt_tokens)
    result.prefill_seconds = time.perf_counter() - started
    started = time.perf_counter()
    budget = min(max_new_tokens, runner.max_context - runner.position + 1)
    while len(result.tokens) < budget:
        token = sample(logits, temperature, generator)
        result.tokens.append(token)
        on_token(token)
        if token in runner.eos_ids or len(result.tokens) == budget:
            break
        logits = runner.feed([token])
    result.decode_seconds = time.perf_counter() - started
    return result


def load_tokenizer(path):
    """A Hugging Face ``tokenizer.json``."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise RunnerError(f"--tokenizer {path}: no such file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers library raises its own Exception type
        raise RunnerError(f"--tokenizer {path}: not a tokenizer.json ({error})") from None


class TextStream:
    """Token ids in, printable text out: holds back bytes of a character not yet complete."""

    def __init__(self, tokenizer):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=False)

    def push(self, token: int) -> str:
        return self.stream.step(self.tokenizer, token) or ""
