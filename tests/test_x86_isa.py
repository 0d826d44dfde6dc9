"""``gdn-bench e2e --hide-avx512`` (gdn_bench/x86_isa.py): AVX-512 hidden from XNNPACK in a child process, our
x86-64-v3 kernels loaded, and a program still computes what transformers does; the bench's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdn_bench import UsageError, e2e, llama_cpp, x86_isa
from tests.test_export import fresh_prompt, hugging_face_model, hugging_face_step_logits

ROOT = Path(__file__).resolve().parent.parent

# In a fresh process: the table before and after hiding, then a program's logits for a prompt and a continuation.
CHILD = """
import json, sys, torch
from gdn_bench import x86_isa
before = list(x86_isa.cpuinfo_table())
cleared = x86_isa.hide_avx512()
after = list(x86_isa.cpuinfo_table())
from gdn_export.runner import ProgramRunner
from tests.test_export import pte_step_logits
program, prompt, continuation, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
torch.save({"before": before, "after": after, "cleared": cleared,
            "logits": pte_step_logits(ProgramRunner(program), prompt, continuation)}, out)
"""


def test_hidden_avx512_leaves_a_program_matching_transformers(x86_64_v3_library, dense_checkpoint, tmp_path,
                                                               generator, seed):
    """With AVX-512 hidden (XNNPACK's AVX2 kernels) and our x86-64-v3 kernels, a float program's logits over a
    prompt and decode steps are transformers' own; the table lost exactly its AVX-512 family's flags."""
    from gdn_export.export import export_qwen35

    program = tmp_path / "dense.pte"
    export_qwen35(dense_checkpoint, program, max_seq_len=64)
    prompt, continuation = fresh_prompt(11, generator), fresh_prompt(5, generator)
    out = tmp_path / "child.pt"
    env = dict(os.environ, GDN_RUNTIME_OPS_LIB=str(x86_64_v3_library), ATEN_CPU_CAPABILITY="avx2")
    child = subprocess.run([sys.executable, "-c", CHILD, str(program), json.dumps(prompt), json.dumps(continuation),
                            str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, f"seed {seed}: {child.stderr[-2000:]}"
    result = torch.load(out)
    hidden = [x86_isa.FIELDS.index(name) for name in x86_isa.HIDDEN]
    assert all(result["after"][i] == 0 for i in hidden)
    assert [v for i, v in enumerate(result["after"]) if i not in hidden] == \
        [v for i, v in enumerate(result["before"]) if i not in hidden]
    assert result["cleared"] == [name for name in x86_isa.HIDDEN if result["before"][x86_isa.FIELDS.index(name)]]
    assert ("avx512f" in result["cleared"]) == ("avx512f" in x86_isa.cpu_flags())
    expected = hugging_face_step_logits(hugging_face_model(dense_checkpoint), prompt, continuation)
    error = (result["logits"] - expected).abs().max().item()
    assert error <= 1e-4, f"seed {seed}: logits {error} from transformers'"


def test_a_table_laid_out_otherwise_is_refused_and_left_as_it_was():
    """The layout check compares the table with /proc/cpuinfo's flags; flags that cannot be this CPU's (none at
    all) fail it, naming a field, and nothing is cleared."""
    if not x86_isa.cpu_flags():
        pytest.skip("no /proc/cpuinfo flags to check a table against")
    table = x86_isa.cpuinfo_table()
    before = list(table)
    with pytest.raises(x86_isa.IsaError, match=r"not laid out as cpuinfo\.h's struct cpuinfo_x86_isa .*sse3 = 1"):
        x86_isa.hide_avx512(flags=set())
    assert list(table) == before
    x86_isa.check_layout(table, x86_isa.cpu_flags())  # this machine's own flags pass


def test_machine_line_names_the_cpu_and_its_avx_extensions():
    line = x86_isa.machine_line(hidden=False)
    assert line.startswith(x86_isa.cpu_name())
    for flag in x86_isa.cpu_flags():
        if flag.startswith(("avx512", "amx")) or flag == "avx2":
            assert f" {flag}" in line
    assert ("; AMX: " in line) == any(flag.startswith("amx") for flag in x86_isa.cpu_flags())
    assert "hidden" not in line and "(--hide-avx512)" in x86_isa.machine_line(hidden=True)


@pytest.mark.parametrize("cache, expected", [
    ("GGML_NATIVE:BOOL=ON\nGGML_AVX512:BOOL=OFF\n", True),  # native: whatever the building machine had
    ("GGML_NATIVE:BOOL=OFF\nGGML_AVX512:BOOL=ON\n", True),
    ("GGML_NATIVE:BOOL=OFF\nGGML_AVX2:BOOL=ON\nGGML_AVX512:BOOL=OFF\n", False),
    ("GGML_AVX512:BOOL=OFF\n", None),  # not a cache this reads
    (None, None),  # no build
])
def test_llama_cpp_build_says_whether_it_may_use_avx512(tmp_path, cache, expected):
    if cache is not None:
        (tmp_path / "build").mkdir()
        (tmp_path / "build" / "CMakeCache.txt").write_text("# a CMake cache\n" + cache)
    assert llama_cpp.builds_avx512(llama_cpp.LlamaCpp(tmp_path)) is expected


def test_bench_refuses_hide_avx512_without_an_avx2_library_before_writing(tmp_path, monkeypatch):
    import argparse

    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    missing = tmp_path / "no" / "libgdn_runtime_ops.so"
    monkeypatch.setenv("GDN_RUNTIME_OPS_LIB", str(missing))
    monkeypatch.delenv(x86_isa.ENV_VAR, raising=False)
    args = parser.parse_args(["--hide-avx512", "--workdir", str(tmp_path / "work"), "--only", "ours_8da4w"])
    with pytest.raises(UsageError, match=f"--hide-avx512: no runtime_ops library at {missing}"):
        e2e.run(args)
    assert not (tmp_path / "work").exists() and x86_isa.ENV_VAR not in os.environ
