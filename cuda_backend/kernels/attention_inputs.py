"""A full-attention layer's decode prologue: one token's q and k normed and rotated, k and v into the caches.

Between the layer's merged q/k/v projection and its attention, the model's form
is the q and k RMSNorms, the rotary embedding of both, and two ``index_put``
writes into the caches. AOTInductor compiled those into seven small kernels a
layer (two reductions, four pointwise kernels that each recomputed cos/sin from
the position, one cache write), a few microseconds each in a step whose
weights take about 1.2 ms to stream; given cos and sin as tensors, it still
computed them in two kernels of their own a layer. Here each program computes
the rotary angles from the position itself and takes one head of the
projection's output as it lies (``[q_0 | gate_0 | q_1 | gate_1 | ... | k | v]``,
read in place): a query head's program writes that head's normed, rotated query;
a KV head's program writes its normed, rotated key and its value into the
caches at the token's position, read from ``input_pos`` on the device.
"""

import triton
import triton.language as tl


@triton.jit
def _rms_normed(x, weight, scale):
    """x * scale * (1 + weight), in fp32 after rounding to x's dtype, as the model's RMSNorm returns it
    (``type_as(x)``) before the rotary embedding reads it."""
    return (x.to(tl.float32) * scale * (1.0 + weight.to(tl.float32))).to(x.dtype).to(tl.float32)


@triton.jit
def _rotary(position, log2_theta, dtype, BD: tl.constexpr, ROTARY: tl.constexpr):
    """(cos, sin) [BD] of the rotary angles at ``position`` as the model's ``rotary_embedding`` makes them for
    its first ROTARY channels (halves layout: channel c turns at theta^(-2 (c mod ROTARY / 2) / ROTARY)),
    rounded to ``dtype`` as it returns them; cos 1 and sin 0 past ROTARY."""
    d = tl.arange(0, BD)
    half: tl.constexpr = ROTARY // 2
    # AOTInductor passes float arguments as fp64: the exponent is cast to fp32.
    inverse_frequency = tl.exp2((-(2 * (d % half)).to(tl.float32) / ROTARY * log2_theta).to(tl.float32))
    angle = position.to(tl.float32) * inverse_frequency
    rotating = d < ROTARY
    cos = tl.where(rotating, tl.cos(angle).to(dtype).to(tl.float32), 1.0)
    sin = tl.where(rotating, tl.sin(angle).to(dtype).to(tl.float32), 0.0)
    return cos, sin


@triton.jit
def _normed_and_rotated(x_ptr, weight_ptr, cos, sin, eps, D: tl.constexpr, BD: tl.constexpr,
                        ROTARY: tl.constexpr):
    """One head [D] at ``x_ptr``: Qwen3.5's RMSNorm over D channels, then the rotary embedding (``cos``,
    ``sin`` from ``_rotary``) of its first ROTARY channels (halves layout: channel c < ROTARY / 2 pairs with
    c + ROTARY / 2), the rest passed."""
    d = tl.arange(0, BD)
    d_ok = d < D
    x = tl.load(x_ptr + d, mask=d_ok, other=0.0)
    x32 = x.to(tl.float32)
    # AOTInductor passes float arguments as fp64: the scale is cast back to fp32.
    scale = tl.rsqrt((tl.sum(x32 * x32, 0) / D + eps).to(tl.float32))
    normed = _rms_normed(x, tl.load(weight_ptr + d, mask=d_ok, other=0.0), scale)
    # rotate_half's partner of each rotated channel, loaded again (registers cannot be permuted).
    half: tl.constexpr = ROTARY // 2
    rotating = d < ROTARY
    partner = tl.where(d < half, d + half, d - half)
    partner_normed = _rms_normed(tl.load(x_ptr + partner, mask=rotating, other=0.0),
                                 tl.load(weight_ptr + partner, mask=rotating, other=0.0), scale)
    rotated = normed * cos + tl.where(d < half, -partner_normed, partner_normed) * sin
    return tl.where(rotating, rotated, normed)


@triton.jit
def decode_attention_inputs_kernel(
    projected_ptr, q_norm_ptr, k_norm_ptr, position_ptr, query_ptr, k_cache_ptr, v_cache_ptr,
    eps, log2_theta, k_start, v_start, max_len,
    skc_h, skc_d, skc_s, svc_h, svc_s, svc_d,
    NUM_HEADS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, ROTARY: tl.constexpr,
):
    """Programs 0 .. NUM_HEADS - 1: query head h, from [q_h | gate_h] at h * 2D, into ``query`` [NUM_HEADS, D]
    (dense). Then one program per KV head j: its key (at ``k_start`` + j * D) into k_cache [Hkv, D, S] and its
    value (at ``v_start`` + j * D) into v_cache [Hkv, S, D], both at the position; a position past the caches
    writes nothing (the model's index_put would fail the call)."""
    head = tl.program_id(0)
    d = tl.arange(0, BD)
    d_ok = d < D
    position = tl.load(position_ptr)
    cos, sin = _rotary(position, log2_theta, projected_ptr.dtype.element_ty, BD, ROTARY)
    if head < NUM_HEADS:
        query = _normed_and_rotated(projected_ptr + head * 2 * D, q_norm_ptr, cos, sin, eps, D, BD, ROTARY)
        tl.store(query_ptr + head * D + d, query.to(query_ptr.dtype.element_ty), mask=d_ok)
    else:
        kv_head = head - NUM_HEADS
        in_cache = d_ok & (tl.zeros([BD], tl.int64) + position < max_len)
        key = _normed_and_rotated(projected_ptr + k_start + kv_head * D, k_norm_ptr, cos, sin, eps, D, BD, ROTARY)
        tl.store(k_cache_ptr + kv_head * skc_h + d * skc_d + position * skc_s,
                 key.to(projected_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty), mask=in_cache)
        value = tl.load(projected_ptr + v_start + kv_head * D + d, mask=d_ok, other=0.0)
        tl.store(v_cache_ptr + kv_head * svc_h + position * svc_s + d * svc_d,
                 value.to(v_cache_ptr.dtype.element_ty), mask=in_cache)
