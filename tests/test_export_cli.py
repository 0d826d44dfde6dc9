"""Bad input to export_qwen35 and gdn-run: exit code != 0, one clear line, no partial .pte."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch

from gdn_export import loading
from gdn_export.cli import export_main, run_main
from gdn_export.tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("cli") / "tiny", seed=3)


def broken_copy(checkpoint, tmp_path, damage):
    folder = tmp_path / "broken"
    shutil.copytree(checkpoint, folder)
    damage(folder)
    return folder


def remove(name):
    return lambda folder: (folder / name).unlink()


def rewrite_config(**changes):
    def damage(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))

    return damage


def truncate_weights(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage, message",
    [
        (remove("config.json"), "missing config.json"),
        (remove("model.safetensors"), "missing weights"),
        (remove("tokenizer.json"), "missing tokenizer.json"),
        (rewrite_config(model_type="llama"), "model_type 'llama'"),
        (truncate_weights, "model.safetensors"),
    ],
    ids=["no-config", "no-weights", "no-tokenizer", "wrong-model-type", "corrupt-safetensors"],
)
def test_bad_checkpoint(checkpoint, tmp_path, capsys, damage, message):
    folder = broken_copy(checkpoint, tmp_path, damage)
    output = tmp_path / "model.pte"
    assert export_main(["--checkpoint", str(folder), "--output", str(output)]) != 0
    error_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("export_qwen35: error")]
    assert len(error_lines) == 1 and message in error_lines[0]
    assert list(tmp_path.glob("*.pte*")) == [] and list(tmp_path.glob(".model.pte*")) == []


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-seq-len", "1"], "--max-seq-len"),
        (["--prefill-chunk", "300", "--max-seq-len", "256"], "--prefill-chunk"),
        (["--quantize", "8da4w", "--backend", "portable"], "8da4w needs --backend xnnpack"),
        (["--state-dtype", "float16", "--backend", "cuda"], "--state-dtype float16 needs --backend xnnpack or portable"),
        (["--state-dtype", "float16", "--dtype", "bf16"], "--state-dtype float16 needs --dtype fp32"),
    ],
)
def test_bad_flag_values(checkpoint, tmp_path, capsys, flags, message):
    output = tmp_path / "model.pte"
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(output), *flags]) != 0
    assert message in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of machines without a CUDA GPU")
def test_cuda_backend_without_a_gpu_says_so_before_loading(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load_model", _must_not_load)
    output = tmp_path / "model.pte"
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(output), "--backend", "cuda"]) == 1
    error_lines = capsys.readouterr().err.strip().splitlines()
    assert error_lines[-1].startswith("export_qwen35: error: --backend cuda") and "no CUDA device" in error_lines[-1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(platform.system() == "Darwin", reason="checks the error of machines other than Macs")
def test_metal_backend_off_macos_says_so_before_loading(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load_model", _must_not_load)
    output = tmp_path / "model.pte"
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(output), "--backend", "metal"]) == 1
    error_lines = capsys.readouterr().err.strip().splitlines()
    assert error_lines[-1].startswith("export_qwen35: error: --backend metal lowers only on macOS")
    assert list(tmp_path.iterdir()) == []


def _must_not_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the backend's machine check")


@pytest.mark.parametrize("flags", [["--backend", "tpu"], ["--dtype", "fp8"], ["--quantize", "int3"],
                                   ["--state-dtype", "bfloat16"]])
def test_flag_choices_are_checked_by_the_parser(checkpoint, tmp_path, flags):
    output = tmp_path / "model.pte"
    with pytest.raises(SystemExit) as exit_info:
        export_main(["--checkpoint", str(checkpoint), "--output", str(output), *flags])
    assert exit_info.value.code == 2 and not output.exists()


def test_missing_checkpoint_folder(tmp_path, capsys):
    assert export_main(["--checkpoint", str(tmp_path / "nowhere"), "--output", str(tmp_path / "m.pte")]) != 0
    assert "no such folder" in capsys.readouterr().err


def test_unwritable_output(checkpoint, capsys):
    # /proc takes no new files, not even from root: the write fails, cleanly.
    output = "/proc/gdn-export-test.pte"
    assert export_main(["--checkpoint", str(checkpoint), "--output", output]) != 0
    error_lines = capsys.readouterr().err.strip().splitlines()
    assert error_lines[-1].startswith("export_qwen35: error:") and "not writable" in error_lines[-1]
    assert not os.path.exists(output)


def test_output_that_is_a_folder(checkpoint, tmp_path, capsys):
    folder = tmp_path / "model.pte"
    folder.mkdir()
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(folder)]) != 0
    assert "is a folder" in capsys.readouterr().err


def test_output_in_missing_folder(checkpoint, tmp_path, capsys):
    output = tmp_path / "no" / "such" / "m.pte"
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(output)]) != 0
    assert "does not exist" in capsys.readouterr().err


def test_console_script_prints_no_traceback(checkpoint, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from gdn_export.cli import export_main; sys.exit(export_main())",
         "--checkpoint", str(tmp_path / "missing"), "--output", str(tmp_path / "m.pte")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "no such folder" in result.stderr


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda tmp, ckpt: ["--model", str(tmp / "none.pte"), "--tokenizer", str(ckpt / "tokenizer.json")],
         "--model"),
        (lambda tmp, ckpt: ["--model", str(ckpt / "config.json"), "--tokenizer", str(tmp / "none.json")],
         "--tokenizer"),
        (lambda tmp, ckpt: ["--model", str(ckpt / "config.json"), "--tokenizer", str(ckpt / "tokenizer.json")],
         "--model"),
    ],
    ids=["missing-model", "missing-tokenizer", "not-a-program"],
)
def test_gdn_run_bad_files(checkpoint, tmp_path, capsys, make_args, message):
    assert run_main([*make_args(tmp_path, checkpoint), "--prompt", "hi"]) != 0
    error = capsys.readouterr().err
    assert error.startswith("gdn-run: error:") and message in error
