"""Give each layer of the model its backend's form of the recurrence, the attention and the linear layers.

The model delegates its recurrence to a ``recurrence`` submodule called as
``recurrence(mixed_qkv, a, b, A_log, dt_bias, recurrent_state) -> [B, T, Hv, Dv]``
that leaves the final state in ``recurrent_state``, and its full attention to
an ``attend`` submodule. ``rewrite`` asks the backend (``gdn_export.backends``)
for a module of each and puts it in place, so the exported program neither
loops over tokens nor copies the state; a backend may also merge sibling
linear layers that read the same input (``linear_groups``) and replace the
MLPs and the ``nn.Linear`` layers (CUDA's decode takes them through a
matrix-vector kernel).

The modules here call the ``gdn`` ops, and backends pick among them:

* ``InplaceOpRecurrence``: split and gate in PyTorch, then
  ``gdn::gated_delta_rule_inplace`` (the CPU backends' C++ kernel);
* ``FusedOpRecurrence``: ``gdn::fused_gated_delta_rule``, whose kernels also
  do the q/k/v split, L2 norm, head repeat and gating (Metal maps it to its C shim);
* ``ConvOpGatedDeltaNet``: a layer whose conv, gates and recurrence are one
  ``gdn::conv_gated_delta_rule`` (the CPU backends' C++ kernel);
* ``CachedAttentionOp``: ``gdn::cached_attention``, which reads the position
  from ``input_pos`` and attends only over the cache written so far, where
  the model's masked form multiplies against all ``max_seq_len`` positions;
* ``GatedAttentionOp``: a full-attention layer whose norms, rotations, cache
  writes, attention and gate are one ``gdn::gated_attention`` (the CPU
  backends' C++ kernel);
* ``GatedRMSNormOp``: the norm after the recurrence as ``gdn::gated_rms_norm``
  (the CPU backends' C++ kernel), one call where the model's form is some nine
  small ops.

A backend may bring its own (CUDA's Triton ops live in ``cuda_backend``).
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.backends import get_backend
from gdn_export.models.qwen35 import MLP, GatedAttention, GatedDeltaNet, GatedRMSNorm
from gdn_export.ops.conv_recurrence import STATE_DTYPES
from gdn_export.ops.fused import gating, split_heads  # importing gdn_export.ops defines torch.ops.gdn
from gdn_export.passes.linear_groups import merge_linears


class InplaceOpRecurrence(nn.Module):
    """``gdn::gated_delta_rule_inplace`` after splitting q/k/v and computing the gates in PyTorch."""

    def forward(self, mixed_qkv, a, b, A_log, dt_bias, state):
        _, query, key, value = split_heads(mixed_qkv, state)
        g, beta = gating(a, b, A_log, dt_bias)
        return torch.ops.gdn.gated_delta_rule_inplace(query, key, value, g, beta, state, use_qk_l2norm=True)


class FusedOpRecurrence(nn.Module):
    """``gdn::fused_gated_delta_rule``: split, L2 norm and gating happen inside the kernel."""

    def forward(self, mixed_qkv, a, b, A_log, dt_bias, state):
        return torch.ops.gdn.fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state)


class ConvOpGatedDeltaNet(GatedDeltaNet):
    """A Gated DeltaNet layer whose causal conv, gates and recurrence are one ``gdn::conv_gated_delta_rule``, where
    the model's form made, a layer at a token in a CPU program, some twenty calls of portable kernels and ours and
    as many small XNNPACK ops, each waking the thread pool. The op takes float32, and a float16 recurrent state
    (``keep_recurrent_states_in``); a layer of another dtype keeps the model's form."""

    def convolved_recurrence(self, qkv, a, b, positions) -> torch.Tensor:
        tensors = (qkv, a, b, self.conv1d.weight, self.A_log, self.dt_bias, self.conv_state)
        if any(tensor.dtype != torch.float32 for tensor in tensors) or self.recurrent_state.dtype not in STATE_DTYPES:
            return super().convolved_recurrence(qkv, a, b, positions)
        return torch.ops.gdn.conv_gated_delta_rule(qkv, a, b, self.conv1d.weight, self.A_log, self.dt_bias,
                                                   positions, self.conv_state, self.recurrent_state)


def keep_recurrent_states_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Every Gated DeltaNet layer's recurrent state in ``dtype`` (zeroed, as a new sequence's): float16 only where
    the layer is a ``ConvOpGatedDeltaNet``, whose op keeps it (``STATE_DTYPES``); ValueError otherwise."""
    for name, module in model.named_modules():
        if isinstance(module, GatedDeltaNet) and module.recurrent_state.dtype != dtype:
            if dtype != torch.float32 and not (type(module) is ConvOpGatedDeltaNet and dtype in STATE_DTYPES):
                raise ValueError(f"{name}: a {dtype} recurrent state needs the conv op's float32 layer "
                                 f"(a CPU backend's), got {type(module).__name__}")
            module.recurrent_state = torch.zeros_like(module.recurrent_state, dtype=dtype)


def give_layers_the_conv_op(model: nn.Module) -> None:
    """Every Gated DeltaNet layer of ``model`` as a ``ConvOpGatedDeltaNet`` (same parameters and buffers)."""
    for module in model.modules():
        if type(module) is GatedDeltaNet:
            module.__class__ = ConvOpGatedDeltaNet


class GatedRMSNormOp(GatedRMSNorm):
    """A Gated DeltaNet layer's ``GatedRMSNorm`` through ``gdn::gated_rms_norm`` on float32 tensors (others keep the
    model's form, which rounds the normed values to their dtype first)."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if not x.dtype == z.dtype == self.weight.dtype == torch.float32:
            return super().forward(x, z)
        return torch.ops.gdn.gated_rms_norm(x, z, self.weight, self.eps)


def give_gated_norms_the_op(model: nn.Module) -> None:
    """Every ``GatedRMSNorm`` of ``model`` as a ``GatedRMSNormOp`` (same parameters)."""
    for module in model.modules():
        if type(module) is GatedRMSNorm:
            module.__class__ = GatedRMSNormOp


class CachedAttentionOp(nn.Module):
    """``GatedAttention.attend`` through ``gdn::cached_attention``: the mask is implied by the position."""

    def forward(self, query, k_cache, v_cache, positions, mask):
        return torch.ops.gdn.cached_attention(query, k_cache, v_cache, positions[:1])


class GatedAttentionOp(GatedAttention):
    """A full-attention layer whose work between its projections is one ``gdn::gated_attention``: its query and
    key norms, rotations, cache writes, attention and output gate, where the model's form made, a layer at a token
    in a CPU program, two XNNPACK calls of some thirty small ops, two portable ``index_put_`` calls and the
    attention (a 0.8B ``8da4w_avx2`` decode step ran 1.07x as fast with the op, docs/benchmarks.md run 39).
    Given only to layers whose ``attend`` is a ``CachedAttentionOp`` (float32 caches) and whose two norms share
    an eps."""

    def forward(self, x, positions, cos, sin, mask):
        if x.dtype != torch.float32 or cos.dtype != torch.float32:
            return super().forward(x, positions, cos, sin, mask)
        attended = torch.ops.gdn.gated_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.q_norm.weight,
                                                 self.k_norm.weight, cos, sin, positions[:1], self.k_cache,
                                                 self.v_cache, eps=self.q_norm.eps)
        return self.o_proj(attended)


def give_attention_layers_the_op(model: nn.Module) -> None:
    """Every full-attention layer of ``model`` that attends through ``CachedAttentionOp`` as a ``GatedAttentionOp``
    (same parameters and buffers)."""
    for module in model.modules():
        if type(module) is GatedAttention and isinstance(module.attend, CachedAttentionOp) \
                and module.q_norm.eps == module.k_norm.eps:
            module.__class__ = GatedAttentionOp


def rewrite(model: nn.Module, backend: str) -> nn.Module:
    """Give every layer of ``model`` the recurrence and attention of ``backend`` (a name); returns ``model``."""
    chosen = get_backend(backend)
    for module in model.modules():
        if isinstance(module, GatedDeltaNet):
            module.recurrence = chosen.recurrence()
        elif isinstance(module, GatedAttention):
            attend = chosen.attention(module)
            if attend is not None:
                module.attend = attend
    for layer in list(model.modules()):
        for names in chosen.merged_linears(layer):
            merge_linears(layer, names)
    for kind, replace in ((MLP, chosen.mlp), (nn.Linear, chosen.linear)):
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is kind:  # exactly: a replacement may subclass it, and is not replaced again
                    replacement = replace(child)
                    if replacement is not None:
                        setattr(parent, name, replacement)
    chosen.finish_rewrite(model)
    return model
