"""A Gated DeltaNet layer's prologue: its causal convolution and gates, in one kernel.

Between the layer's input projection and its recurrence, the model's form is
a handful of small tensor ops: the conv window (conv state, cleared at a new
sequence, then the tokens' q/k/v channels), the depthwise conv and SiLU, the
conv state's shift, and ``forget_previous_sequence`` on a.

* Decode (one token): AOTInductor compiled them into five kernels a layer
  (three for the conv and its state, two for the gates), each a launch of a few
  microseconds in a decode step whose weights take about 1.2 ms to stream. Here
  each program takes BLOCK channels of the projection's output as it lies
  (``[qkv | z | b | a]``, read in place), writes their SiLU(conv) to
  ``mixed_qkv`` and their shifted window back to the conv state; one more
  program writes ``gates = [a' | b]``, a raised at position 0, where the
  recurrent kernel reads both.
* Prefill (a chunk of tokens): AOTInductor's conv of the transposed window took
  66 us a layer of the 4B's 2048-token call on the H100, three times the bytes'
  time, and splitting its output into the dense q, k, v, a and b the chunked
  kernels read took 0.75 ms a call more. Here each program takes a tile of
  tokens x channels from the projection as it lies and writes SiLU(conv)
  straight into q, k or v; a column of programs writes a' and b.
"""

import triton
import triton.language as tl


@triton.jit
def decode_convolution_kernel(
    projected_ptr, conv_state_ptr, conv_weight_ptr, position_ptr, a_log_ptr, dt_bias_ptr, mixed_qkv_ptr, gates_ptr,
    channels, num_v_heads, b_start, a_start,
    ss_c, ss_t, sw_c, sw_t,
    TAPS: tl.constexpr, TAPS_P2: tl.constexpr, BLOCK: tl.constexpr, HEADS_P2: tl.constexpr,
    FORGET_LOG_DECAY: tl.constexpr,
):
    """Channels c of this program: window = [state[c, :] * keep | x[c]] (TAPS values), out[c] =
    silu(sum(window * weight[c, :])), state[c, :] = window[1:], where keep is 0 at a new sequence (the call's
    position, ``position_ptr``, is 0). The last program writes the gates instead."""
    starting = tl.load(position_ptr) == 0
    if tl.program_id(0) == tl.num_programs(0) - 1:
        heads = tl.arange(0, HEADS_P2)
        head_ok = heads < num_v_heads
        a = tl.load(projected_ptr + a_start + heads, mask=head_ok, other=0.0)
        b = tl.load(projected_ptr + b_start + heads, mask=head_ok, other=0.0)
        # forget_previous_sequence: at position 0, a is raised to FORGET_LOG_DECAY * exp(-A_log) - dt_bias.
        needed = FORGET_LOG_DECAY * tl.exp(-tl.load(a_log_ptr + heads, mask=head_ok, other=0.0).to(tl.float32)) \
            - tl.load(dt_bias_ptr + heads, mask=head_ok, other=0.0).to(tl.float32)
        raised = tl.maximum(a.to(tl.float32), needed).to(a.dtype)
        tl.store(gates_ptr + heads, tl.where(starting, raised, a), mask=head_ok)
        tl.store(gates_ptr + num_v_heads + heads, b, mask=head_ok)
    else:
        keep = tl.where(starting, 0.0, 1.0)
        c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        c_ok = c < channels
        x = tl.load(projected_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        # The state's TAPS - 1 columns, and the same shifted by one, as [BLOCK, TAPS_P2] tiles (the tap count is
        # small and no power of two).
        taps = tl.arange(0, TAPS_P2)
        old_ok = c_ok[:, None] & (taps < TAPS - 1)[None, :]
        old = tl.load(conv_state_ptr + c[:, None] * ss_c + taps[None, :] * ss_t, mask=old_ok, other=0.0)
        shifted_ok = c_ok[:, None] & (taps < TAPS - 2)[None, :]
        shifted = tl.load(conv_state_ptr + c[:, None] * ss_c + (taps[None, :] + 1) * ss_t, mask=shifted_ok,
                          other=0.0)
        weight = tl.load(conv_weight_ptr + c[:, None] * sw_c + taps[None, :] * sw_t,
                         mask=c_ok[:, None] & (taps < TAPS)[None, :], other=0.0).to(tl.float32)
        # The window's last tap is the token itself.
        window = tl.where((taps == TAPS - 1)[None, :], x[:, None], old.to(tl.float32) * keep)
        conv = tl.sum(window * weight, 1)
        tl.store(mixed_qkv_ptr + c, (conv * tl.sigmoid(conv)).to(mixed_qkv_ptr.dtype.element_ty), mask=c_ok)
        # state[c, j] = window[c, j + 1]: the old columns one to the left, then x.
        shifted = tl.where((taps == TAPS - 2)[None, :], x[:, None], shifted.to(tl.float32) * keep)
        # No other program touches these channels, and the barrier keeps this program's stores after every
        # thread's loads of the old state.
        tl.debug_barrier()
        tl.store(conv_state_ptr + c[:, None] * ss_c + taps[None, :] * ss_t,
                 shifted.to(conv_state_ptr.dtype.element_ty), mask=old_ok)


@triton.jit
def prefill_convolution_kernel(
    projected_ptr, conv_state_ptr, conv_weight_ptr, position_ptr, a_log_ptr, dt_bias_ptr,
    query_ptr, key_ptr, value_ptr, a_ptr, b_ptr,
    length, channels, key_channels, num_v_heads, b_start, a_start,
    sproj_b, sproj_t, sproj_c, ss_c, ss_t, sw_c, sw_t,
    TAPS: tl.constexpr, TAPS_P2: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    HEADS_P2: tl.constexpr, FORGET_LOG_DECAY: tl.constexpr,
):
    """Tokens t (program_id 1) x channels c (program_id 0) of a chunk of ``length`` tokens: out[t, c] =
    silu(sum_j window[t + j, c] * weight[c, j]), window = [state[c, :] * keep | x[:, c]] (TAPS - 1 + length
    rows), into query, key or value [1, T, H, D] by c; keep is 0 at a new sequence (``position_ptr`` holds the
    chunk's first position). The first token block also writes state[c, :] = window[length:, c] (BLOCK_T >=
    TAPS - 1, so no other program reads the old state). The last column of programs writes a' and b [1, T, Hv]
    instead, a' raised on the first token of a new sequence."""
    starting = tl.load(position_ptr) == 0
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < length
    if tl.program_id(0) == tl.num_programs(0) - 1:
        heads = tl.arange(0, HEADS_P2)
        gate_ok = t_ok[:, None] & (heads < num_v_heads)[None, :]
        rows = projected_ptr + t[:, None] * sproj_t
        a = tl.load(rows + (a_start + heads[None, :]) * sproj_c, mask=gate_ok, other=0.0)
        b = tl.load(rows + (b_start + heads[None, :]) * sproj_c, mask=gate_ok, other=0.0)
        # forget_previous_sequence: on a new sequence's first token, a is raised to
        # FORGET_LOG_DECAY * exp(-A_log) - dt_bias.
        head_ok = heads < num_v_heads
        needed = FORGET_LOG_DECAY * tl.exp(-tl.load(a_log_ptr + heads, mask=head_ok, other=0.0).to(tl.float32)) \
            - tl.load(dt_bias_ptr + heads, mask=head_ok, other=0.0).to(tl.float32)
        raised = tl.maximum(a.to(tl.float32), needed[None, :]).to(a.dtype)
        first = starting & (t == 0)
        gate_at = t[:, None] * num_v_heads + heads[None, :]
        tl.store(a_ptr + gate_at, tl.where(first[:, None], raised, a), mask=gate_ok)
        tl.store(b_ptr + gate_at, b, mask=gate_ok)
    else:
        keep = tl.where(starting, 0.0, 1.0)
        c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        total = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for tap in tl.static_range(TAPS):
            # The token this tap reads; before the chunk (source < 0) it is the state's column TAPS - 1 + source.
            source = t - (TAPS - 1) + tap
            from_input = t_ok & (source >= 0)
            from_state = t_ok & (source < 0)
            x = tl.load(projected_ptr + source[:, None] * sproj_t + c[None, :] * sproj_c,
                        mask=from_input[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
            old = tl.load(conv_state_ptr + c[None, :] * ss_c + (source + TAPS - 1)[:, None] * ss_t,
                          mask=from_state[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
            weight = tl.load(conv_weight_ptr + c * sw_c + tap * sw_t, mask=c_ok, other=0.0).to(tl.float32)
            total += (x + old * keep) * weight[None, :]
        out = (total * tl.sigmoid(total)).to(query_ptr.dtype.element_ty)
        out_ok = t_ok[:, None] & c_ok[None, :]
        value_channels = channels - 2 * key_channels
        # Masks split the tile between q, k and v: a block may straddle two of them.
        tl.store(query_ptr + t[:, None] * key_channels + c[None, :], out,
                 mask=out_ok & (c < key_channels)[None, :])
        tl.store(key_ptr + t[:, None] * key_channels + (c - key_channels)[None, :], out,
                 mask=out_ok & ((c >= key_channels) & (c < 2 * key_channels))[None, :])
        tl.store(value_ptr + t[:, None] * value_channels + (c - 2 * key_channels)[None, :], out,
                 mask=out_ok & (c >= 2 * key_channels)[None, :])
        if tl.program_id(1) == 0:
            # The new state: window rows length .. length + TAPS - 2, from the chunk's last tokens, or (a chunk
            # shorter than TAPS - 1) partly from the old state.
            column = tl.arange(0, TAPS_P2)
            column_ok = column < TAPS - 1
            row = length + column
            new_from_input = column_ok & (row >= TAPS - 1)
            new_from_state = column_ok & (row < TAPS - 1)
            recent = tl.load(projected_ptr + (row - (TAPS - 1))[None, :] * sproj_t + c[:, None] * sproj_c,
                        mask=c_ok[:, None] & new_from_input[None, :], other=0.0).to(tl.float32)
            kept = tl.load(conv_state_ptr + c[:, None] * ss_c + row[None, :] * ss_t,
                          mask=c_ok[:, None] & new_from_state[None, :], other=0.0).to(tl.float32)
            state = tl.where(new_from_input[None, :], recent, kept * keep)
            # This program alone touches these channels' state; the barrier keeps its stores after every
            # thread's loads of the old state (above and in the taps).
            tl.debug_barrier()
            tl.store(conv_state_ptr + c[:, None] * ss_c + column[None, :] * ss_t,
                     state.to(conv_state_ptr.dtype.element_ty), mask=c_ok[:, None] & column_ok[None, :])
