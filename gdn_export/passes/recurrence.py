"""Swap each Gated DeltaNet layer's per-token recurrence for a ``gdn`` op.

The model delegates its recurrence to a ``recurrence`` submodule called as
``recurrence(mixed_qkv, a, b, A_log, dt_bias, recurrent_state) -> [B, T, Hv, Dv]``
that leaves the final state in ``recurrent_state``. ``rewrite`` replaces it,
per backend, with a module that calls one op and updates the state buffer in
place, so the exported program neither loops over tokens nor copies the state:

* ``portable``, ``xnnpack``: split and gate in PyTorch, then
  ``gdn::gated_delta_rule_inplace`` (the C++ CPU kernel registers it);
* ``cuda``: ``cuda_backend``'s fused Triton ops (``gdn_cuda::fused_recurrent_*``
  for one token, ``gdn_cuda::fused_chunked_*`` otherwise; see
  ``gdn_export.passes.cuda``). They are ``triton_op``s, which AOTInductor
  compiles into the CudaBackend program; ``gdn::fused_gated_delta_rule`` is not
  (its CUDA kernel is a PyTorch registration that a program cannot call);
* ``metal``: ``gdn::fused_gated_delta_rule``, which the Metal backend maps to
  its C shim.

The fused ops' kernels also do the q/k/v split, L2 norm, head repeat and gating.

A backend adds or overrides an entry with ``register_recurrence``. On the CPU
backends ``rewrite`` also gives the full-attention layers ``gdn::cached_attention``
(see ``gdn_export.passes.attention``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from gdn_export.models.qwen35 import GatedDeltaNet
from gdn_export.passes.attention import swap_attention
from gdn_export.passes.cuda import CudaFusedRecurrence
from gdn_export.ops.fused import gating, split_heads  # importing gdn_export.ops defines torch.ops.gdn


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


# Backend name (as in ``export_qwen35 --backend``) -> factory of its recurrence module.
RECURRENCES: dict[str, Callable[[], nn.Module]] = {
    "portable": InplaceOpRecurrence,
    "xnnpack": InplaceOpRecurrence,
    "cuda": CudaFusedRecurrence,
    "metal": FusedOpRecurrence,
}


def register_recurrence(backend: str, factory: Callable[[], nn.Module]) -> None:
    """Use ``factory()`` as the recurrence module for ``backend`` (new or overriding)."""
    RECURRENCES[backend] = factory


def rewrite(model: nn.Module, backend: str) -> nn.Module:
    """Give every Gated DeltaNet layer of ``model`` the recurrence module of ``backend``; returns ``model``."""
    if backend not in RECURRENCES:
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(RECURRENCES)}")
    for module in model.modules():
        if isinstance(module, GatedDeltaNet):
            module.recurrence = RECURRENCES[backend]()
    return swap_attention(model, backend)
