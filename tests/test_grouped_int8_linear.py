"""gdn::grouped_int8_linear: int8 weights with a scale per group (bfloat16, or the int8 form with a float32
multiplier a channel), the linears of 16da8w programs.

The C++ kernel inside a program against the PyTorch reference, and the reference against plain math on
the float weight it was made from (each weight within half its group's scale).
"""

import pytest
import torch

from gdn_export.ops.grouped_int8_linear import (
    MULTIPLIER_ROWS,
    float_weight,
    reference_grouped_int8_linear,
    round_activations,
    tile_scales,
    to_grouped_int8,
)
from runtime_ops.conformance import export_program

FORMS = [False, True]
FORM_IDS = ["bfloat16-scales", "int8-scales"]


class Linear(torch.nn.Module):
    def __init__(self, weight, scales):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    def forward(self, x):
        return torch.ops.gdn.grouped_int8_linear(x, self.weight, self.scales)


def random_weight(generator, n, k):
    # Rows and groups of different magnitudes, so each group has its own scale.
    magnitudes = torch.rand(n, k // 32, 1, generator=generator) * 0.2 + 0.01
    return (torch.randn(n, k // 32, 32, generator=generator) * magnitudes).reshape(n, k)


@pytest.mark.parametrize("group,n,k", [(32, 48, 96), (64, 32, 256), (256, 16, 512)])
@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_program_kernel_matches_the_reference(group, n, k, small, seed, generator):
    weight, scales = to_grouped_int8(random_weight(generator, n, k), group, small=small)
    x = torch.randn(1, 19, k, generator=generator) * torch.rand(1, 19, 1, generator=generator) * 4
    program = export_program(Linear(weight, scales), (x,), dynamic_length_args=1, max_length=24)
    # 1 row (a decode step); 8 (one pass of AVX-512's rows; AVX2's 6, then 2); 19 (AVX-512: two passes and 3;
    # AVX2: three passes of 6, its assembly loop, and 1).
    for length in (1, 8, 19):
        (actual,) = program.execute([x[:, :length]])
        expected = reference_grouped_int8_linear(x[:, :length], weight, scales)
        scale = expected.abs().max().item()
        assert (actual - expected).abs().max().item() <= 2e-6 * scale, f"seed {seed} length {length}"
        # The reference is the rounded input times the float weight.
        math = round_activations(x[:, :length]) @ float_weight(weight, scales).T
        assert (expected - math).abs().max().item() <= 1e-6 * scale, f"seed {seed}"


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_reference_stays_within_the_formats_error(small, seed, generator):
    """Each weight within half its group's scale; the outputs within the error those and the int16 input allow."""
    dense = random_weight(generator, 64, 128)
    weight, scales = to_grouped_int8(dense, small=small)
    unit = tile_scales(scales).permute(0, 2, 1).reshape(64, 4).repeat_interleave(32, dim=1)
    assert ((float_weight(weight, scales) - dense).abs() <= 0.5 * unit * 1.0001).all(), f"seed {seed}"
    assert (dense.reshape(64, 4, 32).abs().amax(-1) <= 127 * unit[:, ::32] * 1.00001).all(), f"seed {seed}: a code clipped"
    x = torch.randn(5, 128, generator=generator)
    exact = x @ dense.T
    bound = (x.abs() @ (0.5 * unit).T) + x.abs().amax(-1, keepdim=True) / 65534 * dense.abs().sum(-1)
    assert ((reference_grouped_int8_linear(x, weight, scales) - exact).abs() <= bound * 1.001).all(), f"seed {seed}"


def test_small_scales_are_the_smallest_no_code_clips_at(seed, generator):
    """The int8 form: a tile's integers, then its channels' float32 multipliers (each channel's largest group
    max-abs / 127 / 127); each integer the least whose unit holds the group's largest weight at code 127."""
    dense = random_weight(generator, 32, 256)
    weight, scales = to_grouped_int8(dense, small=True)
    assert scales.dtype == torch.int8 and list(scales.shape) == [2, 8 + MULTIPLIER_ROWS, 16], f"seed {seed}"
    integers = scales[:, :8].permute(0, 2, 1).reshape(32, 8).float()
    multipliers = scales[:, 8:].contiguous().view(torch.float32).reshape(32)
    needed = dense.reshape(32, 8, 32).abs().amax(-1) / 127  # [channel, group]: the scale at which nothing clips
    assert torch.allclose(multipliers, needed.amax(-1) / 127, rtol=1e-6), f"seed {seed}"
    assert ((integers >= 1) & (integers <= 127)).all() and (integers.amax(-1) == 127).all(), f"seed {seed}"
    ratio = needed / multipliers[:, None]
    assert ((integers >= ratio - 1e-3) & (integers - 1 < ratio)).all(), f"seed {seed}"
    assert torch.equal(tile_scales(scales).permute(0, 2, 1).reshape(32, 8), integers * multipliers[:, None])
    # Fewer bytes than bfloat16 scales: K / group + 4 bytes a channel against 2 K / group.
    assert scales.numel() < to_grouped_int8(dense)[1].numel() * 2, f"seed {seed}"


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_out_form_writes_its_output(small, seed, generator):
    weight, scales = to_grouped_int8(random_weight(generator, 32, 64), small=small)
    x = torch.randn(3, 64, generator=generator)
    out = torch.full((3, 32), float("nan"))
    torch.ops.gdn.grouped_int8_linear.out(x, weight, scales, out=out)
    assert torch.equal(out, reference_grouped_int8_linear(x, weight, scales)), f"seed {seed}"


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda w, s: (w.to(torch.int16), s), "weight must be a 4-d torch.int8"),
        (lambda w, s: (w, s.float()), "scales must be a 3-d torch.bfloat16 or torch.int8"),
        (lambda w, s: (w, s.view(torch.int8)[:, :, :16][:, :MULTIPLIER_ROWS]), "int8 scales must be"),
        (lambda w, s: (w, s[:, :, :8]), "scales must be"),
        (lambda w, s: (w[:, :, :8], s), r"weight must be \[N / 16"),
    ],
)
def test_bad_weight_names_the_argument(breakage, message, generator):
    weight, scales = breakage(*to_grouped_int8(random_weight(generator, 32, 64)))
    with pytest.raises((TypeError, ValueError), match=message):
        reference_grouped_int8_linear(torch.randn(2, 64, generator=generator), weight, scales)


def test_writer_refuses_shapes_the_layout_cannot_hold(generator):
    with pytest.raises(ValueError, match="N a multiple of 16"):
        to_grouped_int8(torch.randn(24, 64, generator=generator))
    with pytest.raises(ValueError, match="group 48"):
        to_grouped_int8(torch.randn(16, 96, generator=generator), group=48)
