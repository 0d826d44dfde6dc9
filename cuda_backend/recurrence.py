"""The CUDA recurrence: the Triton decode kernel for one token, the chunked kernels for more.

Like ExecuTorch's own CUDA LLM exports, the choice is made when the graph is
traced: a program exported with T = 1 (a decode method) holds
``gdn_cuda::fused_recurrent_gated_delta_rule``, one exported with T >= 2 or a
dynamic T holds ``gdn_cuda::fused_chunked_gated_delta_rule`` (correct for any
T, T = 1 included), so no run-time branch is needed. Both ops are
``triton_op``s: ``torch.export`` keeps them whole and AOTInductor compiles
their kernels into the CudaBackend program; both update ``state`` in place.
The CUDA rewrite's Gated DeltaNet layers (``DecodeGatedDeltaNet``) take one op
from their projection on instead, at one token and for a chunk of batch 1;
this recurrence serves other batches.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false

from gdn_export.models.qwen35 import GatedDeltaNet

# A Gated DeltaNet layer's projections of its input, merged into one product (``CudaTritonBackend.merged_linears``)
# in this order, so the product's output is [qkv | z | b | a].
INPUT_PROJECTIONS = GatedDeltaNet.INPUT_PROJECTIONS


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


class DecodeGatedDeltaNet(GatedDeltaNet):
    """A Gated DeltaNet layer whose calls go from its input projection to its recurrence's output in one op.

    Its input projections are one merged product (``INPUT_PROJECTIONS``), whose output each op reads as it lies.
    One token takes ``gdn_cuda::decode_gated_delta_net``: the conv, its state's shift and the gates are one
    kernel beside the recurrent one, where the model's form compiled to five kernels a layer, and the output
    projection (a ``DecodeLinear``) applies the gated RMSNorm as it loads its input. A chunk of tokens (batch 1)
    takes ``gdn_cuda::prefill_gated_delta_net``: one prologue kernel writes the dense q, k, v and gates the
    chunked kernels read, where the model's form compiled to the conv of a transposed window and a copy of each
    of q, k, v, a and b. Other batches take the model's form. ``CudaTritonBackend.finish_rewrite`` gives layers
    this class.
    """

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from cuda_backend.linear import one_token

        projections = getattr(self, "__".join(INPUT_PROJECTIONS))
        if one_token(x):
            projected = projections.projection(x)  # [1, 1, C + V + 2 Hv]
            # At one token the model's positions are its input_pos ([1]), which the kernel reads as it is.
            core = torch.ops.gdn_cuda.decode_gated_delta_net(projected, self.conv_state, self.conv1d.weight,
                                                              positions, self.A_log, self.dt_bias,
                                                              self.recurrent_state)
            # The output projection applies the gated RMSNorm itself, reading z where the projection wrote it: the
            # norm is no kernel of its own, and neither z's slice nor core's reshape is a copy.
            out_proj = self.out_proj
            return torch.ops.gdn_cuda.decode_linear(core, out_proj.weight, out_proj.bias, self.norm.weight,
                                                    self.norm.eps, False, out_proj.residual, projected,
                                                    self.conv_dim, self.value_head_dim)
        if not guard_or_false(x.shape[0] == 1):
            return super().forward(x, positions)
        length = x.shape[1]
        projected = projections.projection(x)  # [1, T, C + V + 2 Hv]
        core = torch.ops.gdn_cuda.prefill_gated_delta_net(projected, self.conv_state, self.conv1d.weight, positions,
                                                           self.A_log, self.dt_bias, self.recurrent_state)
        value_dim = self.num_v_heads * self.value_head_dim
        z = projected[..., self.conv_dim:self.conv_dim + value_dim].reshape(1, length, self.num_v_heads,
                                                                           self.value_head_dim)
        return self.out_proj(self.norm(core, z).reshape(1, length, -1))
