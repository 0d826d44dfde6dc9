"""``gdn-bench`` entry point."""

import sys


def main(argv=None) -> int:
    print("gdn-bench: not yet available in this version of gdn-export", file=sys.stderr)
    return 2
