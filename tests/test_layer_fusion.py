"""gdn_export.passes.layer_fusion on the CPU's grouped linears: each decoder layer's norms and residual adds move
into the products around them, and the model computes what it computed before.

Eager, on tiny random checkpoints: the XNNPACK rewrite of a ``16da8w`` / ``8da4w_avx2`` model against the same
rewrite without the fusion, in float32 (the ops' reference normalizes in one expression where the model's
norm pools its mean: the floats may differ in the last bits, and an activation then round one level apart) and
in bfloat16 (the products leave the norm, the gating and the add to the model's ops: the same floats).
"""

import copy

import pytest
import torch

from gdn_export.loading import load_qwen35
from gdn_export.passes import rewrite
from gdn_export.passes import layer_fusion
from gdn_export.passes.layer_fusion import GatedInputMLP, NormTakenByItsConsumer, ResidualInProducts
from gdn_export.passes.linear_groups import LinearGroupMember
from gdn_export.quantize import GroupedLinear, quantize_model
from gdn_export.tiny import make_tiny_checkpoint


def fused_and_plain(tmp_path, seed, quantize, monkeypatch, dtype=torch.float32):
    model = quantize_model(load_qwen35(make_tiny_checkpoint(tmp_path / "tiny", seed=seed), max_seq_len=32,
                                       dtype=dtype), quantize)
    fused = rewrite(copy.deepcopy(model), backend="xnnpack")
    with monkeypatch.context() as patch:
        patch.setattr(layer_fusion, "fuse_norms_and_residuals", lambda model: 0)
        plain = rewrite(model, backend="xnnpack")
    return fused, plain


def mixer(layer):
    return layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn


def product(projection):
    """The module computing a projection: its merged group's, or its own."""
    return projection.group.projection if isinstance(projection, LinearGroupMember) else projection


def logits(model, tokens):
    """The logits of a prompt and of one token after it."""
    with torch.no_grad():
        prompt = model(tokens[:, :-1], torch.tensor([0]))
        step = model(tokens[:, -1:], torch.tensor([tokens.shape[1] - 1]))
    return torch.cat([prompt, step], dim=1)


@pytest.mark.parametrize("quantize", ["16da8w", "8da4w_avx2"])
def test_fused_layers_compute_what_the_layers_computed(tmp_path, seed, generator, monkeypatch, quantize):
    fused, plain = fused_and_plain(tmp_path, seed, quantize, monkeypatch)
    assert all(type(layer) is ResidualInProducts for layer in fused.layers)
    # Each MLP's down projection reads the merged gate and up product whole.
    for layer in fused.layers:
        assert type(layer.mlp) is GatedInputMLP and layer.mlp.down_proj.gated_input
        assert isinstance(layer.mlp.gate_up_proj, GroupedLinear)
    for fused_layer, plain_layer in zip(fused.layers, plain.layers):
        # A norm moves where every product reading it is one of ours (the tiny model's Gated DeltaNet gates,
        # 4 outputs, fit no tile of 16: they stay XNNPACK's, and so does that layer's input norm).
        for norm_name, reader in (("input_layernorm", mixer(plain_layer)), ("post_attention_layernorm", plain_layer.mlp)):
            grouped = all(isinstance(product(getattr(reader, name)), GroupedLinear) for name in reader.INPUT_PROJECTIONS)
            taken = type(getattr(fused_layer, norm_name)) is NormTakenByItsConsumer
            assert taken == grouped, norm_name
    assert sum(type(layer.input_layernorm) is NormTakenByItsConsumer for layer in fused.layers) >= 1
    assert all(type(layer.post_attention_layernorm) is NormTakenByItsConsumer for layer in fused.layers)
    assert not any(isinstance(module, ResidualInProducts) for module in plain.modules())
    tokens = torch.randint(3, 200, (1, 10), generator=generator)
    actual, expected = logits(fused, tokens), logits(plain, tokens)
    spread = (expected.max() - expected.min()).item()
    assert (actual - expected).abs().max().item() <= 1e-4 * spread, f"seed {seed}"


def test_bfloat16_layers_keep_the_models_rounding(tmp_path, seed, generator, monkeypatch):
    fused, plain = fused_and_plain(tmp_path, seed, "16da8w", monkeypatch, dtype=torch.bfloat16)
    assert all(type(layer) is ResidualInProducts for layer in fused.layers)
    tokens = torch.randint(3, 200, (1, 10), generator=generator)
    assert torch.equal(logits(fused, tokens), logits(plain, tokens)), f"seed {seed}"


def test_layers_whose_products_are_xnnpacks_stay_as_they_are(tmp_path, seed, monkeypatch):
    """8da4w's linears are XNNPACK's: no product takes a norm, a gated input or an add."""
    fused, _ = fused_and_plain(tmp_path, seed, "8da4w", monkeypatch)
    assert not any(isinstance(module, (ResidualInProducts, NormTakenByItsConsumer, GatedInputMLP))
                   for module in fused.modules())
