"""``gdn::grouped_int4_linear``: a linear layer with 4-bit weights in groups of 32, int8 activations.

The linears of ``8da4w_avx2`` programs. XNNPACK's 4-bit kernels (torchao's
``IntxUnpackedToInt8Tensor`` lowered to its ``qb4w`` GEMMs, ``8da4w``'s) multiply
bytes where the CPU has AVX-512 VNNI (or ARM's dot products); on an AVX2-only x86
they widen both sides to 16 bits, 16 multiplications an instruction, and a 0.8B
prefill ran at 1.1x llama.cpp's Q4_0 (docs/benchmarks.md). This op multiplies
the codes as bytes on every x86 (AVX2's ``vpmaddubsw``, 32 an instruction;
VNNI's ``vpdpbusd``, 64; plain C++ elsewhere), and runs outside XNNPACK, in one
kernel call a layer's projections where ``rewrite`` merges them.

Format (``to_grouped_int4`` writes it): ``W[n, k] = (code[n, k] - 8) * scale[n, k // group]``,
codes in [0, 15], scales bfloat16 of either sign, ``group`` a multiple of 32 up to 256 dividing
``K``. The codes come in tiles of 16 output channels and runs of 4 inputs, two
codes a byte: byte ``4 c + t`` of run ``q`` holds channel ``c``'s code for input
``4 q + t`` in its low nibble and channel ``c + 8``'s in its high one, so
``weight[n // 16, k // 4, 4 * (n % 8) + k % 4]``; the scales as
``scales[n // 16, k // group, n % 16]``. A kernel reads one run of 32 bytes for 16
outputs and 4 inputs, and one run of 16 scales a group.

The scales' smaller form (``to_grouped_int4(..., small=True)``, 8da4w_avx2's; ``gdn::grouped_int8_linear``
takes the same, whose module defines it) is int8 ``[N / 16, K / group + 4, 16]``: each tile's group
scales as integers of either sign, then 4 rows of 16 bytes holding its 16 channels' float32
multipliers, ``scale[n, g] = small[n // 16, g, n % 16] * multiplier[n]``. At groups of 32 and
K = 1024 a weight takes 4.28 bits against bfloat16 scales' 4.5 (5% fewer bytes for a decode step to
read), and a channel's multiplier is its largest scale / 127, so each scale is rounded by at most 0.4%
of that largest one: far below the codes' own rounding (a 0.8B program's mean KL at positions 256-510
went from 0.1543 to 0.1540, docs/benchmarks.md run 39).

    gdn::grouped_int4_linear(Tensor x, Tensor weight, Tensor scales, *, <FUSED_ARGS>) -> Tensor
        x [..., K] float32, weight [N / 16, K / 4, 32] uint8, scales [N / 16, K / group, 16] bfloat16
        (or int8 [N / 16, K / group + 4, 16], the smaller form above)
        -> [..., N] float32: x times W^T, with each row of x rounded to int8 (one max-abs scale),
        as the kernel reads it (XNNPACK's 8da4w kernels read theirs in int8 too, with a zero point)

(and a ``.out`` form; ``FUSED_ARGS``, a decoder layer's norm, MLP gating and residual add taken into the
product, are ``gdn_export.ops.grouped_int8_linear``'s). ``runtime_ops`` implements it in C++ for CPU programs.
"""

from __future__ import annotations

import torch

from gdn_export.ops.grouped_int8_linear import (  # noqa: F401  (fits, the scales' forms: this format's too)
    GROUPS, ROWS_PER_BLOCK, TILE, check_scales_type, checked_group, define_grouped_linear, fits, round_to_levels,
    small_scale_tiles, small_scales, tile_scales)

RUN = 32  # bytes a run: TILE channels x 4 inputs, two codes a byte
CODE_OFFSET = 8  # a code c stands for c - 8



def check_weight(weight, scales) -> tuple[int, int, int]:
    """``(N, K, group)`` of a weight; TypeError / ValueError naming the argument otherwise."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.uint8 or weight.dim() != 3:
        got = f"{weight.dtype} {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(f"gdn.grouped_int4_linear: weight must be a 3-d torch.uint8 tensor, got {got}")
    check_scales_type("grouped_int4_linear", scales)
    tiles, runs = weight.shape[0], weight.shape[1]
    if weight.shape[2] != RUN:
        raise ValueError(f"gdn.grouped_int4_linear: weight must be [N / {TILE}, K / 4, {RUN}], got {list(weight.shape)}")
    k = 4 * runs
    return TILE * tiles, k, checked_group("grouped_int4_linear", scales, tiles, k)


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernel reads it: int8 (``round_to_levels``)."""
    return round_to_levels(x, 127)


def codes(weight: torch.Tensor, start: int = 0, stop=None) -> torch.Tensor:
    """The codes (0..15) of output channels ``start:stop`` (multiples of 16), as uint8 [n, K]."""
    tiles = weight[start // TILE: None if stop is None else -(-stop // TILE)]
    split = torch.cat([tiles & 0x0F, tiles >> 4], dim=2).reshape(tiles.shape[0], -1, TILE, 4)  # [t, K / 4, 16, 4]
    return split.permute(0, 2, 1, 3).reshape(-1, 4 * weight.shape[1])


def float_weight(weight, scales, start: int = 0, stop=None) -> torch.Tensor:
    """Output channels ``start:stop`` (multiples of 16) of ``W`` [N, K], in float32."""
    _, k, group = check_weight(weight, scales)
    tiles = slice(start // TILE, None if stop is None else -(-stop // TILE))
    units = tile_scales(scales[tiles]).permute(0, 2, 1).reshape(-1, k // group).repeat_interleave(group, dim=1)
    return (codes(weight, start, stop).float() - CODE_OFFSET) * units


reference_grouped_int4_linear, reference_grouped_int4_linear_out = define_grouped_linear(
    "grouped_int4_linear", check_weight, round_activations, float_weight)


def to_grouped_int4(weight: torch.Tensor, scales: torch.Tensor,
                    small: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, scales)`` of a float weight [N, K] with nonzero ``scales`` [N, K / group] of either sign
    (``fits(N, K, group)``; ``gdn_export.quantize.fit_int4_scales`` chooses them): each scale rounded to
    bfloat16 (or, ``small``, to the int8 form, ``small_scales``), each weight's code the nearest of -8..7 times
    its rounded scale."""
    n, k = weight.shape
    if scales.dim() != 2 or scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"to_grouped_int4: scales must be [{n}, K / group] for a weight [{n}, {k}], "
                         f"got {list(scales.shape)}")
    group = k // scales.shape[1]
    if not fits(n, k, group):
        raise ValueError(f"to_grouped_int4: weight [{n}, {k}] needs N a multiple of {TILE} and K of the group "
                         f"{group} (one of {GROUPS})")
    if not bool((torch.isfinite(scales) & (scales.to(torch.bfloat16) != 0)).all()):
        raise ValueError("to_grouped_int4: scales must be finite and nonzero in bfloat16")
    packed, units = [], []
    for start in range(0, n, ROWS_PER_BLOCK):
        block = scales[start:start + ROWS_PER_BLOCK]
        if small:
            integers, multipliers = small_scales(block.float())
            unit = integers.float() * multipliers[:, None]  # as the reference's tile_scales computes it
        else:
            unit = block.to(torch.bfloat16)
        groups = weight[start:start + ROWS_PER_BLOCK].detach().float().reshape(-1, k // group, group)
        code = (torch.round(groups / unit.float()[..., None]).clamp_(-8, 7) + CODE_OFFSET).to(torch.uint8)
        quads = code.reshape(-1, TILE, k // 4, 4)  # [t, 16, K / 4, 4]
        low, high = quads[:, :TILE // 2], quads[:, TILE // 2:]
        packed.append((low | (high << 4)).permute(0, 2, 1, 3).reshape(-1, k // 4, RUN).contiguous())
        if small:
            units.append(small_scale_tiles(integers, multipliers))
        else:
            units.append(unit.reshape(-1, TILE, k // group).permute(0, 2, 1).contiguous())
    return torch.cat(packed), torch.cat(units)
