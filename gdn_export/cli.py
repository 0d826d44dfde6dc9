"""Console entry points: ``export_qwen35`` and ``gdn-run``."""

import sys


def _not_yet(name: str) -> int:
    print(f"{name}: not yet available in this version of gdn-export", file=sys.stderr)
    return 2


def export_main(argv=None) -> int:
    return _not_yet("export_qwen35")


def run_main(argv=None) -> int:
    return _not_yet("gdn-run")
