"""What a user meets at the command line: only our lines on stderr, Ctrl-C, and a tokenizer or prompt
that does not fit the program. Each case: one line, the right exit status, nothing partial written."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from gdn_export.cli import INTERRUPTED, run_main
from gdn_export.tiny import make_tiny_checkpoint
from tests.triton_interpreter import REPO_ROOT

MAX_SEQ_LEN = 2048
OUR_STDERR_LINE = re.compile(r"^(\[ *\d+\.\d s\] |export_qwen35: |gdn-run: |prefill: )")
EXPORT = "import sys; from gdn_export.cli import export_main; sys.exit(export_main())"
RUN = "import sys; from gdn_export.cli import run_main; sys.exit(run_main())"


def start(code: str, *arguments: str) -> subprocess.Popen:
    # The child gets Ctrl-C as a terminal gives it, whatever this process inherited: a test run started in
    # the background by a shell without job control ignores SIGINT, and so would every child, which Python
    # then leaves without its KeyboardInterrupt.
    return subprocess.Popen(
        [sys.executable, "-c", code, *arguments], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny portable program, exported by the CLI in a child; (checkpoint, program, the child's stderr)."""
    folder = tmp_path_factory.mktemp("cli_safety")
    checkpoint = make_tiny_checkpoint(folder / "tiny", seed=5)
    program = folder / "tiny.pte"
    child = start(EXPORT, "--checkpoint", str(checkpoint), "--output", str(program), "--backend", "portable",
                  "--max-seq-len", str(MAX_SEQ_LEN), "--prefill-chunk", "32")
    stdout, stderr = child.communicate(timeout=600)
    assert child.returncode == 0, stderr[-3000:]
    return checkpoint, program, stderr


def test_export_stderr_holds_only_our_lines(exported):
    _, _, stderr = exported
    lines = stderr.splitlines()
    assert lines and all(OUR_STDERR_LINE.match(line) for line in lines), lines


def test_export_shows_each_stage_with_elapsed_time(exported):
    _, _, stderr = exported
    stages = [re.match(r"^\[ *(\d+\.\d) s\] (.*)$", line) for line in stderr.splitlines()]
    assert all(stages), stderr
    elapsed = [float(stage.group(1)) for stage in stages]
    assert elapsed == sorted(elapsed), stderr
    # Each stage once, in the order they run (no quantization in this export; the CPU backends
    # export the state methods, whose fingerprint is a stage of its own).
    expected = ["loading ", "exporting ", "fingerprinting ", "lowering for portable",
                "lowering: to_edge and partition", "lowering: to_executorch", "writing "]
    assert [next((e for e in expected if stage.group(2).startswith(e)), None) for stage in stages] == expected, stderr


def test_run_stderr_holds_only_our_lines(exported):
    checkpoint, program, _ = exported
    child = start(RUN, "--model", str(program), "--tokenizer", str(checkpoint / "tokenizer.json"),
                  "--prompt", "hello world", "--max-new-tokens", "4")
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr
    assert [line for line in stderr.splitlines() if line] and all(
        OUR_STDERR_LINE.match(line) for line in stderr.splitlines() if line
    ), stderr


def interrupt_when(child: subprocess.Popen, ready: str, timeout: float = 300) -> str:
    """SIGINT to ``child`` once its stderr (watched=stderr) or stdout shows ``ready``; returns all its stderr."""
    watched = child.stdout if ready.startswith("stdout:") else child.stderr
    ready = ready.removeprefix("stdout:")
    seen, deadline = "", time.monotonic() + timeout
    while ready not in seen and time.monotonic() < deadline:
        character = watched.read(1)
        if not character:
            break
        seen += character
    assert ready in seen, f"never saw {ready!r}: {seen[-2000:]}"
    child.send_signal(signal.SIGINT)
    # Read through the same buffered streams (what read(1) already buffered stays in them).
    stdout_rest, stderr_rest = child.stdout.read(), child.stderr.read()
    child.wait(timeout=120)
    return (seen if watched is child.stderr else "") + stderr_rest


def test_ctrl_c_during_export_writes_nothing_and_leaves_the_old_output(exported, tmp_path):
    checkpoint, _, _ = exported
    output = tmp_path / "model.pte"
    output.write_bytes(b"the previous program")
    child = start(EXPORT, "--checkpoint", str(checkpoint), "--output", str(output), "--backend", "portable",
                  "--max-seq-len", "64")
    stderr = interrupt_when(child, "] lowering").strip().splitlines()
    assert child.returncode == INTERRUPTED, stderr
    assert stderr[-1] == "export_qwen35: interrupted; nothing written", stderr
    assert not any("Traceback" in line for line in stderr), stderr
    assert output.read_bytes() == b"the previous program"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.pte"]


def test_ctrl_c_during_generation(exported):
    checkpoint, program, _ = exported
    child = start(RUN, "--model", str(program), "--tokenizer", str(checkpoint / "tokenizer.json"),
                  "--prompt", "hello", "--max-new-tokens", str(MAX_SEQ_LEN - 8), "--temperature", "1.0",
                  "--seed", "3")
    # The first generated text arrives on stdout; the rest of the budget takes seconds more.
    lines = interrupt_when(child, "stdout: ").strip().splitlines()
    assert child.returncode == INTERRUPTED, lines
    assert lines[-1] == "gdn-run: interrupted; nothing written" and not any("Traceback" in line for line in lines)


def save_tokenizer(tokenizer, path) -> str:
    tokenizer.save(str(path))
    return str(path)


def run_error(capsys, *arguments) -> str:
    assert run_main(list(arguments)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("gdn-run: error: "), lines
    return lines[-1]


def test_a_tokenizer_larger_than_the_program_is_refused(exported, tmp_path, capsys):
    from tokenizers import Tokenizer

    checkpoint, program, _ = exported
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    vocab_size = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    tokenizer.add_tokens([f"extra{i}" for i in range(vocab_size + 5 - tokenizer.get_vocab_size())])
    larger = save_tokenizer(tokenizer, tmp_path / "larger.json")
    error = run_error(capsys, "--model", str(program), "--tokenizer", larger, "--prompt", "hello")
    assert f"{vocab_size + 5} tokens, but the program embeds only {vocab_size}" in error


def test_a_tokenizer_without_the_programs_special_ids_is_refused(exported, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    checkpoint, program, _ = exported
    tokenizer = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    smaller = save_tokenizer(tokenizer, tmp_path / "smaller.json")
    error = run_error(capsys, "--model", str(program), "--tokenizer", smaller, "--prompt", "hello")
    assert "the program's EOS id" in error and "not a special token: not this program's tokenizer" in error


def test_a_prompt_longer_than_the_context_names_the_export_flag(exported, capsys):
    from tokenizers import Tokenizer

    checkpoint, program, _ = exported
    prompt = "hello world " * MAX_SEQ_LEN
    length = len(Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(prompt).ids)
    error = run_error(capsys, "--model", str(program), "--tokenizer", str(checkpoint / "tokenizer.json"),
                      "--prompt", prompt)
    assert f"--prompt is {length} tokens; the program's context holds {MAX_SEQ_LEN}" in error
    assert f"export with --max-seq-len {length + 1} or more" in error


def help_entries(text: str) -> dict:
    """argparse's option list: {'--flag': its help text, joined over lines}."""
    entries, current = {}, None
    for line in text.splitlines():
        match = re.match(r"^  (-{1,2}[\w-]+)(.*?)(?:\s{2,}(\S.*))?$", line)
        if match:
            current = match.group(1)
            entries[current] = match.group(3) or ""
        elif current and line.startswith(" " * 10) and line.strip():
            entries[current] = (entries[current] + " " + line.strip()).strip()
        elif not line.strip():
            current = None
    return entries


@pytest.mark.parametrize("command", [["export_qwen35"], ["gdn-run"], ["gdn-bench"], ["gdn-bench", "cpu"],
                                     ["gdn-bench", "cuda"], ["gdn-bench", "metal"], ["gdn-bench", "e2e"],
                                     ["gdn-bench", "linear"], ["gdn-bench", "pages"]])
def test_help_explains_every_option_once_without_markup(command, capsys, monkeypatch):
    from gdn_bench.cli import main as bench_main
    from gdn_export.cli import export_main

    main = {"export_qwen35": export_main, "gdn-run": run_main, "gdn-bench": bench_main}[command[0]]
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        main([*command[1:], "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    entries = help_entries(text)
    assert entries, text
    for flag, explanation in entries.items():
        assert explanation, f"{' '.join(command)} --help: {flag} has no explanation\n{text}"
        assert explanation.count("(default") <= 1, f"{' '.join(command)} --help: {flag}: {explanation}"
    assert "``" not in text and "(default: None)" not in text and ":class:" not in text, text
