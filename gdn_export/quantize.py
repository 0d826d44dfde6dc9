"""Quantization of the model's linear layers and token embedding before export.

* ``8da4w``: int8 dynamic activations, int4 weights in groups (torchao's
  ``Int8DynamicActivationIntxWeightConfig``, as ExecuTorch's llama export does
  it); XNNPACK runs these linears with its own quantized kernels.
* ``8da8w``: the same with int8 weights, one scale per output channel: the
  8-bit program, on XNNPACK's int8 kernels.
* ``int8wo``: int8 weights with one scale per output channel, activations in
  float. Like ExecuTorch's own ``int8`` scheme, the program widens the weight
  to float at each call: the file is about 4x smaller, decode is not faster.

Every mode also quantizes the token embedding, weight-only, with the
weights' bit width (torchao's ``IntxWeightOnlyConfig``): ExecuTorch's
lowering turns a 4-bit table into its ``quantized_decomposed::embedding_4bit``
kernel, which reads the rows of the packed table, and on XNNPACK an 8-bit one
goes to our ``GdnEmbeddingBackend`` delegate (``runtime_ops.embedding_delegate``;
``embedding_byte`` elsewhere). A tied output head is a linear like the
others, quantized on its own to the same bytes as the table: in ``8da8w`` the
program stores them once (XNNPACK's copy in the named data serves both), in
``8da4w`` twice (XNNPACK packs 4-bit weights with bf16 scales, a layout no
embedding kernel reads).

``quantize_module`` quantizes one module in place, so the loader can quantize
each layer as soon as its weights are read (``gdn_export.loading``) and the
float weights never all sit in memory at once; ``quantize_model`` does a whole
model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("none", "8da4w", "8da8w", "int8wo")
# Group sizes of 4-bit weights, largest first: 128 is ExecuTorch's llama default.
GROUP_SIZES_4BIT = (128, 64, 32)


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


def _granularity(mode: str, features: int):
    """Per output channel for 8-bit modes; for 4-bit, the largest group size that tiles ``features`` (None: none)."""
    from torchao.quantization.granularity import PerAxis, PerGroup

    if mode != "8da4w":
        return PerAxis(0)
    return next((PerGroup(size) for size in GROUP_SIZES_4BIT if features % size == 0), None)


def quantize_module(module: nn.Module, mode: str) -> nn.Module:
    """``module`` (an ``nn.Linear`` or ``nn.Embedding``; others are returned as they are) quantized for ``mode``.

    Linears and embeddings are quantized in place (their weight becomes a torchao
    quantized tensor); ``int8wo`` linears are replaced (the returned module). A
    4-bit layer whose width no group size tiles stays in float.
    """
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none" or not isinstance(module, (nn.Linear, nn.Embedding)):
        return module
    if mode == "int8wo" and isinstance(module, nn.Linear):
        return Int8WeightOnlyLinear(module)
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_

    features = module.in_features if isinstance(module, nn.Linear) else module.embedding_dim
    granularity = _granularity(mode, features)
    if granularity is None:
        return module
    weight_dtype = torch.int4 if mode == "8da4w" else torch.int8
    if isinstance(module, nn.Embedding):
        config = IntxWeightOnlyConfig(weight_dtype=weight_dtype, granularity=granularity)
    else:
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=weight_dtype, weight_granularity=granularity)
    with torch.no_grad():
        quantize_(module, config, filter_fn=lambda candidate, _name: candidate is module)
    return module


def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Quantize ``model``'s linears and embeddings in place (``mode`` one of ``MODES``); returns it."""
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            replaced = quantize_module(child, mode)
            if replaced is not child:
                setattr(parent, name, replaced)
    return model
