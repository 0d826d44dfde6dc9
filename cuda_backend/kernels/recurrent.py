"""The per-token kernel: decode (T = 1) and short sequences.

One program owns the state tile ``S[:, v_block]`` of one (sequence, value
head): it reads the tile once, runs every token through it in registers, and
writes it once. ``state_out`` may be ``state_in`` (in-place decode): each
program reads its tile before it writes it and touches no other tile.

With ``RAW_GATES`` the kernel also does Qwen3.5's gating itself
(g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)); q/k/v may be
strided views of the conv output, so the split costs nothing.
"""

import triton
import triton.language as tl

from cuda_backend.kernels.common import L2NORM_EPS, gate_from_raw, load_gate_coefficients, sequence_and_head


@triton.jit
def recurrent_gated_delta_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    state_in_ptr, state_out_ptr, out_ptr,
    length, scale, q_start, k_start, v_start, g_start, beta_start,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_t, sk_h, sk_d,
    sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h, sg_d,
    sbeta_b, sbeta_t, sbeta_h,
    ss_b, ss_h, ss_k, ss_v,
    so_b, so_t, so_h, so_d,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # value heads per key head
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    GATE_PER_CHANNEL: tl.constexpr, RAW_GATES: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    batch, v_head = sequence_and_head(pid_bh, NUM_V_HEADS)
    k_head = v_head // GROUP

    k_offs = tl.arange(0, DK)
    v_offs = pid_v * BV + tl.arange(0, BV)
    v_mask = v_offs < DV

    state_tile = (batch * ss_b + v_head * ss_h) + k_offs[:, None] * ss_k + v_offs[None, :] * ss_v
    state = tl.load(state_in_ptr + state_tile, mask=v_mask[None, :], other=0.0).to(tl.float32)

    if RAW_GATES:
        neg_a, dt_bias = load_gate_coefficients(a_log_ptr, dt_bias_ptr, v_head)

    q_base = q_ptr + q_start + batch * sq_b + k_head * sq_h + k_offs * sq_d
    k_base = k_ptr + k_start + batch * sk_b + k_head * sk_h + k_offs * sk_d
    v_base = v_ptr + v_start + batch * sv_b + v_head * sv_h + v_offs * sv_d
    g_base = g_ptr + g_start + batch * sg_b + v_head * sg_h
    beta_base = beta_ptr + beta_start + batch * sbeta_b + v_head * sbeta_h
    o_base = out_ptr + batch * so_b + v_head * so_h + v_offs * so_d
    for t in range(length):
        q = tl.load(q_base + t * sq_t).to(tl.float32)
        k = tl.load(k_base + t * sk_t).to(tl.float32)
        if USE_QK_L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS)
            k = k * tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)
        q = (q * scale).to(tl.float32)  # AOTInductor passes float arguments as fp64
        v = tl.load(v_base + t * sv_t, mask=v_mask, other=0.0).to(tl.float32)
        if RAW_GATES:
            g = gate_from_raw(tl.load(g_base + t * sg_t), neg_a, dt_bias)
            beta = tl.sigmoid(tl.load(beta_base + t * sbeta_t).to(tl.float32))
        else:
            beta = tl.load(beta_base + t * sbeta_t).to(tl.float32)
            if GATE_PER_CHANNEL:
                g = tl.load(g_base + t * sg_t + k_offs * sg_d).to(tl.float32)[:, None]
            else:
                g = tl.load(g_base + t * sg_t).to(tl.float32)
        state = state * tl.exp(g)
        update = beta * (v - tl.sum(state * k[:, None], 0))
        state = state + k[:, None] * update[None, :]
        output = tl.sum(state * q[:, None], 0)
        tl.store(o_base + t * so_t, output.to(out_ptr.dtype.element_ty), mask=v_mask)

    tl.store(state_out_ptr + state_tile, state, mask=v_mask[None, :])
