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


def test_grouped_int8_projections_merge_to_the_same_outputs(generator, seed):
    """16da8w's GroupedInt8Linear layers stack their tiles: each output of the merged product is exactly what its
    own layer computed (the same codes, scales and int16 input)."""
    import gdn_export  # noqa: F401  (the gdn ops' kernels)
    from gdn_export.quantize import GroupedInt8Linear

    layer = Layer(generator)
    for name, rows in (("q", 32), ("k", 16), ("v", 48)):
        linear = nn.Linear(64, rows, bias=name != "k")
        with torch.no_grad():
            for parameter in linear.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        setattr(layer, name, GroupedInt8Linear(linear))
    x = torch.randn(3, 5, 64, generator=generator)
    expected = [output.clone() for output in layer(x)]
    group = merge_linears(layer, ("q", "k", "v"))
    assert isinstance(group.projection, GroupedInt8Linear) and group.projection.out_features == 96
    assert torch.equal(group.projection.bias[32:48], torch.zeros(16))
    for actual, wanted in zip(layer(x), expected):
        assert torch.equal(actual, wanted), f"seed {seed}"


@pytest.mark.parametrize("quantize", ["16da8w", "8da4w_avx2"])
def test_xnnpack_merges_a_layers_grouped_projections(tmp_path, generator, seed, monkeypatch, quantize):
    """The XNNPACK rewrite computes a layer's input projections that run on one of our grouped ops, with one
    group size, as one product (16da8w's int8 linears; 8da4w_avx2's 4-bit ones and, apart, its 8-bit gates), and leaves
    the others (XNNPACK's, and one of a kind alone) as they were; the model's logits do not change."""
    import copy

    from gdn_export.loading import load_qwen35
    from gdn_export.models.qwen35 import MLP, GatedAttention, GatedDeltaNet
    from gdn_export.passes import layer_fusion, rewrite
    from gdn_export.passes.linear_groups import LinearGroupMember
    from gdn_export.quantize import GroupedLinear, quantize_model
    from gdn_export.tiny import make_tiny_checkpoint
    from runtime_ops.backend import XnnpackBackend

    model = quantize_model(load_qwen35(make_tiny_checkpoint(tmp_path / "tiny", seed=seed), max_seq_len=32), quantize)
    layers = {name: m for name, m in model.named_modules() if type(m) in (GatedDeltaNet, GatedAttention, MLP)}
    kinds = {(name, child): (type(getattr(m, child)), getattr(m, child).group)
             for name, m in layers.items() for child in m.INPUT_PROJECTIONS
             if isinstance(getattr(m, child), GroupedLinear)}
    # The merges alone: the layer fusion that follows them has its own tests (tests/test_layer_fusion.py).
    monkeypatch.setattr(layer_fusion, "fuse_norms_and_residuals", lambda model: 0)
    merged = rewrite(copy.deepcopy(model), backend="xnnpack")
    monkeypatch.setattr(XnnpackBackend, "merged_linears", lambda self, layer: [])
    plain = rewrite(model, backend="xnnpack")
    merges = 0
    for name, layer in layers.items():
        groups = {}
        for child in layer.INPUT_PROJECTIONS:
            projection = getattr(merged.get_submodule(name), child)
            siblings = sum(kind == kinds.get((name, child)) for (other, _), kind in kinds.items() if other == name)
            assert isinstance(projection, LinearGroupMember) == (siblings > 1), f"{name}.{child}"
            if siblings > 1:
                groups.setdefault(id(projection.group), set()).add(kinds[(name, child)])
        assert all(len(kind) == 1 for kind in groups.values()), f"{name}: a group mixes kinds"
        merges += len(groups)
    assert merges, f"the tiny model should have a layer with two {quantize} projections of one kind"
    tokens = torch.randint(3, 200, (1, 9), generator=generator)
    with torch.no_grad():
        assert torch.equal(merged(tokens, torch.tensor([0])), plain(tokens, torch.tensor([0]))), f"seed {seed}"
