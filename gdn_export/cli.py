"""Console entry points: ``export_qwen35`` and ``gdn-run``.

Both print our own lines only: third-party warnings, log records and what
native libraries write to the process's stderr (cpuinfo, re2, ExecuTorch's
logger) are hidden unless ``--verbose``. Bad input is one line and exit status
1 (2 for bad flags, from argparse); Ctrl-C is one line and status 130, with
nothing written; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, TextIO

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default in --help, and descriptions kept as written.

    argparse's own defaults formatter also tags required options and options
    whose help already explains their default with "(default: None)"; here
    only a real value is added, once.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required or any(action.default is value for value in (None, False, argparse.SUPPRESS)) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


@contextlib.contextmanager
def our_lines_only(verbose: bool) -> Iterator[TextIO]:
    """The stream for our own lines; everything else written to stderr is hidden unless ``verbose``.

    Native libraries write to file descriptor 2, ExecuTorch's Python bindings
    to ``sys.stderr``, Python's warnings and log records through their own
    machinery: while this is open, descriptor 2 points at a scratch file,
    ``sys.stderr`` at nothing, warnings and logs below errors are off, and our
    lines go to the stderr the process started with. A bug's traceback is
    printed after it closes, so it still shows.
    """
    if verbose:
        yield sys.stderr
        return
    import logging
    import warnings

    sys.stderr.flush()
    try:  # a caller that captures sys.stderr itself (a test) keeps receiving our lines
        stderr_is_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        stderr_is_fd2 = False
    saved_fd2, saved_stderr = os.dup(2), sys.stderr
    ours = os.fdopen(os.dup(saved_fd2), "w", buffering=1) if stderr_is_fd2 else saved_stderr
    with tempfile.TemporaryFile() as scratch, open(os.devnull, "w") as nowhere, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(scratch.fileno(), 2)
        sys.stderr = nowhere
        logging.disable(logging.WARNING)
        try:
            yield ours
        finally:
            logging.disable(logging.NOTSET)
            ours.flush()
            sys.stderr = saved_stderr
            os.dup2(saved_fd2, 2)
            os.close(saved_fd2)
            if ours is not saved_stderr:
                ours.close()


def _run(program: str, verbose: bool, body: Callable[[TextIO], int]) -> int:
    """``body(console)``'s status; Ctrl-C anywhere in it is one line and status 130."""
    try:
        with our_lines_only(verbose) as console:
            return body(console)
    except KeyboardInterrupt:
        print(f"{program}: interrupted; nothing written", file=sys.stderr, flush=True)
        return INTERRUPTED


def export_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="export_qwen35", formatter_class=HelpFormatter,
        description="Export a Hugging Face Qwen3.5 folder to an ExecuTorch .pte program "
        "(plus .ptd weight files for the GPU backends).",
    )
    from gdn_export.backends import backend_names, default_backend
    from gdn_export.export import DEFAULT_MAX_SEQ_LEN, DEFAULT_PREFILL_CHUNK, DTYPES, QUANTIZATIONS, STATE_DTYPES

    parser.add_argument("--checkpoint", required=True,
                        help="Hugging Face folder: config.json, safetensors weights, tokenizer.json")
    parser.add_argument("--output", required=True, help="the .pte file to write (written whole or not at all)")
    parser.add_argument("--backend", default=default_backend(), choices=backend_names(),
                        help="the registered backend to lower for: xnnpack and portable run on CPU, "
                        "cuda on NVIDIA GPUs, metal on Apple GPUs")
    parser.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                        help="weights and activations (default: the backend's, bf16 for cuda and fp32 for the "
                        "others); the recurrent state's is --state-dtype's")
    parser.add_argument("--max-seq-len", type=_positive_int, default=DEFAULT_MAX_SEQ_LEN,
                        help="context length: the tokens the KV cache holds")
    parser.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                        help="linear layers and token embedding: 8da4w (int8 activations, int4 weights in groups of 32, "
                        "the token table in 8 bits, which a tied output head reads as 4-bit weights; xnnpack), 8da4w_avx2 (the "
                        "same on our own 4-bit kernel, whose scales take either sign: less KL than 8da4w, and for x86 "
                        "CPUs, fastest where there is AVX2 and no AVX-512 VNNI; xnnpack), "
                        "8da8w (int8 activations, int8 weights; xnnpack), int8wo (int8 weights, float activations; "
                        "XNNPACK's int8-weight kernels on xnnpack) or 16da8w (int8 weights with a scale per group of 32, "
                        "int16 activations: the 8-bit program closest to fp32, on our kernels, the token table in 8 bits, which a "
                        "tied output head reads as 5-bit weights; xnnpack)")
    parser.add_argument("--state-dtype", default=None, choices=tuple(STATE_DTYPES),
                        help="the Gated DeltaNet layers' recurrent state (default: float16 for a quantized xnnpack "
                        "or portable program, which halves a decode step's state traffic for a KL change of some "
                        "1e-6; float32 otherwise); float16 needs --dtype fp32 and a CPU backend")
    parser.add_argument("--prefill-chunk", type=_positive_int, default=None,
                        help=f"most prompt tokens per call (default: the smaller of {DEFAULT_PREFILL_CHUNK} "
                        "and --max-seq-len)")
    parser.add_argument("--verbose", action="store_true", help="also show third-party warnings and native logs")
    args = parser.parse_args(argv)

    def body(console: TextIO) -> int:
        from gdn_export import export
        from gdn_export.checkpoint import CheckpointError

        try:
            summary = export.export_qwen35(
                args.checkpoint, args.output, backend=args.backend, dtype=args.dtype,
                max_seq_len=args.max_seq_len, quantize=args.quantize, prefill_chunk=args.prefill_chunk,
                state_dtype=args.state_dtype, progress=lambda line: print(line, file=console, flush=True),
            )
        except (export.ExportError, CheckpointError, OSError) as error:
            print(f"export_qwen35: error: {error}", file=console)
            return 1
        print(summary.describe())
        return 0

    return _run("export_qwen35", args.verbose, body)


def _check_conversation_flags(args) -> Optional[str]:
    """What is wrong with gdn-run's conversation flags (one line), before anything is loaded; None if nothing."""
    if args.chat == (args.prompt is not None):
        if args.chat:
            return "--chat reads its messages from stdin and takes no --prompt"
        return "--prompt is required (or --chat)"
    if args.prompt_cache and (args.load_state or args.chat):
        return "--prompt-cache starts a new conversation: it goes without --load-state and --chat"
    for flag, value in (("--load-state", args.load_state), ("--prompt-cache", args.prompt_cache)):
        if value is not None and Path(value).is_dir():
            return f"{flag} {value} is a folder, expected a state file"
    if args.save_state is not None:
        path = Path(args.save_state)
        if path.is_dir():
            return f"--save-state {path} is a folder, expected a file path"
        if not path.resolve().parent.is_dir():
            return f"--save-state {path}: folder {path.parent} does not exist"
    return None


def run_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="gdn-run", formatter_class=HelpFormatter,
        description="Generate text from a .pte written by export_qwen35.",
    )
    parser.add_argument("--model", required=True, help="the .pte program")
    parser.add_argument("--tokenizer", required=True, help="the checkpoint's tokenizer.json")
    parser.add_argument("--prompt", default=None, help="the text to continue (required unless --chat)")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=64,
                        help="most tokens to generate (fewer at an end-of-sequence token or the context's end)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed when --temperature > 0")
    parser.add_argument("--data", default=None, help="the .ptd weights file of a GPU (cuda, metal) program")
    parser.add_argument("--save-state", default=None, metavar="FILE",
                        help="write the decoding state here when generation ends (written whole or not at all)")
    parser.add_argument("--load-state", default=None, metavar="FILE",
                        help="continue the conversation a --save-state FILE holds: the prompt is fed after it")
    parser.add_argument("--prompt-cache", default=None, metavar="FILE",
                        help="reuse the state in FILE when its tokens begin the prompt (prefill only the rest); "
                        "otherwise save the prompt's state there")
    parser.add_argument("--chat", action="store_true",
                        help="chat on stdin with the checkpoint's chat template (tokenizer_config.json beside "
                        "--tokenizer), keeping the state between turns; Ctrl-D ends (and writes --save-state), "
                        "Ctrl-C ends writing nothing")
    parser.add_argument("--verbose", action="store_true", help="also show third-party warnings and native logs")
    args = parser.parse_args(argv)
    problem = _check_conversation_flags(args) or (
        f"--temperature must be >= 0, got {args.temperature}" if args.temperature < 0 else None
    )
    if problem:
        print(f"gdn-run: error: {problem}", file=sys.stderr)
        return 1

    def body(console: TextIO) -> int:
        from gdn_export import runner

        runner.leave_the_cores_to_programs()
        try:
            tokenizer = runner.load_tokenizer(args.tokenizer)
            program = runner.ProgramRunner(args.model, data_path=args.data)
            runner.check_tokenizer(tokenizer, program, args.tokenizer)
            if args.chat:
                from gdn_export.chat import run_chat

                return run_chat(program, tokenizer, args, console)
            prompt_tokens = tokenizer.encode(args.prompt).ids
            if not prompt_tokens:
                raise runner.RunnerError("--prompt encodes to no tokens")
            stream = runner.TextStream(tokenizer)

            def on_token(token: int) -> None:
                print(stream.push(token), end="", flush=True)

            if args.save_state or args.load_state or args.prompt_cache:
                from gdn_export.session import run_with_state

                result = run_with_state(program, prompt_tokens, args, console, on_token)
            else:
                runner.check_prompt_fits(program, len(prompt_tokens))
                result = runner.generate(
                    program, prompt_tokens, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    on_token=on_token, seed=args.seed,
                )
        except (runner.RunnerError, ValueError) as error:
            print(f"gdn-run: error: {error}", file=console)
            return 1
        print()
        print(
            f"prefill: {len(result.prompt_tokens)} tokens, {result.prefill_tokens_per_second:.1f} tok/s; "
            f"decode: {len(result.tokens)} tokens, {result.decode_tokens_per_second:.1f} tok/s",
            file=console,
        )
        return 0

    return _run("gdn-run", args.verbose, body)
