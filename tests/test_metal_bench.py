"""``gdn-bench metal`` off macOS, and its bytes-per-call arithmetic."""

from __future__ import annotations

import pytest
import torch

from gdn_bench import cli, metal
from gdn_export.backends import get_backend
from gdn_export.ops.conformance import OpCase


def test_refuses_clearly_without_apple_gpu(capsys):
    if get_backend("metal").unavailable_reason() is None:
        pytest.skip("this machine has an Apple GPU: the benchmark runs instead")
    assert cli.main(["metal", "--batches", "1", "--lengths", "16"]) == 2
    assert "gdn-bench metal needs a Mac with an Apple-silicon GPU" in capsys.readouterr().err


def test_bytes_per_call_counts_inputs_output_and_state_twice():
    case = OpCase(batch=2, length=3, num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, dtype=torch.bfloat16)
    state = 2 * 32 * 128 * 128 * 4
    tokens = 2 * 3
    activations = tokens * (2 * 16 * 128 + 32 * 128 + 32 * 128 + 2 * 32) * 2  # q, k, v, output, two gates
    assert metal.bytes_per_call(case, fused=False) == 2 * state + activations
    assert metal.bytes_per_call(case, fused=True) == 2 * state + activations + 2 * 32 * 4
