"""``gdn::cached_attention``: causal attention of new tokens over a KV cache.

Qwen3.5's full-attention layers keep their keys and values in fixed-size
caches (``max_seq_len`` positions). Written with plain tensor ops, every call
multiplies against the whole cache and masks the unused tail: at position 100
of a 4096-position cache, 97% of the attention work and memory traffic is
wasted, and the slice that would avoid it has a data-dependent length no
delegate accepts. This op reads the position from ``input_pos`` at run time and
touches only the cache positions the new tokens can see:

    gdn::cached_attention(Tensor query, Tensor k_cache, Tensor v_cache,
        Tensor input_pos, *, float? scale=None) -> Tensor
    gdn::cached_attention.out(<same>, Tensor(a!) output) -> Tensor(a!)

    query      [Hq, T, D]   the new tokens' queries (batch 1)
    k_cache    [Hkv, D, S]  keys, stored transposed (position last)
    v_cache    [Hkv, S, D]  values
    input_pos  [1] int64    position of the first new token; the caches
                            already hold the new tokens' keys and values
    -> output  [Hq, T, D]   query's dtype

Query head h reads KV head h // (Hq / Hkv) (transformers' repeat_kv order).
Row t, at position p = input_pos + t, attends to cache positions 0..p with
scale (default D**-0.5) and an fp32 softmax. The reference below is the masked
whole-cache form the model uses in eager mode; runtime_ops implements the op
in C++ for ExecuTorch programs (float32).
"""

from __future__ import annotations

import torch

from gdn_export.ops.contract import FLOAT_DTYPES, define_op

_ARGS = "Tensor query, Tensor k_cache, Tensor v_cache, Tensor input_pos, *, float? scale=None"
SCHEMA = f"cached_attention({_ARGS}) -> Tensor"
OUT_SCHEMA = f"cached_attention.out({_ARGS}, Tensor(a!) output) -> Tensor(a!)"


def check_attention_inputs(query, k_cache, v_cache, input_pos) -> None:
    """Raises TypeError / ValueError naming the argument and what it must be (shapes only: no data is read)."""
    named = {"query": query, "k_cache": k_cache, "v_cache": v_cache, "input_pos": input_pos}
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn.cached_attention: {name} must be a Tensor, got {type(tensor).__name__}")
    for name in ("query", "k_cache", "v_cache"):
        if named[name].dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"gdn.cached_attention: {name} must be float32, bfloat16 or float16, got {named[name].dtype}"
            )
    if input_pos.dtype != torch.long or input_pos.shape != (1,):
        raise TypeError(
            f"gdn.cached_attention: input_pos must be an int64 tensor of shape [1], "
            f"got {input_pos.dtype} {list(input_pos.shape)}"
        )
    for name, layout in (("query", "[Hq, T, D]"), ("k_cache", "[Hkv, D, S]"), ("v_cache", "[Hkv, S, D]")):
        if named[name].dim() != 3:
            raise ValueError(f"gdn.cached_attention: {name} must be {layout}, got shape {list(named[name].shape)}")
    num_heads, _, head_dim = query.shape
    num_kv_heads, _, max_len = k_cache.shape
    if list(k_cache.shape) != [num_kv_heads, head_dim, max_len]:
        raise ValueError(
            f"gdn.cached_attention: k_cache must be [Hkv, D={head_dim}, S] (D from query {list(query.shape)}), "
            f"got {list(k_cache.shape)}"
        )
    if list(v_cache.shape) != [num_kv_heads, max_len, head_dim]:
        raise ValueError(
            f"gdn.cached_attention: v_cache must be [Hkv={num_kv_heads}, S={max_len}, D={head_dim}] "
            f"(from k_cache {list(k_cache.shape)}), got {list(v_cache.shape)}"
        )
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"gdn.cached_attention: query's head count {num_heads} must be a multiple of the caches' {num_kv_heads}"
        )


def reference_cached_attention(query, k_cache, v_cache, input_pos, *, scale=None):
    """Masked attention over the whole cache (the form plain tensor ops allow)."""
    check_attention_inputs(query, k_cache, v_cache, input_pos)
    num_heads, length, head_dim = query.shape
    num_kv_heads, _, max_len = k_cache.shape
    start = int(input_pos[0])
    if start < 0 or start + length > max_len:
        raise ValueError(
            f"gdn.cached_attention: input_pos {start} + T {length} must lie within the caches' {max_len} positions"
        )
    scale = head_dim**-0.5 if scale is None else scale
    group = num_heads // num_kv_heads
    grouped = query.reshape(num_kv_heads, group * length, head_dim).float()
    scores = torch.bmm(grouped, k_cache.float()) * scale  # [Hkv, G*T, S]
    positions = start + torch.arange(length, device=query.device)
    visible = torch.arange(max_len, device=query.device)[None, :] <= positions[:, None]  # [T, S]
    scores = scores.masked_fill(~visible.repeat(group, 1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.bmm(weights, v_cache.float()).reshape(num_heads, length, head_dim).to(query.dtype)


def reference_cached_attention_out(query, k_cache, v_cache, input_pos, *, scale=None, output):
    result = reference_cached_attention(query, k_cache, v_cache, input_pos, scale=scale)
    if output.shape != result.shape or output.dtype != result.dtype:
        raise ValueError(
            f"gdn.cached_attention.out: output must be {list(result.shape)} {result.dtype}, "
            f"got {list(output.shape)} {output.dtype}"
        )
    return output.copy_(result)


def _fake_cached_attention(query, k_cache, v_cache, input_pos, *, scale=None):
    check_attention_inputs(query, k_cache, v_cache, input_pos)
    return torch.empty_like(query)


def _fake_cached_attention_out(query, k_cache, v_cache, input_pos, *, scale=None, output):
    check_attention_inputs(query, k_cache, v_cache, input_pos)
    return output


define_op(SCHEMA, reference_cached_attention, _fake_cached_attention)
define_op(OUT_SCHEMA, reference_cached_attention_out, _fake_cached_attention_out)
