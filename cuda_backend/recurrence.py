"""The CUDA recurrence: the Triton decode kernel for one token, the chunked kernels for more.

Like ExecuTorch's own CUDA LLM exports, the choice is made when the graph is
traced: a program exported with T = 1 (a decode method) holds
``gdn_cuda::fused_recurrent_gated_delta_rule``, one exported with T >= 2 or a
dynamic T holds ``gdn_cuda::fused_chunked_gated_delta_rule`` (correct for any
T, T = 1 included), so no run-time branch is needed. Both ops are
``triton_op``s: ``torch.export`` keeps them whole and AOTInductor compiles
their kernels into the CudaBackend program; both update ``state`` in place.
"""

from __future__ import annotations

from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false


class CudaFusedRecurrence(nn.Module):
    """``recurrence(mixed_qkv, a, b, A_log, dt_bias, state)`` on the Triton kernels of ``cuda_backend``."""

    def __init__(self):
        super().__init__()
        from cuda_backend import triton_ops_for_rewrite

        kernels = triton_ops_for_rewrite()

        self.decode = kernels.fused_recurrent_gated_delta_rule
        self.prefill = kernels.fused_chunked_gated_delta_rule

    def forward(self, mixed_qkv, a, b, A_log, dt_bias, state):
        # A symbolic T that is not known to be 1 takes the chunked kernels, which handle any T.
        single_token = guard_or_false(mixed_qkv.shape[1] == 1)
        step = self.decode if single_token else self.prefill
        return step(mixed_qkv, a, b, A_log, dt_bias, state)
