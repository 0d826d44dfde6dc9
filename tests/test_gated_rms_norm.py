"""gdn::gated_rms_norm: the C++ kernel inside a program against the PyTorch reference, the reference against the
model's GatedRMSNorm, and bad arguments refused by name."""

import pytest
import torch

from gdn_export.models.qwen35 import GatedRMSNorm
from gdn_export.ops.gated_rms_norm import reference_gated_rms_norm
from runtime_ops.conformance import export_program

EPS = 1e-6


class Norm(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.register_buffer("weight", weight)

    def forward(self, x, gate):
        return torch.ops.gdn.gated_rms_norm(x, gate, self.weight, EPS)


@pytest.mark.parametrize("heads,d", [(16, 128), (4, 24), (3, 13)])
def test_program_kernel_matches_the_reference(heads, d, seed, generator):
    """Heads of a vector's width and of widths that leave a remainder; 1 token (a decode step) to 40 (rows shared
    across the threads)."""
    weight = torch.randn(d, generator=generator)
    x = torch.randn(1, 40, heads, d, generator=generator) * torch.rand(1, 40, heads, 1, generator=generator) * 4
    gate = torch.randn(1, 40, heads, d, generator=generator) * 3
    program = export_program(Norm(weight), (x, gate), dynamic_length_args=2, max_length=48)
    for length in (1, 7, 40):
        (actual,) = program.execute([x[:, :length], gate[:, :length]])
        expected = reference_gated_rms_norm(x[:, :length], gate[:, :length], weight, EPS)
        # Another order of the squares' sum and another exp: a few float32 roundings apart.
        assert torch.allclose(actual, expected, rtol=2e-6, atol=2e-6 * expected.abs().max().item()), \
            f"seed {seed} length {length}"


def test_reference_is_the_models_gated_norm(seed, generator):
    norm = GatedRMSNorm(24, EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24, generator=generator))
    x = torch.randn(2, 5, 4, 24, generator=generator) * 3
    gate = torch.randn(2, 5, 4, 24, generator=generator) * 3
    expected = norm(x, gate)
    assert torch.equal(reference_gated_rms_norm(x, gate, norm.weight.detach(), EPS), expected), f"seed {seed}"
    assert torch.equal(torch.ops.gdn.gated_rms_norm(x, gate, norm.weight.detach(), EPS), expected), f"seed {seed}"


def test_out_form_writes_its_output(seed, generator):
    x, gate = torch.randn(3, 16, generator=generator), torch.randn(3, 16, generator=generator)
    weight = torch.randn(16, generator=generator)
    out = torch.full((3, 16), float("nan"))
    torch.ops.gdn.gated_rms_norm.out(x, gate, weight, EPS, out=out)
    assert torch.equal(out, reference_gated_rms_norm(x, gate, weight, EPS)), f"seed {seed}"


@pytest.mark.parametrize(
    "argument,breakage",
    [
        ("x", lambda x, gate, weight: (x.double(), gate, weight)),
        ("gate", lambda x, gate, weight: (x, gate[..., :-1], weight)),
        ("gate", lambda x, gate, weight: (x, gate.half(), weight)),
        ("weight", lambda x, gate, weight: (x, gate, weight[:-1])),
    ],
)
def test_bad_arguments_are_refused_by_name(argument, breakage, generator):
    x, gate, weight = breakage(torch.randn(3, 16, generator=generator), torch.randn(3, 16, generator=generator),
                               torch.randn(16, generator=generator))
    with pytest.raises(TypeError, match=f"gdn.gated_rms_norm: {argument} must"):
        reference_gated_rms_norm(x, gate, weight, EPS)
