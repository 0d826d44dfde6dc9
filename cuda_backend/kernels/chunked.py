"""The chunk-parallel (WY) kernels: prefill, T >> 1.

Two launches, following the chunked form in ``gdn_export.ops.reference``:

1. ``chunk_prepare_kernel``, one program per (chunk, sequence, value head), all
   in parallel. With Gamma the gate summed from the chunk start, it builds the
   strictly lower matrix A[t, s] = beta_t k_t.k_s exp(Gamma_t - Gamma_s), inverts
   the unit-lower-triangular I + A by forward substitution, and writes

       w  = (I + A)^-1 (beta k exp(Gamma))      [BT, Dk]  (the WY factor)
       u  = (I + A)^-1 (beta v)                 [BT, Dv]
       qg = q exp(Gamma)                         [BT, Dk]
       kg = k exp(Gamma_last - Gamma)            [BT, Dk]
       aqk[t, s] = q_t.k_s exp(Gamma_t - Gamma_s), s <= t
       decay = exp(Gamma_last)                   [Dk or 1]

   Every exponent is of a gate difference with s <= t (masked before exp), so
   nothing overflows, also for per-channel gates (KDA).
2. ``chunk_state_output_kernel``, one program per (value block, sequence, head),
   walks the chunks in order with its state tile in registers:
   u' = u - w S; o = qg S + aqk u'; S = decay * S + kg^T u'. The state is read
   once and written once, so ``state_out`` may be ``state_in``.
"""

import triton
import triton.language as tl

L2NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def _row_scale(x, USE_QK_L2NORM: tl.constexpr):
    """1 / |row| per row of ``x`` (Qwen3.5's q/k L2 norm), or 1."""
    if USE_QK_L2NORM:
        return tl.rsqrt(tl.sum(x * x, 1) + L2NORM_EPS)
    return tl.full((x.shape[0],), 1.0, tl.float32)


@triton.jit
def chunk_prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
    w_ptr, u_ptr, qg_ptr, kg_ptr, aqk_ptr, decay_ptr,
    length, scale,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_t, sk_h, sk_d,
    sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h, sg_d,
    sbeta_b, sbeta_t, sbeta_h,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,  # channel block of the per-channel-gate A matrix
    GATE_PER_CHANNEL: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    chunk = tl.program_id(0)
    pid_bh = tl.program_id(1)
    num_chunks = tl.num_programs(0)
    batch = pid_bh // NUM_V_HEADS
    v_head = pid_bh % NUM_V_HEADS
    k_head = v_head // GROUP

    rows = tl.arange(0, BT)
    t_offs = chunk * BT + rows
    row_mask = t_offs < length
    last_row = tl.minimum(length - chunk * BT, BT) - 1
    k_offs = tl.arange(0, DK)
    v_offs = tl.arange(0, DV)

    q_rows = q_ptr + batch * sq_b + k_head * sq_h + t_offs[:, None] * sq_t
    k_rows = k_ptr + batch * sk_b + k_head * sk_h + t_offs[:, None] * sk_t
    q = tl.load(q_rows + k_offs[None, :] * sq_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    k = tl.load(k_rows + k_offs[None, :] * sk_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    q_scale = (_row_scale(q, USE_QK_L2NORM) * scale).to(tl.float32)  # AOTInductor passes floats as fp64
    k_scale = _row_scale(k, USE_QK_L2NORM)
    q = q * q_scale[:, None]
    k = k * k_scale[:, None]
    v = tl.load(
        v_ptr + batch * sv_b + v_head * sv_h + t_offs[:, None] * sv_t + v_offs[None, :] * sv_d,
        mask=row_mask[:, None], other=0.0,
    ).to(tl.float32)
    beta = tl.load(beta_ptr + batch * sbeta_b + v_head * sbeta_h + t_offs * sbeta_t, mask=row_mask, other=0.0)
    beta = beta.to(tl.float32)

    causal = rows[:, None] >= rows[None, :]
    g_rows = g_ptr + batch * sg_b + v_head * sg_h + t_offs[:, None] * sg_t
    if GATE_PER_CHANNEL:
        gate = tl.cumsum(tl.load(g_rows + k_offs[None, :] * sg_d, mask=row_mask[:, None], other=0.0).to(tl.float32), 0)
        gate_last = tl.sum(tl.where(rows[:, None] == last_row, gate, 0.0), 0)  # [DK]
        # k_t.k_s exp(Gamma_t - Gamma_s) summed per channel block: no matrix form, so
        # the [BT, BT, BK] products are summed directly.
        key_key = tl.zeros((BT, BT), tl.float32)
        query_key = tl.zeros((BT, BT), tl.float32)
        for c in range(0, DK, BK):
            c_offs = c + tl.arange(0, BK)
            q_block = tl.load(q_rows + c_offs[None, :] * sq_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
            k_block = tl.load(k_rows + c_offs[None, :] * sk_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
            q_block = q_block * q_scale[:, None]
            k_block = k_block * k_scale[:, None]
            g_block = tl.load(g_rows + c_offs[None, :] * sg_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
            g_block = tl.cumsum(g_block, 0)
            diff = g_block[:, None, :] - g_block[None, :, :]
            decay = tl.exp(tl.where(causal[:, :, None], diff, float("-inf")))
            key_key += tl.sum(k_block[:, None, :] * k_block[None, :, :] * decay, 2)
            query_key += tl.sum(q_block[:, None, :] * k_block[None, :, :] * decay, 2)
        key_decay = tl.exp(gate)
        qg = q * key_decay
        kg = k * tl.exp(gate_last[None, :] - gate)
        decay_last = tl.exp(gate_last)
    else:
        gate = tl.cumsum(tl.load(g_ptr + batch * sg_b + v_head * sg_h + t_offs * sg_t, mask=row_mask, other=0.0).to(tl.float32), 0)
        gate_last = tl.sum(tl.where(rows == last_row, gate, 0.0), 0)
        decay = tl.exp(tl.where(causal, gate[:, None] - gate[None, :], float("-inf")))
        key_key = tl.dot(k, tl.trans(k), input_precision=DOT_PRECISION) * decay
        query_key = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * decay
        key_decay = tl.exp(gate)[:, None]
        qg = q * key_decay
        kg = k * tl.exp(gate_last - gate)[:, None]
        decay_last = tl.exp(gate_last)

    system = tl.where(rows[:, None] > rows[None, :], key_key * beta[:, None], 0.0)
    query_key = tl.where(causal, query_key, 0.0)
    # (I + A)^-1 by forward substitution, one row at a time: row i = e_i - A[i, :i] inv[:i].
    inverse = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for i in range(1, BT):
        a_row = tl.sum(tl.where(rows[:, None] == i, system, 0.0), 0)
        row = tl.sum(a_row[:, None] * inverse, 0)
        inverse = tl.where(rows[:, None] == i, inverse - row[None, :], inverse)
    w = tl.dot(inverse, k * key_decay * beta[:, None], input_precision=DOT_PRECISION)
    u = tl.dot(inverse, v * beta[:, None], input_precision=DOT_PRECISION)

    # Scratch layout [B * Hv, chunks * BT, D]: each program writes its own rows.
    chunk_rows = (pid_bh * num_chunks + chunk) * BT + rows
    tl.store(w_ptr + chunk_rows[:, None] * DK + k_offs[None, :], w)
    tl.store(qg_ptr + chunk_rows[:, None] * DK + k_offs[None, :], qg)
    tl.store(kg_ptr + chunk_rows[:, None] * DK + k_offs[None, :], kg)
    tl.store(u_ptr + chunk_rows[:, None] * DV + v_offs[None, :], u)
    tl.store(aqk_ptr + chunk_rows[:, None] * BT + rows[None, :], query_key)
    if GATE_PER_CHANNEL:
        tl.store(decay_ptr + (pid_bh * num_chunks + chunk) * DK + k_offs, decay_last)
    else:
        tl.store(decay_ptr + pid_bh * num_chunks + chunk, decay_last)


@triton.jit
def chunk_state_output_kernel(
    w_ptr, u_ptr, qg_ptr, kg_ptr, aqk_ptr, decay_ptr,
    state_in_ptr, state_out_ptr, out_ptr,
    length, num_chunks,
    ss_b, ss_h, ss_k, ss_v,
    so_b, so_t, so_h, so_d,
    NUM_V_HEADS: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    GATE_PER_CHANNEL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // NUM_V_HEADS
    v_head = pid_bh % NUM_V_HEADS

    rows = tl.arange(0, BT)
    k_offs = tl.arange(0, DK)
    v_offs = pid_v * BV + tl.arange(0, BV)

    state_tile = (batch * ss_b + v_head * ss_h) + k_offs[:, None] * ss_k + v_offs[None, :] * ss_v
    state = tl.load(state_in_ptr + state_tile).to(tl.float32)
    o_base = out_ptr + batch * so_b + v_head * so_h + v_offs[None, :] * so_d
    for chunk in range(num_chunks):
        chunk_rows = (pid_bh * num_chunks + chunk) * BT + rows
        w = tl.load(w_ptr + chunk_rows[:, None] * DK + k_offs[None, :])
        qg = tl.load(qg_ptr + chunk_rows[:, None] * DK + k_offs[None, :])
        kg = tl.load(kg_ptr + chunk_rows[:, None] * DK + k_offs[None, :])
        u = tl.load(u_ptr + chunk_rows[:, None] * DV + v_offs[None, :])
        query_key = tl.load(aqk_ptr + chunk_rows[:, None] * BT + rows[None, :])
        updates = u - tl.dot(w, state, input_precision=DOT_PRECISION)
        output = tl.dot(qg, state, input_precision=DOT_PRECISION)
        output += tl.dot(query_key, updates, input_precision=DOT_PRECISION)
        t_offs = chunk * BT + rows
        tl.store(o_base + t_offs[:, None] * so_t, output.to(out_ptr.dtype.element_ty), mask=(t_offs < length)[:, None])
        if GATE_PER_CHANNEL:
            decay = tl.load(decay_ptr + (pid_bh * num_chunks + chunk) * DK + k_offs)[:, None]
        else:
            decay = tl.load(decay_ptr + pid_bh * num_chunks + chunk)
        state = state * decay + tl.dot(tl.trans(kg), updates, input_precision=DOT_PRECISION)
    tl.store(state_out_ptr + state_tile, state)
