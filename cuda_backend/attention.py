"""The CUDA program's full attention: ``gdn_cuda::cached_attention`` in place of the masked whole-cache form.

The model's ``MaskedCacheAttention`` multiplies against every cache position and
masks the tail; inside a CudaBackend program that is two batched matmuls and a
softmax over [G*T, S] scores per KV head, whatever the position. This module
calls the Triton kernels of ``cuda_backend.kernels.attention`` instead, which
walk the cache only up to the last visible position (the mask is implied by
``input_pos``). ``torch.export`` keeps the ``triton_op`` whole and AOTInductor
compiles its kernels into the program, as with the recurrence.

At one token, ``DecodeGatedAttention`` also takes the layer's norms, rotary
embedding and cache writes into one kernel (``gdn_cuda::decode_attention_inputs``)
and its output gate into the output projection's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false

from gdn_export.models.qwen35 import GatedAttention

# A full-attention layer's projections of its input, merged into one product (``CudaTritonBackend.merged_linears``)
# in this order, so the product's output is [q_0 | gate_0 | q_1 | gate_1 | ... | k | v].
ATTENTION_PROJECTIONS = GatedAttention.INPUT_PROJECTIONS


class CudaCachedAttention(nn.Module):
    """``attend(query, k_cache, v_cache, positions, mask)`` of ``GatedAttention`` on the Triton kernels."""

    def __init__(self):
        super().__init__()
        from cuda_backend import triton_ops_for_rewrite

        kernels = triton_ops_for_rewrite()
        self.attend = kernels.cached_attention_op

    def forward(self, query, k_cache, v_cache, positions, mask):
        # positions[0] is input_pos; the mask is implied by it. At one token positions is input_pos, which the
        # kernel reads as it is: a slice would be a copy kernel of its own in the program.
        first = positions if guard_or_false(positions.shape[0] == 1) else positions[:1]
        return self.attend(query, k_cache, v_cache, first)


class DecodeGatedAttention(GatedAttention):
    """A full-attention layer whose one-token calls read its merged projection's output as it lies: one kernel
    (``gdn_cuda::decode_attention_inputs``) norms and rotates q and k and writes k and v into the caches, where
    the model's form compiled to seven kernels a layer; the attention kernels follow, and the output projection
    (a ``DecodeLinear``) applies the per-head sigmoid gate as it loads its input. More tokens take the model's
    form. The kernel computes the rotary angles from the position: given the model's cos and sin, AOTInductor
    computed them in two kernels of their own for each layer."""

    @classmethod
    def taking(cls, layer: GatedAttention, config) -> None:
        """Give ``layer`` (its projections merged, its o_proj a ``DecodeLinear``, its ``attend`` a
        ``CudaCachedAttention``: the CUDA rewrite's) this class, with the rotary embedding of ``config``."""
        layer.__class__ = cls
        layer.rope_theta, layer.rotary_dim = config.rope_theta, config.rotary_dim

    def forward(self, x, positions, cos, sin, mask):
        from cuda_backend.linear import one_token

        if not one_token(x):
            return super().forward(x, positions, cos, sin, mask)
        projected = getattr(self, "__".join(ATTENTION_PROJECTIONS)).projection(x)  # [1, 1, 2 (H + Hkv) D]
        # At one token the model's positions are its input_pos ([1]), which the kernels read as it is.
        query = torch.ops.gdn_cuda.decode_attention_inputs(projected, self.q_norm.weight, self.k_norm.weight,
                                                           self.q_norm.eps, self.rope_theta, self.rotary_dim,
                                                           positions, self.k_cache, self.v_cache)
        attended = self.attend(query, self.k_cache, self.v_cache, positions, mask)  # [H, 1, D]
        # Head h's gate lies after its query, at h * 2D + D of the projection.
        o_proj, head_dim = self.o_proj, self.head_dim
        return torch.ops.gdn_cuda.decode_linear(attended, o_proj.weight, o_proj.bias, None, 0.0, False,
                                                o_proj.residual, projected, head_dim, head_dim, 2 * head_dim, True)
