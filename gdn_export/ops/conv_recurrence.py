"""``gdn::conv_gated_delta_rule``: a Gated DeltaNet layer from its input projections to its recurrence's output.

    gdn::conv_gated_delta_rule(Tensor qkv, Tensor a, Tensor b, Tensor conv_weight, Tensor A_log,
        Tensor dt_bias, Tensor positions, Tensor(a!) conv_state, Tensor(b!) state) -> Tensor output
    gdn::conv_gated_delta_rule.out(<same>, *, Tensor(c!) output) -> Tensor(c!)

    qkv          [B, T, C]       in_proj_qkv's output, before the conv; C = 2*Hk*Dk + Hv*Dv
    a, b         [B, T, Hv]      raw in_proj_a / in_proj_b outputs
    conv_weight  [C, 1, W]       the depthwise causal conv's weight
    A_log, dt_bias [Hv]
    positions    [T] int64       the tokens' positions; positions[0] == 0 starts a new sequence
    conv_state   [B, C, W - 1]   the conv's last W - 1 inputs, read and overwritten
    state        [B, Hv, Dk, Dv] the recurrent state, read and overwritten
    -> output    [B, T, Hv, Dv]
    all float32 but positions, and the state, which may be float16: the recurrence then runs
    in float32 on its values and stores its result rounded once a call. A decode step reads
    and writes the state whole (36 MB a 0.8B step in float32, the largest read after the
    weights'), so half precision saves half those bytes; on the 0.8B checkpoint it moved the
    mean KL of the next-token distribution over 512 tokens by 2.6e-6 (docs/benchmarks.md).

It is what ``GatedDeltaNet.convolved_recurrence`` computes with ``causal_conv``,
``forget_previous_sequence`` and the layer's recurrence: the window of
the conv state and the new inputs (the state cleared at a sequence's start), the
conv and its SiLU, the state shifted, the first token's gate raised at a
sequence's start, then q/k/v split, L2 norm, gates and the recurrence. In the
CPU programs that was, a layer at a token, some twenty calls of portable
kernels and ours and as many small XNNPACK ops, each waking the thread pool;
the C++ kernel (``runtime_ops``) makes it one. The reference below composes the
model's own functions with the recurrence's reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.contract import define_op, reference_gated_delta_rule
from gdn_export.ops.fused import num_key_heads_of, unfuse

_ARGS = (
    "Tensor qkv, Tensor a, Tensor b, Tensor conv_weight, Tensor A_log, Tensor dt_bias, Tensor positions, "
    "Tensor(a!) conv_state, Tensor(b!) state"
)
# The recurrent state's dtypes the op takes.
STATE_DTYPES = (torch.float32, torch.float16)
SCHEMA = f"conv_gated_delta_rule({_ARGS}) -> Tensor"
OUT_SCHEMA = f"conv_gated_delta_rule.out({_ARGS}, *, Tensor(c!) output) -> Tensor(c!)"

# Runners (ExecuTorch's among them) start a new sequence by calling again at
# position 0, without clearing the program's buffers. A sequence's first gate g
# only ever multiplies the previous sequence's state (a fresh one is zero, and
# the chunked form's gate differences cancel it), so at position 0 the layer
# raises a until g = -exp(A_log) * softplus(a + dt_bias) <= -FORGET_LOG_DECAY:
# the old state is scaled by at most e^-50 inside the recurrence, with no extra
# pass over the state and the same result as a cleared buffer.
FORGET_LOG_DECAY = 50.0


def forget_previous_sequence(a, A_log, dt_bias, starting):
    """``a`` [B, T, Hv] with its first token raised when ``starting`` (see FORGET_LOG_DECAY)."""
    # softplus(y) >= y, so a + dt_bias >= FORGET_LOG_DECAY * exp(-A_log) gives g <= -FORGET_LOG_DECAY.
    needed = FORGET_LOG_DECAY * torch.exp(-A_log.float()) - dt_bias.float()
    first_of_sequence = (torch.arange(a.shape[1], device=a.device) == 0) & starting  # [T]
    raised = torch.maximum(a.float(), needed).to(a.dtype)
    return torch.where(first_of_sequence[None, :, None], raised, a)


def causal_conv(qkv, conv_state, conv_weight, starting):
    """SiLU of the depthwise causal conv of ``qkv`` [B, T, C] after ``conv_state`` [B, C, W - 1] (zeros when
    ``starting``), as [B, T, C]; leaves the window's last W - 1 inputs in ``conv_state``."""
    length, channels = qkv.shape[1], qkv.shape[2]
    # A product, not torch.where: ExecuTorch's portable where broadcasts the [1]
    # condition element by element (0.13 ms a layer at 0.8B, a decode step's 2%),
    # while XNNPACK multiplies. The inputs it keeps are finite, so x * 0 = 0.
    kept = conv_state * (~starting).to(conv_state.dtype)
    window = torch.cat([kept, qkv.transpose(1, 2)], dim=-1)  # [B, C, W - 1 + T]
    conv_state.copy_(window[:, :, length:])
    return F.silu(F.conv1d(window, conv_weight, groups=channels)).transpose(1, 2)


def check_conv_inputs(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state) -> None:
    """TypeError / ValueError naming the argument, for what the op cannot take."""
    named = {"qkv": qkv, "a": a, "b": b, "conv_weight": conv_weight, "A_log": A_log, "dt_bias": dt_bias,
             "positions": positions, "conv_state": conv_state, "state": state}
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn.conv_gated_delta_rule: {name} must be a Tensor, got {type(tensor).__name__}")
        if name == "state":
            if tensor.dtype not in STATE_DTYPES:
                raise TypeError(f"gdn.conv_gated_delta_rule: state must be torch.float32 or torch.float16, got "
                                f"{tensor.dtype}")
            continue
        wanted = torch.int64 if name == "positions" else torch.float32
        if tensor.dtype != wanted:
            raise TypeError(f"gdn.conv_gated_delta_rule: {name} must be {wanted}, got {tensor.dtype}")
    if qkv.dim() != 3 or state.dim() != 4 or conv_weight.dim() != 3 or conv_weight.shape[1] != 1 \
            or conv_weight.shape[2] < 1:
        raise ValueError(
            f"gdn.conv_gated_delta_rule: qkv must be [B, T, C], conv_weight [C, 1, W] with W >= 1 and state "
            f"[B, Hv, Dk, Dv], got {list(qkv.shape)}, {list(conv_weight.shape)} and {list(state.shape)}")
    batch, length, channels = qkv.shape
    num_v_heads, taps = state.shape[1], conv_weight.shape[2]
    expected = {"a": [batch, length, num_v_heads], "b": [batch, length, num_v_heads],
                "conv_weight": [channels, 1, taps], "A_log": [num_v_heads], "dt_bias": [num_v_heads],
                "positions": [length], "conv_state": [batch, channels, taps - 1],
                "state": [batch, *state.shape[1:]]}
    for name, shape in expected.items():
        if list(named[name].shape) != shape:
            raise ValueError(f"gdn.conv_gated_delta_rule: {name} must have shape {shape} (from qkv "
                             f"{list(qkv.shape)}, conv_weight {list(conv_weight.shape)} and state "
                             f"{list(state.shape)}), got {list(named[name].shape)}")
    if length < 1:
        raise ValueError("gdn.conv_gated_delta_rule: qkv must hold at least one token, got T = 0")
    num_key_heads_of(channels, state)  # raises on an impossible channel count


def conv_gated_delta_rule_out(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state, *, output):
    """Reference: the model's conv and forget steps, then the recurrence's reference, in place."""
    check_conv_inputs(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state)
    starting = positions[:1] == 0
    a = forget_previous_sequence(a, A_log, dt_bias, starting)
    mixed_qkv = causal_conv(qkv, conv_state, conv_weight, starting)
    query, key, value, g, beta = unfuse(mixed_qkv, a, b, A_log, dt_bias, state)
    result, final_state = reference_gated_delta_rule(query, key, value, g, beta, state.float(), use_qk_l2norm=True)
    output.copy_(result)
    state.copy_(final_state)  # a float16 state rounds once a call, to nearest
    return output


def _output_shape(qkv, state) -> list:
    return [qkv.shape[0], qkv.shape[1], state.shape[1], state.shape[3]]


def conv_gated_delta_rule(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state):
    check_conv_inputs(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state)
    output = qkv.new_empty(_output_shape(qkv, state))
    return conv_gated_delta_rule_out(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state,
                                     output=output)


def _fake(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state):
    check_conv_inputs(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state)
    return qkv.new_empty(_output_shape(qkv, state))


def _fake_out(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state, *, output):
    check_conv_inputs(qkv, a, b, conv_weight, A_log, dt_bias, positions, conv_state, state)
    return output


define_op(SCHEMA, conv_gated_delta_rule, _fake)
define_op(OUT_SCHEMA, conv_gated_delta_rule_out, _fake_out)
