"""Decoding-state snapshots: save, load and continue; the prompt cache; chat; the state files refused.

The reference for every continuation is the same program run over the whole
conversation's tokens in one go (greedy): a restored state must continue
exactly where the saved one stopped. Programs are exported once per module
(an export takes 30-50 s here) from tiny random checkpoints (``gdn_export.tiny``).
"""

from __future__ import annotations

import io
import json
import random

import pytest
import torch

from gdn_export.cli import run_main
from gdn_export.export import export_qwen35
from gdn_export.runner import ProgramRunner, TextStream, generate, load_tokenizer
from gdn_export.session import LOGITS, Session, StateFileError, read_state_file
from gdn_export.tiny import make_tiny_checkpoint

MAX_SEQ_LEN = 160
PREFILL_CHUNK = 32
# Every CPU program kind, over both checkpoints and both backends.
PROGRAMS = {
    "dense-xnnpack-fp32": ("dense", dict(backend="xnnpack")),
    "moe-portable-fp32": ("moe", dict(backend="portable")),
    "moe-xnnpack-bf16": ("moe", dict(backend="xnnpack", dtype="bf16")),
    "dense-xnnpack-8da4w": ("dense", dict(backend="xnnpack", quantize="8da4w")),
    "dense-portable-int8wo": ("dense", dict(backend="portable", quantize="int8wo", state_dtype="float32")),
}
CHECKPOINTS = {"dense": dict(), "moe": dict(moe=True, wrapper=True)}
# Where calls start changes float32 results by about 1e-6 (chunked and step-by-step arithmetic);
# these programs round activations to bf16 or int8 (8da4w also its recurrent state to float16 once a
# call, as quantized CPU programs do by default), which turns that into about 1e-2, so a greedy
# near-tie may break either way between a conversation fed in several calls and one call.
ROUNDING_PROGRAMS = {"moe-xnnpack-bf16", "dense-xnnpack-8da4w"}


class Programs:
    """Tiny checkpoints and their programs, made on first use and shared by the module's tests."""

    def __init__(self, root, seed):
        self.root, self.seed = root, seed
        self.made = {}

    def checkpoint(self, name):
        if name not in self.made:
            seed = self.seed + list(CHECKPOINTS).index(name)
            self.made[name] = make_tiny_checkpoint(self.root / name, seed=seed, **CHECKPOINTS[name])
        return self.made[name]

    def program(self, name):
        if name not in self.made:
            checkpoint_name, options = PROGRAMS[name]
            output = self.root / f"{name}.pte"
            export_qwen35(self.checkpoint(checkpoint_name), output, max_seq_len=MAX_SEQ_LEN,
                          prefill_chunk=PREFILL_CHUNK, **options)
            self.made[name] = output
        return self.made[name]

    def tokenizer_path(self, name):
        return self.checkpoint(PROGRAMS[name][0]) / "tokenizer.json"


@pytest.fixture(scope="module")
def programs(tmp_path_factory, module_seed):
    return Programs(tmp_path_factory.mktemp("session"), module_seed)


def random_tokens(generator, count):
    # Ids 3 and up: the tiny tokenizer's first three are its special tokens.
    return torch.randint(3, 512, (count,), generator=generator).tolist()


def streamed(tokenizer, tokens) -> str:
    """The text gdn-run prints for ``tokens`` (bytes of an unfinished character are held back)."""
    stream = TextStream(tokenizer)
    return "".join(stream.push(token) for token in tokens)


def one_shot(program_path, tokens, new_tokens):
    """Greedy generation over ``tokens`` fed from scratch, in one go, by a program of its own."""
    return generate(ProgramRunner(program_path), tokens, max_new_tokens=new_tokens).tokens


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_saved_state_continues_exactly(programs, name, generator, tmp_path):
    turn_1, turn_2 = random_tokens(generator, 37), random_tokens(generator, 11)
    path = tmp_path / "turn1.state"
    first = Session(ProgramRunner(programs.program(name)))
    first.feed(turn_1)
    reply_1 = first.generate(9)
    first.save(path)

    second = Session(ProgramRunner(programs.program(name)))
    second.load(path)
    assert second.tokens == turn_1 + reply_1 and second.position == len(turn_1) + len(reply_1) - 1
    restored_logits = second.feed(turn_2).clone()
    reply_2 = second.generate(12)
    # The same calls without the snapshot: the restored state is the saved one, bit for bit.
    assert torch.equal(restored_logits, first.feed(turn_2))
    assert reply_2 == first.generate(12)
    if name not in ROUNDING_PROGRAMS:
        # And what one call over the whole conversation generates.
        assert one_shot(programs.program(name), turn_1, 9) == reply_1
        assert reply_2 == one_shot(programs.program(name), turn_1 + reply_1 + turn_2, 12)

    # The file holds each cache up to the position only, and says what it holds.
    state = read_state_file(path)
    assert state.position == len(turn_1) + len(reply_1) - 1 and state.tokens == turn_1 + reply_1
    for tensor_name, dim in zip(first.state_names, first.position_dims):
        if dim is not None:
            assert state.tensors[tensor_name].shape[dim] == state.position
    assert LOGITS in state.tensors


def test_prompt_cache_reuses_exactly_the_shared_prefix(programs, generator, tmp_path):
    name = "dense-xnnpack-fp32"
    prefix, question_1, question_2 = random_tokens(generator, 45), random_tokens(generator, 7), random_tokens(generator, 5)
    cache = tmp_path / "prompt.cache"
    session = Session(ProgramRunner(programs.program(name)))

    def ask(prompt):
        session.reset()
        result = session.respond(prompt, max_new_tokens=10, prompt_cache=cache)
        assert result.tokens == one_shot(programs.program(name), prompt, 10)
        return result.reused_tokens

    assert ask(prefix) == 0  # no file yet: the prompt's state is stored
    assert read_state_file(cache).tokens == prefix
    assert ask(prefix + question_1) == len(prefix)
    assert ask(prefix + question_2) == len(prefix)
    assert ask(prefix) == len(prefix)  # the whole prompt: its logits come from the file
    assert read_state_file(cache).tokens == prefix  # hits leave the file as it was
    other = random_tokens(generator, 20)
    assert ask(other) == 0  # not a prefix: prefilled, and stored in place of the old state
    assert read_state_file(cache).tokens == other


def test_gdn_run_save_load_and_prompt_cache(programs, seed, tmp_path, capsys):
    name = "dense-xnnpack-fp32"
    tokenizer_path = programs.tokenizer_path(name)
    tokenizer = load_tokenizer(tokenizer_path)
    program = ["--model", str(programs.program(name)), "--tokenizer", str(tokenizer_path)]
    words = "the quick brown fox jumps over a lazy dog while the cat watches from the window".split()
    rng = random.Random(seed)
    text_1, text_2 = " ".join(rng.choices(words, k=12)), " " + " ".join(rng.choices(words, k=6))
    state = tmp_path / "chat.state"

    assert run_main([*program, "--prompt", text_1, "--max-new-tokens", "6", "--save-state", str(state)]) == 0
    capsys.readouterr()
    assert run_main([*program, "--prompt", text_2, "--max-new-tokens", "8", "--load-state", str(state)]) == 0
    continued = capsys.readouterr().out.removesuffix("\n")
    saved = read_state_file(state)
    expected = one_shot(programs.program(name), saved.tokens + tokenizer.encode(text_2).ids, 8)
    assert continued == streamed(tokenizer, expected)

    cache = tmp_path / "prompt.cache"
    for prompt, reused in ((text_1, 0), (text_1 + text_2, len(tokenizer.encode(text_1).ids))):
        assert run_main([*program, "--prompt", prompt, "--max-new-tokens", "5", "--prompt-cache", str(cache)]) == 0
        captured = capsys.readouterr()
        assert f"reused {reused} of {len(tokenizer.encode(prompt).ids)} prompt tokens" in captured.err
        expected = one_shot(programs.program(name), tokenizer.encode(prompt).ids, 5)
        assert captured.out.removesuffix("\n") == streamed(tokenizer, expected)


def test_chat_feeds_each_turn_once_and_continues_as_one_shot(programs, seed, monkeypatch, capsys):
    name = "moe-portable-fp32"
    tokenizer_path = programs.tokenizer_path(name)
    tokenizer = load_tokenizer(tokenizer_path)
    words = "hello world how are you the sea is wide and deep".split()
    rng = random.Random(seed)
    messages = [" ".join(rng.choices(words, k=5)), " ".join(rng.choices(words, k=4))]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(message + "\n" for message in messages)))
    status = run_main(["--model", str(programs.program(name)), "--tokenizer", str(tokenizer_path), "--chat",
                       "--max-new-tokens", "7"])
    captured = capsys.readouterr()
    assert status == 0, captured.err

    # The reference writes ChatML out itself and generates over the whole conversation at once.
    eos_ids = ProgramRunner(programs.program(name)).eos_ids
    im_end = tokenizer.token_to_id("<|im_end|>")
    conversation, replies = [], []
    for index, message in enumerate(messages):
        if replies and replies[-1][-1:] != [im_end]:
            conversation += tokenizer.encode("<|im_end|>", add_special_tokens=False).ids
        opening = "\n" if index else ""
        conversation += tokenizer.encode(f"{opening}<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n",
                                         add_special_tokens=False).ids
        reply = one_shot(programs.program(name), conversation, 7)
        conversation += reply
        replies.append(reply)
    shown = [streamed(tokenizer, [t for t in reply if t not in eos_ids]) for reply in replies]
    assert captured.out == "".join(text + "\n" for text in shown)


def refusal(arguments, capsys) -> str:
    """gdn-run's one error line for ``arguments`` (status 1)."""
    capsys.readouterr()  # what making the programs printed
    assert run_main(arguments) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_foreign_truncated_and_out_of_context_states_are_refused(programs, generator, tmp_path, capsys):
    dense, moe = "dense-xnnpack-fp32", "moe-portable-fp32"
    run_dense = ["--model", str(programs.program(dense)), "--tokenizer", str(programs.tokenizer_path(dense)),
                 "--prompt", "hello", "--max-new-tokens", "2"]
    moe_state = tmp_path / "moe.state"
    session = Session(ProgramRunner(programs.program(moe)))
    session.feed(random_tokens(generator, 20))
    session.save(moe_state)
    line = refusal([*run_dense, "--load-state", str(moe_state)], capsys)
    assert line.startswith(f"gdn-run: error: --load-state {moe_state}: saved by another program")
    line = refusal([*run_dense, "--prompt-cache", str(moe_state)], capsys)
    assert line.startswith(f"gdn-run: error: --prompt-cache {moe_state}: saved by another program")
    assert read_state_file(moe_state).tokens == session.tokens  # a refused cache is never overwritten

    dense_state = tmp_path / "dense.state"
    session = Session(ProgramRunner(programs.program(dense)))
    session.feed(random_tokens(generator, 30))
    session.save(dense_state)
    data = dense_state.read_bytes()
    truncated = tmp_path / "truncated.state"
    truncated.write_bytes(data[: len(data) // 2])
    line = refusal([*run_dense, "--load-state", str(truncated)], capsys)
    assert line.startswith(f"gdn-run: error: --load-state {truncated}: not a complete state file")

    from safetensors.torch import save

    state = read_state_file(dense_state)
    beyond = MAX_SEQ_LEN + 1
    tokens = state.tokens + random_tokens(generator, beyond - len(state.tokens))
    with open(dense_state, "rb") as handle:
        header = json.loads(handle.read(8 + int.from_bytes(data[:8], "little"))[8:])["__metadata__"]
    header.update(position=str(beyond), tokens=json.dumps(tokens))
    too_far = tmp_path / "too_far.state"
    too_far.write_bytes(save(state.tensors, header))
    line = refusal([*run_dense, "--load-state", str(too_far)], capsys)
    assert line == (f"gdn-run: error: --load-state {too_far}: its position {beyond} is beyond the program's "
                    f"context ({MAX_SEQ_LEN} tokens)")

    with pytest.raises(StateFileError, match="not a gdn-export state file"):
        read_state_file(programs.checkpoint("dense") / "model.safetensors")
    with pytest.raises(ValueError, match="nothing to save"):
        Session(ProgramRunner(programs.program(dense))).save(tmp_path / "empty.state")


def test_chat_ctrl_c_ends_with_one_line_and_writes_nothing(programs, tmp_path, monkeypatch, capsys):
    name = "moe-portable-fp32"

    class InterruptedStdin(io.StringIO):
        """One message, then Ctrl-C while gdn-run waits for the next."""

        def readline(self, *args):
            line = super().readline(*args)
            if not line:
                raise KeyboardInterrupt
            return line

    monkeypatch.setattr("sys.stdin", InterruptedStdin("hello there\n"))
    state = tmp_path / "chat.state"
    arguments = ["--model", str(programs.program(name)), "--tokenizer", str(programs.tokenizer_path(name)),
                 "--chat", "--max-new-tokens", "3", "--save-state", str(state)]
    capsys.readouterr()  # what making the program printed
    assert run_main(arguments) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["gdn-run: interrupted; nothing written"]
    assert not state.exists()


def test_bench_prompt_cache_times_a_restored_prefix(programs, seed, tmp_path):
    """gdn-bench e2e --prompt-cache's measurement, on a tiny program (the 0.8B shape is the benchmark's)."""
    from gdn_bench import e2e

    plan = e2e.CachePlan(prefix=40, question=6, rounds=2, vocab_size=512, seed=seed, threads=1)
    cache = tmp_path / "prompt_cache.state"
    entry = e2e.time_prompt_cache(str(programs.program("dense-xnnpack-fp32")), plan, str(cache))
    state = read_state_file(cache)
    assert state.position == len(state.tokens) == 40 and entry["state_file_bytes"] == cache.stat().st_size
    # Restored and prefilled states give the same first token, to float32 rounding.
    assert entry["first_token_equal"] and entry["max_logits_gap"] < 1e-4
    assert entry["ttft_cached_s"] > 0 and entry["ttft_uncached_s"] > 0 and entry["load_s"] > 0
    table = e2e.prompt_cache_report({**entry, "threads": 1, "load_average": [0.5, 0.7], "measured_at": "now"})
    ratio = entry["ttft_cached_s"] / entry["ttft_uncached_s"]
    assert f"| 40 + 6 | {entry['ttft_uncached_s']:.2f} | {entry['ttft_cached_s']:.3f} | {ratio:.3f}x | 0.1x |" in table
