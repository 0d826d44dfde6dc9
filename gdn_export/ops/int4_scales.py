"""``gdn::fit_int4_scales``: the search for each group's 4-bit scale that the 4-bit exports run on every weight.

    gdn::fit_int4_scales(Tensor weight, int group_size, float[] divisors) -> Tensor
        weight [rows, columns] float32, columns a multiple of group_size
        -> scales [rows, columns / group_size] float32

Per group of ``group_size`` weights along a row, the scale ``s`` whose
int4 rounding ``clamp(round(w / s), -8, 7) * s`` has the least squared
error among those tried: each candidate starts from one of ``divisors`` and is
refined twice by least squares for its rounding (the scale that best fits ``w``
by ``q * s`` given ``q``); an all-zero rounding or a fit of the other sign keeps
the scale it had, and the first of equal errors wins. A positive divisor ``d``
starts from the positive scale ``largest / d``, ``largest`` the group's largest
magnitude; a negative one from ``extreme / d``, ``extreme`` the group's (first)
weight of that magnitude, a scale of the other sign that rounds ``extreme`` to
about ``d``: the -8 side of the levels, one level more than the +7 side
(llama.cpp's Q4_0 scales its blocks so). Positive divisors alone give positive
scales only, which XNNPACK needs. ``gdn_export.quantize.fit_int4_scales`` says why this search.

It is an op so the export can run it in C++ (``runtime_ops``: a group at a time
in registers, where the reference below makes some forty passes of tensor ops
over each block of rows; most of loading a 0.8B checkpoint for 8da4w). The
reference is the definition; the C++ kernel sums each group in order, so a
scale may differ from the reference's in its last bits where the order of a sum
moves an error or a fit (tests/test_loading.py bounds that).
"""

from __future__ import annotations

import math

import torch

from gdn_export.ops.contract import define_op

SCHEMA = "fit_int4_scales(Tensor weight, int group_size, float[] divisors) -> Tensor"
# The reference works on blocks of rows of about this many weights: a block's passes stay in cache, where a
# whole matrix's went to memory (2.5x faster on 0.8B's matrices).
FIT_BLOCK_ELEMENTS = 1 << 19


def check_fit_inputs(weight, group_size, divisors) -> None:
    """TypeError / ValueError naming the argument, for what the op cannot take."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32 or weight.dim() != 2:
        got = f"{weight.dtype} {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(f"gdn.fit_int4_scales: weight must be a 2-d torch.float32 tensor, got {got}")
    if group_size <= 0 or weight.shape[1] % group_size:
        raise ValueError(f"gdn.fit_int4_scales: group_size must be positive and divide the {weight.shape[1]} "
                         f"columns of weight, got {group_size}")
    if not divisors or any(not math.isfinite(divisor) or divisor == 0 for divisor in divisors):
        raise ValueError(f"gdn.fit_int4_scales: divisors must be one or more finite nonzero numbers, "
                         f"got {list(divisors)}")


def reference_fit_int4_scales(weight: torch.Tensor, group_size: int, divisors) -> torch.Tensor:
    check_fit_inputs(weight, group_size, divisors)
    rows, columns = weight.shape
    # Each group's scale depends on its group only, so blocks of rows give the same scales.
    block = max(1, FIT_BLOCK_ELEMENTS // columns)
    return torch.cat([_fit_block(weight[start:start + block], group_size, divisors)
                      for start in range(0, rows, block)])


def _fit_block(weight: torch.Tensor, group_size: int, divisors) -> torch.Tensor:
    rows, columns = weight.shape
    groups = weight.detach().reshape(rows, columns // group_size, group_size)
    magnitudes = groups.abs()
    largest = magnitudes.amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    # The first weight of the largest magnitude decides the sign (argmax gives the first of equals).
    extreme = torch.where(groups.gather(-1, magnitudes.argmax(dim=-1, keepdim=True))[..., 0] < 0, -largest, largest)
    levels = torch.empty_like(groups)  # each rounding is written here, in place (the same values, fewer temporaries)
    best_error = best_scale = None
    for divisor in divisors:
        scale = (largest if divisor > 0 else extreme) / divisor
        for _ in range(2):
            torch.div(groups, scale[..., None], out=levels).round_().clamp_(-8, 7)
            energy = (levels * levels).sum(dim=-1)
            fitted = (groups * levels).sum(dim=-1) / energy.clamp_min(1.0)
            # An all-zero rounding or a fit of the other sign (or zero) keeps the scale it had.
            scale = torch.where((energy > 0) & (fitted != 0) & ((fitted > 0) == (scale > 0)), fitted, scale)
        torch.div(groups, scale[..., None], out=levels).round_().clamp_(-8, 7)
        residual = levels.mul_(scale[..., None]).sub_(groups)
        error = (residual * residual).sum(dim=-1)
        if best_error is None:
            best_error, best_scale = error, scale
        else:
            better = error < best_error
            best_error, best_scale = torch.where(better, error, best_error), torch.where(better, scale, best_scale)
    return best_scale


def _fake_fit_int4_scales(weight, group_size, divisors):
    check_fit_inputs(weight, group_size, divisors)
    return weight.new_empty(weight.shape[0], weight.shape[1] // group_size)


define_op(SCHEMA, reference_fit_int4_scales, _fake_fit_int4_scales)
