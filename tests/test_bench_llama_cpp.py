"""gdn-bench e2e --llama-cpp without llama.cpp: the folder check, the converter entry (against a stub converter),
the pre-tokenizer naming, and the parsing of llama-bench's and llama-perplexity's recorded output."""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from gdn_bench import e2e, llama_cpp
from tests.triton_interpreter import REPO_ROOT

# Recorded: `llama-bench -m model-q4_0.gguf -t 2 -r 3 -o json -p 128,512 -n 0` on this repository's random-weight
# 0.8B-shape checkpoint (one of its two tests, most fields kept as printed).
LLAMA_BENCH_PREFILL = """[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.80GHz",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/tmp/q/e2e/llama_cpp/model-q4_0.gguf",
    "model_type": "qwen35 0.8B Q4_0",
    "model_size": 490209280,
    "model_n_params": 752393024,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "n_prompt": 128,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-11-25T02:40:11Z",
    "avg_ns": 1087305541,
    "stddev_ns": 21540322,
    "avg_ts": 117.741,
    "stddev_ts": 2.31,
    "samples_ns": [ 1110114000, 1087300000, 1064502623 ],
    "samples_ts": [ 115.304, 117.723, 120.244 ]
  },
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.80GHz",
    "model_size": 490209280,
    "n_threads": 2,
    "n_prompt": 512,
    "n_gen": 0,
    "n_depth": 0,
    "avg_ts": 104.2,
    "samples_ts": [ 99.5, 108.9, 104.2 ]
  }
]
"""
# Recorded the same way with `-p 0 -n 32 -d 128`.
LLAMA_BENCH_DECODE = """[
  {
    "build_commit": "unknown",
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.80GHz",
    "model_size": 490209280,
    "n_threads": 2,
    "n_prompt": 0,
    "n_gen": 32,
    "n_depth": 128,
    "avg_ts": 27.51,
    "samples_ts": [ 28.03, 26.12, 28.38 ]
  }
]
"""
# Recorded: the end of `llama-perplexity --kl-divergence` (Q4_0 against F32), log lines around it kept.
LLAMA_PERPLEXITY_KL = """kl_divergence: computing over 1 chunks, n_ctx=512, batch_size=512, n_seq=1
kl_divergence: 1.53 seconds per pass - ETA 0.02 minutes

chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1   253310.1230 ± 9988.7612      -0.00351 ±    0.00623       0.271832 ±    0.003120     2.113 ±  0.098 %    3.137 ±  1.094 %

====== Perplexity statistics ======
Mean PPL(Q)                   : 253310.123010 ± 9988.761245
Mean PPL(base)                : 254200.445219 ± 9981.992347
Cor(ln(PPL(Q)), ln(PPL(base))):  98.71%
Mean ln(PPL(Q)/PPL(base))     :  -0.003508 ±   0.006231

====== KL divergence statistics ======
Mean    KLD:   0.271832 ±   0.003120
Maximum KLD:   0.399110
99.9%   KLD:   0.398712
Median  KLD:   0.270551
Minimum KLD:   0.181623

====== Token probability statistics ======
Mean    Δp: -0.000 ± 0.000 %
RMS Δp    :  0.002 ±  0.000 %
Same top p:  3.137 ± 1.094 %

llama_perf_context_print:        load time =     312.44 ms
"""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-bench e2e")
    e2e.add_arguments(parser)
    return parser


def fake_llama_cpp(root, tools=llama_cpp.TOOLS):
    """A folder shaped like a built llama.cpp source tree (empty files, the tools executable)."""
    (root / "gguf-py" / "gguf").mkdir(parents=True)
    (root / llama_cpp.CONVERTER).write_text("")
    (root / "build" / "bin").mkdir(parents=True)
    for tool in tools:
        path = root / "build" / "bin" / tool
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return root


@pytest.mark.parametrize("tied", [True, False])
def test_decode_read_bytes_are_the_tensors_a_step_streams(tmp_path, generator, tied):
    """A GGUF written with gguf-py's writer: a step reads every tensor, but the token table when the file has
    its own output head; bytes from the arrays written (f32 and f16)."""
    import numpy as np
    from gguf import GGUFWriter

    rows, width = (int(v) for v in torch.randint(8, 40, (2,), generator=generator))
    tensors = {"token_embd.weight": torch.randn(rows, width, generator=generator).numpy(),
               "blk.0.ffn_up.weight": torch.randn(2 * width, width, generator=generator).numpy().astype(np.float16),
               "output_norm.weight": torch.randn(width, generator=generator).numpy()}
    if not tied:
        tensors["output.weight"] = torch.randn(rows, width, generator=generator).numpy().astype(np.float16)
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(str(path), "qwen35")
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expected = sum(array.nbytes for array in tensors.values()) - (0 if tied else 4 * rows * width)
    assert llama_cpp.decode_read_bytes(llama_cpp.LlamaCpp(fake_llama_cpp(tmp_path / "llama")), path) == expected


def test_a_bad_llama_cpp_folder_is_one_line_naming_the_flag(tmp_path, capsys):
    cases = {
        "missing": (tmp_path / "missing", "is not a folder"),
        "unbuilt": (fake_llama_cpp(tmp_path / "unbuilt", tools=()), "lacks build/bin/llama-bench, "
                    "build/bin/llama-quantize, build/bin/llama-perplexity"),
        "no perplexity": (fake_llama_cpp(tmp_path / "partial", tools=("llama-bench", "llama-quantize")),
                          "lacks build/bin/llama-perplexity"),
    }
    for name, (folder, reason) in cases.items():
        with pytest.raises(SystemExit) as raised:
            parser().parse_args(["--llama-cpp", str(folder)])
        assert raised.value.code == 2, name
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1, (name, errors)
        assert "argument --llama-cpp: expected a llama.cpp source folder" in errors[0], (name, errors)
        assert reason in errors[0] and str(folder) in errors[0], (name, errors)
    built = fake_llama_cpp(tmp_path / "built")
    args = parser().parse_args(["--llama-cpp", str(built)])
    assert args.llama_cpp.root == built.resolve()
    assert args.llama_cpp.tool("llama-bench") == built.resolve() / "build" / "bin" / "llama-bench"
    assert parser().parse_args([]).llama_cpp is None


def test_the_bench_tokenizers_pre_tokenizer_is_named_qwen2():
    """The bench tokenizer's pre-tokenizer (as tokenizers serializes it) splits with Qwen2's regex, which
    llama.cpp names "qwen2"; any other split, or a byte-level step with its own regex, has no name."""
    from gdn_export.tiny import build_tokenizer

    spec = json.loads(build_tokenizer().to_str())["pre_tokenizer"]
    assert llama_cpp.pre_tokenizer_name(spec) == "qwen2"
    split, byte_level = spec["pretokenizers"]
    qwen35 = r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"  # Qwen3.5's letters run over combining marks
    renamed = {**split, "pattern": {"Regex": split["pattern"]["Regex"].replace(r"[^\r\n\p{L}\p{N}]?\p{L}+", qwen35)
                                    .replace(r" ?[^\s\p{L}\p{N}]+", r" ?[^\s\p{L}\p{M}\p{N}]+")}}
    assert llama_cpp.pre_tokenizer_name({**spec, "pretokenizers": [renamed, byte_level]}) == "qwen35"
    other = {**split, "pattern": {"Regex": split["pattern"]["Regex"].replace(r"\p{N}|", r"\p{N}{1,3}|")}}
    for changed in ([other, byte_level], [split, {**byte_level, "use_regex": True}],
                    [{**split, "behavior": "Removed"}, byte_level], [split]):
        assert llama_cpp.pre_tokenizer_name({**spec, "pretokenizers": changed}) is None, changed
    assert llama_cpp.pre_tokenizer_name(None) is None
    assert llama_cpp.pre_tokenizer_name(byte_level) is None


# A stand-in for llama.cpp's converter: what our entry relies on, nothing more. Its pre-tokenizer lookup
# knows one hash, as llama.cpp's does (a published tokenizer), and raises NotImplementedError otherwise.
STUB_CONVERTER = '''
import argparse, hashlib, json
from pathlib import Path
from conversion.base import TextModel

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--outfile")
    parser.add_argument("--outtype")
    parser.add_argument("--no-mtp", action="store_true")
    args = parser.parse_args()
    from transformers import PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(args.model) / "tokenizer.json"))
    name = TextModel(args.model).get_vocab_base_pre(tokenizer)
    Path(args.outfile).write_text(json.dumps({"pre": name, "outtype": args.outtype, "no_mtp": args.no_mtp}))
'''
STUB_BASE = '''
import hashlib

class TextModel:
    known = {}  # chkhsh -> name, filled by the test

    def __init__(self, dir_model):
        self.dir_model = dir_model

    def get_vocab_base_pre(self, tokenizer):
        chkhsh = hashlib.sha256(str(tokenizer.encode("a test string 123")).encode()).hexdigest()
        if chkhsh in self.known:
            return self.known[chkhsh]
        raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")
'''


def test_the_converter_entry_names_an_unknown_pre_tokenizer_and_keeps_known_ones(tmp_path):
    from gdn_export.tiny import build_tokenizer

    stub = tmp_path / "llama.cpp"
    (stub / "conversion").mkdir(parents=True)
    (stub / llama_cpp.CONVERTER).write_text(STUB_CONVERTER)
    (stub / "conversion" / "__init__.py").write_text("")
    (stub / "conversion" / "base.py").write_text(STUB_BASE)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    tokenizer = build_tokenizer()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT))

    def convert(output):
        command = llama_cpp.convert_command(llama_cpp.LlamaCpp(stub), checkpoint, output)
        return subprocess.run(command, capture_output=True, text=True, env=environment)

    done = convert(tmp_path / "unknown.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "unknown.json").read_text()) == {"pre": "qwen2", "outtype": "f32", "no_mtp": True}
    assert "naming it 'qwen2'" in done.stderr

    # A hash the converter knows keeps the converter's own name.
    import hashlib
    chkhsh = hashlib.sha256(str(tokenizer.encode("a test string 123").ids).encode()).hexdigest()
    (stub / "conversion" / "base.py").write_text(STUB_BASE.replace("known = {}", f"known = {{{chkhsh!r}: 'mine'}}"))
    done = convert(tmp_path / "known.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "known.json").read_text())["pre"] == "mine"

    # A pre-tokenizer we cannot name: the converter's own refusal stands.
    spec = json.loads(tokenizer.to_str())
    spec["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = True
    (stub / "conversion" / "base.py").write_text(STUB_BASE)
    (checkpoint / "tokenizer.json").write_text(json.dumps(spec))
    done = convert(tmp_path / "refused.json")
    assert done.returncode != 0 and "BPE pre-tokenizer was not recognized" in done.stderr
    assert not (tmp_path / "refused.json").exists()

    missing = subprocess.run([sys.executable, "-m", "gdn_bench.llama_cpp", str(tmp_path / "nowhere"), "x"],
                             capture_output=True, text=True, env=environment)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1].startswith("LLAMA_CPP_DIR: expected a llama.cpp source folder")


def test_llama_bench_json_gives_median_tok_s_in_the_e2e_shape():
    entry = llama_cpp.parse_bench([LLAMA_BENCH_PREFILL, LLAMA_BENCH_DECODE])
    # The middle of each recorded test's three samples.
    assert entry["prefill_tok_s"] == {"128": 117.723, "512": 104.2}
    assert entry["decode_tok_s"] == 28.03
    assert entry["llama_bench"]["cpu_info"] == "Intel(R) Xeon(R) Processor @ 2.80GHz"
    assert entry["llama_bench"]["model_size"] == 490209280


def test_llama_bench_commands_use_the_bench_plan(tmp_path, generator):
    prompts = tuple(int(v) for v in torch.randint(16, 4096, (2,), generator=generator))
    steps, threads = (int(v) for v in torch.randint(1, 64, (2,), generator=generator))
    llama = llama_cpp.LlamaCpp(tmp_path)
    prefill, decode = llama_cpp.bench_commands(llama, tmp_path / "m.gguf", prompts, steps, threads, 3)
    assert prefill[0] == str(tmp_path / "build" / "bin" / "llama-bench")
    for command in (prefill, decode):
        assert command[command.index("-t") + 1] == str(threads) and command[command.index("-o") + 1] == "json"
    assert prefill[prefill.index("-p") + 1] == f"{prompts[0]},{prompts[1]}" and prefill[prefill.index("-n") + 1] == "0"
    assert decode[decode.index("-n") + 1] == str(steps) and decode[decode.index("-d") + 1] == str(prompts[0])
    assert decode[decode.index("-p") + 1] == "0"


def test_llama_perplexity_kl_output_is_parsed():
    assert llama_cpp.parse_kl(LLAMA_PERPLEXITY_KL) == {
        "mean_kl": 0.271832, "mean_kl_stderr": 0.003120, "top1_agreement": pytest.approx(0.03137),
    }
    with pytest.raises(ValueError, match="Mean    KLD"):
        llama_cpp.parse_kl(LLAMA_PERPLEXITY_KL.replace("Mean    KLD", "Mean KL"))


def test_kl_base_file_tokens_are_read_back(tmp_path, generator):
    context, chunks, vocab = 8 + int(torch.randint(0, 64, (1,), generator=generator)), 2, 1000
    tokens = torch.randint(0, vocab, (context * chunks,), generator=generator).tolist()
    base = tmp_path / "base.bin"
    base.write_bytes(llama_cpp.LOGITS_MAGIC + struct.pack("<Iii", context, vocab, chunks)
                     + struct.pack(f"<{len(tokens)}i", *tokens) + bytes(64))  # log-probabilities follow
    assert llama_cpp.base_tokens(base) == tokens
    base.write_bytes(b"_other__" + bytes(64))
    with pytest.raises(ValueError, match="not a llama-perplexity logits file"):
        llama_cpp.base_tokens(base)


def test_perplexity_commands_score_one_context_without_bos(tmp_path):
    llama = llama_cpp.LlamaCpp(tmp_path)
    base = llama_cpp.perplexity_base_command(llama, tmp_path / "f32.gguf", tmp_path / "t.txt", tmp_path / "b", 512, 2)
    kl = llama_cpp.perplexity_kl_command(llama, tmp_path / "q.gguf", tmp_path / "b", 512, 2)
    for command in (base, kl):
        assert command[command.index("-c") + 1] == "512" and command[command.index("-b") + 1] == "512"
        assert command[command.index("--override-kv") + 1] == "tokenizer.ggml.add_bos_token=bool:false"
    assert base[base.index("--chunks") + 1] == "1" and "--kl-divergence" not in base
    assert "--kl-divergence" in kl and "-f" not in kl  # the tokens come from the base file
    # The positions llama-perplexity scores: the second half of its context up to the one before the last.
    assert list(e2e.LLAMA_KL_POSITIONS) == list(range(256, 511))


def test_report_sets_ours_against_llama_cpp(generator):
    q4_prefill, q4_decode, q8_decode, kl_q4, kl_q8 = (float(v) for v in 1 + 50 * torch.rand(5, generator=generator))
    kl_q4, kl_q8 = kl_q4 / 100, kl_q8 / 1000
    results = {
        "ours_8da4w": {"prefill_tok_s": {"512": 2 * q4_prefill}, "decode_tok_s": 1.25 * q4_decode, "measured_at": "t"},
        "ours_8da8w": {"prefill_tok_s": {"512": 3.0}, "decode_tok_s": 1.5 * q8_decode, "measured_at": "t"},
        "llama_q4_0": {"prefill_tok_s": {"512": q4_prefill}, "decode_tok_s": q4_decode, "measured_at": "t"},
        "llama_q8_0": {"prefill_tok_s": {"512": 2.0}, "decode_tok_s": q8_decode, "measured_at": "t"},
        "quality": {
            "ours_8da4w": {"mean_kl": 3 * kl_q4, "mean_kl_llama_positions": 0.5 * kl_q4, "top1_agreement": 0.1,
                           "measured_at": "t"},
            "ours_8da8w": {"mean_kl": kl_q8, "mean_kl_llama_positions": 2 * kl_q8, "top1_agreement": 0.5,
                           "measured_at": "t"},
            "llama_q4_0": {"mean_kl": kl_q4, "mean_kl_stderr": 0.001, "top1_agreement": 0.1, "measured_at": "t"},
            "llama_q8_0": {"mean_kl": kl_q8, "mean_kl_stderr": 0.0001, "top1_agreement": 0.5, "measured_at": "t"},
        },
    }
    floor = {"copy_bandwidth_bytes_s": 30e9, "read_bandwidth_bytes_s": 30e9, "weight_bytes": 3e9, "floor_tok_s": 10.0}
    sizes = {"ours_8da4w": 500 * 2**20, "llama_q4_0": 468 * 2**20, "ours_8da8w": 965 * 2**20, "llama_q8_0": 764 * 2**20}
    table = e2e.report(results, {}, floor, (512,), sizes)
    assert f"| {e2e.SYSTEM_LABELS['llama_q4_0']} | {e2e.format_rate(q4_prefill)} | {e2e.format_rate(q4_decode)} | - |" \
        in table
    assert "| decode: ours_8da4w / llama_q4_0 | 1.25x | 1.5x | NO | - |" in table
    # With the bytes each step streams: a memory floor per system, and the share of it the floor asks.
    streamed = {"ours_8da4w": 0.4e9, "llama_q4_0": 0.5e9, "ours_8da8w": 0.8e9, "llama_q8_0": 0.85e9}
    # The states: 18 Gated DeltaNet layers' fp32 conv states (6144 channels x 3 taps) and recurrent states
    # (16 x 128 x 128), llama.cpp's fp32, ours float16, each read and written.
    conv_state, state = 2 * 18 * 4 * 6144 * 3, 2 * 18 * 16 * 128 * 128
    theirs, ours = conv_state + 4 * state, conv_state + 2 * state
    assert e2e.system_state_traffic("llama_q4_0") == theirs and e2e.system_state_traffic("ours_8da4w") == ours
    with_bytes = e2e.report(results, {}, floor, (512,), sizes, streamed)
    q4_floor, ours_floor = 30e9 / (0.5e9 + theirs), 30e9 / (0.4e9 + ours)
    assert f"| {e2e.format_rate(q4_decode)} | {(0.5e9 + theirs) / 1e9:.3f} | {q4_decode / q4_floor:.2f} |" \
        in with_bytes
    ours_share = 1.25 * q4_decode / ours_floor
    assert f"| {e2e.format_rate(1.25 * q4_decode)} | {(0.4e9 + ours) / 1e9:.3f} | {ours_share:.2f} |" in with_bytes
    assert f"| decode: ours_8da4w / llama_q4_0 | 1.25x | 1.5x | NO | {1.5 * q4_decode / ours_floor:.2f} |" in with_bytes
    assert "| prefill 512: ours_8da4w / llama_q4_0 | 2.00x | 1.5x | yes |" in table
    assert "| decode: ours_8da8w / llama_q8_0 | 1.50x | 1.5x | yes |" in table
    assert "| prefill 512: ours_8da8w / llama_q8_0 | 1.50x | 1.5x | yes |" in table
    assert "llama_f32" not in table and "/ hf" not in table  # pairs not measured get no row
    assert f"| 4-bit | {e2e.SYSTEM_LABELS['ours_8da4w']} | {3 * kl_q4:.4f} | {0.5 * kl_q4:.4f} " \
           f"| {e2e.SYSTEM_LABELS['llama_q4_0']} | {kl_q4:.4f} ± 1.0e-03 | 0.50x | yes |" in table
    assert f"| 8-bit | {e2e.SYSTEM_LABELS['ours_8da8w']} | {kl_q8:.4f} | {2 * kl_q8:.4f} " \
           f"| {e2e.SYSTEM_LABELS['llama_q8_0']} | {kl_q8:.4f} ± 1.0e-04 | 2.00x | NO |" in table
    assert f"| {e2e.SYSTEM_LABELS['ours_8da4w']} | 500.0 | {e2e.SYSTEM_LABELS['llama_q4_0']} | 468.0 | 1.07x | 1.1x | yes |" \
        in table
    assert f"| {e2e.SYSTEM_LABELS['ours_8da8w']} | 965.0 | {e2e.SYSTEM_LABELS['llama_q8_0']} | 764.0 | 1.26x | 1.1x | NO |" \
        in table


# A llama-bench stand-in: each run logs its arguments and prints the next of its scripted decode rates as
# llama-bench's JSON.
FAKE_LLAMA_BENCH = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
with open(here / "calls.txt", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
rates = json.loads((here / "rates.json").read_text())
calls = len((here / "calls.txt").read_text().splitlines())
arguments = sys.argv[1:]
tokens, depth = int(arguments[arguments.index("-n") + 1]), int(arguments[arguments.index("-d") + 1])
print(json.dumps([{{"n_prompt": 0, "n_gen": tokens, "n_depth": depth, "samples_ts": [rates[calls - 1]]}}]))
"""


def test_decode_alternated_with_llama_cpp_takes_turns_from_the_prompt(tmp_path, generator):
    """--llama-rounds: every round, our tiny program decodes from the prompt again in its own process and
    llama-bench runs once at the prompt's depth; each system's rate is the median of its turns, llama-bench's
    being the rates it printed, in order."""
    from gdn_export import export_qwen35
    from gdn_export.tiny import make_tiny_checkpoint

    llama = llama_cpp.LlamaCpp(fake_llama_cpp(tmp_path / "llama"))
    bench = llama.tool("llama-bench")
    bench.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable))
    rounds, tokens, depth = 3, 4, int(torch.randint(3, 9, (1,), generator=generator))
    rates = [round(float(v), 2) for v in 10 + 40 * torch.rand(rounds, generator=generator)]
    (bench.parent / "rates.json").write_text(json.dumps(rates))
    gguf = tmp_path / "model-q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    program = tmp_path / "ours_8da4w.pte"
    export_qwen35(make_tiny_checkpoint(tmp_path / "tiny", seed=int(torch.randint(0, 2**31, (1,), generator=generator))),
                  program, max_seq_len=64, prefill_chunk=8, quantize="8da4w")
    plan = e2e.Plan((depth,), tokens, 64, seed=0, threads=1)

    result = e2e.alternated_with_llama({"ours_8da4w": program}, {"llama_q4_0": gguf}, llama, plan, rounds)

    assert result["llama_q4_0"]["turns_tok_s"] == rates
    assert result["llama_q4_0"]["decode_tok_s"] == sorted(rates)[1]
    calls = (bench.parent / "calls.txt").read_text().splitlines()
    assert calls == [f"-m {gguf} -t 1 -r 1 -o json -p 0 -n {tokens} -d {depth}"] * rounds
    ours = result["ours_8da4w"]["turns_tok_s"]
    assert len(ours) == rounds and all(rate > 0 for rate in ours)
    assert result["ours_8da4w"]["decode_tok_s"] == sorted(ours)[1]


def test_report_of_the_alternated_decode(generator):
    """Each system's median turn and its range; per target pair the ratio of medians and the range of the
    rounds' own ratios."""
    ours, theirs = ([round(float(v), 2) for v in 20 + 30 * torch.rand(4, generator=generator)] for _ in range(2))
    median = lambda values: (sorted(values)[1] + sorted(values)[2]) / 2  # noqa: E731 (four values)
    results = {"llama_alternated": {
        "systems": {"ours_8da4w": {"decode_tok_s": median(ours), "turns_tok_s": ours},
                    "llama_q4_0": {"decode_tok_s": median(theirs), "turns_tok_s": theirs}},
        "rounds": 4, "tokens": 32, "depth": 128, "measured_at": "t"}}
    floor = {"copy_bandwidth_bytes_s": 30e9, "read_bandwidth_bytes_s": 30e9, "weight_bytes": 3e9, "floor_tok_s": 10.0}
    table = e2e.report(results, {}, floor, (128,), {})
    assert "Decode alternated with llama.cpp (4 rounds; in each, every system decodes 32 tokens after 128" in table
    assert f"| {e2e.SYSTEM_LABELS['ours_8da4w']} | {e2e.format_rate(median(ours))} | " \
           f"{e2e.format_rate(min(ours))} to {e2e.format_rate(max(ours))} |" in table
    value = median(ours) / median(theirs)
    by_round = [a / b for a, b in zip(ours, theirs)]
    assert f"alternated decode ours_8da4w / llama_q4_0: {value:.2f}x (floor 1.5x: " \
           f"{'met' if value >= 1.5 else 'NOT met'}; round by round {min(by_round):.2f}x to {max(by_round):.2f}x)" \
        in table
