"""``gdn-bench``: benchmarks reported as ratios against anchors measured in the same run.

A tool above the library: it imports ``gdn_export`` and the backend packages
through their public entry points only, and none of them imports it.
"""


class UsageError(ValueError):
    """Bad command-line input, found before anything is written: ``gdn-bench`` prints the message as one line."""
