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

The scales' smaller form (``to_grouped_int4(..., small=True)``, 8da4w_avx2's) is int8
``[N / 16, K / group + 4, 16]``: each tile's group scales as integers of either sign, then 4 rows
of 16 bytes holding its 16 channels' float32 multipliers, ``scale[n, g] = small[n // 16, g, n % 16]
* multiplier[n]``. At groups of 32 and K = 1024 a weight takes 4.28 bits against bfloat16
scales' 4.5 (5% fewer bytes for a decode step to read), and a channel's multiplier is its largest
scale / 127, so each scale is rounded by at most 0.4% of that largest one: far below the codes'
own rounding (a 0.8B program's mean KL at positions 256-510 went from 0.1543 to 0.1540, docs/benchmarks.md
run 39).

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

from gdn_export.ops.grouped_int8_linear import (  # noqa: F401  (fits: this format's too)
    GROUPS, ROWS_PER_BLOCK, TILE, checked_group, define_grouped_linear, fits, round_to_levels)

RUN = 32  # bytes a run: TILE channels x 4 inputs, two codes a byte
CODE_OFFSET = 8  # a code c stands for c - 8
MULTIPLIER_ROWS = 4  # rows of TILE int8 after a tile's small scales: its TILE float32 multipliers



def check_weight(weight, scales) -> tuple[int, int, int]:
    """``(N, K, group)`` of a weight; TypeError / ValueError naming the argument otherwise."""
    for name, tensor, dtypes in (("weight", weight, (torch.uint8,)), ("scales", scales, (torch.bfloat16, torch.int8))):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in dtypes or tensor.dim() != 3:
            got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"gdn.grouped_int4_linear: {name} must be a 3-d {' or '.join(map(str, dtypes))} tensor, "
                            f"got {got}")
    tiles, runs = weight.shape[0], weight.shape[1]
    if weight.shape[2] != RUN:
        raise ValueError(f"gdn.grouped_int4_linear: weight must be [N / {TILE}, K / 4, {RUN}], got {list(weight.shape)}")
    k = 4 * runs
    if scales.dtype == torch.int8:
        if scales.shape[1] <= MULTIPLIER_ROWS:
            raise ValueError(f"gdn.grouped_int4_linear: int8 scales must be [{tiles}, K / group + {MULTIPLIER_ROWS}, "
                             f"{TILE}], got {list(scales.shape)}")
        return TILE * tiles, k, checked_group("grouped_int4_linear", scales[:, :-MULTIPLIER_ROWS], tiles, k)
    return TILE * tiles, k, checked_group("grouped_int4_linear", scales, tiles, k)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """The scales of either form as float32 [tiles, K / group, 16]."""
    if scales.dtype != torch.int8:
        return scales.float()
    small, multipliers = scales[:, :-MULTIPLIER_ROWS], scales[:, -MULTIPLIER_ROWS:]
    multipliers = multipliers.contiguous().view(torch.float32).reshape(-1, 1, TILE)  # the rows' bytes, in order
    return small.float() * multipliers


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


def small_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(integers, multipliers)`` of nonzero ``scales`` [N, G]: int8 [N, G] of either sign and float32 [N], each
    channel's multiplier its largest magnitude / 127, each integer the nearest to scale / multiplier but not 0."""
    multipliers = scales.abs().amax(dim=1) / 127
    integers = torch.round(scales / multipliers[:, None]).clamp_(-127, 127)
    integers = torch.where(integers == 0, torch.sign(scales), integers)
    return integers.to(torch.int8), multipliers.float()


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
            tiles = integers.reshape(-1, TILE, k // group).permute(0, 2, 1)  # [t, K / group, 16]
            tail = multipliers.reshape(-1, TILE).contiguous().view(torch.int8).reshape(-1, MULTIPLIER_ROWS, TILE)
            units.append(torch.cat([tiles, tail], dim=1).contiguous())
        else:
            units.append(unit.reshape(-1, TILE, k // group).permute(0, 2, 1).contiguous())
    return torch.cat(packed), torch.cat(units)
