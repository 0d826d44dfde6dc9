"""``int8wo`` linears on XNNPACK's kernels for float activations and int8 weights.

XNNPACK multiplies float activations by int8 weights with one scale per output
channel (its ``f32_qc8w`` GEMM and GEMV), but ExecuTorch 1.5.1's partitioner
does not take such a linear whole: a weight behind a dequantize reads to it as
static quantization, which wants a dequantized activation too, so ``to_edge``
decomposes the linear (and the decomposed dequantize and matrix product that
XNNPACK then took computed wrong values when we tried it). Before this module
``int8wo`` programs therefore used their own linear, which widens the weight
to float at each call. ``WeightOnlyLinearConfig`` takes the linear whose
weight is torchao's int8 rows (``gdn_export.quantize.int8_rows``) and whose
activation is float, with the weight and its scales: XNNPACK's own serializer
then writes an int8 weight with per-channel scales beside a float input, and
XNNPACK's runtime picks the ``f32_qc8w`` kernels for that pair. Everything
else goes to XNNPACK's own configs as before.

So an ``int8wo`` program reads int8 weights (decode streams a quarter of the
fp32 bytes) while its activations stay float: its next-token distributions
are closer to the fp32 model's than ``8da8w``'s, whose per-token int8
activations cost most of its KL (docs/benchmarks.md, "What costs the 8-bit
program its KL").
"""

from __future__ import annotations

import torch
from torch import nn
from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
from executorch.backends.xnnpack.utils.quant_utils import is_affine_qdq, is_dequant, tag_as_implicit_q_dq
from executorch.backends.xnnpack.utils.utils import get_input_node, is_param_node


class WeightOnlyLinearConfig(LinearConfig):
    """XNNPACK's linear config, which also takes a float-activation linear of an int8 per-channel weight."""

    def get_deps(self, node, ep):
        weight, activation = get_input_node(node, self.weight_idx), get_input_node(node, self.act_idx)
        if not is_dequant(weight) or is_dequant(activation):
            return super().get_deps(node, ep)
        return weight_only_deps(node, weight, ep)


def weight_only_deps(node, dequantize, ep) -> tuple:
    """``(valid, nodes)``: what XNNPACK takes with the linear ``node`` (no bias) whose weight is ``dequantize``'s
    output and whose activation is float: the dequantize, the int8 weight, its scales and zero points."""
    quantized = get_input_node(dequantize, 0)
    value = quantized.meta.get("val")
    if value is None or value.dim() != 2 or not is_param_node(ep, quantized) or not int8_rows(dequantize, value):
        return False, []
    parameters = dequantize.all_input_nodes[1:3]
    if not all(is_param_node(ep, parameter) for parameter in parameters):
        return False, []
    # XNNPACK's serializer quantizes a bias only beside a quantized input: ``biases_added_after`` takes them out.
    if len(node.all_input_nodes) > 2:
        return False, []
    tag_as_implicit_q_dq(dequantize)
    return True, [dequantize, quantized, *parameters]


def int8_rows(dequantize, value) -> bool:
    """Whether ``dequantize`` is torchao's of int8 ``value`` with one scale a row (``gdn_export.quantize.int8_rows``:
    a block as wide as the row, the full int8 range)."""
    if not is_affine_qdq(dequantize) or len(dequantize.args) < 7:
        return False
    block_size, dtype, low, high = dequantize.args[1], dequantize.args[4], dequantize.args[5], dequantize.args[6]
    return (value.dtype == torch.int8 and dtype == torch.int8 and list(block_size) == [1, value.shape[1]]
            and (low, high) == (-128, 127))


class BiasAddedAfter(nn.Module):
    """An ``int8wo`` linear without its bias, and the bias added to its output."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.bias = linear.bias
        linear.bias = None
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.bias


def biases_added_after(model: nn.Module) -> int:
    """Give each ``int8wo`` linear of ``model`` with a bias (Qwen3.5's attention projections with
    ``attention_bias``) the form ``BiasAddedAfter``, which ``WeightOnlyLinearConfig`` takes; returns how many.

    Left whole, such a linear is refused here and decomposed by ``to_edge``, and the dequantize and matrix
    product that XNNPACK then takes computed wrong values (tests/test_xnnpack_weight_only.py)."""
    from gdn_export.quantize import is_weight_only

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if is_weight_only(child) and child.bias is not None:
                setattr(parent, name, BiasAddedAfter(child))
                replaced += 1
    return replaced


# XNNPACK's configs with its linear config replaced by ours.
CONFIGS = [WeightOnlyLinearConfig if config is LinearConfig else config for config in ALL_PARTITIONER_CONFIGS]
