"""XNNPACK's form of the model's RMSNorms: the mean of squares as a global average pooling.

XNNPACK's partitioner takes a mean only over the two inner dims of a 4D tensor
(keepdim), which it lowers to global average pooling; the model's norms average
the last dim of a 3D or 4D tensor. Left outside the delegate, each norm ended an
XNNPACK partition, and every partition costs the lowering about a second of
retracing (docs/benchmarks.md, "Where the export time goes") and the runtime a
delegate call. Viewed as [..., D, 1] with the static dims kept, the mean goes in.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.models.qwen35 import GatedRMSNorm, RMSNorm


def pooled_mean_of_squares(x32: torch.Tensor) -> torch.Tensor:
    """``mean_of_squares`` as XNNPACK's mean: x² viewed [A, B, D, 1] and averaged over its inner two dims.

    A and B are x's leading dims (size-one leading dims dropped) with a symbolic size written as -1,
    the one inferred dim a reshape may have in XNNPACK; a tensor whose leading dims do not come to
    two keeps the plain mean.
    """
    squares = x32 * x32
    leading = [size if isinstance(size, int) else -1 for size in squares.shape[:-1]]
    pooled_dims = leading[:]
    while len(pooled_dims) > 2 and pooled_dims[0] == 1:
        pooled_dims = pooled_dims[1:]
    if len(pooled_dims) != 2 or pooled_dims.count(-1) > 1:
        return squares.mean(-1, keepdim=True)
    pooled = squares.reshape(*pooled_dims, squares.shape[-1], 1).mean((2, 3), keepdim=True)
    return pooled.reshape(*leading, 1)


class PooledRMSNorm(RMSNorm):
    mean_of_squares = staticmethod(pooled_mean_of_squares)


class PooledGatedRMSNorm(GatedRMSNorm):
    mean_of_squares = staticmethod(pooled_mean_of_squares)


POOLED = {RMSNorm: PooledRMSNorm, GatedRMSNorm: PooledGatedRMSNorm}


def pool_norm_means(model: nn.Module) -> None:
    """Give every RMSNorm of ``model`` XNNPACK's form of its mean (same parameters, same names)."""
    for module in model.modules():
        if type(module) in POOLED:
            module.__class__ = POOLED[type(module)]
