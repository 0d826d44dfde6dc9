"""Graph selection and lowering entry for ``--backend metal``, on a tiny Qwen3.5.

* The Metal rewrite makes every Gated DeltaNet layer one
  ``gdn.fused_gated_delta_rule`` call, the op with a Metal C shim, and the
  exported graph (before and after functionalization) shows exactly those.
* The rewritten model with that op run by the emulated Metal kernel gives the
  same logits as the unrewritten model (its own per-token PyTorch recurrence),
  over a prefill and a decode step, so the kernel reads the model's real
  layouts (a transposed mixed_qkv, the state buffer) correctly.
* ``lower_to_metal`` refuses clearly off macOS and for unsupported head dims;
  the shim injection into ExecuTorch's MetalBackend is scoped and undone.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from gdn_export import load_qwen35, rewrite
from gdn_export.backends import get_backend
from gdn_export.models.qwen35 import GatedDeltaNet
from gdn_export.passes import FusedOpRecurrence
from gdn_export.tiny import make_tiny_checkpoint
from metal_backend import emulation, lowering, shims

LINEAR_LAYERS = 2  # make_tiny_checkpoint's default layer_types: 2 linear attention + 1 full attention


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny64"), key_head_dim=64, value_head_dim=64)


@pytest.fixture(scope="module")
def exported(checkpoint):
    model = rewrite(load_qwen35(checkpoint, max_seq_len=32), "metal")
    tokens, input_pos = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        return torch.export.export(model, (tokens, input_pos), strict=False)


def _gdn_targets(program) -> list:
    targets = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.args[0] if "auto_functionalized" in str(node.target) else node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace == "gdn":
            targets.append(target)
    return targets


def test_metal_rewrite_selects_the_ops_with_metal_shims(exported):
    targets = _gdn_targets(exported)
    assert targets == [torch.ops.gdn.fused_gated_delta_rule.default] * LINEAR_LAYERS
    assert set(targets) <= set(shims.C_SHIMS)
    assert len(lowering.metal_op_nodes(exported)) == LINEAR_LAYERS
    lowering.check_head_dims(exported)


def test_functionalized_graph_still_shows_the_metal_ops(exported):
    functional = exported.run_decompositions({})
    assert _gdn_targets(functional) == [torch.ops.gdn.fused_gated_delta_rule.default] * LINEAR_LAYERS
    assert all("auto_functionalized" in str(node.target) for node in lowering.metal_op_nodes(functional))
    lowering.check_head_dims(functional)


class EmulatedMetalRecurrence(nn.Module):
    """The Metal rewrite's op, run by the emulated Metal kernel (state updated in place)."""

    def forward(self, mixed_qkv, a, b, A_log, dt_bias, state):
        output = torch.full(
            (mixed_qkv.shape[0], mixed_qkv.shape[1], state.shape[1], state.shape[3]), float("nan"),
            dtype=mixed_qkv.dtype,
        )
        return emulation.fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, output=output)


def test_emulated_metal_model_matches_the_pytorch_model(checkpoint, seed):
    reference_model = load_qwen35(checkpoint, max_seq_len=32)
    metal_model = rewrite(load_qwen35(checkpoint, max_seq_len=32), "metal")
    layers = [module for module in metal_model.modules() if isinstance(module, GatedDeltaNet)]
    assert len(layers) == LINEAR_LAYERS
    for layer in layers:
        assert isinstance(layer.recurrence, FusedOpRecurrence)
        layer.recurrence = EmulatedMetalRecurrence()
    prompt = torch.randint(0, reference_model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for tokens, start in ((prompt, 0), (prompt[:, -1:], 5)):
            input_pos = torch.tensor([start])
            expected = reference_model(tokens, input_pos)
            actual = metal_model(tokens, input_pos)
            error = (actual - expected).abs().max().item() / expected.abs().max().item()
            assert error <= 1e-4, f"logits error {error:.3g} at position {start} (seed {seed})"


def test_lower_to_metal_refuses_off_macos(exported):
    if get_backend("metal").unavailable_reason() is None:
        pytest.skip("this machine can lower for Metal")
    with pytest.raises(RuntimeError, match="--backend metal lowers only on macOS"):
        lowering.lower_to_metal(exported, metadata={})


def test_unsupported_head_dims_are_refused_before_lowering(tmp_path):
    checkpoint = make_tiny_checkpoint(tmp_path / "tiny16", key_head_dim=16, value_head_dim=24)
    model = rewrite(load_qwen35(checkpoint, max_seq_len=16), "metal")
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)))
    with pytest.raises(ValueError, match=r"Dk=16, Dv=24.*--backend xnnpack"):
        lowering.check_head_dims(program)


def test_shims_are_added_to_metal_backend_only_inside_the_context(monkeypatch):
    from executorch.backends.apple.metal.metal_backend import MetalBackend

    # MetalBackend reads torchao's Metal shims, a module that loads only on macOS builds of torchao.
    stub = types.ModuleType("torchao.experimental.ops.mps.cshim")
    stub.torchao_op_c_shim = {}
    monkeypatch.setitem(sys.modules, "torchao.experimental.ops.mps.cshim", stub)
    ours = shims.fallback_kernel_names()
    with lowering.gdn_shims_in_metal_backend():
        assert ours <= set(MetalBackend.get_supported_fallback_kernels())
        options = MetalBackend.get_aoti_compile_options([])
        c_shims = options["aot_inductor.custom_ops_to_c_shims"]
        assert all(c_shims[op] == declarations for op, declarations in shims.C_SHIMS.items())
        assert torch.ops.metal.gated_delta_rule.default in c_shims  # ExecuTorch's own are kept
    assert not ours & set(MetalBackend.get_supported_fallback_kernels())
    assert not set(shims.C_SHIMS) & set(MetalBackend.get_aoti_compile_options([])["aot_inductor.custom_ops_to_c_shims"])
