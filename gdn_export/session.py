"""A conversation with a program: feed tokens, generate, save its decoding state and load it again.

A Qwen3.5 state cannot be cut back to an earlier position (a Gated DeltaNet
layer's recurrent and conv states summarize every token seen), so a
conversation continues only from a snapshot taken where it stood. A
``Session`` keeps the conversation's tokens beside the program's state: the
first ``position`` of them are fed; the rest (the last sampled token, which
generation does not feed) are fed before anything new. ``save`` writes the
state through the program's ``get_state`` method and ``load`` restores it with
``set_state`` (``gdn_export.state_methods``): the program then continues exactly
where the saved one stopped.

The state file is a safetensors file: one tensor per state buffer (the caches
up to the position only), the last position's logits, and metadata: the
format, the program's fingerprint, the position, the tokens and each tensor's
dtype. It is written atomically; a file that is truncated, not a state file,
from another program (fingerprint) or for a position beyond the program's
context is refused with one line, before anything is restored.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from gdn_export.lowering import write_atomically
from gdn_export.runner import Generation, ProgramRunner, RunnerError, check_prompt_fits, decode
from gdn_export.state_methods import STATE_FINGERPRINT, STATE_METHODS, STATE_NAMES, STATE_POSITION_DIMS

STATE_FILE_FORMAT = "gdn-export-state-file/1"
LOGITS = "logits"  # the tensor holding the last fed position's logits (a state name never is a bare word)


class StateFileError(RunnerError):
    """A state file that cannot be restored into this program; the message names the file and why."""


@dataclass
class StateFile:
    """A state file's contents, checked for integrity (not yet against a program)."""

    path: Path
    fingerprint: str
    position: int
    tokens: list
    tensors: dict  # state buffer name -> tensor, and LOGITS


def read_state_file(path) -> StateFile:
    """The state file at ``path``; raises StateFileError if it is missing, truncated or not a state file."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise StateFileError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != STATE_FILE_FORMAT:
                raise StateFileError(f"{path}: not a gdn-export state file (a safetensors file of something else)")
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as error:
        raise StateFileError(f"{path}: not a complete state file (truncated or another format: {error})") from None
    try:
        position = int(metadata["position"])
        tokens = [int(token) for token in json.loads(metadata["tokens"])]
        dtypes = json.loads(metadata["dtypes"])
        fingerprint = metadata["fingerprint"]
    except (KeyError, TypeError, ValueError) as error:
        raise StateFileError(f"{path}: corrupt state file metadata ({error!r})") from None
    if not 0 < position <= len(tokens):
        raise StateFileError(f"{path}: corrupt state file: position {position} with {len(tokens)} tokens")
    if dtypes != {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in tensors.items()}:
        raise StateFileError(f"{path}: corrupt state file: its tensors' dtypes differ from those it records")
    return StateFile(path, fingerprint, position, tokens, tensors)


class Session:
    """A conversation with a program that has state methods: ``feed``, ``generate``, ``save``, ``load``."""

    def __init__(self, program: ProgramRunner):
        required = (*STATE_METHODS, STATE_NAMES, STATE_POSITION_DIMS, STATE_FINGERPRINT)
        missing = [name for name in required if name not in program.program.method_names]
        if missing:
            raise RunnerError(
                f"--model {program.model_path}: no {missing[0]} method, so its state cannot be saved or restored: "
                "export it again with this version of export_qwen35 (--backend xnnpack or portable)"
            )
        self.program = program
        # Loaded now, before the program runs: every method of the program shares the state buffers.
        self._get_state = program.program.load_method("get_state")
        self._set_state = program.program.load_method("set_state")
        self.state_names = list(program.program.load_method(STATE_NAMES).execute([]))
        position_dims = program.program.load_method(STATE_POSITION_DIMS).execute([])
        self.position_dims = [None if dim < 0 else dim for dim in position_dims]
        (self.fingerprint,) = program.program.load_method(STATE_FINGERPRINT).execute([])
        self.tokens: list = []
        self.logits: Optional[torch.Tensor] = None
        program.reset()

    # What gdn_export.runner.decode needs of a runner.
    @property
    def position(self) -> int:
        return self.program.position

    @property
    def max_context(self) -> int:
        return self.program.max_context

    @property
    def eos_ids(self) -> set:
        return self.program.eos_ids

    @property
    def pending_tokens(self) -> list:
        """Tokens of the conversation not yet fed (the last sampled one); the next feed starts with them."""
        return self.tokens[self.position:]

    def reset(self) -> None:
        """Start a new conversation."""
        self.program.reset()
        self.tokens, self.logits = [], None

    def feed(self, tokens: list) -> torch.Tensor:
        """Feed the pending tokens and ``tokens``; returns the last position's logits [vocab]."""
        to_feed = self.pending_tokens + list(tokens)
        if to_feed:
            self.logits = self.program.feed(to_feed)
            self.tokens += list(tokens)
        if self.logits is None:
            raise ValueError("feed: nothing fed yet, so there are no logits to continue from")
        return self.logits

    def generate(
        self,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        on_token: Callable[[int], None] = lambda token: None,
        generator: Optional[torch.Generator] = None,
    ) -> list:
        """New tokens from where the conversation stands (greedy at temperature 0); they join the conversation."""
        logits = self.feed([])
        tokens = decode(self, logits, max_new_tokens=max_new_tokens, temperature=temperature, on_token=on_token,
                        generator=generator)
        # decode fed all but the last (through self.feed, which recorded them); the last is pending.
        self.tokens += tokens[-1:]
        return tokens

    def respond(
        self,
        prompt_tokens: list,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        on_token: Callable[[int], None] = lambda token: None,
        generator: Optional[torch.Generator] = None,
        prompt_cache=None,
    ) -> Generation:
        """Feed ``prompt_tokens`` after the conversation so far, then generate; timed as ``runner.generate`` is.

        With ``prompt_cache`` (a path; the session must be new), the prompt is
        fed through ``feed_with_prompt_cache``.
        """
        result = Generation(prompt_tokens=list(prompt_tokens))
        started = time.perf_counter()
        if prompt_cache is None:
            self.feed(result.prompt_tokens)
        else:
            result.reused_tokens = self.feed_with_prompt_cache(result.prompt_tokens, prompt_cache)
        result.prefill_seconds = time.perf_counter() - started
        started = time.perf_counter()
        result.tokens = self.generate(max_new_tokens, temperature=temperature, on_token=on_token, generator=generator)
        result.decode_seconds = time.perf_counter() - started
        return result

    def save(self, path) -> int:
        """Write the state to ``path`` atomically; returns the file's size in bytes."""
        from safetensors.torch import save

        if self.position == 0:
            raise RunnerError("nothing to save: the conversation has not fed any token yet")
        path = Path(path)
        live = self._get_state.execute([torch.arange(self.position, dtype=torch.long)])
        tensors = {name: tensor.contiguous() for name, tensor in zip(self.state_names, live, strict=True)}
        tensors[LOGITS] = self.logits.float().contiguous()
        metadata = {
            "format": STATE_FILE_FORMAT,
            "fingerprint": self.fingerprint,
            "position": str(self.position),
            "tokens": json.dumps(self.tokens),
            "dtypes": json.dumps({name: str(tensor.dtype).removeprefix("torch.") for name, tensor in tensors.items()}),
        }
        data = save(tensors, metadata)
        write_atomically(path, lambda handle: handle.write(data))
        return len(data)

    def check(self, state: StateFile) -> None:
        """Refuse a state that is not this program's or does not fit it (StateFileError, one line)."""
        if state.fingerprint != self.fingerprint:
            raise StateFileError(
                f"{state.path}: saved by another program (state fingerprint {state.fingerprint[:12]}, this "
                f"program's {self.fingerprint[:12]}); a state restores only into a program exported from the same "
                "checkpoint with the same options"
            )
        if state.position > self.max_context:
            raise StateFileError(
                f"{state.path}: its position {state.position} is beyond the program's context "
                f"({self.max_context} tokens)"
            )
        if sorted(state.tensors) != sorted([*self.state_names, LOGITS]):
            raise StateFileError(f"{state.path}: its tensors are not this program's state buffers")
        for name, dim in zip(self.state_names, self.position_dims):
            if dim is not None and state.tensors[name].shape[dim] != state.position:
                raise StateFileError(
                    f"{state.path}: {name} holds {state.tensors[name].shape[dim]} positions, the state's position "
                    f"is {state.position}"
                )

    def restore(self, state: StateFile) -> None:
        """Put ``state`` (checked with ``check``) into the program: the conversation continues from it."""
        self.check(state)
        values = [state.tensors[name] for name in self.state_names]
        self.reset()
        try:
            self._set_state.execute([torch.arange(state.position, dtype=torch.long), *values])
        except RuntimeError as error:
            raise StateFileError(f"{state.path}: ExecuTorch could not restore it ({error})") from None
        self.program.position = state.position
        self.tokens = list(state.tokens)
        self.logits = state.tensors[LOGITS]

    def load(self, path) -> None:
        """Restore the state saved in ``path``; raises StateFileError (one line) for a file it refuses."""
        self.restore(read_state_file(path))

    def feed_with_prompt_cache(self, prompt_tokens: list, path) -> int:
        """Feed a new conversation's prompt, reusing the state in ``path`` when its tokens begin the prompt;
        returns how many prompt tokens were restored rather than prefilled.

        A hit restores the state and feeds only the rest, leaving the file as it is
        (it still begins this prompt). Otherwise (no file, or a state of other
        tokens) the whole prompt is fed and its state saved to ``path``, before
        anything is generated. A file that is not a state of this program is
        refused, never overwritten.
        """
        if self.tokens:
            raise ValueError("feed_with_prompt_cache: the session must be new (a prompt cache holds a prompt's start)")
        path = Path(path)
        cached = read_state_file(path) if path.exists() else None
        if cached is not None:
            self.check(cached)
        if cached is not None and cached.tokens == list(prompt_tokens[:len(cached.tokens)]):
            self.restore(cached)
            self.feed(prompt_tokens[len(cached.tokens):])
            return cached.position
        self.feed(prompt_tokens)
        self.save(path)
        return 0


# ---------------------------------------------------------------------------
# gdn-run's --save-state, --load-state and --prompt-cache (its --chat is in gdn_export.chat).


@contextlib.contextmanager
def naming(flag: str):
    """State file and file system errors as RunnerErrors that start with ``flag``."""
    try:
        yield
    except StateFileError as error:
        raise RunnerError(f"{flag} {error}") from None
    except OSError as error:
        raise RunnerError(f"{flag} {error.filename}: {error.strerror}") from None


def seeded_generator(seed: Optional[int]) -> Optional[torch.Generator]:
    return torch.Generator().manual_seed(seed) if seed is not None else None


def run_with_state(program: ProgramRunner, prompt_tokens: list, args, console, on_token) -> Generation:
    """gdn-run with --load-state, --prompt-cache or --save-state: the prompt fed after the loaded state (or
    through the prompt cache), then generation, then the state saved."""
    session = Session(program)
    if args.load_state:
        with naming("--load-state"):
            session.load(args.load_state)
    check_prompt_fits(program, len(prompt_tokens), len(session.tokens))
    with naming("--prompt-cache"):
        result = session.respond(
            prompt_tokens, max_new_tokens=args.max_new_tokens, temperature=args.temperature, on_token=on_token,
            generator=seeded_generator(args.seed), prompt_cache=args.prompt_cache,
        )
    if args.prompt_cache:
        print(f"gdn-run: prompt cache {args.prompt_cache}: reused {result.reused_tokens} of {len(prompt_tokens)} "
              "prompt tokens", file=console)
    if args.save_state:
        with naming("--save-state"):
            session.save(args.save_state)
    return result
