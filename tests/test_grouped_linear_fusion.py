"""The grouped linears' fused arguments: ``norm_weight`` (the input through Qwen3.5's RMSNorm first), ``gated``
(the input silu(gate) * up of an MLP's merged gate and up product) and ``residual`` (added to the output), the work
a decoder layer does around its products.

The C++ kernels inside a program against the PyTorch reference, for both formats; the reference against the
model's own RMSNorm, MLP gating and add; bad fused arguments refused by name.
"""

import pytest
import torch

from gdn_export.models.qwen35 import RMSNorm
from gdn_export.ops.grouped_int4_linear import reference_grouped_int4_linear, to_grouped_int4
from gdn_export.ops.grouped_int8_linear import reference_grouped_int8_linear, to_grouped_int8
from runtime_ops.conformance import export_program
from tests.test_grouped_int4_linear import random_weight as random_int4_weight
from tests.test_grouped_int8_linear import random_weight as random_int8_weight

EPS = 1e-6
# format: (the op, its reference, a random weight in the format for (generator, n, k), the levels its
# kernel rounds a row of x to)
FORMATS = {
    "int4": ("grouped_int4_linear", reference_grouped_int4_linear,
             lambda generator, n, k: to_grouped_int4(*random_int4_weight(generator, n, k)), 127),
    "int8": ("grouped_int8_linear", reference_grouped_int8_linear,
             lambda generator, n, k: to_grouped_int8(random_int8_weight(generator, n, k)), 32767),
}


class FusedLinear(torch.nn.Module):
    def __init__(self, op, weight, scales, norm_weight, gated, with_residual):
        super().__init__()
        self.op, self.gated, self.with_residual = op, gated, with_residual
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("norm_weight", norm_weight)

    def forward(self, x, residual):
        return getattr(torch.ops.gdn, self.op)(x, self.weight, self.scales, norm_weight=self.norm_weight,
                                                norm_eps=EPS, gated=self.gated,
                                                residual=residual if self.with_residual else None)


def model_norm(x, norm_weight):
    """The model's RMSNorm of x (its zero-centered weight ``norm_weight``)."""
    norm = RMSNorm(x.shape[-1], EPS)
    with torch.no_grad():
        norm.weight.copy_(norm_weight)
    return norm(x)


def model_gating(gate_up):
    """The model's MLP input to its down projection, from its gate and up projections' outputs side by side."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("prologue,with_residual", [("norm", True), ("norm", False), ("gated", True),
                                                    ("gated", False), (None, True)])
@pytest.mark.parametrize("form", sorted(FORMATS))
def test_program_kernel_matches_the_reference(form, prologue, with_residual, seed, generator):
    op, reference, make_weight, levels = FORMATS[form]
    n, k = 48, 256
    weight, scales = make_weight(generator, n, k)
    norm_weight = torch.randn(k, generator=generator) * 0.5 if prologue == "norm" else None
    gated = prologue == "gated"
    width = 2 * k if gated else k
    x = torch.randn(1, 19, width, generator=generator) * torch.rand(1, 19, 1, generator=generator) * 4
    residual = torch.randn(1, 19, n, generator=generator)
    program = export_program(FusedLinear(op, weight, scales, norm_weight, gated, with_residual), (x, residual),
                             dynamic_length_args=2, max_length=24)
    for length in (1, 4, 8, 19):
        (actual,) = program.execute([x[:, :length], residual[:, :length]])
        expected = reference(x[:, :length], weight, scales, norm_weight=norm_weight, norm_eps=EPS, gated=gated,
                             residual=residual[:, :length] if with_residual else None)
        scale = expected.abs().max().item()
        # The kernel sums the squares in another order than torch, and its exp is not torch's: an input within
        # the last bits of a rounding boundary may round one level apart, each such input moving an output by a
        # level times its weight.
        read = {"norm": lambda x: model_norm(x, norm_weight), "gated": model_gating, None: lambda x: x}[prologue]
        level = (read(x[:, :length]).abs().amax(-1) / levels).max().item()
        largest_weight = reference(torch.eye(k), weight, scales).abs().max().item()
        bound = 2e-6 * scale + (2 * level * largest_weight if prologue else 0.0)
        error = (actual - expected).abs().amax(-1)  # [1, length]
        assert error.max().item() <= bound, f"seed {seed} length {length}"
        # With int8 activations such inputs are rare: all rows but at most one agree as closely as the plain
        # product. With int16 ones (the int8 format's) a level is 258 times finer, so most rows of 256 inputs may
        # hold one (GDN_TEST_SEED=1193959074, portable build): the bound above still holds each row.
        if levels == 127:
            assert int((error > 2e-6 * scale).sum()) <= 1, f"seed {seed} length {length}"


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_reference_is_the_models_ops_then_the_product_plus_the_residual(form, seed, generator):
    op, reference, make_weight, _ = FORMATS[form]
    weight, scales = make_weight(generator, 32, 128)
    norm_weight = torch.randn(128, generator=generator) * 0.5
    x = torch.randn(2, 5, 128, generator=generator) * 3
    gate_up = torch.randn(2, 5, 256, generator=generator) * 3
    residual = torch.randn(2, 5, 32, generator=generator)
    for fused, plain in (
        (dict(x=x, norm_weight=norm_weight, norm_eps=EPS), reference(model_norm(x, norm_weight), weight, scales)),
        (dict(x=gate_up, gated=True), reference(model_gating(gate_up), weight, scales)),
    ):
        expected = plain + residual
        assert torch.equal(reference(weight=weight, scales=scales, residual=residual, **fused), expected), f"seed {seed}"
        # The eager op is the reference.
        eager = getattr(torch.ops.gdn, op)(fused.pop("x"), weight, scales, residual=residual, **fused)
        assert torch.equal(eager, expected), f"seed {seed}"


@pytest.mark.parametrize(
    "argument,breakage",
    [
        ("norm_weight", lambda norm_weight, residual: (norm_weight[:-1], residual)),
        ("norm_weight", lambda norm_weight, residual: (norm_weight.double(), residual)),
        ("residual", lambda norm_weight, residual: (norm_weight, residual[..., :-1])),
        ("residual", lambda norm_weight, residual: (norm_weight, residual.half())),
    ],
)
@pytest.mark.parametrize("form", sorted(FORMATS))
def test_bad_fused_arguments_are_refused_by_name(form, argument, breakage, generator):
    _, reference, make_weight, _ = FORMATS[form]
    weight, scales = make_weight(generator, 32, 64)
    norm_weight, residual = breakage(torch.randn(64, generator=generator), torch.randn(3, 32, generator=generator))
    with pytest.raises(TypeError, match=f"{argument} must be float32"):
        reference(torch.randn(3, 64, generator=generator), weight, scales, norm_weight=norm_weight, residual=residual)


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_gated_input_is_refused_at_the_wrong_width_or_beside_a_norm(form, generator):
    _, reference, make_weight, _ = FORMATS[form]
    weight, scales = make_weight(generator, 32, 64)
    with pytest.raises(TypeError, match=r"x must be float32 \[\.\.\., 128\] \(gated\)"):
        reference(torch.randn(3, 64, generator=generator), weight, scales, gated=True)
    with pytest.raises(TypeError, match="norm_weight and gated cannot both be given"):
        reference(torch.randn(3, 128, generator=generator), weight, scales, gated=True,
                  norm_weight=torch.randn(64, generator=generator))
