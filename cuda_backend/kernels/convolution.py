"""A Gated DeltaNet layer's decode prologue: its causal convolution and gates for one token, in one kernel.

Between the layer's input projection and its recurrence, the model's form is
a handful of small tensor ops: the conv window (conv state, cleared at a new
sequence, then the token's q/k/v channels), the depthwise conv and SiLU, the
conv state's shift, and ``forget_previous_sequence`` on a. AOTInductor
compiled them into five kernels a layer (three for the conv and its state,
two for the gates), each a launch of a few microseconds in a decode step whose
weights take about 1.2 ms to stream. Here each program takes BLOCK channels
of the projection's output as it lies (``[qkv | z | b | a]``, read in place),
writes their SiLU(conv) to ``mixed_qkv`` and their shifted window back to the
conv state; one more program writes ``gates = [a' | b]``, a raised at
position 0, where the recurrent kernel reads both.
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
