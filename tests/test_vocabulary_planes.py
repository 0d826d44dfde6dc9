"""gdn::planes_embedding and gdn::planes_logits: the two-plane token table of 8da4w and 16da8w programs.

The C++ kernels inside a program against the PyTorch reference, and the reference against plain math on
the float table it was made from (the lookup within half a unit, the 4-bit head the middle of its 16 codes,
the 5-bit head, with the fifth plane, the middle of its 8).
"""

import pytest
import torch

from gdn_export.ops.vocabulary_planes import (
    fifth_plane,
    head_weights,
    reference_planes_embedding,
    reference_planes_logits,
    round_activations,
    to_vocabulary_planes,
)
from runtime_ops.conformance import export_program


class Vocabulary(torch.nn.Module):
    """Both ops over one table held as buffers, as the quantized model holds it: the lookup, the 4-bit head and
    the 5-bit head."""

    def __init__(self, planes):
        super().__init__()
        for name, tensor in zip(("high", "low", "row_units", "group_units"), planes):
            self.register_buffer(name, tensor)
        self.register_buffer("fifth", fifth_plane(self.low))

    def forward(self, tokens, x):
        return (torch.ops.gdn.planes_embedding(tokens, self.high, self.low, self.row_units, self.group_units),
                torch.ops.gdn.planes_logits(x, self.high, self.row_units, self.group_units),
                torch.ops.gdn.planes_logits(x, self.high, self.row_units, self.group_units, self.fifth))


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
    fifth = fifth_plane(planes[1])
    for length in (1, 5):
        lookup, *heads = program.execute([tokens[:, :length], x[:, :length]])
        expected_lookup = reference_planes_embedding(tokens[:, :length], *planes)
        assert torch.equal(lookup, expected_lookup), f"seed {seed}"
        for logits, bits in zip(heads, (None, fifth)):
            expected_logits = reference_planes_logits(x[:, :length], planes[0], planes[2], planes[3], bits)
            scale = expected_logits.abs().max().item()
            assert (logits - expected_logits).abs().max().item() <= 1e-5 * scale, f"seed {seed}"
            # The reference is the rounded input times the head's float weights.
            math = round_activations(x[:, :length]) @ head_weights(planes[0], planes[2], planes[3], fifth=bits).T
            assert (expected_logits - math).abs().max().item() <= 1e-5 * scale, f"seed {seed}"


def test_head_sums_past_32_bits_at_the_formats_extremes(seed, generator):
    """Rows whose every weight takes the 5-bit head's largest value (31) at the largest units (255), against
    activations all at or next to their largest (127), sum to about 255 * 7874 * width / 2 in the kernels'
    integers: past 2^31 at the 4B shape's width. Each is the middle of codes 248..255 (123.5 units) times the
    sum of the rounded activations; the kernels must not wrap."""
    width = 2624  # 41 runs: both loops' tails
    high, low, row_units, group_units = to_vocabulary_planes(random_table(generator, rows=4, width=width))
    high[:2], low[:2], group_units[:2] = 0xFF, 0xFF, 255  # rows 0 and 1 at the extremes, 2 and 3 as drawn
    x = 1 + 0.01 * torch.rand(1, 2, width, generator=generator)
    x[:, 1] *= -1  # the second token's sums are negative
    planes = (high, low, row_units, group_units)
    program = export_program(Vocabulary(planes), (torch.zeros(1, 2, dtype=torch.int64), x))
    fifth = fifth_plane(low)
    logits = program.execute([torch.zeros(1, 2, dtype=torch.int64), x])[2]
    expected = reference_planes_logits(x, high, row_units, group_units, fifth)
    math = 123.5 * 255 * row_units[:2].float() * round_activations(x).sum(-1, keepdim=True)  # [1, 2, 2]
    scale = expected.abs().max().item()
    assert (expected[..., :2] - math).abs().max().item() <= 1e-5 * scale, f"seed {seed}"
    assert (logits - expected).abs().max().item() <= 1e-5 * scale, f"seed {seed}"


def test_reference_stays_within_the_formats_error(seed, generator):
    """Lookup within half a unit of the float table; the 4-bit head's weights the middle of their 16 codes
    (within 7.5 units of the lookup's) and the 5-bit head's the middle of their 8 (within 3.5), the fifth
    plane holding each code's bit 3; the heads' logits close to the float table's (relative to their
    spread), the 5-bit one closer."""
    table = random_table(generator)
    high, low, row_units, group_units = to_vocabulary_planes(table)
    fifth = fifth_plane(low)
    unit = (row_units.float()[:, None] * group_units.float()).repeat_interleave(32, dim=1)
    lookup = reference_planes_embedding(torch.arange(table.shape[0]), high, low, row_units, group_units)
    assert ((lookup - table).abs() <= 0.5 * unit * 1.001 + 1e-9).all(), f"seed {seed}"
    # The codes, from the lookup (whole multiples of the units), and the bit the fifth plane holds of each.
    codes = torch.round(lookup / torch.where(unit > 0, unit, 1)).to(torch.int32)
    bits = torch.stack([(fifth[:, k // 8] >> (k % 8)) & 1 for k in range(table.shape[1])], dim=1).to(torch.int32)
    assert torch.equal(bits, (codes >> 3) & 1), f"seed {seed}"
    four, five = head_weights(high, row_units, group_units), head_weights(high, row_units, group_units, fifth=fifth)
    assert torch.allclose(four, (16 * torch.div(codes, 16, rounding_mode="floor") + 7.5) * unit), f"seed {seed}"
    assert torch.allclose(five, (8 * torch.div(codes, 8, rounding_mode="floor") + 3.5) * unit), f"seed {seed}"
    assert ((four - lookup).abs() <= 7.5 * unit * 1.001 + 1e-9).all(), f"seed {seed}"
    assert ((five - lookup).abs() <= 3.5 * unit * 1.001 + 1e-9).all(), f"seed {seed}"
    x = torch.randn(4, table.shape[1], generator=generator)
    exact = x @ table.T
    error = (reference_planes_logits(x, high, row_units, group_units) - exact).norm() / exact.norm()
    error5 = (reference_planes_logits(x, high, row_units, group_units, fifth) - exact).norm() / exact.norm()
    assert error.item() < 0.15 and error5.item() < 0.6 * error.item(), f"seed {seed}: {error.item(), error5.item()}"


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
    fifth = fifth_plane(planes[1])
    logits = torch.full((2, table.shape[0]), float("nan"))
    torch.ops.gdn.planes_logits.out(x, planes[0], planes[2], planes[3], fifth, out=logits)
    assert torch.equal(logits, reference_planes_logits(x, planes[0], planes[2], planes[3], fifth)), f"seed {seed}"


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
    lookup, *_ = program.execute([tokens, x])  # still usable afterwards
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


def test_bad_fifth_plane_is_refused_by_name(generator):
    table = random_table(generator, rows=20, width=128)
    high, low, row_units, group_units = to_vocabulary_planes(table)
    x = torch.randn(1, 128, generator=generator)
    for bad in (fifth_plane(low)[:, :-1], fifth_plane(low).to(torch.int8), fifth_plane(low)[:-1]):
        with pytest.raises(TypeError, match="fifth must be None or a uint8 tensor"):
            reference_planes_logits(x, high, row_units, group_units, bad)


def test_writer_refuses_widths_the_layout_cannot_hold(generator):
    with pytest.raises(ValueError, match="width 96 must be a multiple of 64"):
        to_vocabulary_planes(torch.randn(4, 96, generator=generator))
    with pytest.raises(ValueError, match="group 48"):
        to_vocabulary_planes(torch.randn(4, 128, generator=generator), group=48)


# A stand-in for gdn::planes_logits as it was before it took `fifth`, under a namespace of the same length
# (so a program's bytes can name the real op instead).
_OLD_HEAD = torch.library.Library("gdo", "DEF")
_OLD_HEAD.define("planes_logits(Tensor x, Tensor high, Tensor row_units, Tensor group_units) -> Tensor")
_OLD_HEAD.define("planes_logits.out(Tensor x, Tensor high, Tensor row_units, Tensor group_units, *, Tensor(a!) out)"
                 " -> Tensor(a!)")
_OLD_HEAD.impl("planes_logits", reference_planes_logits, "CompositeExplicitAutograd")
_OLD_HEAD.impl("planes_logits.out", lambda x, high, row_units, group_units, *, out:
               out.copy_(reference_planes_logits(x, high, row_units, group_units)), "CompositeExplicitAutograd")
torch.library.register_fake("gdo::planes_logits", lambda x, high, row_units, group_units:
                            x.new_empty((*x.shape[:-1], high.shape[0])), lib=_OLD_HEAD)


def test_programs_exported_before_the_fifth_plane_still_run(seed, generator):
    """A program whose gdn::planes_logits call has no ``fifth`` (exported before the op took it) runs on
    today's kernel as the 4-bit head it was."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.runtime import Runtime

    class OldHead(torch.nn.Module):
        def __init__(self, planes):
            super().__init__()
            for name, tensor in zip(("high", "row_units", "group_units"), planes):
                self.register_buffer(name, tensor)

        def forward(self, x):
            return torch.ops.gdo.planes_logits(x, self.high, self.row_units, self.group_units)

    high, _, row_units, group_units = to_vocabulary_planes(random_table(generator))
    x = torch.randn(2, high.shape[1] * 2, generator=generator)
    exported = torch.export.export(OldHead((high, row_units, group_units)), (x,))
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer
    assert program.count(b"gdo::planes_logits") == 1
    program = program.replace(b"gdo::planes_logits", b"gdn::planes_logits")
    logits = Runtime.get().load_program(program).load_method("forward").execute([x])[0]
    expected = reference_planes_logits(x, high, row_units, group_units)
    assert (logits - expected).abs().max().item() <= 1e-5 * expected.abs().max().item(), f"seed {seed}"


def test_tables_of_several_row_blocks_get_each_rows_planes(seed, generator):
    """A table longer than the ``ROWS_PER_BLOCK`` rows that the planes are made at a time (the last block part
    full): each row's planes are those the row gets alone (a row's units and codes come from its own weights),
    and its fifth plane holds bit 3 of each weight's low nibble, bit i of byte k being weight 8 k + i."""
    from gdn_export.ops.vocabulary_planes import ROWS_PER_BLOCK

    table = random_table(generator, rows=2 * ROWS_PER_BLOCK + 37, width=64)
    whole = to_vocabulary_planes(table)
    picked = torch.randint(0, table.shape[0], (20,), generator=generator).tolist() + [table.shape[0] - 1]
    for row in picked:
        alone = to_vocabulary_planes(table[row:row + 1])
        for name, of_table, of_row in zip(("high", "low", "row_units", "group_units"), whole, alone):
            assert torch.equal(of_table[row:row + 1], of_row), f"seed {seed}: row {row}'s {name}"
    fifth = fifth_plane(whole[1])
    low = whole[1].long()
    # Byte j of a 64-weight run holds weight j (low nibble) and weight 32 + j (high nibble).
    nibbles = torch.cat([low.reshape(low.shape[0], -1, 32) & 15, low.reshape(low.shape[0], -1, 32) >> 4], dim=-1)
    bits = (nibbles.reshape(low.shape[0], -1) >> 3) & 1
    unpacked = (fifth.long()[..., None] >> torch.arange(8)) & 1
    assert torch.equal(unpacked.reshape(low.shape[0], -1), bits), f"seed {seed}"
