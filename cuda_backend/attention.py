"""The CUDA program's full attention: ``gdn_cuda::cached_attention`` in place of the masked whole-cache form.

The model's ``MaskedCacheAttention`` multiplies against every cache position and
masks the tail; inside a CudaBackend program that is two batched matmuls and a
softmax over [G*T, S] scores per KV head, whatever the position. This module
calls the Triton kernels of ``cuda_backend.kernels.attention`` instead, which
walk the cache only up to the last visible position (the mask is implied by
``input_pos``). ``torch.export`` keeps the ``triton_op`` whole and AOTInductor
compiles its kernels into the program, as with the recurrence.
"""

from __future__ import annotations

from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false


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
