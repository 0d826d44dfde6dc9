"""``gdn-bench e2e``: the CPU benchmark (``gdn_bench.e2e``) or, with ``--device cuda``, the GPU one
(``gdn_bench.e2e_cuda``); this module only joins their options and sends a run to one of them."""

from __future__ import annotations

import argparse

from gdn_bench import UsageError, e2e, e2e_cuda


def add_arguments(parser: argparse.ArgumentParser) -> None:
    e2e.add_arguments(parser)
    e2e_cuda.add_arguments(parser)


def run(args) -> int:
    if args.device == "cuda":
        return e2e_cuda.run(args)
    given = [flag for name, flag in e2e_cuda.CUDA_ONLY.items() if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} applies to --device cuda only")
    return e2e.run(args)
