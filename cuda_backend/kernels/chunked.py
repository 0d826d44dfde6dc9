"""The chunk-parallel (WY) kernels: prefill, T >> 1.

Three launches, following the chunked form in ``gdn_export.ops.reference``.
Only the middle one walks the chunks in order; it does the least work it can
(two matrix products per chunk), and everything else runs with one program
per chunk, so the sequential part stays short:

1. ``chunk_prepare_kernel``, one program per (chunk, sequence, value head).
   With Gamma the gate summed from the chunk start, it builds the strictly
   lower matrix A[t, s] = beta_t k_t.k_s exp(Gamma_t - Gamma_s), inverts the
   unit-lower-triangular I + A with matrix products only (see
   ``_unit_lower_inverse``), and writes

       w  = (I + A)^-1 (beta k exp(Gamma))      [BT, Dk]  (the WY factor)
       u  = (I + A)^-1 (beta v)                 [BT, Dv]
       qg = q exp(Gamma)                         [BT, Dk]
       kg = k exp(Gamma_last - Gamma)            [BT, Dk] (stored transposed)
       aqk[t, s] = q_t.k_s exp(Gamma_t - Gamma_s), s <= t
       decay = exp(Gamma_last)                   [Dk or 1]

   Every exponent is of a gate difference with s <= t (masked before exp), so
   nothing overflows, also for per-channel gates (KDA). With ``RAW_GATES`` it
   also computes Qwen3.5's gates from the raw a/b (the fused op).
2. ``chunk_state_kernel``, one program per (value block, sequence, head), walks
   the chunks in order with its state tile S in registers (fp32):
   records S as the chunk's starting state h, u' = u - w S (written over u),
   S = decay * S + kg^T u'. The state is read once and written once, so
   ``state_out`` may be ``state_in``. With ``FUSED_OUTPUT`` it also computes
   the output itself and writes no h (fewer launches and bytes, a longer
   sequential step: the launcher picks).
3. ``chunk_output_kernel``, one program per (chunk, value block, sequence,
   head): o = qg h + aqk u'.

The scratch tensors (w, u, qg, kg, aqk, h) have the dtype the launcher picks:
fp32 for fp32 callers (products in exact fp32), bf16 for bf16/fp16 callers,
whose products then run on the tensor cores at full rate and whose scratch
traffic halves; the state, the accumulators and the gates stay fp32.
"""

import triton
import triton.language as tl

from cuda_backend.kernels.common import (
    L2NORM_EPS,
    dot_fp32,
    gate_from_raw,
    load_gate_coefficients,
    narrow,
    sequence_and_head,
)

# Diagonal block of the triangular inverse: (I + N)^-1 of a strictly lower 16 x 16
# block N is a product of 4 factors (N^16 = 0), and 16 is the smallest tl.dot size.
INVERSE_BLOCK = tl.constexpr(16)


@triton.jit
def _row_scale(x, USE_QK_L2NORM: tl.constexpr):
    """1 / |row| per row of ``x`` (Qwen3.5's q/k L2 norm), or 1."""
    if USE_QK_L2NORM:
        return tl.rsqrt(tl.sum(x * x, 1) + L2NORM_EPS)
    return tl.full((x.shape[0],), 1.0, tl.float32)


@triton.jit
def _unit_lower_inverse(a, BT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(I + a)^-1 for a strictly lower [BT, BT] ``a`` (BT = 32 or 64), by matrix products only.

    Row-by-row substitution is BT dependent steps of reductions across the
    tile; products run on the tensor cores and take a handful of steps:

    * the 16 x 16 diagonal blocks: with N = a on those blocks (N^16 = 0),
      D = (I + N)^-1 = (I - N)(I + N^2)(I + N^4)(I + N^8), all blocks at once
      as [BT, BT] products of block-diagonal matrices;
    * the rest: I + a = (I + N)(I + D a_off) with a_off the part of a below the
      diagonal blocks, and M = D a_off is strictly block-lower, so M^(BT/16) = 0:
      (I + a)^-1 = (I - M)(I + M^2) D for 4 blocks, (I - M) D for 2.
    """
    tl.static_assert(BT == 32 or BT == 64, "chunk length must be 32 or 64")
    rows = tl.arange(0, BT)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    in_block = (rows[:, None] // INVERSE_BLOCK) == (rows[None, :] // INVERSE_BLOCK)
    power = tl.where(in_block, a, 0.0)
    diagonal_inverse = eye - power
    for _ in tl.static_range(3):  # factors (I + N^2), (I + N^4), (I + N^8)
        power = tl.dot(power, power, input_precision=DOT_PRECISION)
        diagonal_inverse += tl.dot(diagonal_inverse, power, input_precision=DOT_PRECISION)
    power = tl.dot(diagonal_inverse, tl.where(in_block, 0.0, a), input_precision=DOT_PRECISION)
    inverse = eye - power
    if BT == 64:
        power = tl.dot(power, power, input_precision=DOT_PRECISION)
        inverse += tl.dot(inverse, power, input_precision=DOT_PRECISION)
    return tl.dot(inverse, diagonal_inverse, input_precision=DOT_PRECISION)


@triton.jit
def _store_chunk_output(qg_ptr, aqk_ptr, chunk_rows, start_state, updates, o_base, so_t, chunk, length,
                        DK: tl.constexpr, BT: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """o = qg h + aqk u' for one chunk's rows, stored at ``o_base`` (the chunk's value
    block); the fused state kernel and the output kernel both write it."""
    rows = tl.arange(0, BT)
    qg = tl.load(qg_ptr + chunk_rows[:, None] * DK + tl.arange(0, DK)[None, :])
    query_key = tl.load(aqk_ptr + chunk_rows[:, None] * BT + rows[None, :])
    output = dot_fp32(qg, start_state, DOT_PRECISION, WIDEN)
    output += dot_fp32(query_key, updates, DOT_PRECISION, WIDEN)
    t_offs = chunk * BT + rows
    tl.store(o_base + t_offs[:, None] * so_t, narrow(output, o_base.dtype.element_ty, WIDEN),
             mask=(t_offs < length)[:, None])


@triton.jit
def chunk_prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    w_ptr, u_ptr, qg_ptr, kg_ptr, aqk_ptr, decay_ptr,
    length, scale,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_t, sk_h, sk_d,
    sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h, sg_d,
    sbeta_b, sbeta_t, sbeta_h,
    NUM_V_HEADS: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr,  # channel block of the per-channel-gate A matrix
    GATE_PER_CHANNEL: tl.constexpr,
    RAW_GATES: tl.constexpr,  # g_ptr/beta_ptr hold Qwen3.5's raw a/b (scalar gates only)
    USE_QK_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    chunk = tl.program_id(0)
    pid_bh = tl.program_id(1)
    num_chunks = tl.num_programs(0)
    batch, v_head = sequence_and_head(pid_bh, NUM_V_HEADS)
    k_head = v_head // GROUP
    scratch = w_ptr.dtype.element_ty

    rows = tl.arange(0, BT)
    t_offs = chunk * BT + rows
    row_mask = t_offs < length
    last_row = tl.minimum(length - chunk * BT, BT) - 1
    k_offs = tl.arange(0, DK)
    v_offs = tl.arange(0, DV)
    causal = rows[:, None] >= rows[None, :]
    # Scratch layout [B * Hv, chunks * BT, D]: each program writes its own rows.
    chunk_rows = (pid_bh * num_chunks + chunk) * BT + rows

    beta_rows = beta_ptr + batch * sbeta_b + v_head * sbeta_h + t_offs * sbeta_t
    beta = tl.load(beta_rows, mask=row_mask, other=0.0).to(tl.float32)
    if RAW_GATES:
        beta = tl.where(row_mask, tl.sigmoid(beta), 0.0)

    q_rows = q_ptr + batch * sq_b + k_head * sq_h + t_offs[:, None] * sq_t
    k_rows = k_ptr + batch * sk_b + k_head * sk_h + t_offs[:, None] * sk_t
    q = tl.load(q_rows + k_offs[None, :] * sq_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    k = tl.load(k_rows + k_offs[None, :] * sk_d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    q_scale = (_row_scale(q, USE_QK_L2NORM) * scale).to(tl.float32)  # AOTInductor passes floats as fp64
    k_scale = _row_scale(k, USE_QK_L2NORM)
    q = q * q_scale[:, None]
    k = k * k_scale[:, None]

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
        key_to_end = tl.exp(gate_last[None, :] - gate)
        decay_last = tl.exp(gate_last)
    else:
        if RAW_GATES:
            neg_a, dt_bias = load_gate_coefficients(a_log_ptr, dt_bias_ptr, v_head)
            raw = tl.load(g_ptr + batch * sg_b + v_head * sg_h + t_offs * sg_t, mask=row_mask, other=0.0)
            step = tl.where(row_mask, gate_from_raw(raw, neg_a, dt_bias), 0.0)
        else:
            step = tl.load(g_ptr + batch * sg_b + v_head * sg_h + t_offs * sg_t, mask=row_mask, other=0.0)
        gate = tl.cumsum(step.to(tl.float32), 0)
        gate_last = tl.sum(tl.where(rows == last_row, gate, 0.0), 0)
        decay = tl.exp(tl.where(causal, gate[:, None] - gate[None, :], float("-inf")))
        key_key = tl.dot(k, tl.trans(k), input_precision=DOT_PRECISION) * decay
        query_key = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * decay
        key_decay = tl.exp(gate)[:, None]
        key_to_end = tl.exp(gate_last - gate)[:, None]
        decay_last = tl.exp(gate_last)

    # The query side is done here, so q is dead before the inverse needs registers.
    tl.store(aqk_ptr + chunk_rows[:, None] * BT + rows[None, :], narrow(tl.where(causal, query_key, 0.0), scratch, WIDEN))
    tl.store(qg_ptr + chunk_rows[:, None] * DK + k_offs[None, :], narrow(q * key_decay, scratch, WIDEN))
    # kg is stored transposed, [Dk, BT] per chunk: the state kernel multiplies kg^T by u', and
    # so loads it as a plain row-major operand with no transposed layout inside its loop.
    key_tile = kg_ptr + (pid_bh * num_chunks + chunk) * DK * BT + k_offs[:, None] * BT + rows[None, :]
    tl.store(key_tile, tl.trans(narrow(k * key_to_end, scratch, WIDEN)))
    if GATE_PER_CHANNEL:
        tl.store(decay_ptr + (pid_bh * num_chunks + chunk) * DK + k_offs, decay_last)
    else:
        tl.store(decay_ptr + pid_bh * num_chunks + chunk, decay_last)

    inverse = _unit_lower_inverse(tl.where(rows[:, None] > rows[None, :], key_key * beta[:, None], 0.0),
                                  BT, DOT_PRECISION)
    w = tl.dot(inverse, k * key_decay * beta[:, None], input_precision=DOT_PRECISION)
    tl.store(w_ptr + chunk_rows[:, None] * DK + k_offs[None, :], narrow(w, scratch, WIDEN))
    v = tl.load(
        v_ptr + batch * sv_b + v_head * sv_h + t_offs[:, None] * sv_t + v_offs[None, :] * sv_d,
        mask=row_mask[:, None], other=0.0,
    ).to(tl.float32)
    u = tl.dot(inverse, v * beta[:, None], input_precision=DOT_PRECISION)
    tl.store(u_ptr + chunk_rows[:, None] * DV + v_offs[None, :], narrow(u, scratch, WIDEN))


@triton.jit
def chunk_state_kernel(
    w_ptr, u_ptr, kg_ptr, decay_ptr, state_in_ptr, state_out_ptr, h_ptr,
    qg_ptr, aqk_ptr, out_ptr,  # FUSED_OUTPUT only
    length,
    ss_b, ss_h, ss_k, ss_v,
    so_b, so_t, so_h, so_d,
    NUM_V_HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    GATE_PER_CHANNEL: tl.constexpr, FUSED_OUTPUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch, v_head = sequence_and_head(pid_bh, NUM_V_HEADS)
    scratch = w_ptr.dtype.element_ty

    # Derived here, not passed: Triton turns an int argument equal to 1 into a constant, and
    # with the count passed, the one-chunk case gave a wrong final state on H100 (Triton 3.6,
    # pipelined loop) while its output was right; a runtime bound avoids that specialization.
    num_chunks = tl.cdiv(length, BT)
    rows = tl.arange(0, BT)
    k_offs = tl.arange(0, DK)
    v_offs = pid_v * BV + tl.arange(0, BV)

    state_tile = (batch * ss_b + v_head * ss_h) + k_offs[:, None] * ss_k + v_offs[None, :] * ss_v
    state = tl.load(state_in_ptr + state_tile).to(tl.float32)
    o_base = out_ptr + batch * so_b + v_head * so_h + v_offs[None, :] * so_d
    for chunk in range(num_chunks):
        chunk_rows = (pid_bh * num_chunks + chunk) * BT + rows
        w = tl.load(w_ptr + chunk_rows[:, None] * DK + k_offs[None, :])
        key_t = tl.load(kg_ptr + (pid_bh * num_chunks + chunk) * DK * BT + k_offs[:, None] * BT + rows[None, :])
        u_tile = u_ptr + chunk_rows[:, None] * DV + v_offs[None, :]
        u = tl.load(u_tile).to(tl.float32)
        if GATE_PER_CHANNEL:
            decay = tl.load(decay_ptr + (pid_bh * num_chunks + chunk) * DK + k_offs)[:, None]
        else:
            decay = tl.load(decay_ptr + pid_bh * num_chunks + chunk)
        # The products take the state in the scratch dtype (bf16 for bf16 callers: the
        # tensor cores' full rate) and accumulate in fp32; the state itself stays fp32.
        state_operand = narrow(state, scratch, WIDEN)
        updates = narrow(u - dot_fp32(w, state_operand, DOT_PRECISION, WIDEN), scratch, WIDEN)
        if FUSED_OUTPUT:
            _store_chunk_output(qg_ptr, aqk_ptr, chunk_rows, state_operand, updates, o_base, so_t, chunk, length,
                                DK, BT, DOT_PRECISION, WIDEN)
        else:
            # h [B * Hv, chunks, DK, DV]: the chunk's starting state, for the output kernel.
            h_tile = h_ptr + ((pid_bh * num_chunks + chunk) * DK + k_offs[:, None]) * DV + v_offs[None, :]
            tl.store(h_tile, state_operand)
            tl.store(u_tile, updates)  # u' over u: only this program reads these rows
        state = state * decay + dot_fp32(key_t, updates, DOT_PRECISION, WIDEN)
    tl.store(state_out_ptr + state_tile, state)


@triton.jit
def chunk_output_kernel(
    qg_ptr, aqk_ptr, h_ptr, u_ptr, out_ptr,
    length,
    so_b, so_t, so_h, so_d,
    NUM_V_HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    chunk = tl.program_id(0)
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    num_chunks = tl.num_programs(0)
    batch, v_head = sequence_and_head(pid_bh, NUM_V_HEADS)

    rows = tl.arange(0, BT)
    k_offs = tl.arange(0, DK)
    v_offs = pid_v * BV + tl.arange(0, BV)
    chunk_rows = (pid_bh * num_chunks + chunk) * BT + rows
    h = tl.load(h_ptr + ((pid_bh * num_chunks + chunk) * DK + k_offs[:, None]) * DV + v_offs[None, :])
    updates = tl.load(u_ptr + chunk_rows[:, None] * DV + v_offs[None, :])
    o_base = out_ptr + batch * so_b + v_head * so_h + v_offs[None, :] * so_d
    _store_chunk_output(qg_ptr, aqk_ptr, chunk_rows, h, updates, o_base, so_t, chunk, length,
                        DK, BT, DOT_PRECISION, WIDEN)
