"""gdn-bench linear: our 4-bit linear and XNNPACK's, exported from the same codes, compute the same chain."""

import argparse

import numpy as np
import pytest
import torch

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
        assert ("read" in entry) == (rows == 1)
    assert results[1]["read"] > 0
    table = linear.report(results, args)
    assert "| 5 |" in table and "ours / XNNPACK speed" in table
    assert f"| {results[1]['read']:.2f} | {results[1]['read'] / results[1]['ours']:.2f} |" in table


def test_the_read_reads_every_byte_of_every_layer_once(seed):
    """read_layers' sum is the sum of the chain's codes and scales taken as little-endian int64s, counted
    here by numpy from the layers' bytes (modulo 2**64, as int64 sums wrap)."""
    torch.manual_seed(seed)
    ours, _ = linear.quantized_chains(linear.float_chain(2, 64, 96, seed))
    expected = 0
    for layer in ours.layers:
        raw = layer.weight.numpy().tobytes() + layer.scales.numpy().tobytes()
        assert len(raw) == layer.weight.numel() + layer.scales.element_size() * layer.scales.numel()
        expected += int(np.frombuffer(raw, dtype="<i8").astype(object).sum())
    buffers = linear.layer_bytes(ours)
    assert len(buffers) == 4, f"seed {seed}"
    assert linear.read_layers(buffers) % 2 ** 64 == expected % 2 ** 64, f"seed {seed}"


@pytest.mark.parametrize("overrides,message", [
    ({"pairs": 0}, "--pairs must be >= 1"),
    ({"rows": [1, 0]}, "--rows must all be >= 1"),
    ({"hidden": 48}, "--hidden must be a multiple of 32"),
])
def test_bad_arguments_are_refused_by_name(overrides, message):
    with pytest.raises(UsageError, match=message):
        linear.run(arguments(**overrides))
