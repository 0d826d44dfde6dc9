"""``gdn::planes_embedding`` and ``gdn::planes_logits``: one token table for the lookup and the output head.

A tied model's table is read twice in a decode step: one row by the lookup,
all of it by the output head, the step's largest read (254 MB of a 0.8B 8da4w
program's 538 when the head is 8-bit). Here the table is stored once, as 8-bit
codes in two 4-bit planes: the lookup reads both planes, the head only the
high one, so the head streams half the bytes, as a 4-bit weight; or, given
the table's ``fifth`` plane (one bit a weight: each code's fifth bit from the
top), the high plane and that one, as a 5-bit weight.

Format (``to_vocabulary_planes`` writes it): a weight is ``unit * c`` with
``c`` an int8 code and ``unit`` the row's bfloat16 ``row_units`` times a
``group_units`` uint8 per ``group`` weights of the row (one byte a group:
groups of 32, which the KL needs, at the file size the issue allows).
``high`` holds ``(c >> 4) + 8`` (0..15), ``low`` holds ``c & 15``; within each
run of 64 weights of a row, byte ``j`` of a plane holds weight ``j`` in its
low nibble and weight ``32 + j`` in its high nibble. ``fifth`` (``fifth_plane``
writes it from ``low``) holds ``(c >> 3) & 1``, weight ``8 k + i`` of a row in
bit ``i`` of its byte ``k``.

    gdn::planes_embedding(Tensor tokens, Tensor high, Tensor low, Tensor row_units, Tensor group_units) -> Tensor
        tokens [...] int64, high / low [rows, width / 2] uint8, row_units [rows] bfloat16,
        group_units [rows, width / group] uint8 -> [..., width] float32: unit * c
    gdn::planes_logits(Tensor x, Tensor high, Tensor row_units, Tensor group_units, Tensor? fifth=None) -> Tensor
        x [..., width] float32, fifth None or [rows, width / 8] uint8 -> [..., rows] float32: x times the head
        weights, each the middle of the codes its bits stand for: 16 * unit * (high - 8 + 15/32) (16 codes),
        or with ``fifth`` 8 * unit * (2 high + fifth - 16 + 7/16) (8 codes), with each row of x rounded to
        int8 (one max-abs scale), as the kernel reads it

(and ``.out`` forms). ``runtime_ops`` implements both in C++ for CPU programs.
Scored on the 0.8B checkpoint (docs/benchmarks.md), this table and 4-bit head
give a lower KL than the 8-bit row-wise table and head they replace: the
lookup gains a scale per group, the head loses 4 bits where the model is least
sensitive. The 8-bit programs' head reads 5 bits (``16da8w``; run 41).
"""

from __future__ import annotations

import torch

from gdn_export.ops.contract import define_op

GROUP_MULTIPLE = 32  # a group of units holds a multiple of this many weights (half of a run of 64)
HIGH_OFFSET = 8 - 15 / 32  # a high nibble h stands for the codes 16 (h - 8) .. 16 (h - 8) + 15
# With the fifth bit b, v = 2 h + b stands for the codes 8 (v - 16) .. 8 (v - 16) + 7.
FIFTH_OFFSET = 16 - 7 / 16
ROWS_PER_BLOCK = 4096  # the references and the writer work on this many rows at a time (bounded temporaries)

_TABLE = "Tensor high, Tensor low, Tensor row_units, Tensor group_units"
_HEAD = "Tensor high, Tensor row_units, Tensor group_units, Tensor? fifth=None"
EMBEDDING_SCHEMA = f"planes_embedding(Tensor tokens, {_TABLE}) -> Tensor"
EMBEDDING_OUT_SCHEMA = f"planes_embedding.out(Tensor tokens, {_TABLE}, *, Tensor(a!) out) -> Tensor(a!)"
LOGITS_SCHEMA = f"planes_logits(Tensor x, {_HEAD}) -> Tensor"
LOGITS_OUT_SCHEMA = f"planes_logits.out(Tensor x, {_HEAD}, *, Tensor(a!) out) -> Tensor(a!)"


def check_fifth(fifth, rows: int, width: int, op: str) -> None:
    """TypeError naming ``fifth`` unless it is None or a table's fifth plane."""
    if fifth is None:
        return
    if not isinstance(fifth, torch.Tensor) or fifth.dtype != torch.uint8 or list(fifth.shape) != [rows, width // 8]:
        got = f"{fifth.dtype} {list(fifth.shape)}" if isinstance(fifth, torch.Tensor) else type(fifth).__name__
        raise TypeError(f"gdn.{op}: fifth must be None or a uint8 tensor [{rows}, {width // 8}], got {got}")


def check_planes(high, low, row_units, group_units, op: str) -> tuple[int, int, int]:
    """``(rows, width, group)`` of a table; TypeError / ValueError naming the argument otherwise."""
    named = (("high", high, torch.uint8, 2), ("low", low, torch.uint8, 2), ("row_units", row_units, torch.bfloat16, 1),
             ("group_units", group_units, torch.uint8, 2))
    for name, tensor, dtype, dims in named:
        if tensor is None and name == "low":
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tensor.dim() != dims:
            got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"gdn.{op}: {name} must be a {dims}-d {dtype} tensor, got {got}")
    rows, width = high.shape[0], 2 * high.shape[1]
    if low is not None and low.shape != high.shape:
        raise ValueError(f"gdn.{op}: low must have high's shape {list(high.shape)}, got {list(low.shape)}")
    if row_units.shape[0] != rows:
        raise ValueError(f"gdn.{op}: row_units must be [{rows}], got {list(row_units.shape)}")
    groups = group_units.shape[1]
    if (group_units.shape[0] != rows or width % 64 or groups == 0 or width % groups
            or (width // groups) % GROUP_MULTIPLE):
        raise ValueError(f"gdn.{op}: width {width} must be a multiple of 64 and group_units [{rows}, groups] with "
                         f"groups of a multiple of {GROUP_MULTIPLE} weights, got {list(group_units.shape)}")
    return rows, width, width // groups


def _units(row_units, group_units, group: int) -> torch.Tensor:
    """[rows, width] float32: each weight's unit."""
    return (row_units.float()[:, None] * group_units.float()).repeat_interleave(group, dim=1)


def _nibbles(plane: torch.Tensor) -> torch.Tensor:
    """[rows, width / 2] uint8 -> [rows, width] int32 nibbles in weight order."""
    runs = plane.reshape(plane.shape[0], -1, 32).to(torch.int32)
    return torch.cat([runs & 15, runs >> 4], dim=-1).reshape(plane.shape[0], -1)


def _pack(nibbles: torch.Tensor) -> torch.Tensor:
    """``_nibbles``' inverse: [rows, width] values in 0..15 -> [rows, width / 2] uint8."""
    runs = nibbles.reshape(nibbles.shape[0], -1, 2, 32).to(torch.uint8)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(nibbles.shape[0], -1)


def _codes(high, low) -> torch.Tensor:
    return ((_nibbles(high) - 8) << 4) | _nibbles(low)


def reference_planes_embedding(tokens, high, low, row_units, group_units):
    rows, width, group = check_planes(high, low, row_units, group_units, "planes_embedding")
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
        raise TypeError(f"gdn.planes_embedding: tokens must be an int64 tensor, got {tokens!r}")
    flat = tokens.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= rows):
        raise ValueError(f"gdn.planes_embedding: tokens must lie in [0, {rows}), got {flat.min()}..{flat.max()}")
    values = _codes(high[flat], low[flat]).float() * _units(row_units[flat], group_units[flat], group)
    return values.reshape(*tokens.shape, width)


def round_to_levels(x: torch.Tensor, largest: int) -> torch.Tensor:
    """``x`` rounded as our kernels read it: integers in [-largest, largest] with one max-abs scale along the
    last dim, each value times the scale's float32 reciprocal rounded to the nearest (ties to even), so the
    kernel's integers are these (a quotient x / scale rounds the other way at some near-ties)."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True) / largest
    inverse = torch.where(scale > 0, 1 / torch.where(scale > 0, scale, 1), 0)
    return torch.round(x * inverse).clamp(-largest, largest) * scale


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the head's kernel reads it: int8 with one max-abs scale along the last dim."""
    return round_to_levels(x, 127)


def head_weights(high, row_units, group_units, start: int = 0, stop=None, fifth=None) -> torch.Tensor:
    """Rows ``start:stop`` of the head's float weights (4-bit, or 5-bit with the ``fifth`` plane)."""
    group = 2 * high.shape[1] // group_units.shape[1]
    nibbles = _nibbles(high[start:stop]).float()
    units = _units(row_units[start:stop], group_units[start:stop], group)
    if fifth is None:
        return 16 * (nibbles - HIGH_OFFSET) * units
    return 8 * (2 * nibbles + _bits(fifth[start:stop]) - FIFTH_OFFSET) * units


def _bits(plane: torch.Tensor) -> torch.Tensor:
    """[rows, width / 8] uint8 -> [rows, width] float32: bit i of byte k is value 8 k + i."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((plane[..., None] >> shifts) & 1).reshape(plane.shape[0], -1).float()


def fifth_plane(low: torch.Tensor) -> torch.Tensor:
    """The ``fifth`` plane of a table from its ``low`` plane: each code's bit 3, eight weights a byte. Made
    ``ROWS_PER_BLOCK`` rows at a time: the 0.8B table's nibbles at once (int32, 1 GiB) raised its 16da8w
    export's peak by 1.1 GiB."""
    fifth = torch.empty(low.shape[0], low.shape[1] // 4, dtype=torch.uint8)
    for start in range(0, low.shape[0], ROWS_PER_BLOCK):
        block = low[start:start + ROWS_PER_BLOCK]
        bits = (_nibbles(block) >> 3).reshape(block.shape[0], -1, 8).to(torch.uint8)
        fifth[start:start + ROWS_PER_BLOCK] = (bits << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
    return fifth


def reference_planes_logits(x, high, row_units, group_units, fifth=None):
    rows, width, _ = check_planes(high, None, row_units, group_units, "planes_logits")
    check_fifth(fifth, rows, width, "planes_logits")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != width:
        raise TypeError(f"gdn.planes_logits: x must be float32 [..., {width}], got {x!r}")
    read = round_activations(x).reshape(-1, width)
    logits = torch.cat([read @ head_weights(high, row_units, group_units, start, start + ROWS_PER_BLOCK, fifth).T
                        for start in range(0, rows, ROWS_PER_BLOCK)], dim=1)
    return logits.reshape(*x.shape[:-1], rows)


def _copied_into(out, result, op: str):
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(f"gdn.{op}.out: out must be {list(result.shape)} {result.dtype}, got {list(out.shape)} {out.dtype}")
    return out.copy_(result)


def reference_planes_embedding_out(tokens, high, low, row_units, group_units, *, out):
    return _copied_into(out, reference_planes_embedding(tokens, high, low, row_units, group_units), "planes_embedding")


def reference_planes_logits_out(x, high, row_units, group_units, fifth=None, *, out):
    return _copied_into(out, reference_planes_logits(x, high, row_units, group_units, fifth), "planes_logits")


def _fake_embedding(tokens, high, low, row_units, group_units):
    _, width, _ = check_planes(high, low, row_units, group_units, "planes_embedding")
    return tokens.new_empty((*tokens.shape, width), dtype=torch.float32)


def _fake_logits(x, high, row_units, group_units, fifth=None):
    rows, width, _ = check_planes(high, None, row_units, group_units, "planes_logits")
    check_fifth(fifth, rows, width, "planes_logits")
    if x.shape[-1] != width:
        raise TypeError(f"gdn.planes_logits: x must be float32 [..., {width}], got {list(x.shape)}")
    return x.new_empty((*x.shape[:-1], rows), dtype=torch.float32)


define_op(EMBEDDING_SCHEMA, reference_planes_embedding, _fake_embedding)
define_op(EMBEDDING_OUT_SCHEMA, reference_planes_embedding_out,
          lambda tokens, high, low, row_units, group_units, *, out: out)
define_op(LOGITS_SCHEMA, reference_planes_logits, _fake_logits)
define_op(LOGITS_OUT_SCHEMA, reference_planes_logits_out,
          lambda x, high, row_units, group_units, fifth=None, *, out: out)


def to_vocabulary_planes(weight: torch.Tensor, group: int = 32):
    """``(high, low, row_units, group_units)`` of a float table [rows, width] (width a multiple of 64, ``group``
    a multiple of 32 dividing it).

    A group's unit is the smallest that no code clips (its largest magnitude / 127.5), rounded up to the
    row's grid (the row's unit, 1/255 of its largest group's unit, rounded up to bfloat16). A unit fitted to
    the head's 4-bit weights instead scored a higher KL: the lookup's 8 bits count for more.
    """
    rows, width = weight.shape
    if width % 64 or group % GROUP_MULTIPLE or width % group:
        raise ValueError(f"to_vocabulary_planes: width {width} must be a multiple of 64 and group {group} a multiple "
                         f"of {GROUP_MULTIPLE} dividing it")
    # Written into tensors of the whole table's size, made first: a block's results kept between its temporaries
    # left the freed temporaries' memory in pieces too small to reuse, and the 0.8B table's conversion grew the
    # process by 1.2 GiB.
    high = torch.empty(rows, width // 2, dtype=torch.uint8)
    low = torch.empty(rows, width // 2, dtype=torch.uint8)
    row_units = torch.empty(rows, dtype=torch.bfloat16)
    group_units = torch.empty(rows, width // group, dtype=torch.uint8)
    for start in range(0, rows, ROWS_PER_BLOCK):
        stop = min(start + ROWS_PER_BLOCK, rows)
        groups = weight[start:stop].float().reshape(-1, width // group, group)
        smallest = groups.abs().amax(-1) / 127.5  # [rows, groups]
        row_unit = bfloat16_at_least(smallest.amax(-1) / 255)  # [rows]
        steps = torch.ceil(smallest / torch.where(row_unit > 0, row_unit, 1)[:, None]).clamp_(0, 255)
        unit = (row_unit[:, None] * steps)[..., None]
        codes = torch.round(groups / torch.where(unit > 0, unit, 1)).clamp_(-128, 127).to(torch.int32)
        codes = codes.reshape(-1, width)
        high[start:stop] = _pack((codes >> 4) + 8)
        low[start:stop] = _pack(codes & 15)
        row_units[start:stop] = row_unit
        group_units[start:stop] = steps
    return high, low, row_units, group_units


def bfloat16_at_least(values: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 values >= ``values`` (float32, >= 0, finite), as float32."""
    bits = values.contiguous().view(torch.int32)
    return ((bits + 0xFFFF) & -0x10000).view(torch.float32)
