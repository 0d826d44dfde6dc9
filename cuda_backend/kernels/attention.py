"""Causal attention of the new tokens over the KV caches: ``gdn::cached_attention``.

The model's own form multiplies every query against the whole cache and masks
the tail, so a prefill chunk of 2048 tokens at the start of a 8320-position
cache does four times the work it needs and writes a [G*T, S] score matrix per
KV head. These kernels read the position from ``input_pos`` on the device and
walk the cache only up to the last position a block of rows can see, with an
online softmax in registers (no score matrix in memory). Nothing is read back
to the host, so a decode step stays capturable as a CUDA graph.

Rows: the G = Hq / Hkv query heads that share one KV head, token-major (row r
is token r // G of query head kv * G + r % G), so a block of rows spans
consecutive tokens and its walk ends at their last position.

* One pass (prefill): a program owns BM rows of one KV head and walks the cache
  from 0, writing the normalized output. The tiles before its first row's
  position, which every row sees, skip the causal mask and the bounds checks.
* Split (decode: a few rows, few programs): the cache is cut into spans of
  ``span`` positions; a program walks one span and writes its partial output
  (normalized over the span, fp32) and log2-sum-exp to scratch, and ``merge_spans_kernel``
  weighs the spans together. Spans past the last visible position write an
  empty partial (log2-sum-exp -inf) and stop at once.
"""

import triton
import triton.language as tl

from cuda_backend.kernels.common import dot_fp32, narrow

# Start of the running row maximum: finite, so a row that sees no position of a span keeps
# exp2(-inf - start) = 0 instead of exp2(-inf + inf) = NaN.
NO_MAXIMUM = tl.constexpr(-1.0e30)


@triton.jit
def _attend_tile(q, k_base, v_base, col0, high, position, acc, row_max, row_sum, scale_log2, d, d_ok,
                 sk_d, sk_s, sv_s, sv_d, BN: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                 MASKED: tl.constexpr):
    """One tile of BN cache positions into the online softmax; ``MASKED``: the tile may reach past a
    row's position or past ``high``."""
    cols = col0 + tl.arange(0, BN)
    col_ok = cols < high
    if MASKED:
        keys = tl.load(k_base + d[:, None] * sk_d + cols[None, :] * sk_s,
                       mask=d_ok[:, None] & col_ok[None, :], other=0.0).to(q.dtype)
    else:
        keys = tl.load(k_base + d[:, None] * sk_d + cols[None, :] * sk_s, mask=d_ok[:, None], other=0.0).to(q.dtype)
    scores = (dot_fp32(q, keys, DOT_PRECISION, WIDEN) * scale_log2).to(tl.float32)  # AOTInductor: fp64 scale
    if MASKED:
        # Causal. (A span is a whole number of tiles, so no tile reaches into the next span.)
        scores = tl.where(cols[None, :] <= position[:, None], scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    weights = tl.exp2(scores - new_max[:, None])
    rescale = tl.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(weights, 1)
    if MASKED:
        values = tl.load(v_base + cols[:, None] * sv_s + d[None, :] * sv_d,
                         mask=col_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
    else:
        values = tl.load(v_base + cols[:, None] * sv_s + d[None, :] * sv_d, mask=d_ok[None, :], other=0.0).to(q.dtype)
    acc = acc * rescale[:, None] + dot_fp32(narrow(weights, q.dtype, WIDEN), values, DOT_PRECISION, WIDEN)
    return acc, new_max, row_sum


@triton.jit
def cached_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, part_ptr, lse_ptr,
    length, span, scale_log2,
    sq_h, sq_t, sq_d,
    sk_h, sk_d, sk_s,
    sv_h, sv_s, sv_d,
    so_h, so_t, so_d,
    sp_split, sp_h, sp_t, sp_d,
    sl_split, sl_h, sl_t,
    GROUP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(pos_ptr)

    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < length * GROUP
    # Rows past the last token repeat it (their results are not stored), so every row sees position 0.
    token = tl.minimum(rows // GROUP, length - 1)
    head = kv_head * GROUP + rows % GROUP
    position = start + token
    d = tl.arange(0, BD)
    d_ok = d < D

    q = tl.load(q_ptr + head[:, None] * sq_h + token[:, None] * sq_t + d[None, :] * sq_d,
                mask=d_ok[None, :], other=0.0)
    # The block's last visible position bounds the walk; a span starts at split * span.
    last_token = tl.minimum((pid_m * BM + BM - 1) // GROUP, length - 1)
    low = split * span
    high = start + last_token + 1
    if SPLIT:
        high = tl.minimum(high, low + span)

    k_base = k_ptr + kv_head * sk_h
    v_base = v_ptr + kv_head * sv_h
    row_max = tl.full([BM], NO_MAXIMUM, tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    # Tiles before the block's first position are visible to every row: no causal mask, no bounds
    # (most of a long prompt's walk); the tiles from there to ``high`` are masked.
    first_position = start + tl.minimum((pid_m * BM) // GROUP, length - 1)
    unmasked_end = low + tl.maximum(tl.minimum(first_position + 1, high) - low, 0) // BN * BN
    for col0 in range(low, unmasked_end, BN):
        acc, row_max, row_sum = _attend_tile(
            q, k_base, v_base, col0, high, position, acc, row_max, row_sum, scale_log2, d, d_ok,
            sk_d, sk_s, sv_s, sv_d, BN, DOT_PRECISION, WIDEN, False)
    for col0 in range(unmasked_end, high, BN):
        acc, row_max, row_sum = _attend_tile(
            q, k_base, v_base, col0, high, position, acc, row_max, row_sum, scale_log2, d, d_ok,
            sk_d, sk_s, sv_s, sv_d, BN, DOT_PRECISION, WIDEN, True)

    seen = row_sum > 0.0
    output = acc / tl.where(seen, row_sum, 1.0)[:, None]
    store_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        part_offsets = split * sp_split + head[:, None] * sp_h + token[:, None] * sp_t + d[None, :] * sp_d
        tl.store(part_ptr + part_offsets, output, mask=store_mask)
        log_sum = tl.where(seen, row_max + tl.log2(tl.where(seen, row_sum, 1.0)), float("-inf"))
        tl.store(lse_ptr + split * sl_split + head * sl_h + token * sl_t, log_sum, mask=row_ok)
    else:
        out_offsets = head[:, None] * so_h + token[:, None] * so_t + d[None, :] * so_d
        tl.store(out_ptr + out_offsets, output.to(out_ptr.dtype.element_ty), mask=store_mask)


@triton.jit
def merge_spans_kernel(
    part_ptr, lse_ptr, out_ptr,
    length,
    sp_split, sp_h, sp_t, sp_d,
    sl_split, sl_h, sl_t,
    so_h, so_t, so_d,
    SPLITS: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
):
    """One (query head, token) row: the spans' partial outputs weighted by their share of the softmax sum."""
    pid = tl.program_id(0)
    head = pid // length
    token = pid % length
    spans = tl.arange(0, BS)
    span_ok = spans < SPLITS
    d = tl.arange(0, BD)
    d_ok = d < D
    log_sums = tl.load(lse_ptr + spans * sl_split + head * sl_h + token * sl_t, mask=span_ok, other=float("-inf"))
    # Span 0 holds position 0, which every row sees: the maximum is finite.
    weights = tl.exp2(log_sums - tl.max(log_sums, 0))
    parts = tl.load(part_ptr + spans[:, None] * sp_split + head * sp_h + token * sp_t + d[None, :] * sp_d,
                    mask=span_ok[:, None] & d_ok[None, :], other=0.0)
    output = tl.sum(weights[:, None] * parts, 0) / tl.sum(weights, 0)
    tl.store(out_ptr + head * so_h + token * so_t + d * so_d, output.to(out_ptr.dtype.element_ty), mask=d_ok)
