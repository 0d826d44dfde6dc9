"""gdn::cached_attention beyond the conformance table.

The table's cases (``ATTENTION_CASES``: the reference, the registered op and
the C++ kernel inside ``.pte`` programs against fp64 attention row by row) run
in tests/conformance. Here: the C++ kernel in a program whose caches are
buffers, as the rewritten model holds them, where a position past the caches
is an error rather than a read and leaves the program usable; and bad inputs
name the argument.
"""

import dataclasses

import pytest
import torch

from gdn_export.ops.attention import reference_cached_attention
from gdn_export.ops.conformance import AttentionCase, expected_attention_output, make_attention_inputs, relative_error
from runtime_ops.conformance import export_program


class Attend(torch.nn.Module):
    """The op over caches held as buffers, as the rewritten model holds them."""

    def __init__(self, k_cache, v_cache):
        super().__init__()
        self.register_buffer("k_cache", k_cache)
        self.register_buffer("v_cache", v_cache)

    def forward(self, query, input_pos):
        return torch.ops.gdn.cached_attention(query, self.k_cache, self.v_cache, input_pos)


@pytest.fixture(scope="module")
def attention_program(module_seed):
    """8 query heads over 2 KV heads of 64 positions, D = 48, T up to 16: (program, case, inputs)."""
    case = AttentionCase(num_heads=8, num_kv_heads=2, length=5, head_dim=48, max_len=64)
    inputs = make_attention_inputs(case, torch.Generator().manual_seed(module_seed))
    module = Attend(inputs.k_cache, inputs.v_cache)
    program = export_program(module, (inputs.query, inputs.input_pos), dynamic_length_args=1, max_length=16)
    return program, case, inputs


@pytest.mark.parametrize("start", [-1, 60, 1 << 40])
def test_position_past_the_cache_is_an_error_not_a_read(attention_program, start):
    program, case, inputs = attention_program
    with pytest.raises(RuntimeError):
        program.execute([inputs.query, torch.tensor([start])])
    with pytest.raises(ValueError, match="input_pos"):
        reference_cached_attention(inputs.query, inputs.k_cache, inputs.v_cache, torch.tensor([start]))
    (output,) = program.execute([inputs.query, torch.tensor([3])])  # still usable afterwards
    error = relative_error(output, expected_attention_output(dataclasses.replace(case, start=3), inputs))
    assert error <= case.tolerance, f"output error {error:.3g}"


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda q, k, v, p: (q, k, v, p.int()), "input_pos must be an int64"),
        (lambda q, k, v, p: (q[0], k, v, p), r"query must be \[Hq, T, D\]"),
        (lambda q, k, v, p: (q, k[:, :-1], v, p), "k_cache must be"),
        (lambda q, k, v, p: (q, k, v[:, :-1], p), "v_cache must be"),
        (lambda q, k, v, p: (q[:3], k, v, p), "multiple"),
    ],
)
def test_bad_input_names_the_argument(breakage, message, generator):
    case = AttentionCase(num_heads=4, num_kv_heads=2, length=3, start=5, max_len=32)
    args = breakage(*make_attention_inputs(case, generator).as_args())
    with pytest.raises((TypeError, ValueError), match=message):
        torch.ops.gdn.cached_attention(*args)
