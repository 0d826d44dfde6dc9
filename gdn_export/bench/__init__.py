"""``gdn-bench``: benchmarks reported as ratios against anchors measured in the same run."""
