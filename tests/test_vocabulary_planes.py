"""gdn::planes_embedding and gdn::planes_logits: the two-plane token table of 8da4w programs.

The C++ kernels inside a program against the PyTorch reference, and the reference against plain math on
the float table it was made from (the lookup within half a unit, the head the middle of its 16 codes).
"""

import pytest
import torch

from gdn_export.ops.vocabulary_planes import (
    head_weights,
    reference_planes_embedding,
    reference_planes_logits,
    round_activations,
    to_vocabulary_planes,
)
from runtime_ops.conformance import export_program


class Vocabulary(torch.nn.Module):
    """Both ops over one table held as buffers, as the quantized model holds it."""

    def __init__(self, planes):
        super().__init__()
        for name, tensor in zip(("high", "low", "row_units", "group_units"), planes):
            self.register_buffer(name, tensor)

    def forward(self, tokens, x):
        return (torch.ops.gdn.planes_embedding(tokens, self.high, self.low, self.row_units, self.group_units),
                torch.ops.gdn.planes_logits(x, self.high, self.row_units, self.group_units))


def random_table(generator, rows=300, width=192):
    # Rows of different magnitudes, so groups use their own units and the rows' grids differ.
    magnitudes = torch.rand(rows, 1, generator=generator) * 0.2 + 0.01
    return torch.randn(rows, width, generator=generator) * magnitudes


# Widths: three runs of 64 (the 512-bit head loop's pair of runs and a run left over); 41 runs, whose 82
# halves fill the loop's blocks of 32 halves twice and a third in part.
@pytest.mark.parametrize("group,width", [(32, 192), (64, 192), (32, 2624)])
def test_program_kernels_match_the_reference(group, width, seed, generator):
    table = random_table(generator, width=width)
    planes = to_vocabulary_planes(table, group)
    tokens = torch.randint(0, table.shape[0], (1, 5), generator=generator)
    x = torch.randn(1, 5, table.shape[1], generator=generator)
    program = export_program(Vocabulary(planes), (tokens, x), dynamic_length_args=2, max_length=8)
    for length in (1, 5):
        lookup, logits = program.execute([tokens[:, :length], x[:, :length]])
        expected_lookup = reference_planes_embedding(tokens[:, :length], *planes)
        assert torch.equal(lookup, expected_lookup), f"seed {seed}"
        expected_logits = reference_planes_logits(x[:, :length], planes[0], planes[2], planes[3])
        scale = expected_logits.abs().max().item()
        assert (logits - expected_logits).abs().max().item() <= 1e-5 * scale, f"seed {seed}"
        # The reference is the rounded input times the head's float weights.
        math = round_activations(x[:, :length]) @ head_weights(planes[0], planes[2], planes[3]).T
        assert (expected_logits - math).abs().max().item() <= 1e-5 * scale, f"seed {seed}"


def test_reference_stays_within_the_formats_error(seed, generator):
    """Lookup within half a unit of the float table; the head's weights within 8.5 units; the head's logits
    close to the float table's (relative to their spread)."""
    table = random_table(generator)
    high, low, row_units, group_units = to_vocabulary_planes(table)
    unit = (row_units.float()[:, None] * group_units.float()).repeat_interleave(32, dim=1)
    lookup = reference_planes_embedding(torch.arange(table.shape[0]), high, low, row_units, group_units)
    assert ((lookup - table).abs() <= 0.5 * unit * 1.001 + 1e-9).all(), f"seed {seed}"
    assert ((head_weights(high, row_units, group_units) - table).abs() <= 8.5 * unit * 1.001 + 1e-9).all()
    x = torch.randn(4, table.shape[1], generator=generator)
    exact = x @ table.T
    error = (reference_planes_logits(x, high, row_units, group_units) - exact).norm() / exact.norm()
    assert error.item() < 0.15, f"seed {seed}: {error.item():.3f}"


def test_out_forms_write_their_outputs(seed, generator):
    table = random_table(generator)
    planes = to_vocabulary_planes(table)
    tokens = torch.randint(0, table.shape[0], (3,), generator=generator)
    lookup = torch.full((3, table.shape[1]), float("nan"))
    torch.ops.gdn.planes_embedding.out(tokens, *planes, out=lookup)
    assert torch.equal(lookup, reference_planes_embedding(tokens, *planes)), f"seed {seed}"
    x = torch.randn(2, table.shape[1], generator=generator)
    logits = torch.full((2, table.shape[0]), float("nan"))
    torch.ops.gdn.planes_logits.out(x, planes[0], planes[2], planes[3], out=logits)
    assert torch.equal(logits, reference_planes_logits(x, planes[0], planes[2], planes[3])), f"seed {seed}"


def test_token_outside_the_table_is_an_error_not_a_read(generator):
    table = random_table(generator, rows=100, width=64)
    planes = to_vocabulary_planes(table)
    tokens = torch.randint(0, 100, (1, 3), generator=generator)
    x = torch.randn(1, 3, 64, generator=generator)
    program = export_program(Vocabulary(planes), (tokens, x), dynamic_length_args=2, max_length=4)
    for bad in (100, -1):
        with pytest.raises(RuntimeError):
            program.execute([torch.tensor([[3, bad]]), x[:, :2]])
        with pytest.raises(ValueError, match="tokens must lie in"):
            reference_planes_embedding(torch.tensor([3, bad]), *planes)
    lookup, _ = program.execute([tokens, x])  # still usable afterwards
    assert torch.equal(lookup, reference_planes_embedding(tokens, *planes))


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda h, lo, r, g: (h.to(torch.int8), lo, r, g), "high must be a 2-d torch.uint8"),
        (lambda h, lo, r, g: (h, lo[:, :-1], r, g), "low must have high's shape"),
        (lambda h, lo, r, g: (h, lo, r.float(), g), "row_units must be a 1-d torch.bfloat16"),
        (lambda h, lo, r, g: (h, lo, r[:-1], g), "row_units must be"),
        (lambda h, lo, r, g: (h, lo, r, g[:, :-1]), "group_units"),
    ],
)
def test_bad_table_names_the_argument(breakage, message, generator):
    planes = breakage(*to_vocabulary_planes(random_table(generator, rows=10, width=128)))
    with pytest.raises((TypeError, ValueError), match=message):
        reference_planes_embedding(torch.tensor([1]), *planes)


def test_writer_refuses_widths_the_layout_cannot_hold(generator):
    with pytest.raises(ValueError, match="width 96 must be a multiple of 64"):
        to_vocabulary_planes(torch.randn(4, 96, generator=generator))
    with pytest.raises(ValueError, match="group 48"):
        to_vocabulary_planes(torch.randn(4, 128, generator=generator), group=48)
