"""Swap the full-attention layers' masked whole-cache attention for ``gdn::cached_attention``.

On the CPU backends the op's C++ kernel (runtime_ops) reads the position
from ``input_pos`` and attends only over the cache positions written so far,
where the masked form multiplies against all ``max_seq_len`` of them on every
call. The kernel takes float32, so caches of other dtypes keep the masked form.
GPU backends keep it too: their compilers fuse it, and the op has no GPU kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.models.qwen35 import GatedAttention
import gdn_export.ops  # noqa: F401  (defines torch.ops.gdn.cached_attention)

CACHED_ATTENTION_BACKENDS = ("portable", "xnnpack")


class CachedAttentionOp(nn.Module):
    """``GatedAttention.attend`` through ``gdn::cached_attention``: the mask is implied by the position."""

    def forward(self, query, k_cache, v_cache, positions, mask):
        return torch.ops.gdn.cached_attention(query, k_cache, v_cache, positions[:1])


def swap_attention(model: nn.Module, backend: str) -> nn.Module:
    """Give ``backend``'s float32 full-attention layers the op; others keep what they have. Returns ``model``."""
    if backend in CACHED_ATTENTION_BACKENDS:
        for module in model.modules():
            if isinstance(module, GatedAttention) and module.k_cache.dtype == torch.float32:
                module.attend = CachedAttentionOp()
    return model
