"""``gdn::grouped_int8_linear``: a linear layer with int8 weights in groups of 32, activations kept near float.

The 8-bit programs XNNPACK can run give each output channel one int8 scale
(``int8wo``, ``8da8w``). On the 0.8B shape that scale, over 1024 to 3584
weights, costs most of their KL against fp32: with everything else equal, a
bfloat16 scale per 32 weights (llama.cpp's Q8_0 block) took the mean KL from
0.00342 to 0.00218, under Q8_0's 0.0026 (docs/benchmarks.md). No XNNPACK
kernel takes int8 weights in groups, so this op has its own.

Format (``to_grouped_int8`` writes it): ``W[n, k] = code[n, k] * scale[n, k // group]``,
codes in [-127, 127], scales bfloat16, ``group`` a multiple of 32 up to 256 dividing
``K``. The codes are stored in tiles of 16 output channels, the two codes of each
pair of inputs side by side: ``weight[n // 16, k // 2, n % 16, k % 2]``; the
scales as ``scales[n // 16, k // group, n % 16]``. A kernel then reads one run of
32 bytes for 16 outputs and 2 inputs, and one run of 16 scales a group.

The scales' smaller form (``to_grouped_int8(..., small=True)``, what exports write) is int8
``[N / 16, K / group + 4, 16]``: each tile's group scales as integers, then 4 rows of 16 bytes
holding its 16 channels' float32 multipliers, ``scale[n, g] = small[n // 16, g, n % 16] *
multiplier[n]`` (``tile_scales``; ``gdn::grouped_int4_linear`` takes the same form). At groups of 32
and K = 1024 a weight takes 8.28 bits against bfloat16 scales' 8.5: 2.6% fewer bytes for a decode
step to read. Each integer is the smallest that no code clips at (``small_scales(at_least=True)``),
so a group's unit is up to one multiplier (its channel's largest scale / 127) coarser than its
largest weight asks; on the 0.8B checkpoint's matrices that raised the weights' squared error by
2% to 3% over bfloat16 scales.

    gdn::grouped_int8_linear(Tensor x, Tensor weight, Tensor scales, *, <FUSED_ARGS>) -> Tensor
        x [..., K] float32, weight [N / 16, K / 2, 16, 2] int8, scales [N / 16, K / group, 16] bfloat16
        (or int8 [N / 16, K / group + 4, 16], the smaller form above)
        -> [..., N] float32: x times W^T, with each row of x rounded to int16 (one max-abs scale),
        as the kernel reads it (a relative error of 2^-16 of the row's largest value)

(and a ``.out`` form). ``runtime_ops`` implements it in C++ for CPU programs.

``FUSED_ARGS``, the optional keyword arguments of both grouped linears (this and ``gdn::grouped_int4_linear``),
are the work a decoder layer does around its products (``gdn_export.passes.layer_fusion``):

    norm_weight [K] float32, norm_eps: x [..., K] is first normalized as Qwen3.5's RMSNorm does,
        x * rsqrt(mean(x², -1) + norm_eps) * (1 + norm_weight)
    gated: x is [..., 2K], an MLP's gate and up projections side by side, and the product reads
        silu(x[..., :K]) * x[..., K:]
    residual [..., N] float32: added to the output

(at most one of norm_weight and gated). In a CPU program each was a few XNNPACK ops in a delegate call of
their own, or a copy: a 0.8B 8da4w_avx2 decode step made 116 delegate calls before and 43 with these, and ran
1.075x as fast (docs/benchmarks.md, run 38). Programs exported before these arguments still run: the kernels take
both forms of the call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.contract import define_op
from gdn_export.ops.vocabulary_planes import bfloat16_at_least, round_to_levels

TILE = 16  # output channels per tile
MULTIPLIER_ROWS = 4  # rows of TILE int8 after a tile's small scales: its TILE float32 multipliers
GROUPS = (32, 64, 128, 256)  # group sizes the kernel takes (int32 sums of a group of int16 x int8 cannot overflow)
ROWS_PER_BLOCK = 4096  # the reference and the writer work on this many output channels at a time



def check_weight(weight, scales) -> tuple[int, int, int]:
    """``(N, K, group)`` of a weight; TypeError / ValueError naming the argument otherwise."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.int8 or weight.dim() != 4:
        got = f"{weight.dtype} {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(f"gdn.grouped_int8_linear: weight must be a 4-d torch.int8 tensor, got {got}")
    check_scales_type("grouped_int8_linear", scales)
    tiles, pairs = weight.shape[0], weight.shape[1]
    if tuple(weight.shape[2:]) != (TILE, 2):
        raise ValueError(f"gdn.grouped_int8_linear: weight must be [N / {TILE}, K / 2, {TILE}, 2], "
                         f"got {list(weight.shape)}")
    k = 2 * pairs
    return TILE * tiles, k, checked_group("grouped_int8_linear", scales, tiles, k)


def check_scales_type(name: str, scales) -> None:
    """TypeError naming ``scales`` unless it is a 3-d bfloat16 or int8 (the smaller form) tensor."""
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.bfloat16, torch.int8) or scales.dim() != 3:
        got = f"{scales.dtype} {list(scales.shape)}" if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise TypeError(f"gdn.{name}: scales must be a 3-d torch.bfloat16 or torch.int8 tensor, got {got}")


def checked_group(name: str, scales: torch.Tensor, tiles: int, k: int) -> int:
    """The group size of a grouped format's ``scales`` [tiles, K / group, 16] (or, int8, the smaller form's
    [tiles, K / group + 4, 16]; this module's and ``grouped_int4_linear``'s); ValueError naming the argument
    otherwise."""
    if scales.dtype == torch.int8:
        if scales.shape[1] <= MULTIPLIER_ROWS:
            raise ValueError(f"gdn.{name}: int8 scales must be [{tiles}, K / group + {MULTIPLIER_ROWS}, {TILE}], "
                             f"got {list(scales.shape)}")
        scales = scales[:, :-MULTIPLIER_ROWS]
    groups = scales.shape[1]
    if (scales.shape[0] != tiles or scales.shape[2] != TILE or groups == 0 or k % groups
            or k // groups not in GROUPS):
        raise ValueError(f"gdn.{name}: scales must be [{tiles}, K / group, {TILE}] with K = {k} and "
                         f"group one of {GROUPS}, got {list(scales.shape)}")
    return k // groups


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernel reads it: int16 (``round_to_levels``)."""
    return round_to_levels(x, 32767)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """The scales of either form as float32 [tiles, K / group, 16]."""
    if scales.dtype != torch.int8:
        return scales.float()
    small, multipliers = scales[:, :-MULTIPLIER_ROWS], scales[:, -MULTIPLIER_ROWS:]
    multipliers = multipliers.contiguous().view(torch.float32).reshape(-1, 1, TILE)  # the rows' bytes, in order
    return small.float() * multipliers


def small_scales(scales: torch.Tensor, at_least: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(integers, multipliers)`` of ``scales`` [N, G]: int8 [N, G] of either sign and float32 [N], each
    channel's multiplier its largest magnitude / 127 (1 for a channel of zeros), each integer the nearest to
    scale / multiplier but not 0 where the scale is not; ``at_least``: the smallest of magnitude at least
    that (for positive scales, so that no code clips)."""
    multipliers = scales.abs().amax(dim=1) / 127
    multipliers = torch.where(multipliers > 0, multipliers, 1.0)
    ratios = scales / multipliers[:, None]
    # at_least: a ratio a rounding error above an integer (127.00001 for the channel's largest) stays that integer;
    # its largest code then rounds to 127 all the same.
    integers = (torch.ceil(ratios - 1e-4) if at_least else torch.round(ratios)).clamp_(-127, 127)
    integers = torch.where(integers == 0, torch.sign(scales), integers)
    return integers.to(torch.int8), multipliers.float()


def small_scale_tiles(integers: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """The smaller form [N / 16, G + 4, 16] of ``small_scales``' ``(integers, multipliers)``."""
    tiles = integers.reshape(-1, TILE, integers.shape[1]).permute(0, 2, 1)  # [t, G, 16]
    tail = multipliers.reshape(-1, TILE).contiguous().view(torch.int8).reshape(-1, MULTIPLIER_ROWS, TILE)
    return torch.cat([tiles, tail], dim=1).contiguous()


def float_weight(weight, scales, start: int = 0, stop=None) -> torch.Tensor:
    """Output channels ``start:stop`` (multiples of 16) of ``W`` [N, K], in float32."""
    _, k, group = check_weight(weight, scales)
    tiles = slice(start // TILE, None if stop is None else -(-stop // TILE))
    codes = weight[tiles].permute(0, 2, 1, 3).reshape(-1, k).float()  # [n, k]
    units = tile_scales(scales[tiles]).permute(0, 2, 1).reshape(-1, k // group).repeat_interleave(group, dim=1)
    return codes * units


# The optional work around the product (see the module's docstring), keyword arguments of both grouped linears.
FUSED_ARGS = "Tensor? norm_weight=None, float norm_eps=1e-6, bool gated=False, Tensor? residual=None"


def fused_input(name: str, x: torch.Tensor, k: int, norm_weight, norm_eps: float, gated: bool) -> torch.Tensor:
    """What the product reads of ``x``: ``x`` [..., k] itself; through Qwen3.5's RMSNorm of weight
    ``(1 + norm_weight)``; or, ``gated``, ``silu(gate) * up`` of ``x`` [..., 2k] (the model's own ops, so an eager
    model computes the same floats). TypeError naming the argument for an ``x`` of the wrong width."""
    if norm_weight is not None and gated:
        raise TypeError(f"gdn.{name}: norm_weight and gated cannot both be given")
    width = 2 * k if gated else k
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != width:
        got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"gdn.{name}: x must be float32 [..., {width}]{' (gated)' if gated else ''}, got {got}")
    if gated:
        return F.silu(x[..., :k]) * x[..., k:]
    if norm_weight is None:
        return x
    check_fused_argument(name, "norm_weight", norm_weight, [k])
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps) * (1.0 + norm_weight)


def check_fused_argument(name: str, argument: str, tensor, shape: list) -> None:
    """TypeError naming ``argument`` unless ``tensor`` is a float32 tensor of ``shape``."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or list(tensor.shape) != list(shape):
        got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"gdn.{name}: {argument} must be float32 {list(shape)}, got {got}")


def define_grouped_linear(name: str, check_weight, round_activations, float_weight):
    """Define ``gdn::<name>(Tensor x, Tensor weight, Tensor scales, *, <FUSED_ARGS>) -> Tensor`` and its
    ``.out`` form for a grouped weight format (this module's and ``grouped_int4_linear``'s): the reference is
    what the product reads of ``x`` (``fused_input``) as the kernel reads it (``round_activations``) times the
    float weight (``float_weight``), a block of output channels at a time, plus ``residual``. Returns the two
    references."""

    def reference(x, weight, scales, *, norm_weight=None, norm_eps=1e-6, gated=False, residual=None):
        n, k, _ = check_weight(weight, scales)
        read = fused_input(name, x, k, norm_weight, norm_eps, gated)
        if residual is not None:
            check_fused_argument(name, "residual", residual, [*x.shape[:-1], n])
        read = round_activations(read).reshape(-1, k)
        y = torch.cat([read @ float_weight(weight, scales, start, start + ROWS_PER_BLOCK).T
                       for start in range(0, n, ROWS_PER_BLOCK)], dim=1)
        y = y.reshape(*x.shape[:-1], n)
        return y if residual is None else y + residual

    def reference_out(x, weight, scales, *, norm_weight=None, norm_eps=1e-6, gated=False, residual=None, out):
        result = reference(x, weight, scales, norm_weight=norm_weight, norm_eps=norm_eps, gated=gated,
                           residual=residual)
        if out.shape != result.shape or out.dtype != result.dtype:
            raise ValueError(f"gdn.{name}.out: out must be {list(result.shape)} {result.dtype}, "
                             f"got {list(out.shape)} {out.dtype}")
        return out.copy_(result)

    def fake(x, weight, scales, *, norm_weight=None, norm_eps=1e-6, gated=False, residual=None):
        n, k, _ = check_weight(weight, scales)
        if x.shape[-1] != (2 * k if gated else k):
            raise TypeError(f"gdn.{name}: x must be float32 [..., {2 * k if gated else k}], got {list(x.shape)}")
        if gated and norm_weight is not None:
            raise TypeError(f"gdn.{name}: norm_weight and gated cannot both be given")
        if norm_weight is not None and list(norm_weight.shape) != [k]:
            raise TypeError(f"gdn.{name}: norm_weight must be float32 [{k}], got {list(norm_weight.shape)}")
        if residual is not None and residual.shape[-1] != n:
            raise TypeError(f"gdn.{name}: residual must be float32 [..., {n}], got {list(residual.shape)}")
        return x.new_empty((*x.shape[:-1], n), dtype=torch.float32)

    define_op(f"{name}(Tensor x, Tensor weight, Tensor scales, *, {FUSED_ARGS}) -> Tensor", reference, fake)
    define_op(f"{name}.out(Tensor x, Tensor weight, Tensor scales, *, {FUSED_ARGS}, Tensor(a!) out) -> Tensor(a!)",
              reference_out, lambda x, weight, scales, *, out, **fused: out)
    return reference, reference_out


reference_grouped_int8_linear, reference_grouped_int8_linear_out = define_grouped_linear(
    "grouped_int8_linear", check_weight, round_activations, float_weight)


def fits(out_features: int, in_features: int, group: int = 32) -> bool:
    """Whether a linear of this shape can be stored in this format (and in ``grouped_int4_linear``'s)."""
    return out_features % TILE == 0 and group in GROUPS and in_features % group == 0


def to_grouped_int8(weight: torch.Tensor, group: int = 32, small: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, scales)`` of a float weight [N, K] (``fits(N, K, group)``).

    A group's scale is the smallest bfloat16 no code clips at (its largest magnitude / 127, rounded up), or,
    ``small``, the smallest of the int8 form (``small_scales(at_least=True)``), so every code is the nearest of
    [-127, 127]."""
    n, k = weight.shape
    if not fits(n, k, group):
        raise ValueError(f"to_grouped_int8: weight [{n}, {k}] needs N a multiple of {TILE} and K of the group "
                         f"{group} (one of {GROUPS})")
    codes, scales = [], []
    for start in range(0, n, ROWS_PER_BLOCK):
        groups = weight[start:start + ROWS_PER_BLOCK].detach().float().reshape(-1, k // group, group)
        largest = groups.abs().amax(-1) / 127  # [rows, k / group]
        if small:
            integers, multipliers = small_scales(largest, at_least=True)
            scale = integers.float() * multipliers[:, None]  # as the reference's tile_scales computes it
        else:
            scale = bfloat16_at_least(largest)
        code = torch.round(groups / torch.where(scale > 0, scale, 1)[..., None]).clamp_(-127, 127).to(torch.int8)
        codes.append(code.reshape(-1, TILE, k // 2, 2).permute(0, 2, 1, 3).contiguous())
        if small:
            scales.append(small_scale_tiles(integers, multipliers))
        else:
            scales.append(scale.to(torch.bfloat16).reshape(-1, TILE, k // group).permute(0, 2, 1).contiguous())
    return torch.cat(codes), torch.cat(scales)
