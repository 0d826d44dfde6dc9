"""gdn-bench linear: our 4-bit linear and XNNPACK's, exported from the same codes, compute the same chain."""

import argparse

import pytest

from gdn_bench import UsageError
from gdn_bench import linear


def arguments(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    linear.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in {"pairs": 1, "hidden": 64, "intermediate": 96, "rows": [1, 5], "rounds": 2, **overrides}.items():
        setattr(args, name, value)
    return args


def test_both_programs_compute_the_same_chain(seed):
    args = arguments(seed=seed)
    results = linear.measure(args)
    assert sorted(results) == [1, 5]
    for rows, entry in results.items():
        # The same 4-bit codes and scales; the activations' int8 rounding differs (ours symmetric, XNNPACK's
        # with a zero point), about 1% of the output through two layers.
        assert entry["error"] < 0.03, f"seed {seed} rows {rows}: {entry}"
        assert entry["ours"] > 0 and entry["xnnpack"] > 0
    table = linear.report(results, args)
    assert "| 5 |" in table and "ours / XNNPACK speed" in table


@pytest.mark.parametrize("overrides,message", [
    ({"pairs": 0}, "--pairs must be >= 1"),
    ({"rows": [1, 0]}, "--rows must all be >= 1"),
    ({"hidden": 48}, "--hidden must be a multiple of 32"),
])
def test_bad_arguments_are_refused_by_name(overrides, message):
    with pytest.raises(UsageError, match=message):
        linear.run(arguments(**overrides))
