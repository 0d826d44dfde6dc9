"""Quantization of the model's linear layers and token embedding before export.

* ``8da4w``: int8 dynamic activations, int4 weights in groups of 32 (torchao's
  ``Int8DynamicActivationIntxWeightConfig``, as ExecuTorch's llama export does
  it, with the group of llama.cpp's Q4_0), each group's scale fitted by
  torchao's HQQ (scale only) rather than taken from the group's largest
  weight; XNNPACK runs these linears with its own quantized kernels. The token
  table and the output head keep 8 bits, as in ``8da8w`` (see below).
* ``8da8w``: the same with int8 weights, one scale per output channel: the
  8-bit program, on XNNPACK's int8 kernels.
* ``int8wo``: int8 weights with one scale per output channel, activations in
  float. Like ExecuTorch's own ``int8`` scheme, the program widens the weight
  to float at each call: the file is about 4x smaller, decode is not faster.

Every mode also quantizes the token embedding, weight-only, in 8 bits, one
scale a row (torchao's ``IntxWeightOnlyConfig``): on XNNPACK the lookup goes to
our ``GdnEmbeddingBackend`` delegate (``runtime_ops.embedding_delegate``;
ExecuTorch's ``embedding_byte`` elsewhere). A tied output head is a linear like
the others, quantized on its own to the same bytes as the table, and the
program stores them once (XNNPACK's copy in the named data serves both).

Why the table keeps 8 bits in ``8da4w``: its rounding enters every position's
residual stream undamped. On the random-weight 0.8B shape (mean KL of the
next-token distribution from fp32, 512 tokens) 4-bit groups of 32 everywhere
gave 0.226, the same with an 8-bit table and head 0.184, and with HQQ scales
0.173 (llama.cpp's Q4_0 file, whose tied table is Q6_K, 0.165). A 4-bit table
would also be stored twice: XNNPACK packs 4-bit weights in a layout that no
embedding kernel reads, so the 8-bit table costs no more bytes than two 4-bit
copies did.

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
# Group sizes of 4-bit weights, the preferred first: 32 is llama.cpp's Q4_0 block (ExecuTorch's llama
# export defaults to 128, which measured 0.258 against 0.226 mean KL with everything else equal).
GROUP_SIZES_4BIT = (32, 64, 128)
# The modules of the vocabulary (``Qwen35ForCausalLM``'s names): quantized in 8 bits in every mode.
VOCABULARY_MODULES = ("embed_tokens", "lm_head")


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


def _granularity(features: int):
    """The first of ``GROUP_SIZES_4BIT`` that tiles ``features`` (None: none), as a torchao granularity."""
    from torchao.quantization.granularity import PerGroup

    return next((PerGroup(size) for size in GROUP_SIZES_4BIT if features % size == 0), None)


def module_mode(name: str, mode: str) -> str:
    """The mode the module called ``name`` in the model is quantized with when the program's is ``mode``."""
    if mode == "8da4w" and name.rpartition(".")[2] in VOCABULARY_MODULES:
        return "8da8w"
    return mode


def quantize_module(module: nn.Module, mode: str, name: str = "") -> nn.Module:
    """``module`` (an ``nn.Linear`` or ``nn.Embedding``; others are returned as they are), called ``name`` in
    the model, quantized for a program of ``mode``.

    Linears and embeddings are quantized in place (their weight becomes a torchao
    quantized tensor); ``int8wo`` linears are replaced (the returned module). A
    4-bit layer whose width no group size tiles stays in float. The vocabulary's
    modules (``VOCABULARY_MODULES``) are found by ``name``.
    """
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    mode = module_mode(name, mode)
    if mode == "none" or not isinstance(module, (nn.Linear, nn.Embedding)):
        return module
    if mode == "int8wo" and isinstance(module, nn.Linear):
        return Int8WeightOnlyLinear(module)
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.quantize_.workflows.intx.intx_choose_qparams_algorithm import (
        IntxChooseQParamsAlgorithm,
    )

    if isinstance(module, nn.Embedding):
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    elif mode == "8da4w":
        granularity = _granularity(module.in_features)
        if granularity is None:
            return module
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=granularity,
            intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm.HQQ_SCALE_ONLY,
        )
    else:
        # The tied head's bytes must equal the table's (stored once): both take the plain max-abs scale.
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    with torch.no_grad():
        quantize_(module, config, filter_fn=lambda candidate, _name: candidate is module)
    return module


def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Quantize ``model``'s linears and embeddings in place (``mode`` one of ``MODES``); returns it."""
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            replaced = quantize_module(child, mode, f"{parent_name}.{name}" if parent_name else name)
            if replaced is not child:
                setattr(parent, name, replaced)
    return model
