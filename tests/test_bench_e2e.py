"""gdn-bench e2e: the cheap logic (params mapping, weight bytes, child RSS, report math); no model is timed."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from gdn_bench import e2e


def tiny_hf_config(seed: int):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4 + seed % 1000, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
    )


def test_published_shape_params_are_executorch_model_args_fields():
    from executorch.examples.models.llama.model_args import ModelArgs

    params = e2e.executorch_params(e2e.qwen35_config("0.8b").to_dict())
    fields = {field.name for field in dataclasses.fields(ModelArgs)}
    assert set(params) <= fields, f"not ModelArgs fields: {sorted(set(params) - fields)}"
    args = ModelArgs(**json.loads(json.dumps(params)))  # through JSON, as export_llm reads it
    # The published Qwen3.5-0.8B figures (anchors.md), independent of QWEN35_0_8B's spelling.
    assert (args.dim, args.hidden_dim, args.n_layers, args.vocab_size) == (1024, 3584, 24, 248320)
    assert (args.n_heads, args.n_kv_heads, args.head_dim) == (8, 2, 256)
    assert (args.linear_num_key_heads, args.linear_num_value_heads) == (16, 16)
    assert (args.linear_key_head_dim, args.linear_value_head_dim, args.linear_conv_kernel_dim) == (128, 128, 4)
    assert args.rope_freq_base == 1e7 and args.partial_rotary_factor == 0.25 and args.norm_eps == 1e-6
    assert args.layer_types == ["linear_attention"] * 3 + ["full_attention"] + args.layer_types[4:]
    assert args.layer_types.count("full_attention") == 6 and args.layer_types[3::4] == ["full_attention"] * 6


def test_executorch_model_from_params_matches_transformers(seed):
    """ExecuTorch's llama Transformer built from our params JSON and its converted weights computes HF's logits."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.qwen3_5.convert_weights import qwen_3_5_to_meta
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    config = tiny_hf_config(seed)
    reference = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # every weight random, norms included, so a wrong flag shows
        for parameter in reference.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    params = e2e.executorch_params(json.loads(config.to_json_string()))
    model = construct_transformer(ModelArgs(**params, generate_full_logits=True, max_seq_len=32, max_context_len=32))
    state = {k: v for k, v in reference.state_dict().items() if k != "lm_head.weight"}  # tied, as saved
    missing, unexpected = model.load_state_dict(qwen_3_5_to_meta(state), strict=False)
    assert not unexpected, unexpected
    assert all(name.endswith(("conv_state", "recurrent_state")) for name in missing), missing  # runtime state
    tokens = torch.randint(0, config.vocab_size, (1, 11))
    with torch.no_grad():
        expected = reference(tokens).logits
        actual = model.eval()(tokens)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"seed {seed}: {m}")


def test_decode_weight_bytes_counts_every_parameter_once(tmp_path, seed):
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM(tiny_hf_config(seed))
    model.save_pretrained(tmp_path)
    unique = {id(p): p.numel() for p in model.parameters()}  # the tied lm_head is the embedding
    assert e2e.decode_weight_bytes(tmp_path) == 4 * sum(unique.values()), f"seed {seed}"


def test_run_child_reports_that_childs_time_and_peak_rss(tmp_path):
    megabytes = 200 + torch.randint(0, 100, ()).item()
    code = f"import time, torch; x = torch.ones({megabytes} * 2**18); time.sleep(0.2)"
    child = e2e.run_child([sys.executable, "-c", code], tmp_path / "child.log")
    assert child.returncode == 0
    assert megabytes * 2**20 <= child.peak_rss_bytes < (megabytes + 1500) * 2**20, (megabytes, child)
    assert child.seconds >= 0.2
    failing = e2e.run_child([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "failing.log")
    assert failing.returncode == 3


def test_report_ratios_and_floor_checks(generator):
    hf_prefill, hf_decode, et_decode = (float(v) for v in 10 + 50 * torch.rand(3, generator=generator))
    results = {
        "ours": {"prefill_tok_s": {"128": 9 * hf_prefill, "512": 1.25 * hf_prefill}, "decode_tok_s": 2.5 * hf_decode,
                 "measured_at": "t"},
        "hf": {"prefill_tok_s": {"128": hf_prefill, "512": hf_prefill}, "decode_tok_s": hf_decode, "measured_at": "t"},
        "executorch": {"prefill_tok_s": {"128": et_decode}, "decode_tok_s": et_decode, "measured_at": "t"},
    }
    assert e2e.ratio(results, "ours", "hf", "prefill 128") == pytest.approx(9)
    assert e2e.ratio(results, "ours", "hf", "decode") == pytest.approx(2.5)
    assert e2e.ratio(results, "ours", "executorch", "decode") == pytest.approx(2.5 * hf_decode / et_decode)
    assert e2e.ratio(results, "ours", "executorch", "prefill 512") is None  # not measured
    floor = {"copy_bandwidth_bytes_s": 36e9, "read_bandwidth_bytes_s": 45e9, "weight_bytes": 3e9, "floor_tok_s": 12.0}
    table = e2e.report(results, {}, floor, (128, 512))
    assert "| prefill 512: ours / hf | 1.25x | 1.3x | NO |" in table
    assert "| decode: ours / hf | 2.50x | 2.0x | yes |" in table
    # A step also reads and writes the 0.8B shape's states: 18 Gated DeltaNet layers of 16 x 128 x 128 floats
    # and a conv state of (2 * 16 * 128 + 16 * 128) channels x 3 taps.
    state = 2 * 4 * 18 * (16 * 128 * 128 + 6144 * 3)
    assert e2e.recurrent_state_traffic(e2e.QWEN35_0_8B) == state
    ours_row = next(line for line in table.splitlines() if line.startswith(f"| {e2e.SYSTEM_LABELS['ours']}"))
    assert f"| {(3e9 + state) / 1e9:.3f} | {2.5 * hf_decode / (36e9 / (3e9 + state)):.2f} |" in ours_row
    assert "floor 12.00 tok/s" in table and f"45.0 GB/s: {45e9 / (3e9 + state):.2f} tok/s" in table

    interleaved_ours, interleaved_et = (float(v) for v in 5 + 10 * torch.rand(2, generator=generator))
    results["interleaved_decode"] = {
        "systems": {"ours": {"decode_tok_s": interleaved_ours}, "executorch": {"decode_tok_s": interleaved_et}},
        "rounds": 8, "steps": 4, "measured_at": "t",
    }
    table = e2e.report(results, {}, floor, (128, 512))
    expected = interleaved_ours / interleaved_et
    assert f"interleaved decode ours / executorch: {expected:.2f}x (floor 1.2x: {'met' if expected >= 1.2 else 'NOT met'})" \
        in table
    assert f"| {e2e.SYSTEM_LABELS['ours']} | {e2e.format_rate(interleaved_ours)} |" in table


def test_bad_flags_are_rejected():
    import argparse

    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    assert parser.parse_args(["--only", "hf,ours", "--prompts", "16,32"]).only == ("hf", "ours")
    assert parser.parse_args(["--interleave", ""]).interleave == ()
    for flags in (["--only", "hf,llama"], ["--prompts", "0"], ["--prompts", "a"], ["--interleave", "ours,llama"]):
        with pytest.raises(SystemExit):
            parser.parse_args(flags)


def test_kl_is_zero_for_the_fp32_program_and_positive_for_4_bits(tmp_path, seed):
    """--kl's score: our fp32 program reproduces the eager fp32 model (KL ~ 0, same top tokens); the 8da4w
    program's KL is the mean over positions of sum p log(p / q), computed here again from its logits."""
    from gdn_export import export_qwen35
    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tied", seed=seed, tie_word_embeddings=True)
    programs = {}
    for system, quantize in (("ours", "none"), ("ours_8da4w", "8da4w")):
        programs[system] = str(tmp_path / f"{system}.pte")
        export_qwen35(checkpoint, programs[system], max_seq_len=e2e.KL_TOKENS, prefill_chunk=8, quantize=quantize)
    tokens = e2e.quality_tokens(checkpoint)
    assert len(tokens) == e2e.KL_TOKENS and len(set(tokens)) > 50
    scores = e2e.measure_kl(str(checkpoint), programs, threads=1)
    assert scores["ours"]["mean_kl"] < 1e-6 and scores["ours"]["top1_agreement"] > 0.99
    # 4-bit weights move the distributions, but far less than unrelated ones would (KL of order 1 and more).
    assert 1e-5 < scores["ours_8da4w"]["mean_kl"] < 0.5
    # The mean over llama-perplexity's positions (the second half but the last) is a mean of the same divergences.
    assert scores["ours"]["mean_kl_llama_positions"] < 1e-6
    assert 1e-5 < scores["ours_8da4w"]["mean_kl_llama_positions"] < 0.5


def test_the_cpu_bench_times_our_programs_in_the_runner_by_the_python_protocol(runner, cpu_program, seed,
                                                                                 monkeypatch):
    """--runner: each prompt length in a runner process of two runs, the second timed, the first length followed by
    the decode steps; an alternated turn one run. What the bench reports is what the runner's runs measured, and the
    runs generate what ExecuTorch's Python runtime does on the same program."""
    from gdn_bench import runner_timing
    from tests.test_cpp_runner import executorch_greedy

    program, tokenizer = cpu_program
    calls = []
    run_runner = runner_timing.run_runner

    def recorded(command, expected_runs):
        runs = run_runner(command, expected_runs)
        calls.append((command, runs))
        return runs

    monkeypatch.setattr(runner_timing, "run_runner", recorded)
    plan = e2e.Plan(prompts=(5 + seed % 4, 10), decode_steps=3, vocab_size=0, seed=seed, threads=1)
    entry = e2e.measure_in_runner(runner, program, tokenizer, plan)
    assert [len(runs) for _, runs in calls] == [2, 2]
    for (command, (untimed, timed)), length in zip(calls, plan.prompts):
        assert command[command.index("--threads") + 1] == "1" and untimed["prompt_ids"] == timed["prompt_ids"]
        assert len(timed["prompt_ids"]) == length
        assert entry["prefill_tok_s"][str(length)] == length / timed["prefill_seconds"], (entry, timed)
        expected = executorch_greedy(program, timed["prompt_ids"], eos_ids=set())
        assert timed["generated_ids"] == expected[:len(timed["generated_ids"])], f"seed {seed}: {timed} vs {expected}"
    first = calls[0][1][1]
    assert first["decode_steps"] == 3 and calls[1][1][1]["decode_steps"] == 0
    assert entry["decode_tok_s"] == 1 / first["decode_median_step_seconds"]
    assert (entry["runner"], entry["threads"], entry["load_seconds"]) == (str(runner), 1, calls[0][1][0]["load_seconds"])

    rate = e2e.runner_turn(runner, program, tokenizer, plan)
    command, (turn,) = calls[-1]
    assert turn["decode_steps"] == 3 and rate == 3 / turn["decode_seconds"]
    assert turn["prompt_ids"] == first["prompt_ids"] and turn["generated_ids"] == first["generated_ids"]



def test_the_profile_of_a_runner_etdump_sums_each_instructions_events_by_what_it_runs(runner, cpu_program, tmp_path,
                                                                                       seed, capsys):
    """The runner's --etdump of a real program, summed by ``gdn-bench profile``: its calls are the runner's (runs
    times prefill calls and decode steps), the whole call's time is the mean of the profiler's own ``Method::execute``
    events over the calls kept, the instructions' rows name the program's operators and delegates, and they hold
    less time than the calls that contain them."""
    import subprocess

    from executorch.devtools import Inspector

    from gdn_bench import cli, profile
    from tests.test_cpp_runner import MAX_CHUNK

    program, tokenizer = cpu_program
    length, runs, new_tokens = 5 + seed % 4, 3, 4
    etdump = tmp_path / "profile.etdp"
    done = subprocess.run([str(runner), "--model", str(program), "--tokenizer", str(tokenizer), "--random-prompt-tokens",
                           str(length), "--seed", str(seed), "--max-new-tokens", str(new_tokens), "--ignore-eos",
                           "--runs", str(runs), "--threads", "1", "--etdump", str(etdump)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"wrote the profile of {runs} runs to {etdump}" in done.stderr, done.stderr
    calls = runs * (-(-length // MAX_CHUNK) + new_tokens - 1)  # each run: the prompt's calls, then its decode steps
    blocks = [block for block in Inspector(etdump_path=str(etdump)).event_blocks if block.name == "Execute"]
    events = max(blocks, key=lambda block: len(block.events)).events
    (whole,) = [event.perf_data.raw for event in events if event.name == profile.WHOLE_CALL]
    assert len(whole) == calls, (len(whole), calls)
    names = profile.instruction_names(program, "forward")
    skip = 1 + seed % 2
    whole_ms, rows, summed = profile.sum_calls(events, names, skip, None)
    assert summed == calls - skip and whole_ms == pytest.approx(sum(whole[skip:]) / summed, rel=1e-12)
    outside = {name: ms for name, (ms, _, inside) in rows.items() if not inside}
    assert outside and set(outside) <= set(names.values()), (sorted(outside), sorted(set(names.values())))
    assert 0 < sum(outside.values()) <= whole_ms, (outside, whole_ms)

    assert cli.main(["profile", str(etdump), str(program), "--skip", str(skip), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{calls - skip} calls, {whole_ms:.3f} ms a call")
    assert printed.count("\n| ") == 1 + 3  # the table's header and its top 3 rows
    for arguments, message in ((["--skip", "-1"], "--skip must be >= 0, got -1"),
                               (["--calls", "0"], "--calls must be >= 1, got 0"),
                               (["--skip", str(calls)], "the profile holds no call of the method after --skip")):
        assert cli.main(["profile", str(etdump), str(program), *arguments]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["profile", str(tokenizer), str(program)]) == 2
    assert f"{tokenizer}: not an ETDump" in capsys.readouterr().err
