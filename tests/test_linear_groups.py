"""gdn_export.passes.linear_groups: sibling projections of one input computed as one product."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gdn_export.passes.linear_groups import LinearGroupMember, merge_linears


class Layer(nn.Module):
    def __init__(self, generator):
        super().__init__()
        self.q = nn.Linear(12, 5, bias=True)
        self.k = nn.Linear(12, 3, bias=False)
        self.v = nn.Linear(12, 7, bias=True)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def test_merged_projections_equal_the_separate_ones(generator, seed):
    layer = Layer(generator)
    x, other = torch.randn(2, 4, 12, generator=generator), torch.randn(1, 1, 12, generator=generator)
    expected, expected_other = layer(x), layer(other)
    group = merge_linears(layer, ("q", "k", "v"))
    assert all(isinstance(getattr(layer, name), LinearGroupMember) for name in "qkv")
    # One parameter set, under the group's name; the missing bias of k is zeros.
    assert sorted(name for name, _ in layer.named_parameters()) == ["q__k__v.projection.bias",
                                                                    "q__k__v.projection.weight"]
    assert torch.equal(group.projection.bias[5:8], torch.zeros(3))
    for inputs, wanted in ((x, expected), (other, expected_other), (x, expected)):  # a new input recomputes
        for actual, reference in zip(layer(inputs), wanted):
            torch.testing.assert_close(actual, reference, rtol=1e-6, atol=1e-6, msg=f"seed {seed}")


def test_merged_layer_exports_one_product(generator):
    layer = Layer(generator)
    merge_linears(layer, ("q", "k", "v"))
    program = torch.export.export(layer, (torch.randn(1, 4, 12, generator=generator),), strict=False)
    products = [node for node in program.graph.nodes if node.target in (torch.ops.aten.linear.default,)]
    assert len(products) == 1, program.graph


def test_merging_refuses_what_is_not_one_input(generator):
    layer = Layer(generator)
    layer.k = nn.Linear(11, 3)
    with pytest.raises(ValueError, match=r"one input size, got \[11, 12\]"):
        merge_linears(layer, ("q", "k"))
    layer.k = nn.Identity()
    with pytest.raises(TypeError, match="Layer.k is a Identity, not an nn.Linear"):
        merge_linears(layer, ("q", "k"))
