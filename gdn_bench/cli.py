"""gdn-bench: one subcommand per target (cpu, cuda, metal, linear, pages, e2e); each prints its tables against anchors timed in the same run.

Each subcommand lives in its own module of this package exposing
``add_arguments(parser)`` and ``run(args) -> int``, so a benchmark's
dependencies (Triton, ExecuTorch's anchors, transformers) load only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gdn_bench import UsageError

SUBCOMMANDS = {
    "cpu": ("gdn_bench.cpu", "the C++ kernel vs ExecuTorch's llama::gated_delta_rule, per token"),
    "cuda": ("gdn_bench.cuda", "the Triton kernels vs fla-core and ExecuTorch's kernels (GPU)"),
    "metal": ("gdn_bench.metal", "the Metal kernels vs the reference (macOS)"),
    "linear": ("gdn_bench.linear", "8da4w_avx2's 4-bit linear (ours) vs 8da4w's (XNNPACK's), same weights"),
    "pages": ("gdn_bench.pages", "a program's decode step from its mapped file vs from 2 MiB pages (gdn-run's loading)"),
    "profile": ("gdn_bench.profile", "where a program's calls spend their time: an ETDump of the C++ runner's "
                                     "(--etdump), summed by operator and delegate"),
    "e2e": ("gdn_bench.e2e_cli", "a Qwen3.5-shaped .pte end to end: 0.8B on CPU vs transformers, ExecuTorch's own flow "
                             "and llama.cpp; --device cuda: 0.8B and 4B vs transformers + fla-core"),
}


def main(argv=None) -> int:
    from gdn_export.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="gdn-bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        try:
            modules[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        modules[name].add_arguments(sub)
    args = parser.parse_args(argv)
    if args.command not in modules:
        print(f"gdn-bench {args.command}: not yet available in this version of gdn-export", file=sys.stderr)
        return 2
    try:
        return modules[args.command].run(args)
    except UsageError as error:
        print(f"gdn-bench {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
