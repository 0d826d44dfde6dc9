"""Sibling linear layers that read the same input, computed as one product.

A layer's projections of one input (attention's q/k/v, Gated DeltaNet's
in_proj qkv/z/b/a, the MLP's gate/up) are separate ``nn.Linear`` layers in the
model, so a program runs one matrix product, or at one token one
matrix-vector kernel, per projection. Where launches cost (a GPU decode step
is hundreds of small kernels), a backend asks ``rewrite`` to merge them
(``Backend.merged_linears``): the layer gets one ``LinearGroup`` whose
``projection`` holds the weights stacked along the output dim, and each former
projection becomes a ``LinearGroupMember`` that returns its slice of the
group's output. The layer's own forward is unchanged: its first projection
call computes the product, and the others, called with the same input tensor,
take their slices of it.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def stacked_linear(linears: Sequence[nn.Module]) -> nn.Module:
    """One linear layer whose output is the outputs of ``linears`` (one input size) side by side: their weights
    stacked along the output dim, and their biases where any has one (zeros for those without). The layers are
    ``nn.Linear``s, or grouped-weight linears of one kind and group size (``GroupedLinear``: ``16da8w``'s int8,
    ``8da4w_avx2``'s 4-bit; each output row keeps its codes and scales, so each output is what its own layer
    computes)."""
    from gdn_export.quantize import GroupedLinear

    in_features = {linear.in_features for linear in linears}
    if len(in_features) != 1:
        raise ValueError(f"stacked_linear: the layers must read one input size, got {sorted(in_features)}")
    first = linears[0].weight
    grouped = {isinstance(linear, GroupedLinear) and (type(linear), linear.group) for linear in linears}
    if len(grouped) != 1:
        raise ValueError("stacked_linear: the layers must all be nn.Linear or all grouped linears of one kind and "
                         f"group, got {', '.join(type(linear).__name__ for linear in linears)}")
    has_bias = any(linear.bias is not None for linear in linears)
    with torch.no_grad():
        bias = None
        if has_bias:  # a missing bias is zeros of the others' dtype (a grouped layer's weight is int8)
            dtype = next(linear.bias.dtype for linear in linears if linear.bias is not None)
            bias = torch.cat([linear.bias if linear.bias is not None else
                              torch.zeros(linear.out_features, dtype=dtype, device=first.device) for linear in linears])
        if grouped != {False}:
            return type(linears[0]).stacked(list(linears), None if bias is None else
                                            nn.Parameter(bias, requires_grad=False))
        stacked = nn.Linear(in_features.pop(), sum(linear.out_features for linear in linears), bias=has_bias,
                            device="meta")
        stacked.weight = nn.Parameter(torch.cat([linear.weight for linear in linears]),
                                      requires_grad=first.requires_grad)
        if has_bias:
            stacked.bias = nn.Parameter(bias, requires_grad=first.requires_grad)
    return stacked


class LinearGroup(nn.Module):
    """One ``nn.Linear`` (``projection``) over the stacked weights of sibling layers; its output in their slices."""

    def __init__(self, linears: Sequence[nn.Linear]):
        super().__init__()
        self.projection = stacked_linear(linears)
        self.sizes = [linear.out_features for linear in linears]
        # The last input and its slices: the members are called one after another with the same tensor.
        self._last: tuple = (None, ())

    def slices(self, x: torch.Tensor) -> tuple:
        if self._last[0] is not x:
            self._last = (x, torch.split(self.projection(x), self.sizes, dim=-1))
        return self._last[1]


class LinearGroupMember(nn.Module):
    """One former layer of a ``LinearGroup``: its slice of the group's output (the group is not a submodule,
    so its weights appear once, under the group's name)."""

    def __init__(self, group: LinearGroup, index: int, in_features: int):
        super().__init__()
        self.__dict__["group"] = group  # unregistered on purpose: the parent layer owns the group
        self.index = index
        self.in_features, self.out_features = in_features, group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.slices(x)[self.index]

    def extra_repr(self) -> str:
        return f"slice {self.index} of a LinearGroup, in_features={self.in_features}, out_features={self.out_features}"


def merge_linears(layer: nn.Module, names: Sequence[str]) -> LinearGroup:
    """Replace ``layer``'s linear children ``names`` by members of one group, registered as
    ``layer.<names joined by "__">``; returns the group."""
    from gdn_export.quantize import GroupedLinear

    linears = [getattr(layer, name) for name in names]
    for name, linear in zip(names, linears):
        if type(linear) is not nn.Linear and not isinstance(linear, GroupedLinear):
            raise TypeError(f"merge_linears: {type(layer).__name__}.{name} is a {type(linear).__name__}, "
                            "not an nn.Linear or a GroupedLinear")
    group = LinearGroup(linears)
    layer.add_module("__".join(names), group)
    for index, (name, linear) in enumerate(zip(names, linears)):
        setattr(layer, name, LinearGroupMember(group, index, linear.in_features))
    return group
