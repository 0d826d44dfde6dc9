"""``gdn::fused_gated_delta_rule``: the recurrence with what surrounds it in Qwen3.5.

Qwen3.5's GatedDeltaNet feeds the recurrence from one conv output and two raw
projections. GPU backends fold that glue into the kernel (one launch instead
of half a dozen small ones), so it gets its own op in the contract:

    gdn::fused_gated_delta_rule(Tensor mixed_qkv, Tensor a, Tensor b,
        Tensor A_log, Tensor dt_bias, Tensor(a!) state, *, float? scale=None)
        -> Tensor output
    gdn::fused_gated_delta_rule.out(<same>, Tensor(b!) output) -> Tensor(b!)

    mixed_qkv  [B, T, 2*Hk*Dk + Hv*Dv]  causal-conv + SiLU output, q | k | v
    a, b       [B, T, Hv]                raw in_proj_a / in_proj_b outputs
    A_log      [Hv], dt_bias [Hv]
    state      [B, Hv, Dk, Dv] float32, read as the initial state and
               overwritten with the final state (in place, as
               ``gated_delta_rule_inplace``)
    -> output  [B, T, Hv, Dv] in mixed_qkv's dtype

Hv, Dk and Dv come from ``state``; Hk = (channels - Hv*Dv) / (2*Dk). The op
splits q/k/v, L2-normalizes q and k, repeats heads, gates with
g = -exp(A_log) * softplus(a + dt_bias) (fp32) and beta = sigmoid(b), then runs
``gdn::gated_delta_rule`` semantics. Its reference below is literally the
unfused op plus reference gating, which is what the conformance suite checks
every fused kernel against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.contract import FLOAT_DTYPES, check_inputs, define_op

_ARGS = (
    "Tensor mixed_qkv, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, Tensor(a!) state, "
    "*, float? scale=None"
)
FUSED_SCHEMA = f"fused_gated_delta_rule({_ARGS}) -> Tensor"
FUSED_OUT_SCHEMA = f"fused_gated_delta_rule.out({_ARGS}, Tensor(b!) output) -> Tensor(b!)"


def num_key_heads(mixed_qkv: torch.Tensor, state: torch.Tensor) -> int:
    """Hk of mixed_qkv [B, T, 2*Hk*Dk + Hv*Dv] (Hv, Dk, Dv from state); raises on an impossible channel count."""
    return num_key_heads_of(mixed_qkv.shape[-1], state)


def num_key_heads_of(channels: int, state: torch.Tensor) -> int:
    """Hk of a layer whose q, k and v channels number ``channels`` = 2*Hk*Dk + Hv*Dv (Hv, Dk, Dv from state)."""
    num_v_heads, key_dim, value_dim = state.shape[1], state.shape[2], state.shape[3]
    key_channels = channels - num_v_heads * value_dim
    if key_channels <= 0 or key_channels % (2 * key_dim) != 0:
        raise ValueError(
            f"gdn.fused_gated_delta_rule: mixed_qkv's last dim must be 2*Hk*Dk + Hv*Dv with "
            f"Hv={num_v_heads}, Dk={key_dim}, Dv={value_dim} (from state {list(state.shape)}), "
            f"got {channels}"
        )
    return key_channels // (2 * key_dim)


def split_heads(mixed_qkv: torch.Tensor, state: torch.Tensor):
    """(num_k_heads, query [B,T,Hk,Dk], key [B,T,Hk,Dk], value [B,T,Hv,Dv]) views of mixed_qkv."""
    batch, length, _ = mixed_qkv.shape
    num_v_heads, key_dim, value_dim = state.shape[1], state.shape[2], state.shape[3]
    num_k_heads = num_key_heads(mixed_qkv, state)
    query, key, value = torch.split(
        mixed_qkv, [num_k_heads * key_dim, num_k_heads * key_dim, num_v_heads * value_dim], dim=-1
    )
    return (
        num_k_heads,
        query.reshape(batch, length, num_k_heads, key_dim),
        key.reshape(batch, length, num_k_heads, key_dim),
        value.reshape(batch, length, num_v_heads, value_dim),
    )


def gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """Qwen3.5's gates: g = -exp(A_log) * softplus(a + dt_bias) in fp32 (or fp64), beta = sigmoid(b)."""
    dtype = torch.promote_types(a.dtype, torch.float32)
    g = -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))
    return g, b.sigmoid()


def check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state) -> None:
    named = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "state": state}
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn.fused_gated_delta_rule: {name} must be a Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"gdn.fused_gated_delta_rule: {name} must be float32, bfloat16 or float16, got {tensor.dtype}"
            )
    if mixed_qkv.dim() != 3:
        raise ValueError(
            f"gdn.fused_gated_delta_rule: mixed_qkv must be [B, T, channels], got shape {list(mixed_qkv.shape)}"
        )
    if state.dim() != 4:
        raise ValueError(
            f"gdn.fused_gated_delta_rule: state must be [B, Hv, Dk, Dv], got shape {list(state.shape)}"
        )
    batch, length = mixed_qkv.shape[0], mixed_qkv.shape[1]
    num_v_heads = state.shape[1]
    expected = {
        "a": [batch, length, num_v_heads],
        "b": [batch, length, num_v_heads],
        "A_log": [num_v_heads],
        "dt_bias": [num_v_heads],
    }
    for name, shape in expected.items():
        if list(named[name].shape) != shape:
            raise ValueError(
                f"gdn.fused_gated_delta_rule: {name} must have shape {shape} (from mixed_qkv "
                f"{list(mixed_qkv.shape)} and state {list(state.shape)}), got {list(named[name].shape)}"
            )
    if state.shape[0] != batch:
        raise ValueError(
            f"gdn.fused_gated_delta_rule: state must have batch {batch} (from mixed_qkv), "
            f"got shape {list(state.shape)}"
        )
    num_key_heads(mixed_qkv, state)  # raises on an impossible channel count


def unfuse(mixed_qkv, a, b, A_log, dt_bias, state):
    """The unfused op's inputs (query, key, value, g, beta) for the same computation."""
    _, query, key, value = split_heads(mixed_qkv, state)
    g, beta = gating(a, b, A_log, dt_bias)
    return query, key, value, g, beta


def fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
    """Reference: the unfused ``.out`` kernel of the current backend, with reference gating."""
    check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    query, key, value, g, beta = unfuse(mixed_qkv, a, b, A_log, dt_bias, state)
    check_inputs(query, key, value, g, beta, state, scale)
    torch.ops.gdn.gated_delta_rule.out(
        query, key, value, g, beta, state, scale=scale, use_qk_l2norm=True, output=output, final_state=state
    )
    return output


def fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None):
    check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    _, _, _, value = split_heads(mixed_qkv, state)
    output = torch.empty(value.shape, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    return fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, scale=scale, output=output)


def _fake_fused(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None):
    check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    _, _, _, value = split_heads(mixed_qkv, state)
    return torch.empty(value.shape, dtype=mixed_qkv.dtype, device=mixed_qkv.device)


def _fake_fused_out(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
    check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    return output


define_op(FUSED_SCHEMA, fused_gated_delta_rule, _fake_fused)
define_op(FUSED_OUT_SCHEMA, fused_gated_delta_rule_out, _fake_fused_out)
