"""Pure-PyTorch forms of the gated delta rule: the specification of the op.

Two forms, proven equal by the tests:

* ``recurrent_gated_delta_rule``: one token at a time, exactly the recurrence
  the op contract states. Readable, slow for long sequences.
* ``chunked_gated_delta_rule``: the chunk-parallel (WY) form. Within a chunk
  the delta-rule updates become one unit-lower-triangular solve plus matrix
  products, so prefill runs as matrix work. Both GDA (scalar gate per head)
  and KDA (gate per key channel) are handled; every exponent it takes is of a
  gate difference ``Gamma_t - Gamma_s`` with ``s <= t``, so decays underflow
  to 0 gracefully instead of overflowing.

Shapes follow the op contract (see ``gdn_export.ops.contract``): query/key
``[B, T, Hk, Dk]``, value ``[B, T, Hv, Dv]``, g ``[B, T, Hv]`` or
``[B, T, Hv, Dk]``, beta ``[B, T, Hv]``, state ``[B, Hv, Dk, Dv]``.

These functions do not validate their inputs (the op does that) and compute in
float32, or in float64 when any input is float64 so tests can build an fp64
ground truth.
"""

from __future__ import annotations

import math

import torch

L2NORM_EPS = 1e-6


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 accumulate in fp32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim: the normalization Qwen3.5 (and fla) use."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def prepare_inputs(query, key, value, g, beta, initial_state, scale, use_qk_l2norm):
    """Cast to the compute dtype, repeat q/k heads to the value heads, normalize and scale q.

    Returns q, k ``[B, T, Hv, Dk]``, v ``[B, T, Hv, Dv]``, g ``[B, T, Hv, Dk or 1]``,
    beta ``[B, T, Hv]`` and a fresh state copy ``[B, Hv, Dk, Dv]``, all in the compute dtype.
    """
    dtype = compute_dtype(query, key, value, g, beta, initial_state)
    num_k_heads, key_dim = query.shape[2], query.shape[3]
    group = value.shape[2] // num_k_heads
    q = query.to(dtype)
    k = key.to(dtype)
    if group > 1:
        # Value head h reads key head h // group (Hugging Face's repeat_interleave order).
        q = q.repeat_interleave(group, dim=2)
        k = k.repeat_interleave(group, dim=2)
    if use_qk_l2norm:
        q = l2_normalize(q)
        k = l2_normalize(k)
    q = q * (scale if scale is not None else 1.0 / math.sqrt(key_dim))
    gate = g.to(dtype)
    if gate.dim() == 3:
        gate = gate.unsqueeze(-1)
    state = initial_state.to(dtype).clone()
    return q, k, value.to(dtype), gate, beta.to(dtype), state


def recurrent_gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor, *, scale: float | None = None, use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The specification, token by token.

    Per value head and step t: S *= exp(g_t); u = beta_t (v_t - S^T k_t);
    S += k_t u^T; o_t = S^T q_t. Returns (output in value's dtype, final state).
    """
    q, k, v, gate, beta_c, state = prepare_inputs(
        query, key, value, g, beta, initial_state, scale, use_qk_l2norm
    )
    outputs = []
    for t in range(q.shape[1]):
        state = state * gate[:, t].exp().unsqueeze(-1)
        k_t = k[:, t]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)
        update = beta_c[:, t].unsqueeze(-1) * (v[:, t] - predicted)
        state = state + k_t.unsqueeze(-1) * update.unsqueeze(-2)
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    output = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return output.to(value.dtype), state


def chunked_gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor, *, scale: float | None = None, use_qk_l2norm: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, a chunk of ``chunk_size`` tokens at a time.

    With Gamma_t the gate summed from the chunk start up to t (per key channel),
    state S_0 at the chunk start, K~_t = k_t exp(Gamma_t) and
    M[t, s] = sum_c k_t,c k_s,c exp(Gamma_t,c - Gamma_s,c) for s < t, the
    updates U solve (I + diag(beta) M) U = diag(beta) (V - K~ S_0). Then
    O = Q~ S_0 + (A masked to s <= t) U with A like M but with q_t, and
    S_C = exp(Gamma_C) S_0 + sum_s (k_s exp(Gamma_C - Gamma_s)) u_s^T.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    q, k, v, gate, beta_c, state = prepare_inputs(
        query, key, value, g, beta, initial_state, scale, use_qk_l2norm
    )
    # Work in [B, Hv, T, D] so each (batch, head) is one batch of matrix products.
    q, k, v, gate = (x.transpose(1, 2) for x in (q, k, v, gate))
    beta_c = beta_c.transpose(1, 2)
    per_channel_gate = gate.shape[-1] > 1
    outputs = []
    for start in range(0, q.shape[2], chunk_size):
        stop = min(start + chunk_size, q.shape[2])
        q_c, k_c, v_c = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop]
        beta_chunk = beta_c[:, :, start:stop]
        cumulative_gate = gate[:, :, start:stop].cumsum(dim=2)  # [B, H, C, Dk or 1]
        length = stop - start
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        strictly_causal = causal.tril(-1)
        if per_channel_gate:
            # exp(Gamma_t - Gamma_s) per channel, masked before exp so s > t never overflows.
            gate_diff = cumulative_gate.unsqueeze(3) - cumulative_gate.unsqueeze(2)
            gate_diff = gate_diff.masked_fill(~causal[:, :, None], float("-inf"))
            decay = gate_diff.exp()  # [B, H, C(t), C(s), Dk]
            key_key = torch.einsum("bhtc,bhsc,bhtsc->bhts", k_c, k_c, decay)
            query_key = torch.einsum("bhtc,bhsc,bhtsc->bhts", q_c, k_c, decay)
        else:
            gate_diff = cumulative_gate[..., 0].unsqueeze(3) - cumulative_gate[..., 0].unsqueeze(2)
            decay = gate_diff.masked_fill(~causal, float("-inf")).exp()  # [B, H, C, C]
            key_key = (k_c @ k_c.transpose(-1, -2)) * decay
            query_key = (q_c @ k_c.transpose(-1, -2)) * decay
        key_key = key_key.masked_fill(~strictly_causal, 0.0)
        query_key = query_key.masked_fill(~causal, 0.0)
        chunk_decay = cumulative_gate.exp()  # exp(Gamma_t), broadcasts over Dk
        decayed_keys = k_c * chunk_decay
        system = torch.eye(length, dtype=q.dtype, device=q.device) + beta_chunk.unsqueeze(-1) * key_key
        rhs = beta_chunk.unsqueeze(-1) * (v_c - decayed_keys @ state)
        updates = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        outputs.append((q_c * chunk_decay) @ state + query_key @ updates)
        last_gate = cumulative_gate[:, :, -1:]  # [B, H, 1, Dk or 1]
        keys_to_end = k_c * (last_gate - cumulative_gate).exp()
        state = state * last_gate.transpose(-1, -2).exp() + keys_to_end.transpose(-1, -2) @ updates
    if outputs:
        output = torch.cat(outputs, dim=2).transpose(1, 2)
    else:
        output = v.transpose(1, 2).new_zeros(v.transpose(1, 2).shape)
    return output.to(value.dtype), state

