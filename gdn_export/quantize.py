"""Quantization of a loaded model's linear layers before export.

* ``8da4w``: int8 dynamic activations, int4 weights in groups, through torchao
  as ExecuTorch's llama export does it; XNNPACK runs these linears with its
  own quantized kernels.
* ``int8wo``: int8 weights with one scale per output channel, activations in
  float. Like ExecuTorch's own ``int8`` scheme, the program widens the weight
  to float at each call: the file is about 4x smaller, decode is not faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("none", "8da4w", "int8wo")
# Group sizes of 8da4w weights, largest first: 128 is ExecuTorch's llama default.
GROUP_SIZES_8DA4W = (128, 64, 32)


class Int8WeightOnlyLinear(nn.Module):
    """``y = (x @ q^T) * scale`` with ``q = round(w / scale)`` in int8 and ``scale = max|w_row| / 127``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        self.register_buffer("weight", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return output if self.bias is None else output + self.bias


def _replace_linears(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8WeightOnlyLinear(child))
        else:
            _replace_linears(child)


def quantize_linears(model: nn.Module, mode: str) -> nn.Module:
    """Quantize ``model``'s ``nn.Linear`` layers in place (``mode`` one of ``MODES``); returns it."""
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "int8wo":
        _replace_linears(model)
    elif mode == "8da4w":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        def still_float(module) -> bool:
            return isinstance(module, nn.Linear) and type(module.weight.data) is torch.Tensor

        with torch.no_grad():
            for group_size in GROUP_SIZES_8DA4W:
                # A layer takes the largest group size that tiles its input features;
                # one that none tiles stays in float.
                config = Int8DynamicActivationIntxWeightConfig(
                    weight_dtype=torch.int4, weight_granularity=PerGroup(group_size)
                )
                quantize_(
                    model, config,
                    filter_fn=lambda module, _name: still_float(module) and module.in_features % group_size == 0,
                )
    return model
