"""Generate text from a ``.pte`` written by ``export_qwen35``, with ExecuTorch's Python runtime.

A plain loop in the style of gpt-fast's ``generate.py``: prefill the prompt
(in chunks of the program's ``get_max_seq_len``), then decode one token at a
time, streaming text and timing both phases. Importing ``gdn_export`` first
loads our C++ kernels into the runtime's registry.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import gdn_export  # noqa: F401  (registers the gdn kernels with ExecuTorch)

METADATA_METHODS = (
    "get_max_seq_len", "get_max_context_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
)


def executorch_runtime():
    """ExecuTorch's ``Runtime``, without loading its compiler.

    The runtime's Python binding imports ``executorch.exir._warnings`` for one
    decorator, and importing that submodule runs ``executorch.exir``'s package
    initialisation: the whole compiler, about 5 s of gdn-run's 7 s of imports
    (measured with ``python -X importtime``). A stand-in package module lets
    the submodule load alone; it is removed again at once, so a later
    ``import executorch.exir`` initialises the real package as usual.
    """
    import importlib.util
    import sys
    import types

    if "executorch.exir" not in sys.modules and "executorch.runtime" not in sys.modules:
        spec = importlib.util.find_spec("executorch.exir")
        stand_in = types.ModuleType("executorch.exir")
        stand_in.__spec__, stand_in.__path__ = spec, list(spec.submodule_search_locations)
        sys.modules["executorch.exir"] = stand_in
        try:
            import executorch.runtime  # noqa: F401
        finally:
            if sys.modules.get("executorch.exir") is stand_in:
                del sys.modules["executorch.exir"]
            if getattr(sys.modules["executorch"], "exir", None) is stand_in:
                delattr(sys.modules["executorch"], "exir")
    from executorch.runtime import Runtime

    return Runtime


class RunnerError(ValueError):
    """A missing or unusable program or tokenizer file; the message names it."""


TRANSPARENT_HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE_BYTES = 2 << 20


def huge_pages_on_request() -> bool:
    """Whether Linux backs memory with 2 MiB pages where a process asks (madvise): transparent huge pages in
    ``always`` or ``madvise`` mode."""
    if sys.platform != "linux" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        mode = TRANSPARENT_HUGE_PAGES.read_text()
    except OSError:
        return False
    return "[never]" not in mode


def read_onto_huge_pages(path: Path) -> Optional[bytes]:
    """The bytes of the file at ``path``, in memory that Linux was asked to back with 2 MiB pages before it
    was written; None where it backs none (then load the program from its file).

    ExecuTorch's Python runtime maps a program file in 4 KiB pages, and a decode step streams every weight it
    holds, a TLB entry each 4 KiB. Read onto 2 MiB pages, the 0.8B ``8da4w_avx2`` program's decode steps ran
    9% and 16% faster in two runs of ``gdn-bench pages`` (docs/benchmarks.md, run 37). ExecuTorch's runtime
    runs a program from a bytes object in place (its buffer loader), so the bytes must be those pages: the
    object is made unwritten (CPython's ``PyBytes_FromStringAndSize`` with no source), its pages advised,
    then filled from the file, before anything else can see it.
    """
    if not huge_pages_on_request():
        return None
    size = path.stat().st_size
    # Prototypes of our own, not the shared ctypes.pythonapi entries (whose types other code may set).
    make = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
        ("PyBytes_FromStringAndSize", ctypes.pythonapi))
    address_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyBytes_AsString", ctypes.pythonapi))
    data = make(None, size)
    address = address_of(data)
    first = -(-address // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = (address + size) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.restype, libc.madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.madvise(first, last - first, mmap.MADV_HUGEPAGE) != 0:
            return None
    view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
    filled = 0
    with open(path, "rb") as handle:
        while filled < size:
            count = handle.readinto(view[filled:])
            if not count:
                raise RunnerError(f"--model {path}: the file ended at byte {filled} of {size} while it was read")
            filled += count
    return data


class ProgramRunner:
    """A program's step methods, and where in the context it stands.

    A CPU program has ``forward(tokens, input_pos)`` for any chunk length; a CUDA
    program has ``prefill`` (2 or more tokens) and ``decode`` (one token), which
    share its state buffers.
    """

    def __init__(self, model_path, data_path=None, huge_pages: bool = True):
        """``huge_pages``: read the program onto 2 MiB pages where Linux gives them (``read_onto_huge_pages``);
        False maps its file, as ExecuTorch's runtime does by itself."""
        Runtime = executorch_runtime()
        model_path = Path(model_path)
        if not model_path.is_file():
            raise RunnerError(f"--model {model_path}: no such file")
        if data_path is not None and not Path(data_path).is_file():
            raise RunnerError(f"--data {data_path}: no such file")
        with open(model_path, "rb") as handle:
            # A program's flatbuffer identifier ("ET" and a version) follows its 4-byte root offset.
            if handle.read(8)[4:6] != b"ET":
                raise RunnerError(f"--model {model_path}: not an ExecuTorch program (.pte)")
        _load_delegate_runtimes(model_path, Runtime)
        try:
            on_huge_pages = read_onto_huge_pages(model_path) if huge_pages else None
            self.program = Runtime.get().load_program(model_path if on_huge_pages is None else on_huge_pages,
                                                      data_path=data_path)
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
        self.model_path = model_path
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
            try:
                (logits,) = self._step(len(chunk)).execute(
                    [torch.tensor([chunk], dtype=torch.long), torch.tensor([self.position], dtype=torch.long)]
                )
            except RuntimeError as error:  # ExecuTorch's message, without the C++ stack it may carry
                reason = (str(error).strip().splitlines() or ["no message"])[0]
                raise RunnerError(f"ExecuTorch failed running {len(chunk)} tokens at position {self.position}: "
                                  f"{reason}") from None
            self.position += len(chunk)
        return logits[0, -1]

    def _step(self, length: int):
        """The method that runs a chunk of ``length`` tokens."""
        if "forward" in self.steps:
            return self.steps["forward"]
        return self.steps["decode"] if length == 1 or "prefill" not in self.steps else self.steps["prefill"]


def program_delegate_ids(model_path) -> set:
    """The backend ids of the delegates in a ``.pte`` (every method's), read from its flatbuffer.

    ExecuTorch's schema (``program.fbs``): ``Program.execution_plan`` (field 1)
    holds ``ExecutionPlan``s whose ``delegates`` (field 7) are
    ``BackendDelegate``s whose ``id`` (field 0) is the backend's name.
    """
    with open(model_path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:

        def u32(at: int) -> int:
            return struct.unpack_from("<I", data, at)[0]

        def field(table: int, index: int):
            """Where field ``index`` of the table at ``table`` lies, or None when absent."""
            vtable = table - struct.unpack_from("<i", data, table)[0]
            slot = 4 + 2 * index
            if slot >= struct.unpack_from("<H", data, vtable)[0]:
                return None
            offset = struct.unpack_from("<H", data, vtable + slot)[0]
            return table + offset if offset else None

        def vector(at):
            if at is None:
                return []
            start = at + u32(at)
            return [start + 4 + 4 * i + u32(start + 4 + 4 * i) for i in range(u32(start))]

        ids = set()
        for plan in vector(field(u32(0), 1)):
            for delegate in vector(field(plan, 7)):
                where = field(delegate, 0)
                if where is not None:
                    text = where + u32(where)
                    ids.add(bytes(data[text + 4:text + 4 + u32(text)]).decode())
        return ids


def _load_delegate_runtimes(model_path: Path, Runtime) -> None:
    """Load the runtime of each delegate that ExecuTorch's runtime does not register itself.

    The backend that provides it (``Backend.delegate_ids``) loads it; the runner
    imports no backend package by name.
    """
    from gdn_export.backends import RuntimeUnavailable, backends_for_delegates

    try:
        ids = program_delegate_ids(model_path)
    except (struct.error, IndexError, ValueError) as error:
        raise RunnerError(f"--model {model_path}: not a readable ExecuTorch program ({error})") from None
    registry = Runtime.get().backend_registry
    missing = sorted(delegate_id for delegate_id in ids if not registry.is_available(delegate_id))
    if not missing:
        return
    providers = backends_for_delegates(missing)
    for delegate_id in missing:
        if delegate_id not in providers:
            raise RunnerError(
                f"--model {model_path}: its {delegate_id} delegate has no runtime here (neither ExecuTorch's "
                "runtime nor an installed gdn_export backend provides one)"
            )
    for backend in dict.fromkeys(providers.values()):
        try:
            backend.load_runtime()
        except RuntimeUnavailable as error:
            raise RunnerError(f"--model {model_path} runs on {backend.name}: {error}") from None


def leave_the_cores_to_programs() -> None:
    """Give PyTorch's own intra-op pool one thread, in a process whose heavy work runs in ExecuTorch programs.

    A program computes on ExecuTorch's threadpool; PyTorch only samples between
    its calls. But each PyTorch op over a whole vocabulary (an argmax of 248,320
    logits) wakes PyTorch's OpenMP workers, which then spin waiting for more
    work while the next decode step runs, taking a core from ExecuTorch's
    threads: on 2 cores, 15% of a decode loop's samples were an OpenMP worker
    spinning, and the 0.8B 8da4w program decoded 54 tok/s where it decodes 60
    with this (docs/benchmarks.md, "Runs 12 and 13")."""
    torch.set_num_threads(1)


@dataclass
class Generation:
    prompt_tokens: list
    tokens: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Prompt tokens restored from a saved state (gdn_export.session's prompt cache) instead of prefilled.
    reused_tokens: int = 0

    @property
    def prefill_tokens_per_second(self) -> float:
        prefilled = len(self.prompt_tokens) - self.reused_tokens
        return prefilled / self.prefill_seconds if self.prefill_seconds else 0.0

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
    result.tokens = decode(
        runner, logits, max_new_tokens=max_new_tokens, temperature=temperature, on_token=on_token, generator=generator
    )
    result.decode_seconds = time.perf_counter() - started
    return result


def decode(
    runner,
    logits: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    on_token: Callable[[int], None] = lambda token: None,
    generator: Optional[torch.Generator] = None,
) -> list:
    """Sample from ``logits`` on, feeding ``runner`` each new token but the last; returns the new tokens.

    Stops at an EOS id or the context's end. ``runner`` is a ProgramRunner or
    anything with its ``feed``, ``position``, ``max_context`` and ``eos_ids``
    (``gdn_export.session.Session``).
    """
    tokens = []
    budget = min(max_new_tokens, runner.max_context - runner.position + 1)
    while len(tokens) < budget:
        token = sample(logits, temperature, generator)
        tokens.append(token)
        on_token(token)
        if token in runner.eos_ids or len(tokens) == budget:
            break
        logits = runner.feed([token])
    return tokens


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


def check_tokenizer(tokenizer, program: ProgramRunner, tokenizer_path) -> None:
    """Refuse a tokenizer that is not the program's: ids the program cannot embed, or BOS/EOS ids that are
    not special tokens of it.

    A checkpoint's tokenizer may hold fewer ids than the embedding (Qwen3.5 pads
    its vocabulary), never more; and the ids the program stops at are the
    tokenizer's special tokens (``<|im_end|>``, ``<|endoftext|>``), never text.
    """
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    program_vocab = program.metadata.get("get_vocab_size")
    if program_vocab and vocab_size > int(program_vocab[0]):
        raise RunnerError(
            f"--tokenizer {tokenizer_path}: {vocab_size} tokens, but the program embeds only "
            f"{int(program_vocab[0])}: not this program's tokenizer"
        )
    special_tokens = {index for index, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    special = [("EOS", token) for token in sorted(program.eos_ids)]
    special += [("BOS", int(token)) for token in program.metadata.get("get_bos_id", [])]
    for name, token in special:
        if token not in special_tokens:
            raise RunnerError(
                f"--tokenizer {tokenizer_path}: the program's {name} id {token} is "
                f"{tokenizer.id_to_token(token)!r} there, not a special token: not this program's tokenizer"
            )


def check_prompt_fits(
    program: ProgramRunner, prompt_length: int, context_used: int = 0, what: str = "--prompt"
) -> None:
    """A prompt the program's context cannot hold after ``context_used`` tokens, with the export flag that would."""
    needed = context_used + prompt_length
    if needed >= program.max_context:
        after = f" after the {context_used} of the conversation so far" if context_used else ""
        raise RunnerError(
            f"{what} is {prompt_length} tokens{after}; the program's context holds {program.max_context} "
            f"(its --max-seq-len) with room for the next token: export with --max-seq-len {needed + 1} or more"
        )


class TextStream:
    """Token ids in, printable text out: holds back bytes of a character not yet complete."""

    def __init__(self, tokenizer):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=False)

    def push(self, token: int) -> str:
        return self.stream.step(self.tokenizer, token) or ""
