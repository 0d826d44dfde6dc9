"""examples/cpp_runner: the C++ runner and its tokenizer against Python references.

* The C++ byte-level BPE tokenizer against the Hugging Face ``tokenizers``
  library (ids, decoded text, and the text as the runner streams it token by
  token), on tokenizers trained here in Qwen3.5's style (NFC, its Split regex,
  ByteLevel) and GPT-2's (ByteLevel's own regex, legacy "a b" merges).
* The C++ runner's generation against a greedy loop over the same ``.pte`` in
  ExecuTorch's Python runtime: a tiny stateful LLM-convention program exported
  here (an embedding, a running sum kept in a mutable buffer, XNNPACK linears,
  the metadata methods ExecuTorch's LLM export writes).
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import warnings

import pytest
import torch

from examples.cpp_runner import build as cpp_runner
from tests.conftest import derived_seed

QWEN35_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's 2024; we're here, aren't we?",
    "héllo wörld — 你好，世界。こんにちは 안녕하세요",
    "def f(x):\n    return x  +  1\n\n\n# comment\r\n",
    "Numbers 1234567 and 3.14159, 1,000,000; emoji 🙂👍🏽 ™ © ½",
    "naïve café Ελληνικά русский текст عربي हिन्दी",
]
# Vocabulary 400 < 256 bytes + merges learnt, so many non-ASCII characters stay
# split across tokens and the streamed text must hold partial UTF-8 back.
VOCAB_SIZE = 400
TOKENIZER_STRINGS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's I'M we'Re they'll 'sup",
    "  leading and trailing  ",
    "a\n\nb\r\n  c\t\td   \n",
    'x = (1+2)*3 // 4; y="str"',
    "1234567890 3.14159 1,000,000",
    "héllo wörld — 你好",
    "naïve café Ελληνικά русский",
    "emoji 🙂👍🏽 and ™ © ½ ²",
    "<|endoftext|>hello<|im_start|> x<|im_end|>",
    "\u00a0nbsp\u3000ideographic space",
    "tab\ttab  \n  \n x",
    "!!!???...",
    " ",
    "\n",
]
PROMPT = "The quick brown fox jumps"
# Random strings are drawn from these: ASCII (all whitespace kinds, contractions'
# pieces, punctuation runs), letters of several scripts, digits, other spaces,
# punctuation and emoji outside ASCII.
RANDOM_STRING_PIECES = [
    *"aAbBsStTdDmMlLrReEvVzZ0123456789 \n\r\t'\"!?.,;:-_()[]{}<>/\\|@#$%^&*+=~`",
    *"éüßñçøÅÆЖжЯяΩωλ你好世界こんにちはカタ안녕١٢٣¹²½",
    *"—–…“”«»€£\u00a0\u3000\u2009🙂👍🏽🚀",
    "  ", "\n\n", "\r\n", "'s", "'LL", " 'll", "...", "12345", "<|im_end|>",
]


def train_tokenizer(style: str):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if style == "qwen35":
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TRAINING_TEXT * 10, trainer)
    return tokenizer


def save_tokenizer(tokenizer, path, legacy_merges: bool = False):
    """tokenizer.json as Hugging Face writes it; legacy_merges writes merges as "a b" strings."""
    from tokenizers import Tokenizer

    document = json.loads(tokenizer.to_str())
    if legacy_merges:
        document["model"]["merges"] = [" ".join(pair) for pair in document["model"]["merges"]]
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="session")
def runner_binary(runner):
    return runner  # conftest.py builds it


@pytest.fixture(scope="session")
def seed():
    # One seed for the module's shared program and its tests, from the run's seed (a replay draws it again).
    return derived_seed(__name__)


@pytest.fixture(scope="session")
def qwen_tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    save_tokenizer(train_tokenizer("qwen35"), path)
    return path


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(qwen_tokenizer_path))


def run_binary(command, **kwargs):
    # Bytes, decoded here: text mode would turn a generated "\r" into "\n"
    # (universal newlines) and the comparison with the tokenizer would fail.
    if "input" in kwargs and isinstance(kwargs["input"], str):
        kwargs["input"] = kwargs["input"].encode()
    result = subprocess.run([str(part) for part in command], capture_output=True, timeout=120, **kwargs)
    result.stdout = result.stdout.decode("utf-8", errors="replace")
    result.stderr = result.stderr.decode("utf-8", errors="replace")
    return result


def random_strings(seed: int, count: int = 60) -> list:
    generator = random.Random(seed)
    return ["".join(generator.choices(RANDOM_STRING_PIECES, k=generator.randint(1, 30))) for _ in range(count)]


@pytest.mark.parametrize("style", ["qwen35", "gpt2"])
def test_tokenizer_matches_hugging_face(runner_binary, tmp_path, style, seed):
    path = tmp_path / "tokenizer.json"
    reference = save_tokenizer(train_tokenizer(style), path, legacy_merges=style == "gpt2")
    strings = TOKENIZER_STRINGS + random_strings(seed)
    result = run_binary([runner_binary.parent / cpp_runner.TOKENIZE_NAME, "--tokenizer", path],
                        input=json.dumps(strings))
    assert result.returncode == 0, result.stderr
    outputs = json.loads(result.stdout)
    assert len(outputs) == len(strings)
    split_characters = 0
    for text, output in zip(strings, outputs):
        expected_ids = reference.encode(text).ids
        expected_text = reference.decode(expected_ids, skip_special_tokens=False)
        assert output["ids"] == expected_ids, f"seed {seed}: {style} encode({text!r})"
        assert output["text"] == expected_text, f"seed {seed}: {style} decode of {text!r}"
        assert output["streamed"] == expected_text, f"seed {seed}: {style} streamed decode of {text!r}"
        split_characters += sum("\ufffd" in reference.decode([i]) for i in expected_ids)
    # Some tokens are partial UTF-8 (decode to U+FFFD alone), so streaming was exercised.
    assert split_characters > 0


class RunningSumLM(torch.nn.Module):
    """The LLM program convention in a few lines: forward(tokens [1, T], input_pos [1]) -> logits
    [1, T, vocab]. Its state is the running sum of the embeddings seen so far, kept in a mutable
    buffer (position 0 starts a new sequence), and each position's logits depend on that sum and on
    the position itself, so a runner must carry the state across prefill chunks and decode steps
    and pass the right input_pos to reproduce them."""

    def __init__(self, vocab_size: int, dim: int = 32):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.position_gain = torch.nn.Parameter(0.3 * torch.randn(dim))
        self.head = torch.nn.Linear(dim, vocab_size)
        self.register_buffer("running_sum", torch.zeros(1, dim))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        embeddings = self.embedding(tokens)
        # where, not a multiply: the buffer's initial contents are undefined in a program, maybe NaN
        previous = torch.where(input_pos > 0, self.running_sum, torch.zeros_like(self.running_sum))
        sums = previous.unsqueeze(1) + torch.cumsum(embeddings, dim=1)
        positions = (input_pos + torch.arange(tokens.shape[1])).to(embeddings.dtype)
        hidden = torch.tanh(self.mix(sums) + positions.unsqueeze(-1) * self.position_gain)
        self.running_sum.copy_(sums[:, -1])
        return self.head(hidden)


MAX_CHUNK = 4  # get_max_seq_len: the prompt below takes several prefill calls
MAX_CONTEXT = 40
MAX_NEW_TOKENS = 12


def export_llm_program(model: torch.nn.Module, path, metadata: dict, edge_partitioners=()) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    example = (torch.tensor([[1, 2]]), torch.tensor([0]))
    length = torch.export.Dim("token_dim", min=1, max=MAX_CHUNK)
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=({1: length}, None), strict=False)
    edge = to_edge_transform_and_lower(
        program, partitioner=[XnnpackPartitioner()], constant_methods=metadata,
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    for partitioner in edge_partitioners:
        edge = edge.to_backend(partitioner)
    with warnings.catch_warnings():
        # "buffers that are mutated ... have a meaningless initial state": the
        # model never reads running_sum at position 0, which starts every sequence.
        warnings.filterwarnings("ignore", message="Mutation on a buffer")
        manager = edge.to_executorch(ExecutorchBackendConfig(sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass()))
    path.write_bytes(manager.buffer)


def eager_greedy(model, prompt_ids, steps):
    tokens, position, feed = [], 0, list(prompt_ids)
    with torch.no_grad():
        while len(tokens) < steps:
            for start in range(0, len(feed), MAX_CHUNK):
                chunk = feed[start:start + MAX_CHUNK]
                logits = model(torch.tensor([chunk]), torch.tensor([position]))
                position += len(chunk)
            feed = [int(logits[0, -1].argmax())]
            tokens += feed
    return tokens


def executorch_greedy(path, prompt_ids, eos_ids):
    """The reference loop: ExecuTorch's Python runtime over the same program."""
    from executorch.runtime import Runtime

    forward = Runtime.get().load_program(str(path)).load_method("forward")
    tokens, position, feed = [], 0, list(prompt_ids)
    budget = min(MAX_NEW_TOKENS, MAX_CONTEXT - len(prompt_ids) + 1)
    while True:
        for start in range(0, len(feed), MAX_CHUNK):
            chunk = feed[start:start + MAX_CHUNK]
            (logits,) = forward.execute([torch.tensor([chunk]), torch.tensor([position])])
            position += len(chunk)
        token = int(logits[0, -1].argmax())
        tokens.append(token)
        if token in eos_ids or len(tokens) == budget:
            return tokens
        feed = [token]


@pytest.fixture(scope="session")
def llm_program(tmp_path_factory, qwen_tokenizer, seed):
    """(program path, prompt ids, eos id, greedy ids from ExecuTorch's Python runtime)."""
    return make_llm_program(tmp_path_factory, qwen_tokenizer, seed, int8_embedding=False)


@pytest.fixture(scope="session")
def int8_embedding_program(tmp_path_factory, qwen_tokenizer, seed):
    """``llm_program`` with its embedding quantized to 8 bits as ``gdn_export.quantize`` does: looked up by our
    GdnEmbeddingBackend delegate, whose runtime the runner gets from the linked libgdn_runtime_ops.so."""
    return make_llm_program(tmp_path_factory, qwen_tokenizer, seed, int8_embedding=True)


def make_llm_program(tmp_path_factory, qwen_tokenizer, seed, int8_embedding: bool):
    torch.manual_seed(seed)
    model = RunningSumLM(qwen_tokenizer.get_vocab_size()).eval()
    edge_partitioners = ()
    if int8_embedding:
        from gdn_export.quantize import quantize_module
        from runtime_ops.embedding_delegate import GdnEmbeddingPartitioner
        from runtime_ops.loader import load

        load()  # the delegate's runtime, for the reference loop in ExecuTorch's Python runtime
        quantize_module(model.embedding, "8da8w")
        edge_partitioners = (GdnEmbeddingPartitioner(),)
    prompt_ids = qwen_tokenizer.encode(PROMPT).ids
    assert len(prompt_ids) > MAX_CHUNK, "the prompt must take several prefill calls"
    # EOS: a token greedy decoding first reaches after a few steps, so the
    # runner has to stop there; a random model may never change token, and
    # then the EOS is one it never produces and the run ends at the budget.
    eager = eager_greedy(model, prompt_ids, MAX_NEW_TOKENS - 2)
    fresh = [i for i in range(3, len(eager)) if eager[i] not in eager[:i]]
    unused = [i for i in range(qwen_tokenizer.get_vocab_size()) if i not in eager]
    eos_id = eager[fresh[0]] if fresh else unused[0]
    # The second EOS (<|im_end|>, as in Qwen's configs) must not end the run first;
    # where this random model happens to produce it, an id it never produces stands in.
    im_end = qwen_tokenizer.token_to_id("<|im_end|>")
    second_eos = im_end if im_end not in eager else next(i for i in unused if i != eos_id)
    metadata = {
        "get_max_seq_len": MAX_CHUNK,
        "get_max_context_len": MAX_CONTEXT,
        "get_vocab_size": qwen_tokenizer.get_vocab_size(),
        "get_n_layers": 1,
        "get_bos_id": qwen_tokenizer.token_to_id("<|endoftext|>"),
        "get_eos_ids": [eos_id, second_eos],
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
    }
    path = tmp_path_factory.mktemp("program") / "model.pte"
    export_llm_program(model, path, metadata, edge_partitioners)
    if int8_embedding:
        from gdn_export.runner import program_delegate_ids

        assert program_delegate_ids(path) == {"XnnpackBackend", "GdnEmbeddingBackend"}
    expected = executorch_greedy(path, prompt_ids, set(metadata["get_eos_ids"]))
    if fresh:
        assert expected[-1] == eos_id, f"seed {seed}: the ExecuTorch loop should stop at EOS {eos_id}: {expected}"
    return path, prompt_ids, eos_id, expected


def parse_ids(stderr: str, label: str) -> list:
    line = next(line for line in stderr.splitlines() if line.startswith(label))
    return [int(token) for token in line[len(label):].split()]


def run_runner(runner_binary, program, tokenizer_path, *extra):
    return run_binary([runner_binary, "--model", program, "--tokenizer", tokenizer_path, "--prompt", PROMPT,
                       "--max-new-tokens", MAX_NEW_TOKENS, "--print-token-ids", *extra])


def test_runner_greedy_matches_executorch_python(runner_binary, llm_program, qwen_tokenizer, qwen_tokenizer_path,
                                                 seed):
    path, prompt_ids, eos_id, expected = llm_program
    result = run_runner(runner_binary, path, qwen_tokenizer_path, "--temperature", "0")
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    assert parse_ids(result.stderr, "prompt token ids:") == prompt_ids, f"seed {seed}"
    generated = parse_ids(result.stderr, "generated token ids:")
    assert generated == expected, f"seed {seed}: C++ {generated} vs ExecuTorch Python {expected} (EOS {eos_id})"
    shown = expected[:-1] if expected[-1] == eos_id else expected  # the EOS token is not printed
    assert result.stdout == PROMPT + qwen_tokenizer.decode(shown, skip_special_tokens=False) + "\n", f"seed {seed}"
    assert "prefill:" in result.stderr and "tok/s" in result.stderr


def test_runner_runs_the_int8_embedding_delegate(runner_binary, int8_embedding_program, qwen_tokenizer_path, seed):
    path, prompt_ids, eos_id, expected = int8_embedding_program
    result = run_runner(runner_binary, path, qwen_tokenizer_path, "--temperature", "0")
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    generated = parse_ids(result.stderr, "generated token ids:")
    assert generated == expected, f"seed {seed}: C++ {generated} vs ExecuTorch Python {expected} (EOS {eos_id})"


def test_runner_sampling_at_low_temperature_is_greedy(runner_binary, llm_program, qwen_tokenizer_path, seed):
    # softmax(logits / T) puts all its mass on the argmax as T -> 0
    path, _, _, expected = llm_program
    result = run_runner(runner_binary, path, qwen_tokenizer_path, "--temperature", "1e-6", "--seed", "7")
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    assert parse_ids(result.stderr, "generated token ids:") == expected, f"seed {seed}"


def test_runner_rejects_bad_input(runner_binary, llm_program, tmp_path):
    path = llm_program[0]
    missing = run_binary([runner_binary, "--model", tmp_path / "missing.pte", "--tokenizer", tmp_path / "t.json",
                          "--prompt", "hi"])
    assert missing.returncode == 2 and "--model" in missing.stderr and "no such file" in missing.stderr

    unigram = tmp_path / "unigram.json"
    unigram.write_text(json.dumps({"model": {"type": "Unigram", "vocab": []}}))
    refused = run_binary([runner_binary, "--model", path, "--tokenizer", unigram, "--prompt", "hi"])
    assert refused.returncode == 1
    assert f"--tokenizer {unigram}" in refused.stderr and "type Unigram is not supported" in refused.stderr

    negative = run_binary([runner_binary, "--model", path, "--tokenizer", unigram, "--prompt", "hi",
                           "--max-new-tokens", "0"])
    assert negative.returncode == 2 and "--max-new-tokens" in negative.stderr

    no_library = run_binary([runner_binary, "--model", path, "--tokenizer", unigram, "--prompt", "hi",
                             "--backend-lib", tmp_path / "missing.so"])
    assert no_library.returncode == 2 and f"--backend-lib {tmp_path / 'missing.so'}: no such file" in no_library.stderr
    not_a_library = run_binary([runner_binary, "--model", path, "--tokenizer", unigram, "--prompt", "hi",
                                "--backend-lib", unigram])
    assert not_a_library.returncode == 2 and f"--backend-lib {unigram}: cannot load it" in not_a_library.stderr


@pytest.mark.parametrize("chunk", [1, 3])
def test_runner_prefill_chunk_changes_the_calls_not_the_tokens(runner_binary, llm_program, qwen_tokenizer_path,
                                                               seed, chunk):
    path, prompt_ids, _, expected = llm_program
    result = run_runner(runner_binary, path, qwen_tokenizer_path, "--temperature", "0", "--prefill-chunk", chunk,
                        "--verbose")
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    assert parse_ids(result.stderr, "generated token ids:") == expected, f"seed {seed}"
    # The trace's prompt calls: chunks of `chunk` tokens at consecutive positions, the last one shorter.
    calls = [re.match(r"forward: (\d+) tokens at (\d+) ->", line) for line in result.stderr.splitlines()]
    calls = [(int(m[1]), int(m[2])) for m in calls if m]
    starts = range(0, len(prompt_ids), chunk)
    assert calls[:len(starts)] == [(min(chunk, len(prompt_ids) - start), start) for start in starts], calls


def test_runner_random_prompt_ignoring_eos_generates_the_whole_budget(runner_binary, llm_program,
                                                                       qwen_tokenizer_path, seed):
    path = llm_program[0]
    command = [runner_binary, "--model", path, "--tokenizer", qwen_tokenizer_path, "--random-prompt-tokens", 6,
               "--seed", seed, "--max-new-tokens", MAX_NEW_TOKENS, "--ignore-eos", "--temperature", "0",
               "--print-token-ids"]
    first, second = run_binary(command), run_binary(command)
    assert first.returncode == 0, f"seed {seed}: {first.stderr}"
    prompt_ids = parse_ids(first.stderr, "prompt token ids:")
    assert prompt_ids == parse_ids(second.stderr, "prompt token ids:"), "the prompt must follow --seed"
    assert len(prompt_ids) == 6 and len(set(prompt_ids)) > 1, prompt_ids
    # No EOS stops the reference loop either: it runs to the same budget.
    expected = executorch_greedy(path, prompt_ids, eos_ids=set())
    assert parse_ids(first.stderr, "generated token ids:") == expected, f"seed {seed}"
    assert len(expected) == MAX_NEW_TOKENS


def timings_lines(stderr: str) -> list:
    return [json.loads(line[len("timings: "):]) for line in stderr.splitlines() if line.startswith("timings: ")]


def test_runner_runs_repeat_the_generation_from_position_zero_with_a_timings_line_each(
        runner_binary, llm_program, qwen_tokenizer_path, seed):
    path, prompt_ids, _, _ = llm_program
    runs, chunk = 3, 3
    result = run_binary([runner_binary, "--model", path, "--tokenizer", qwen_tokenizer_path, "--prompt", PROMPT,
                         "--max-new-tokens", MAX_NEW_TOKENS, "--ignore-eos", "--temperature", "0",
                         "--prefill-chunk", chunk, "--runs", runs, "--timings-json", "--print-token-ids"])
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    # Each run starts a new sequence, so each generates what one run from an empty state does.
    expected = executorch_greedy(path, prompt_ids, eos_ids=set())
    generated = [[int(t) for t in line.split(":")[1].split()] for line in result.stderr.splitlines()
                 if line.startswith("generated token ids:")]
    assert generated == [expected] * runs, f"seed {seed}: {generated} vs {expected}"
    timings = timings_lines(result.stderr)
    assert [t["run"] for t in timings] == list(range(runs)), result.stderr
    human = re.findall(r"^prefill: (\d+) tokens in ([\d.]+) ms", result.stderr, flags=re.M)
    decode = re.findall(r"^decode: (\d+) tokens \((\d+) steps\) in ([\d.]+) ms", result.stderr, flags=re.M)
    assert len(human) == len(decode) == runs, result.stderr
    for entry, (tokens, prefill_ms), (new_tokens, steps, decode_ms) in zip(timings, human, decode):
        assert entry["prompt_tokens"] == int(tokens) == len(prompt_ids)
        assert entry["prefill_calls"] == -(-len(prompt_ids) // chunk)
        assert entry["generated_tokens"] == int(new_tokens) == len(expected)
        assert entry["decode_steps"] == int(steps) == len(expected) - 1
        # The JSON line's seconds are the human lines' milliseconds, unrounded.
        assert abs(1e3 * entry["prefill_seconds"] - float(prefill_ms)) <= 0.05 + 1e-9, (entry, prefill_ms)
        assert abs(1e3 * entry["decode_seconds"] - float(decode_ms)) <= 0.05 + 1e-9, (entry, decode_ms)
        assert entry["prefill_seconds"] > 0 and entry["decode_seconds"] > 0 and entry["load_seconds"] > 0
        # The median step: at least half the steps (rounded up) last as long, and all of them add up to the sum.
        steps = entry["decode_steps"]
        assert 0 < math.ceil(steps / 2) * entry["decode_median_step_seconds"] <= entry["decode_seconds"], entry
    assert len({t["load_seconds"] for t in timings}) == 1  # one load, before the runs


@pytest.mark.parametrize("threads", [1, 3])
def test_runner_threads_resize_executorchs_pool_and_keep_the_tokens(runner_binary, llm_program, qwen_tokenizer_path,
                                                                   seed, threads, tmp_path):
    path, prompt_ids, _, _ = llm_program
    result = run_binary([runner_binary, "--model", path, "--tokenizer", qwen_tokenizer_path, "--prompt", PROMPT,
                         "--max-new-tokens", 2, "--ignore-eos", "--temperature", "0", "--threads", threads,
                         "--timings-json", "--print-token-ids", "--verbose"])
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    assert f"Resetting threadpool to {threads} threads." in result.stderr, result.stderr  # ExecuTorch's own log line
    expected = executorch_greedy(path, prompt_ids, eos_ids=set())[:2]
    generated = [[int(t) for t in line.split(":")[1].split()] for line in result.stderr.splitlines()
                 if line.startswith("generated token ids:")]
    assert generated == [expected], f"seed {seed}: {generated} vs {expected}"
    (entry,) = timings_lines(result.stderr)
    assert entry["decode_steps"] == 1 and entry["decode_median_step_seconds"] == entry["decode_seconds"] > 0, entry
    for etdump, message in ((tmp_path, f"--etdump {tmp_path} is a folder, expected a file path"),
                            (tmp_path / "none" / "p.etdp", f"--etdump {tmp_path / 'none' / 'p.etdp'}: folder")):
        refused = run_binary([runner_binary, "--model", path, "--tokenizer", qwen_tokenizer_path, "--prompt", "hi",
                              "--etdump", etdump])
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    for bad in ("0", "1025", "two"):
        refused = run_binary([runner_binary, "--model", path, "--tokenizer", qwen_tokenizer_path, "--prompt", "hi",
                              "--threads", bad])
        message = f"--threads {bad}: not a number" if bad == "two" else f"--threads must be from 1 to 1024, got {bad}"
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


def test_runner_prints_no_timings_line_unless_asked(runner_binary, llm_program, qwen_tokenizer_path):
    result = run_runner(runner_binary, llm_program[0], qwen_tokenizer_path, "--temperature", "0", "--runs", 2)
    assert result.returncode == 0, result.stderr
    assert not timings_lines(result.stderr) and result.stderr.count("prefill:") == 2


@pytest.mark.parametrize("flag", ["--prefill-chunk", "--random-prompt-tokens", "--runs"])
def test_runner_refuses_counts_below_one(runner_binary, llm_program, qwen_tokenizer_path, flag):
    result = run_binary([runner_binary, "--model", llm_program[0], "--tokenizer", qwen_tokenizer_path,
                         "--prompt", "hi", flag, "0"])
    assert result.returncode == 2 and f"{flag} must be at least 1, got 0" in result.stderr, result.stderr


def test_runner_cuda_graph_leaves_other_delegates_programs_alone(runner_binary, llm_program, qwen_tokenizer_path,
                                                                 seed):
    # --cuda-graph is CudaBackend's option for the decode method; a CPU program has no such delegate.
    path, _, _, expected = llm_program
    result = run_runner(runner_binary, path, qwen_tokenizer_path, "--temperature", "0", "--cuda-graph")
    assert result.returncode == 0, f"seed {seed}: {result.stderr}"
    assert parse_ids(result.stderr, "generated token ids:") == expected, f"seed {seed}"
