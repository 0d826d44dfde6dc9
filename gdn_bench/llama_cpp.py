"""llama.cpp as an anchor of ``gdn-bench e2e`` (``--llama-cpp DIR``): the same checkpoint as GGUF files, timed and
scored by llama.cpp's own tools.

``DIR`` is a llama.cpp source folder built in place with CMake (``cmake -B build``): its
``convert_hf_to_gguf.py`` and ``gguf-py/`` convert the bench's checkpoint, and ``build/bin`` holds
``llama-quantize``, ``llama-bench`` and ``llama-perplexity``. llama.cpp is only called and its converter
module imported from ``DIR``; nothing of it is part of this package.

``python -m gdn_bench.llama_cpp DIR CONVERTER_ARGS...`` runs that converter with one change: a tokenizer
whose pre-tokenizer hash llama.cpp does not know (the bench's small random tokenizer) is named after the
pre-tokenization it performs (``PRE_TOKENIZERS``), since llama.cpp identifies pre-tokenizers by a hash of
the token ids of a test string, and a tokenizer trained on our corpus hashes like no published one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gdn_export.tiny import QWEN_SPLIT_PATTERN

TOOLS = ("llama-bench", "llama-quantize", "llama-perplexity")
CONVERTER = "convert_hf_to_gguf.py"
# The GGUF files of the anchor: e2e system name -> llama.cpp file type (the converter writes F32,
# llama-quantize the others from it).
GGUF_TYPES = {"llama_f32": "F32", "llama_q8_0": "Q8_0", "llama_q4_0": "Q4_0"}
# Byte-level BPE pre-tokenizers llama.cpp implements, by the split regex a tokenizer.json gives them:
# "qwen2" is Qwen2/Qwen3's, also the bench tokenizer's (gdn_export.tiny); "qwen35" is Qwen3.5's published
# tokenizer's (letters extended by combining marks, \p{M}), as llama.cpp's src/llama-vocab.cpp quotes it.
PRE_TOKENIZERS = {
    QWEN_SPLIT_PATTERN: "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
}
# llama-perplexity's saved base logits start with this magic, then n_ctx (u32), n_vocab, n_chunk (i32) and
# the n_ctx * n_chunk token ids (i32) it evaluated.
LOGITS_MAGIC = b"_logits_"


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp source folder with its tools built in ``build/bin``."""

    root: Path

    @property
    def converter(self) -> Path:
        return self.root / CONVERTER

    def tool(self, name: str) -> Path:
        return self.root / "build" / "bin" / name


FALSE_WORDS = ("OFF", "0", "FALSE", "NO", "N")  # CMake's false constants (less -NOTFOUND and IGNORE)


def builds_avx512(llama: LlamaCpp) -> Optional[bool]:
    """Whether the build in ``build/`` may use AVX-512, from its CMakeCache.txt: False only for
    GGML_NATIVE=OFF with GGML_AVX512=OFF (a native build takes what the building machine has); None when
    there is no cache to read."""
    try:
        text = (llama.root / "build" / "CMakeCache.txt").read_text()
    except OSError:
        return None
    options = dict(re.findall(r"^(GGML_NATIVE|GGML_AVX512):BOOL=(\w+)$", text, flags=re.MULTILINE))
    if len(options) < 2:
        return None
    return not (options["GGML_NATIVE"].upper() in FALSE_WORDS and options["GGML_AVX512"].upper() in FALSE_WORDS)


def llama_cpp_dir(text: str) -> LlamaCpp:
    """``--llama-cpp``'s argparse type: the folder, checked before any work is done."""
    expected = (f"expected a llama.cpp source folder holding {CONVERTER}, gguf-py/ and build/bin/ with "
                f"{', '.join(TOOLS)} (cmake -B build, gdn_bench/README.md)")
    root = Path(text).expanduser()
    if not root.is_dir():
        raise argparse.ArgumentTypeError(f"{expected}; {text!r} is not a folder")
    llama = LlamaCpp(root.resolve())
    missing = [CONVERTER] if not llama.converter.is_file() else []
    missing += [] if (root / "gguf-py" / "gguf").is_dir() else ["gguf-py/gguf/"]
    missing += [f"build/bin/{tool}" for tool in TOOLS if not _is_executable(llama.tool(tool))]
    if missing:
        raise argparse.ArgumentTypeError(f"{expected}; {text!r} lacks {', '.join(missing)}")
    return llama


def decode_read_bytes(llama: LlamaCpp, gguf: Path) -> int:
    """Bytes of ``gguf``'s tensors that a decode step reads: all of them, but the token table when the file
    has its own output head (then the lookup reads one row a token). Read with the source's gguf-py."""
    source = str(llama.root / "gguf-py")
    sys.path.insert(0, source)
    try:
        from gguf import GGUFReader
    finally:
        sys.path.remove(source)
    tensors = {tensor.name: int(tensor.n_bytes) for tensor in GGUFReader(gguf).tensors}
    untied_table = tensors.get("token_embd.weight", 0) if "output.weight" in tensors else 0
    return sum(tensors.values()) - untied_table


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


# ---------------------------------------------------------------------------
# Conversion: llama.cpp's converter with the pre-tokenizer named.


def pre_tokenizer_name(pre_tokenizer: Optional[dict]) -> Optional[str]:
    """llama.cpp's name for a tokenizer.json ``pre_tokenizer`` (a dict), or None when it is none we know.

    Known: a regex split (isolated) followed by byte-level mapping without a regex of its own, the split
    regex one of ``PRE_TOKENIZERS``.
    """
    if not pre_tokenizer or pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers", [])
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True)):
        return None
    return PRE_TOKENIZERS.get((split.get("pattern") or {}).get("Regex"))


def convert(root: Path, argv: list) -> None:
    """Run ``root``'s convert_hf_to_gguf.py with ``argv``, naming a pre-tokenizer its hash table lacks."""
    sys.path.insert(0, str(root))  # the converter imports its conversion/ package; it adds gguf-py itself
    import convert_hf_to_gguf
    from conversion.base import TextModel

    lookup = TextModel.get_vocab_base_pre
    logger = logging.getLogger("gdn_bench.llama_cpp")

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return lookup(self, tokenizer)  # a published tokenizer: llama.cpp's own name for it
        except NotImplementedError:
            # The checkpoint's own tokenizer.json: transformers' tokenizer classes may replace its pre-tokenizer
            # with their model's (Qwen3_5Tokenizer puts Qwen3.5's regex on any tokenizer it loads).
            path = Path(self.dir_model) / "tokenizer.json"
            spec = json.loads(path.read_text()) if path.is_file() else json.loads(tokenizer.backend_tokenizer.to_str())
            name = pre_tokenizer_name(spec.get("pre_tokenizer"))
            if name is None:
                raise
            logger.warning("gdn-bench: pre-tokenizer hash unknown to llama.cpp; naming it %r after its split regex", name)
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(root / CONVERTER), *argv]
    convert_hf_to_gguf.main()


def convert_command(llama: LlamaCpp, checkpoint: Path, output: Path) -> list:
    """The child command converting ``checkpoint`` to an F32 GGUF at ``output``, without MTP layers
    (Qwen3.5's ``mtp.*`` draft head; a checkpoint without them converts alike)."""
    return [sys.executable, "-m", "gdn_bench.llama_cpp", str(llama.root), str(checkpoint),
            "--outfile", str(output), "--outtype", "f32", "--no-mtp"]


def quantize_command(llama: LlamaCpp, source: Path, output: Path, file_type: str, threads: int) -> list:
    return [str(llama.tool("llama-quantize")), str(source), str(output), file_type, str(threads)]


# ---------------------------------------------------------------------------
# Timing: llama-bench, the bench's prompt lengths, decode steps and threads.


def bench_commands(llama: LlamaCpp, gguf: Path, prompts: tuple, decode_steps: int, threads: int,
                   repetitions: int) -> list:
    """Two llama-bench runs (JSON on stdout): prefill at each prompt length from an empty context, and
    ``decode_steps`` generated tokens after a context of the first prompt length (``-d``), as our decode is
    timed right after the first prompt."""
    common = [str(llama.tool("llama-bench")), "-m", str(gguf), "-t", str(threads), "-r", str(repetitions),
              "-o", "json"]
    return [
        common + ["-p", ",".join(map(str, prompts)), "-n", "0"],
        common + ["-p", "0", "-n", str(decode_steps), "-d", str(prompts[0])],
    ]


def decode_turn_command(llama: LlamaCpp, gguf: Path, depth: int, tokens: int, threads: int) -> list:
    """One llama-bench run (JSON on stdout) of ``tokens`` generated tokens after a context of ``depth``, once:
    a turn of ``gdn-bench e2e --llama-rounds``."""
    return [str(llama.tool("llama-bench")), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json",
            "-p", "0", "-n", str(tokens), "-d", str(depth)]


def parse_bench(outputs: list) -> dict:
    """tok/s from llama-bench JSON outputs: the median over repetitions of each test's ``samples_ts``,
    as ``{"prefill_tok_s": {prompt: tok/s}, "decode_tok_s": tok/s, ...}`` (e2e's result shape)."""
    prefill, decode, about = {}, None, {}
    for output in outputs:
        for test in json.loads(output):
            rate = statistics.median(test["samples_ts"])
            if test["n_gen"] == 0:
                prefill[str(test["n_prompt"])] = rate
            elif test["n_prompt"] == 0:
                decode = rate
            about = {key: test[key] for key in ("build_commit", "cpu_info", "model_size", "n_threads") if key in test}
    return {"prefill_tok_s": prefill, "decode_tok_s": decode, "llama_bench": about}


# ---------------------------------------------------------------------------
# Quality: llama-perplexity's KL divergence of a quantized file from the F32 file.


def perplexity_base_command(llama: LlamaCpp, f32: Path, text: Path, base: Path, context: int, threads: int) -> list:
    """F32's log-probabilities over the first ``context`` tokens of ``text`` (one chunk), saved to ``base``.

    No BOS is added (our programs are fed none), so the chunk is the text's tokens alone; the text must
    tokenize to at least 2 * ``context`` tokens, which llama-perplexity requires even for one chunk.
    """
    return [str(llama.tool("llama-perplexity")), "-m", str(f32), "-f", str(text), "-c", str(context),
            "-b", str(context), "--chunks", "1", "-t", str(threads), "--kl-divergence-base", str(base),
            "--override-kv", "tokenizer.ggml.add_bos_token=bool:false"]


def perplexity_kl_command(llama: LlamaCpp, gguf: Path, base: Path, context: int, threads: int) -> list:
    """KL(F32 || ``gguf``) over the tokens saved in ``base``."""
    return [str(llama.tool("llama-perplexity")), "-m", str(gguf), "-c", str(context), "-b", str(context),
            "-t", str(threads), "--kl-divergence-base", str(base), "--kl-divergence",
            "--override-kv", "tokenizer.ggml.add_bos_token=bool:false"]


_MEAN_KLD = re.compile(r"^Mean\s+KLD:\s*([-+0-9.eE]+|nan|inf)\s*±\s*([-+0-9.eE]+|nan|inf)", re.MULTILINE)
_SAME_TOP = re.compile(r"^Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)\s*%", re.MULTILINE)


def parse_kl(output: str) -> dict:
    """Mean KL divergence (and its standard error) and the same-top-token share from llama-perplexity
    ``--kl-divergence``'s output."""
    mean = _MEAN_KLD.search(output)
    same = _SAME_TOP.search(output)
    if mean is None or same is None:
        raise ValueError("llama-perplexity printed no 'Mean    KLD:' / 'Same top p:' line:\n" + output[-2000:])
    return {"mean_kl": float(mean.group(1)), "mean_kl_stderr": float(mean.group(2)),
            "top1_agreement": float(same.group(1)) / 100}


def base_tokens(base: Path) -> list:
    """The token ids a ``--kl-divergence-base`` file was computed over (all its chunks)."""
    with open(base, "rb") as handle:
        header = handle.read(8 + 12)
        if header[:8] != LOGITS_MAGIC:
            raise ValueError(f"{base} is not a llama-perplexity logits file")
        context, _, chunks = struct.unpack("<Iii", header[8:])
        count = context * chunks
        return list(struct.unpack(f"<{count}i", handle.read(4 * count)))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m gdn_bench.llama_cpp LLAMA_CPP_DIR CONVERT_HF_TO_GGUF_ARGS...")
    root = Path(argv[0]).resolve()
    if not (root / CONVERTER).is_file():
        raise SystemExit(f"LLAMA_CPP_DIR: expected a llama.cpp source folder holding {CONVERTER}, got {argv[0]!r}")
    convert(root, argv[1:])


if __name__ == "__main__":
    main()
