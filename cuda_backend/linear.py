"""The CUDA program's linear layers: one token through ``gdn_cuda::decode_linear``, more through ``F.linear``;
and its MLP (``GatedMLP``), whose down projection takes the silu-gated input in the same kernel.

A decode step's linear layers are matrix-vector products bound by the weights'
bytes; AOTInductor would compile them as matrix templates that read the
weights well below the copy bandwidth (``cuda_backend.kernels.linear``). As
with the recurrence, the choice is made when the graph is traced: the decode
method (T = 1, static) holds the decode kernel, the prefill method (T dynamic)
the matrix products AOTInductor tunes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false


def one_token(x) -> bool:
    """x [1, 1, features]: one token of a batch of one. A symbolic T not known to be 1 is not."""
    return x.dim() == 3 and guard_or_false(x.shape[0] == 1) and guard_or_false(x.shape[1] == 1)


class DecodeLinear(nn.Linear):
    """An ``nn.Linear`` (the same parameters, under the same names) whose one-token calls take the decode kernel.

    ``input_norm`` (None, or an RMSNorm that ``gdn_export.passes.layer_fusion.take_input_norm`` moved here): the
    layer's input is that norm of its argument, which the decode kernel computes itself. ``residual`` (None, or a
    tensor that ``layer_fusion.ResidualInProducts`` sets for the length of one call): added to the output, at one
    token by the kernel.
    """

    residual = None

    @classmethod
    def sharing(cls, linear: nn.Linear) -> "DecodeLinear":
        from cuda_backend import triton_ops_for_rewrite

        triton_ops_for_rewrite()  # registers torch.ops.gdn_cuda.decode_linear
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight = linear.weight
        module.register_parameter("bias", linear.bias)
        module.register_module("input_norm", None)
        return module

    def forward(self, x):
        norm, residual = self.input_norm, self.residual
        if one_token(x):
            return torch.ops.gdn_cuda.decode_linear(x, self.weight, self.bias, None if norm is None else norm.weight,
                                                    0.0 if norm is None else norm.eps, False, residual)
        output = F.linear(x if norm is None else norm(x), self.weight, self.bias)
        return output if residual is None else output + residual


class GatedMLP(nn.Module):
    """Qwen3.5's MLP, down(silu(gate(x)) * up(x)), with gate and up as one product (``gate_up_proj``) and, at
    one token, silu(gate) * up computed inside the down projection's kernel as it loads its input: one launch
    and one vector round trip fewer a layer than the model's form."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        from gdn_export.passes.linear_groups import stacked_linear

        self.gate_up_proj = DecodeLinear.sharing(stacked_linear([mlp.gate_proj, mlp.up_proj]))
        self.down_proj = DecodeLinear.sharing(mlp.down_proj)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if one_token(gate_up):
            return torch.ops.gdn_cuda.decode_linear(gate_up, self.down_proj.weight, gated=True,
                                                    residual=self.down_proj.residual)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
