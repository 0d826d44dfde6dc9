"""Console entry points: ``export_qwen35`` and ``gdn-run``.

Both print one clear line and exit with status 1 on bad input (2 for bad
flags, from argparse); a traceback means a bug.
"""

from __future__ import annotations

import argparse
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def export_main(argv=None) -> int:
    from gdn_export import export

    parser = argparse.ArgumentParser(
        prog="export_qwen35", description="Export a Hugging Face Qwen3.5 folder to an ExecuTorch .pte program."
    )
    parser.add_argument("--checkpoint", required=True, help="Hugging Face folder (config.json, safetensors, tokenizer.json)")
    parser.add_argument("--output", required=True, help="the .pte file to write")
    parser.add_argument("--backend", default="xnnpack", choices=export.BACKENDS)
    parser.add_argument("--dtype", default=None, choices=tuple(export.DTYPES),
                        help="weights and activations (default bf16 for --backend cuda, else fp32; "
                             "recurrent states stay fp32)")
    parser.add_argument("--max-seq-len", type=_positive_int, default=export.DEFAULT_MAX_SEQ_LEN,
                        help="context length: size of the KV cache (default %(default)s)")
    parser.add_argument("--quantize", default="none", choices=export.QUANTIZATIONS)
    parser.add_argument("--prefill-chunk", type=_positive_int, default=None,
                        help=f"most tokens per forward call (default min({export.DEFAULT_PREFILL_CHUNK}, --max-seq-len))")
    args = parser.parse_args(argv)
    from gdn_export.loading import CheckpointError

    try:
        summary = export.export_qwen35(
            args.checkpoint, args.output, backend=args.backend,
            dtype=args.dtype or ("bf16" if args.backend == "cuda" else "fp32"),
            max_seq_len=args.max_seq_len, quantize=args.quantize, prefill_chunk=args.prefill_chunk,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (export.ExportError, CheckpointError, OSError) as error:
        print(f"export_qwen35: error: {error}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


def run_main(argv=None) -> int:
    from gdn_export import runner

    parser = argparse.ArgumentParser(prog="gdn-run", description="Generate text from a .pte written by export_qwen35.")
    parser.add_argument("--model", required=True, help="the .pte program")
    parser.add_argument("--tokenizer", required=True, help="the checkpoint's tokenizer.json")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=_positive_int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed when --temperature > 0")
    parser.add_argument("--data", default=None, help="the .ptd weights file of a CUDA program")
    args = parser.parse_args(argv)
    if args.temperature < 0:
        print(f"gdn-run: error: --temperature must be >= 0, got {args.temperature}", file=sys.stderr)
        return 1
    try:
        tokenizer = runner.load_tokenizer(args.tokenizer)
        program = runner.ProgramRunner(args.model, data_path=args.data)
        prompt_tokens = tokenizer.encode(args.prompt).ids
        if not prompt_tokens:
            raise runner.RunnerError("--prompt encodes to no tokens")
        stream = runner.TextStream(tokenizer)
        result = runner.generate(
            program, prompt_tokens, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            on_token=lambda token: print(stream.push(token), end="", flush=True), seed=args.seed,
        )
    except (runner.RunnerError, ValueError) as error:
        print(f"gdn-run: error: {error}", file=sys.stderr)
        return 1
    print()
    print(
        f"prefill: {len(result.prompt_tokens)} tokens, {result.prefill_tokens_per_second:.1f} tok/s; "
        f"decode: {len(result.tokens)} tokens, {result.decode_tokens_per_second:.1f} tok/s",
        file=sys.stderr,
    )
    return 0
