"""gdn::grouped_int4_linear: 4-bit weights with a scale per group (bfloat16, or the int8 form with a float32
multiplier a channel), the linears of 8da4w_avx2 programs.

The C++ kernel inside a program against the PyTorch reference, the reference against plain math on the
float weight it was made from, and the writer's layout against the format's definition, code by code.
"""

import pytest
import torch

from gdn_export.ops.grouped_int4_linear import (
    float_weight,
    reference_grouped_int4_linear,
    round_activations,
    small_scales,
    tile_scales,
    to_grouped_int4,
)

FORMS = [False, True]
FORM_IDS = ["bfloat16-scales", "int8-scales"]
from runtime_ops.conformance import export_program


class Linear(torch.nn.Module):
    def __init__(self, weight, scales):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    def forward(self, x):
        return torch.ops.gdn.grouped_int4_linear(x, self.weight, self.scales)


def random_weight(generator, n, k, group=32):
    """A float weight [n, k] whose groups have their own magnitudes, and max-abs scales for it, each of a
    random sign (8da4w_avx2's scales take either)."""
    magnitudes = torch.rand(n, k // 32, 1, generator=generator) * 0.2 + 0.01
    dense = (torch.randn(n, k // 32, 32, generator=generator) * magnitudes).reshape(n, k)
    signs = torch.randint(0, 2, (n, k // group), generator=generator) * 2 - 1
    scales = dense.reshape(n, k // group, group).abs().amax(-1) / 7 * signs  # no code clips
    return dense, scales


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("group,n,k", [(32, 48, 96), (64, 32, 256), (256, 16, 512), (32, 64, 1024)])
def test_program_kernel_matches_the_reference(group, n, k, small, seed, generator):
    weight, scales = to_grouped_int4(*random_weight(generator, n, k, group), small=small)
    x = torch.randn(1, 19, k, generator=generator) * torch.rand(1, 19, 1, generator=generator) * 4
    program = export_program(Linear(weight, scales), (x,), dynamic_length_args=1, max_length=24)
    # 1 row (a decode step), 4 and 8 (one pass of the kernel's rows, AVX2 / AVX-512), 19 (passes and a remainder).
    for length in (1, 4, 8, 19):
        (actual,) = program.execute([x[:, :length]])
        expected = reference_grouped_int4_linear(x[:, :length], weight, scales)
        scale = expected.abs().max().item()
        assert (actual - expected).abs().max().item() <= 2e-6 * scale, f"seed {seed} length {length}"
        # The reference is the rounded input times the float weight.
        math = round_activations(x[:, :length]) @ float_weight(weight, scales).T
        assert (expected - math).abs().max().item() <= 1e-6 * scale, f"seed {seed}"


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_writer_lays_out_each_code_where_the_format_says(small, seed, generator):
    """weight[n // 16, k // 4, 4 (n % 8) + k % 4] holds channel n's code for input k, low nibble for n % 16 < 8;
    scales[n // 16, g, n % 16] its scale, or in the int8 form that integer times the float32 whose bytes are
    scales[n // 16, G:, :].flatten()[4 (n % 16):][:4]."""
    dense, scales = random_weight(generator, 32, 64)
    weight, units = to_grouped_int4(dense, scales, small=small)
    for n in range(32):
        for k in range(64):
            byte = int(weight[n // 16, k // 4, 4 * (n % 8) + k % 4])
            code = (byte & 0x0F) if n % 16 < 8 else byte >> 4
            if small:
                tail = units[n // 16, 2:].flatten()[4 * (n % 16):4 * (n % 16) + 4].numpy().tobytes()
                multiplier = torch.frombuffer(bytearray(tail), dtype=torch.float32)[0]
                unit = units[n // 16, k // 32, n % 16].float() * multiplier  # in float32, as the writer
            else:
                unit = units[n // 16, k // 32, n % 16].float()
            expected = int(torch.round(dense[n, k] / unit).clamp(-8, 7)) + 8
            assert code == expected, f"seed {seed}: channel {n} input {k}"


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_reference_stays_within_the_formats_error(small, seed, generator):
    """Each weight within half its group's scale (as stored: the bound is the code's rounding, the scale's own
    rounding apart); the outputs within the error those and the int8 input allow."""
    dense, scales = random_weight(generator, 64, 128)
    # Scales with room: the int8 form's rounded scale may come out smaller than the group's max-abs / 7.
    weight, units = to_grouped_int4(dense, scales * 8 / 7, small=small)
    unit = tile_scales(units).abs().permute(0, 2, 1).reshape(64, 4).repeat_interleave(32, dim=1)
    assert ((float_weight(weight, units) - dense).abs() <= 0.5 * unit * 1.0001).all(), f"seed {seed}"
    x = torch.randn(5, 128, generator=generator)
    exact = x @ dense.T
    bound = (x.abs() @ (0.5 * unit).T) + x.abs().amax(-1, keepdim=True) / 254 * dense.abs().sum(-1)
    assert ((reference_grouped_int4_linear(x, weight, units) - exact).abs() <= bound * 1.001).all(), f"seed {seed}"


def test_small_scales_round_each_scale_within_half_a_multiplier(seed, generator):
    """The int8 form's scale of a group is within half its channel's multiplier (the channel's largest scale /
    127) of the scale it was given, keeps its sign, and the largest integer of a channel is 127."""
    _, scales = random_weight(generator, 48, 256)
    integers, multipliers = small_scales(scales)
    assert torch.allclose(multipliers, scales.abs().amax(1) / 127), f"seed {seed}"
    assert ((integers.float() * multipliers[:, None] - scales).abs() <= 0.5 * multipliers[:, None] * 1.0001).all(), \
        f"seed {seed}"
    assert (torch.sign(integers.float()) == torch.sign(scales)).all(), f"seed {seed}"
    assert (integers.abs().amax(1) == 127).all(), f"seed {seed}"


@pytest.mark.parametrize("small", FORMS, ids=FORM_IDS)
def test_out_form_writes_its_output(small, seed, generator):
    weight, scales = to_grouped_int4(*random_weight(generator, 32, 64), small=small)
    x = torch.randn(3, 64, generator=generator)
    out = torch.full((3, 32), float("nan"))
    torch.ops.gdn.grouped_int4_linear.out(x, weight, scales, out=out)
    assert torch.equal(out, reference_grouped_int4_linear(x, weight, scales)), f"seed {seed}"


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda w, s: (w.to(torch.int8), s), "weight must be a 3-d torch.uint8"),
        (lambda w, s: (w, s.float()), "scales must be a 3-d torch.bfloat16 or torch.int8"),
        (lambda w, s: (w, s.view(torch.int8)[:, :, :16]), "scales must be"),
        (lambda w, s: (w, torch.zeros(2, 4, 16, dtype=torch.int8)), "int8 scales must be"),
        (lambda w, s: (w, s[:, :, :8]), "scales must be"),
        (lambda w, s: (w[:, :, :16], s), r"weight must be \[N / 16"),
    ],
)
def test_bad_weight_names_the_argument(breakage, message, generator):
    weight, scales = breakage(*to_grouped_int4(*random_weight(generator, 32, 64)))
    with pytest.raises((TypeError, ValueError), match=message):
        reference_grouped_int4_linear(torch.randn(2, 64, generator=generator), weight, scales)


def test_writer_refuses_what_the_layout_cannot_hold(generator):
    dense, scales = random_weight(generator, 32, 96)
    with pytest.raises(ValueError, match="N a multiple of 16"):
        to_grouped_int4(dense[:24], scales[:24])
    with pytest.raises(ValueError, match="group 48"):
        to_grouped_int4(dense, dense[:, :2].abs() + 1)
    with pytest.raises(ValueError, match=r"scales must be \[32, K / group\]"):
        to_grouped_int4(dense, scales[:16])
    zero = scales.clone()
    zero[5, 1] = 1e-42  # a float32 subnormal, zero in bfloat16
    with pytest.raises(ValueError, match="nonzero"):
        to_grouped_int4(dense, zero)
