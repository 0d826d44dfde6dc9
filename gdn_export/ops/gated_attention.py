"""``gdn::gated_attention``: a Qwen3.5 full-attention layer between its projections, in one call.

    gdn::gated_attention(Tensor q_gate, Tensor key, Tensor value, Tensor q_norm_weight,
        Tensor k_norm_weight, Tensor cos, Tensor sin, Tensor input_pos, Tensor(a!) k_cache,
        Tensor(b!) v_cache, *, float eps) -> Tensor output
    gdn::gated_attention.out(<same>, *, float eps, Tensor(c!) output) -> Tensor(c!)

    q_gate        [1, T, H * 2D]   q_proj's output: head h's query, then its output gate, at h * 2D
    key, value    [1, T, Hkv * D]  k_proj's and v_proj's outputs
    q_norm_weight, k_norm_weight [D]  the heads' RMSNorms (weight 1 + w, both of ``eps``)
    cos, sin      [T, R]           the rotary embedding of the first R channels of each head, halves layout
    input_pos     [1] int64        position of the first token
    k_cache       [Hkv, D, S]      keys, position last: the new tokens' are written at input_pos..
    v_cache       [Hkv, S, D]      values, likewise
    -> output     [1, T, H * D]    the attention, times the sigmoid of each head's gate: o_proj's input
    all float32 but input_pos.

It is what ``GatedAttention.forward`` computes between its projections: the
query and key heads normed and rotated, the key and value written into the
caches, causal attention over them (``gdn::cached_attention``) and the gate. In
the CPU programs that was, a layer at a token, two XNNPACK calls of some thirty
small ops (the norms, the rotations, the gate), two portable ``index_put_``
calls and the attention; the C++ kernel (``runtime_ops``) makes it one. The
reference below writes the model's steps with the same ops in the same order,
so an eager model computes the same floats.
"""

from __future__ import annotations

import torch

from gdn_export.ops.attention import reference_cached_attention
from gdn_export.ops.contract import define_op

_ARGS = (
    "Tensor q_gate, Tensor key, Tensor value, Tensor q_norm_weight, Tensor k_norm_weight, Tensor cos, Tensor sin, "
    "Tensor input_pos, Tensor(a!) k_cache, Tensor(b!) v_cache"
)
SCHEMA = f"gated_attention({_ARGS}, *, float eps) -> Tensor"
OUT_SCHEMA = f"gated_attention.out({_ARGS}, *, float eps, Tensor(c!) output) -> Tensor(c!)"


def check_gated_attention_inputs(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                                 v_cache) -> None:
    """Raises TypeError / ValueError naming the argument and what it must be (shapes only: no data is read)."""
    named = {"q_gate": q_gate, "key": key, "value": value, "q_norm_weight": q_norm_weight,
             "k_norm_weight": k_norm_weight, "cos": cos, "sin": sin, "k_cache": k_cache, "v_cache": v_cache}
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
            got = str(tensor.dtype) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"gdn.gated_attention: {name} must be a float32 tensor, got {got}")
    if k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError(f"gdn.gated_attention: k_cache must be [Hkv, D, S] and v_cache [Hkv, S, D], got "
                         f"{list(k_cache.shape)} and {list(v_cache.shape)}")
    num_kv_heads, head_dim, _ = k_cache.shape
    if q_gate.dim() != 3 or q_gate.shape[0] != 1 or q_gate.shape[2] % (2 * head_dim) or q_gate.shape[2] == 0:
        raise ValueError(f"gdn.gated_attention: q_gate must be [1, T, H * 2D] with D={head_dim} (from k_cache "
                         f"{list(k_cache.shape)}), got {list(q_gate.shape)}")
    length = q_gate.shape[1]
    num_heads = q_gate.shape[2] // (2 * head_dim)
    for name in ("key", "value"):
        if list(named[name].shape) != [1, length, num_kv_heads * head_dim]:
            raise ValueError(f"gdn.gated_attention: {name} must be [1, T={length}, Hkv * D={num_kv_heads * head_dim}]"
                             f", got {list(named[name].shape)}")
    for name in ("q_norm_weight", "k_norm_weight"):
        if list(named[name].shape) != [head_dim]:
            raise ValueError(f"gdn.gated_attention: {name} must be [D={head_dim}], got {list(named[name].shape)}")
    # R = 0 (partial_rotary_factor 0) rotates nothing.
    if cos.dim() != 2 or cos.shape[0] != length or cos.shape[1] % 2 or not 0 <= cos.shape[1] <= head_dim:
        raise ValueError(f"gdn.gated_attention: cos must be [T={length}, R], R even from 0 to D={head_dim}, got "
                         f"{list(cos.shape)}")
    if sin.shape != cos.shape:
        raise ValueError(f"gdn.gated_attention: sin must be cos's {list(cos.shape)}, got {list(sin.shape)}")
    if list(v_cache.shape) != [num_kv_heads, k_cache.shape[2], head_dim]:
        raise ValueError(f"gdn.gated_attention: v_cache must be [Hkv={num_kv_heads}, S={k_cache.shape[2]}, "
                         f"D={head_dim}] (from k_cache {list(k_cache.shape)}), got {list(v_cache.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"gdn.gated_attention: q_gate's {num_heads} heads must be a multiple of the caches' "
                         f"{num_kv_heads}")
    if not isinstance(input_pos, torch.Tensor) or input_pos.dtype != torch.long or list(input_pos.shape) != [1]:
        got = f"{input_pos.dtype} {list(input_pos.shape)}" if isinstance(input_pos, torch.Tensor) else \
            type(input_pos).__name__
        raise TypeError(f"gdn.gated_attention: input_pos must be an int64 tensor of shape [1], got {got}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm over the last dim (zero-centered weight), as the model's ``RMSNorm`` computes it."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [H, T, D] with its first R = cos.shape[-1] channels rotated (halves layout), as the model's
    ``apply_rotary``."""
    rotary_dim = cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    first, second = rotated.chunk(2, dim=-1)
    return torch.cat((rotated * cos + torch.cat((-second, first), dim=-1) * sin, passed), dim=-1)


def gated_attention_out(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache, v_cache, *,
                        eps, output):
    """Reference: the model's steps, the caches written in place."""
    check_gated_attention_inputs(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                                 v_cache)
    num_kv_heads, head_dim, max_len = k_cache.shape
    length = q_gate.shape[1]
    num_heads = q_gate.shape[2] // (2 * head_dim)
    start = int(input_pos[0])
    if start < 0 or start + length > max_len:
        raise ValueError(f"gdn.gated_attention: input_pos must place the {length} new tokens within the caches' "
                         f"{max_len} positions, got {start}")
    if list(output.shape) != [1, length, num_heads * head_dim] or output.dtype != torch.float32:
        raise ValueError(f"gdn.gated_attention.out: output must be float32 [1, {length}, {num_heads * head_dim}], "
                         f"got {output.dtype} {list(output.shape)}")
    query, gate = q_gate.view(length, num_heads, 2 * head_dim).chunk(2, dim=-1)
    query = rms_norm(query, q_norm_weight, eps).transpose(0, 1)  # [H, T, D]
    key = rms_norm(key.view(length, num_kv_heads, head_dim), k_norm_weight, eps).transpose(0, 1)
    value = value.view(length, num_kv_heads, head_dim).transpose(0, 1)
    query, key = rotate(query, cos, sin), rotate(key, cos, sin)
    positions = start + torch.arange(length, device=k_cache.device)
    torch.ops.aten.index_put_(k_cache, [None, None, positions], key.transpose(1, 2))
    torch.ops.aten.index_put_(v_cache, [None, positions], value)
    attended = reference_cached_attention(query, k_cache, v_cache, input_pos)  # [H, T, D]
    attended = attended.transpose(0, 1).reshape(1, length, -1)
    return output.copy_(attended * torch.sigmoid(gate.reshape(1, length, -1)))


def _output(q_gate, k_cache) -> torch.Tensor:
    return q_gate.new_empty(1, q_gate.shape[1], q_gate.shape[2] // 2)


def gated_attention(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache, v_cache, *,
                    eps):
    check_gated_attention_inputs(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                                 v_cache)
    return gated_attention_out(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                               v_cache, eps=eps, output=_output(q_gate, k_cache))


def _fake(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache, v_cache, *, eps):
    check_gated_attention_inputs(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                                 v_cache)
    return _output(q_gate, k_cache)


def _fake_out(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache, v_cache, *, eps,
              output):
    check_gated_attention_inputs(q_gate, key, value, q_norm_weight, k_norm_weight, cos, sin, input_pos, k_cache,
                                 v_cache)
    return output


define_op(SCHEMA, gated_attention, _fake)
define_op(OUT_SCHEMA, gated_attention_out, _fake_out)
