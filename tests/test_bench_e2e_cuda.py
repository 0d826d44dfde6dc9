"""gdn-bench e2e --device cuda: what runs without a GPU. Its options and refusals, the decode byte counts against
the models' own tensors, the timing protocol (the C++ runner on a CPU program, transformers on a tiny
checkpoint), transformers' kernel check, and the report's floor verdicts."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdn_bench import cli, e2e, e2e_cli, e2e_cuda, runner_timing
from tests.triton_interpreter import REPO_ROOT


def bench_error(capsys, *arguments) -> str:
    """``gdn-bench e2e ARGUMENTS``: exit status 2 and one error line, which is returned."""
    assert cli.main(["e2e", *arguments]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("arguments, message", [
    (["--device", "cuda", "--kl"], "--kl applies to --device cpu only"),
    (["--device", "cuda", "--threads", "1"], "--threads applies to --device cpu only"),
    (["--device", "cuda", "--interleave", ""], "--interleave applies to --device cpu only"),
    (["--shapes", "4b"], "--shapes applies to --device cuda only"),
    (["--time-only"], "--time-only applies to --device cuda only"),
    (["--device", "cuda", "--only", "ours,executorch"],
     "--only: --device cuda times ours, ours_graph, hf, got executorch"),
    (["--only", "ours,ours_graph"], "--only: --device cpu times ours, ours_8da4w, ours_8da4w_avx2, ours_8da8w, ours_int8wo, "
                                    "ours_16da8w, hf, executorch, got ours_graph"),
    (["--device", "cuda", "--runs", "0"], "--runs must be >= 1, got 0"),
    (["--llama-rounds", "-1"], "--llama-rounds must be >= 0, got -1"),
    (["--llama-rounds", "2"], "--llama-rounds needs --llama-cpp DIR: the llama.cpp build whose files take turns"),
    (["--device", "cuda", "--decode-steps", "0"], "--decode-steps must be >= 1, got 0"),
    # The context holds the longest prompt, or the first and the decode steps after it, here the latter.
    (["--device", "cuda", "--prompts", "96,64", "--decode-steps", "64", "--prefill-chunk", "161"],
     "--prefill-chunk 161 exceeds the program's context of 160 tokens"),
    (["--device", "cuda", "--build-only", "--time-only"], "--build-only and --time-only exclude each other"),
    (["--device", "cuda", "--plot", "plot.svg"], "--plot must name a .png file, got plot.svg"),
    # --runner with --device cpu: our programs in the C++ runner, so nothing that needs them in Python.
    (["--runner", "no_runner", "--interleave", ""], "--runner no_runner: not an executable file"),
    (["--runner", sys.executable, "--interleave", "", "--hide-avx512"],
     "--runner: --hide-avx512 hides AVX-512 from programs in ExecuTorch's Python runtime only"),
    (["--runner", sys.executable, "--interleave", "", "--prompt-cache"],
     "--runner: --prompt-cache times the Python runner's state files, not the C++ runner"),
    (["--runner", sys.executable], "--runner: --interleave loads our programs in ExecuTorch's Python runtime"),
    (["--device", "cuda"], "--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)"),
])
def test_bad_options_are_one_line_naming_the_option_before_anything_is_written(arguments, message, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this check whatever the machine
    workdir = tmp_path / "workdir"
    error = bench_error(capsys, "--workdir", str(workdir), *arguments)
    assert error.startswith("gdn-bench e2e: error: ") and message in error, error
    assert not workdir.exists()


def test_an_unknown_shape_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["e2e", "--device", "cuda", "--shapes", "0.8b,2b"])
    assert raised.value.code == 2
    assert "argument --shapes: takes names from 0.8b, 4b, got '0.8b,2b'" in capsys.readouterr().err


def parse(*arguments):
    parser = cli.argparse.ArgumentParser()
    e2e_cli.add_arguments(parser)
    return parser.parse_args(list(arguments))


def test_each_device_has_its_defaults_and_the_cpu_bench_keeps_its_own():
    cpu = parse()
    assert cpu.device == "cpu"
    e2e.apply_defaults(cpu, e2e.CPU_DEFAULTS)
    # The CPU bench's defaults from before --device existed.
    assert (cpu.workdir, cpu.only, cpu.prompts, cpu.decode_steps) == (
        Path("build/e2e"), ("ours", "ours_8da4w", "ours_8da4w_avx2", "ours_8da8w", "ours_int8wo", "ours_16da8w", "hf",
                            "executorch"),
        (128, 512, 2048),
        32)
    cuda = parse("--device", "cuda")
    e2e_cuda.check_arguments(cuda)
    assert (cuda.workdir, cuda.only, cuda.prompts, cuda.decode_steps) == (
        Path("build/e2e_cuda"), ("ours", "ours_graph", "hf"), (512, 2048, 8192), 128)
    assert (cuda.shapes, cuda.prefill_chunk, cuda.runs) == (("0.8b", "4b"), 2048, 3)
    # Issue 17's measurements: prefill at 512, 2048 and 8192, decode 128 tokens after 512, all in one context.
    assert e2e_cuda.context_length(cuda.prompts, cuda.decode_steps) == 8192
    assert e2e_cuda.context_length((512,), 128) == 640


def fake_artifacts(args) -> dict:
    """The files a built workdir holds, empty."""
    shapes = e2e_cuda.layouts(args)
    for layout in shapes.values():
        layout.checkpoint.mkdir(parents=True)
        layout.program_dir.mkdir(parents=True)
        layout.program.write_bytes(b"")
        layout.data.write_bytes(b"")
    return shapes


def listing(root: Path) -> list:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_time_only_refuses_missing_artifacts_tools_and_anchor(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the device check, on any machine
    workdir = tmp_path / "workdir"
    base = ["--device", "cuda", "--workdir", str(workdir), "--shapes", "0.8b", "--time-only"]
    error = bench_error(capsys, *base)
    assert f"--time-only: {workdir.resolve() / '0.8b' / 'checkpoint'} is missing (build it first with --build-only)" \
        in error, error
    assert not workdir.exists()

    args = parse(*base)
    e2e_cuda.check_arguments(args)
    fake_artifacts(args)
    before = listing(workdir)
    missing = tmp_path / "no_runner"
    error = bench_error(capsys, *base, "--runner", str(missing))
    assert f"--runner {missing}: no such file (build it with `python -m examples.cpp_runner.build" in error, error
    runner = tmp_path / "runner"
    runner.write_bytes(b"")
    error = bench_error(capsys, *base, "--runner", str(runner), "--backend-lib", str(tmp_path / "no.so"))
    assert f"--backend-lib {tmp_path / 'no.so'}: no such file" in error, error
    find_spec = e2e_cuda.importlib.util.find_spec
    monkeypatch.setattr(e2e_cuda.importlib.util, "find_spec", lambda name, *rest: None if name == "fla"
                        else find_spec(name, *rest))
    error = bench_error(capsys, *base, "--only", "hf")
    assert "--only hf: fla-core is not installed" in error, error
    assert listing(workdir) == before


# ---------------------------------------------------------------------------
# What a decode step reads, against the models' own tensors.


def hf_parameter_count(config, device="meta") -> int:
    """The distinct parameters of transformers' model of ``config`` (a tied output layer is the embedding), less
    the embedding rows a decode step does not read when the output layer has its own matrix."""
    from transformers import Qwen3_5ForCausalLM

    with torch.device(device):
        model = Qwen3_5ForCausalLM(config)
    distinct = {id(parameter): parameter.numel() for parameter in model.parameters()}
    unread_rows = 0 if config.tie_word_embeddings else (config.vocab_size - 1) * config.hidden_size
    return sum(distinct.values()) - unread_rows


@pytest.mark.parametrize("shape, published", [("0.8b", 0.752e9), ("4b", 4.2e9)])
def test_decode_weight_bytes_of_the_published_shapes(shape, published):
    config = e2e.qwen35_config(shape)
    count = hf_parameter_count(config)
    assert e2e_cuda.decode_weight_bytes(config.to_dict()) == 2 * count
    assert e2e_cuda.decode_weight_bytes(config.to_dict(), bytes_per_weight=4) == 4 * count
    # The parameter counts anchors.md gives for the published models, to their rounding.
    assert abs(count - published) < 0.006 * published, count


def test_decode_weight_bytes_of_random_untied_configs(seed):
    from transformers import Qwen3_5TextConfig

    generator = torch.Generator().manual_seed(seed)

    def pick(*choices):
        return choices[int(torch.randint(0, len(choices), (), generator=generator))]

    for _ in range(4):
        key_heads = pick(1, 2, 4)
        kinds = [pick("linear_attention", "full_attention") for _ in range(pick(2, 3, 5))]
        config = Qwen3_5TextConfig(
            vocab_size=pick(96, 131), hidden_size=pick(32, 48), intermediate_size=pick(40, 72),
            num_hidden_layers=len(kinds), layer_types=kinds, num_attention_heads=pick(2, 4), num_key_value_heads=1,
            head_dim=pick(8, 16), linear_conv_kernel_dim=pick(3, 4), linear_key_head_dim=pick(8, 16),
            linear_value_head_dim=pick(8, 24), linear_num_key_heads=key_heads,
            linear_num_value_heads=key_heads * pick(1, 2, 3), tie_word_embeddings=pick(True, False),
        )
        expected = 2 * hf_parameter_count(config)
        assert e2e_cuda.decode_weight_bytes(config.to_dict()) == expected, f"seed {seed}: {config}"
        # A vision-language checkpoint nests the same fields under text_config.
        assert e2e_cuda.decode_weight_bytes({"text_config": config.to_dict()}) == expected, f"seed {seed}"


def test_decode_state_bytes_are_our_programs_cache_and_state_buffers(tmp_path, seed):
    from gdn_export import load_qwen35
    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny", seed=seed, key_head_dim=32, value_head_dim=16)
    context = 40 + seed % 50
    model = load_qwen35(checkpoint, dtype=torch.bfloat16, max_seq_len=context)
    buffers = dict(model.named_buffers())
    kv = sum(b.nbytes for name, b in buffers.items() if name.endswith(("k_cache", "v_cache")))
    recurrent = sum(b.nbytes for name, b in buffers.items() if name.endswith("recurrent_state"))
    assert kv and recurrent, sorted(buffers)
    config = json.loads((checkpoint / "config.json").read_text())
    assert e2e_cuda.decode_state_bytes(config, context) == {
        "kv_cache_bytes": kv, "recurrent_state_bytes": 2 * recurrent}, f"seed {seed}"


# ---------------------------------------------------------------------------
# The timing protocol.


# cuda_graph: ours_graph's command (--cuda-graph), which a program without CudaBackend runs unchanged.
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_the_runners_timings_and_tokens_of_a_real_cpu_run(runner, cpu_program, seed, cuda_graph):
    from tests.test_cpp_runner import MAX_CHUNK, MAX_NEW_TOKENS, executorch_greedy

    program, tokenizer = cpu_program
    length, runs, chunk = 6 + seed % 5, 3, 3
    command = runner_timing.runner_command(runner, program, tokenizer, prompt_tokens=length,
                                           new_tokens=MAX_NEW_TOKENS, prefill_chunk=chunk, runs=runs, seed=seed,
                                           cuda_graph=cuda_graph)
    assert ("--cuda-graph" in command) == cuda_graph
    measured = runner_timing.run_runner(command, runs)
    prompt = measured[0]["prompt_ids"]
    assert len(prompt) == length and all(run["prompt_ids"] == prompt for run in measured), measured
    expected = executorch_greedy(program, prompt, eos_ids=set())  # ExecuTorch's Python runtime, same program
    for index, run in enumerate(measured):
        assert run["run"] == index and run["generated_ids"] == expected, f"seed {seed}: {run} vs {expected}"
        assert run["prompt_tokens"] == length and run["prefill_calls"] == math.ceil(length / min(chunk, MAX_CHUNK))
        assert run["decode_steps"] == MAX_NEW_TOKENS - 1 and run["generated_tokens"] == MAX_NEW_TOKENS
        assert 0 < run["prefill_seconds"] < 60 and 0 < run["decode_seconds"] < 60, run
    entry = e2e_cuda.system_entry([(length, measured)])
    timed = measured[1:]  # the first run is untimed
    assert entry["prefill_tok_s"] == {str(length): length / statistics.median(r["prefill_seconds"] for r in timed)}
    assert entry["decode_tok_s"] == statistics.median(r["decode_steps"] / r["decode_seconds"] for r in timed)
    assert entry["first_token"] == {str(length): expected[0]} and entry["runs_agree"]
    assert entry["prompt_digest"] == {str(length): runner_timing.prompt_digest(prompt)}
    assert (entry["decode_prompt"], entry["decode_steps"]) == (length, MAX_NEW_TOKENS - 1)

    with pytest.raises(RuntimeError, match="expected 4 runs with timings and token ids, read 3 of 3"):
        runner_timing.run_runner(command, runs + 1)
    with pytest.raises(RuntimeError, match="--runs must be at least 1"):
        runner_timing.run_runner([str(part) for part in command] + ["--runs", "0"], runs)


def test_time_generation_on_transformers_follows_the_runners_protocol(tmp_path, seed):
    from transformers import Qwen3_5ForCausalLM

    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny", seed=seed)
    session = e2e.HFSession(checkpoint)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 200, (9,), generator=generator).tolist()
    new_tokens = 6
    runs = [e2e_cuda.time_generation(session, prompt, new_tokens) for _ in range(2)]
    model = Qwen3_5ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():  # the reference: transformers' own greedy generate
        # The mask says every prompt token is real: without it generate masks those equal to pad_token_id (a
        # prompt holding token 0, as at GDN_TEST_SEED=1730705244, lost that token).
        ids = torch.tensor([prompt])
        reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                   min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(prompt):].tolist()
    for run in runs:  # the second run starts from an empty state again
        assert run["generated_ids"] == reference, f"seed {seed}: {run['generated_ids']} vs {reference}"
        assert (run["prompt_tokens"], run["generated_tokens"], run["decode_steps"]) == (9, 6, 5)
        assert run["prefill_seconds"] > 0 and run["decode_seconds"] > 0 and run["finite"]
    prefill_only = e2e_cuda.time_generation(session, prompt, 1)
    assert prefill_only["generated_ids"] == reference[:1] and prefill_only["decode_seconds"] == 0
    assert "decode_tok_s" not in runner_timing.summarize([prefill_only, prefill_only])


KERNEL_REPORT = ("import json; from gdn_bench import e2e_cuda; kernels = e2e_cuda.transformers_gdn_kernels(); "
                 "e2e_cuda.check_fast_path(kernels); print(json.dumps(kernels))")
FAKE_FLA = {  # the package layout transformers imports fla's kernels from, each kernel behind a decorator as fla's are
    "fla/__init__.py": "from . import ops\n",
    "fla/ops/__init__.py": "from . import gated_delta_rule\n",
    "fla/ops/gated_delta_rule/__init__.py":
        "from .chunk import chunk_gated_delta_rule\nfrom .fused_recurrent import fused_recurrent_gated_delta_rule\n",
    "fla/ops/gated_delta_rule/chunk.py":
        "import functools\n\ndef wrapped(function):\n    @functools.wraps(function)\n"
        "    def call(*args, **kwargs):\n        return function(*args, **kwargs)\n    return call\n\n"
        "@wrapped\ndef chunk_gated_delta_rule(q, k, v, g, beta, **kwargs):\n    raise NotImplementedError\n",
    "fla/ops/gated_delta_rule/fused_recurrent.py":
        "def fused_recurrent_gated_delta_rule(q, k, v, g, beta, **kwargs):\n    raise NotImplementedError\n",
}


def kernel_report(code: str, path: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(REPO_ROOT)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=REPO_ROOT, timeout=300)


def test_transformers_kernels_are_fla_s_where_installed_else_the_bench_refuses(tmp_path):
    for name, text in FAKE_FLA.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = kernel_report(KERNEL_REPORT, str(tmp_path))
    assert found.returncode == 0, found.stderr[-3000:]
    kernels = json.loads(found.stdout.strip().splitlines()[-1])
    assert kernels["chunk_gated_delta_rule"] == "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule"
    assert kernels["fused_recurrent_gated_delta_rule"] == \
        "fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gated_delta_rule"
    # Without fla (import blocked, whatever is installed), transformers keeps its PyTorch path and the bench refuses.
    refused = kernel_report("import sys; sys.modules['fla'] = None; " + KERNEL_REPORT, str(tmp_path))
    assert refused.returncode != 0
    assert "RuntimeError: transformers runs its PyTorch Gated DeltaNet path, not fla-core's kernels" in refused.stderr
    assert "modeling_qwen3_5.torch_chunk_gated_delta_rule" in refused.stderr


# ---------------------------------------------------------------------------
# The report.


def synthetic_results(generator) -> dict:
    """Figures made up around issue 17's floors: each ratio on a known side of its floor."""
    bandwidth = float(2.5e12 + 1e12 * torch.rand((), generator=generator))
    weights = {"0.8b": 1.5e9, "4b": 8.4e9}
    roof = {shape: bandwidth / weight for shape, weight in weights.items()}
    hf_prefill = [float(v) for v in 1e3 + 1e4 * torch.rand(3, generator=generator)]

    def entry(prefill: dict, decode, digest: dict, first: dict, **more) -> dict:
        return {"prefill_tok_s": prefill, "decode_tok_s": decode, "prompt_digest": digest, "first_token": first,
                "runs_agree": True, "measured_at": "m", **more}

    kernels = {"chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule",
               "causal_conv1d_fn": "transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn"}

    digests = {"512": "a", "2048": "b", "8192": "c"}
    state = {"kv_cache_bytes": 100e6, "recurrent_state_bytes": 38e6}
    return {
        "device": {"name": "GPU", "torch": "t", "copy_bandwidth_bytes_s": bandwidth, "copy_bytes": 4 << 30,
                   "measured_at": "m"},
        "0.8b": {
            "weight_bytes": weights["0.8b"], "context": 8192, "attended": 640, "state_bytes": state,
            "ours": entry({"512": 3 * hf_prefill[0], "2048": 2 * hf_prefill[1], "8192": 1.2 * hf_prefill[2]},
                          0.5 * roof["0.8b"], digests, {"512": 7, "2048": 8, "8192": 9}, prefill_chunk=2048,
                          decode_prompt=512, decode_ids=[7, 4, 4, 1]),
            # The same program with decode as a CUDA graph, timed at the first prompt only.
            "ours_graph": entry({"512": 3 * hf_prefill[0]}, 0.45 * roof["0.8b"], {"512": "a"}, {"512": 7},
                                decode_prompt=512, decode_ids=[7, 4, 4, 1]),
            "hf": entry({"512": hf_prefill[0], "2048": hf_prefill[1], "8192": hf_prefill[2]}, 8.4,
                        {**digests, "8192": "other prompt"}, {"512": 7, "2048": 3, "8192": 9}, kernels=kernels,
                        versions={"transformers": "5.23.0", "fla": "0.6.0", "torch": "t"}),
        },
        "4b": {
            "weight_bytes": weights["4b"], "context": 8192, "attended": 640, "state_bytes": state,
            "ours": entry({"512": 1.0, "2048": 1.6 * hf_prefill[1]}, 0.55 * roof["4b"],
                          {"512": "a", "2048": "b"}, {"512": 1, "2048": 2}, prefill_chunk=2048),
            "hf": entry({"512": 1.0, "2048": hf_prefill[1]}, 8.2, {"512": "a", "2048": "b"}, {"512": 1, "2048": 5}),
        },
    }, roof


def hf_prefill_of(results: dict) -> list:
    return [results["0.8b"]["hf"]["prefill_tok_s"][key] for key in ("512", "2048", "8192")]


def test_report_floor_verdicts(generator, tmp_path):
    results, roof = synthetic_results(generator)
    builds = {"0.8b": {"checkpoint": {"seconds": 20.4, "peak_rss_bytes": 6 * 2**30, "size_bytes": 1},
                       "export_ours": {"seconds": 512.6, "peak_rss_bytes": 9 * 2**30, "size_bytes": 1}}}
    sizes = {"0.8b": {"pte_bytes": 3 * 2**20, "ptd_bytes": int(1.5 * 2**30)}}
    table = e2e_cuda.report(results, builds, sizes, (512, 2048, 8192), ("0.8b", "4b"))
    assert "| 0.8b | decode: ours / roofline | 0.50x | 0.4x | met |" in table
    assert "| 0.8b | decode: ours_graph / roofline | 0.45x | 0.4x | met |" in table
    assert "0.8b: decode as a CUDA graph generates ours' 4 tokens: yes." in table
    graph_row = next(line for line in table.splitlines()
                     if line.startswith(f"| 0.8b | {e2e_cuda.SYSTEM_LABELS['ours_graph']}"))
    assert f"| {e2e.format_rate(3 * hf_prefill_of(results)[0])} | - | - |" in graph_row, graph_row
    assert "| 4b | decode: ours / roofline | 0.55x | 0.6x | NOT met |" in table
    assert "| 0.8b | prefill 2048: ours / hf | 2.00x | 1.5x | met |" in table
    assert "| 0.8b | prefill 8192: ours / hf | 1.20x | 1.5x | NOT met |" in table
    assert "| 4b | prefill 2048: ours / hf | 1.60x | 1.5x | met |" in table
    assert "| 4b | prefill 8192: ours / hf | - | 1.5x | - |" not in table  # neither system measured it
    ours_row = next(line for line in table.splitlines() if line.startswith(f"| 4b | {e2e_cuda.SYSTEM_LABELS['ours']}"))
    assert ours_row.endswith(f"| {e2e.format_rate(0.55 * roof['4b'])} | 0.550 | m |"), ours_row
    hf_row = next(line for line in table.splitlines() if line.startswith(f"| 4b | {e2e_cuda.SYSTEM_LABELS['hf']}"))
    assert "| - | 8.20 |" in hf_row, hf_row  # no 8192 figure
    assert f"0.8b: a decode step reads 1.50 GB of bf16 weights: roofline {roof['0.8b']:.0f} tok/s" in table
    assert "It takes a prompt in calls of at most 2048 tokens." in table
    assert ("transformers 5.23.0 with fla-core 0.6.0, its kernel entry points: chunk_gated_delta_rule -> "
            "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule, causal_conv1d_fn -> "
            "transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn.") in table
    # First tokens are compared only where both systems had the same prompt: 512 and 2048 at 0.8B, one equal.
    assert "0.8b: the first generated token is transformers' for 1 of 2 prompts" in table
    assert "4b: the first generated token is transformers' for 1 of 2 prompts" in table
    assert "| 0.8b | export_ours | 513 | 9.00 | 3.0 | 1.50 |" in table
    assert "| 0.8b | checkpoint | 20 | 6.00 | - | - |" in table

    results["0.8b"]["ours_graph"]["decode_ids"] = [7, 4, 5, 1]  # a token the graph changed
    assert "0.8b: decode as a CUDA graph generates ours' 4 tokens: NO." in \
        e2e_cuda.report(results, {}, {}, (512, 2048, 8192), ("0.8b",))
    del results["0.8b"]["hf"]["prefill_tok_s"]["2048"]
    table = e2e_cuda.report(results, {}, {}, (512, 2048, 8192), ("0.8b",))
    assert "| 0.8b | prefill 2048: ours / hf | - | 1.5x | - |" in table


def test_plot_writes_a_png(generator, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib, which this environment lacks")
    results, _ = synthetic_results(generator)
    path = tmp_path / "plots" / "cuda.png"
    e2e_cuda.plot(results, (512, 2048, 8192), ("0.8b", "4b"), path)
    assert path.read_bytes().startswith(b"\x89PNG")
