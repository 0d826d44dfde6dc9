"""Qwen3.5 (dense and MoE), written to export: static caches, state in buffers.

The text model of Hugging Face's ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``
(and of the ``*ForConditionalGeneration`` wrappers every released checkpoint
uses), with the same numerics as transformers 5.23. The layers follow
``config.layer_types``:

* ``linear_attention``: Gated DeltaNet. One projection gives q|k|v, which go
  through a causal depthwise conv (its last ``kernel - 1`` inputs kept in
  ``conv_state``) and SiLU; the delta-rule recurrence then runs over the
  ``recurrent_state`` buffer, and a gated RMSNorm with ``z`` feeds the output
  projection. The recurrence is the swappable ``recurrence`` submodule: here
  the per-token reference loop; ``gdn_export.passes`` swaps in a ``gdn`` op.
* ``full_attention``: gated attention. q and an output gate come from one
  projection, q/k get RMSNorm and partial rotary embeddings, K/V go into a
  static cache, and GQA reads the cache without repeating it. The attention
  over the cache is the swappable ``attend`` submodule: here masked over the
  whole cache; on CPU backends ``gdn_export.passes`` swaps in an op that reads
  only the positions written so far.

``forward(tokens [1, T], input_pos [1])`` continues from the previous call:
the caches are written at ``input_pos .. input_pos + T - 1`` with tensor ops
(``index_put_``) and the causal mask comes from the positions, so the same
code exports with a dynamic ``T`` once the recurrence is an op.

The routed MoE experts gather each token's k experts' weights (as gpt-fast
does): ideal for decode, but the gathered weights grow as T * k * expert size,
so long prefills of the large MoE models want a grouped-expert kernel.

Text-only positions make Qwen3.5's multimodal rotary sections (mrope) all
equal, so plain rotary embeddings over the first ``partial_rotary_factor`` of
each head reproduce them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import guard_or_false

from gdn_export.ops import reference
from gdn_export.ops.conv_recurrence import causal_conv, forget_previous_sequence
from gdn_export.ops.fused import gating, split_heads

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

# model_type of config.json -> whether it is MoE. The wrappers hold the text
# model's config under "text_config".
TEXT_MODEL_TYPES = {"qwen3_5_text": False, "qwen3_5_moe_text": True}
WRAPPER_MODEL_TYPES = {"qwen3_5": False, "qwen3_5_moe": True}
TRANSFORMERS_DEFAULT_HEAD_DIM = 256  # Qwen3_5TextConfig's and Qwen3_5MoeTextConfig's


@dataclass(frozen=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # MLP: dense when num_experts == 0
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, config: dict) -> "Qwen35Config":
        """From a Hugging Face config.json dict: text-only or the vision-language wrapper, dense or MoE."""
        model_type = config.get("model_type")
        if model_type in WRAPPER_MODEL_TYPES:
            if not isinstance(config.get("text_config"), dict):
                raise ValueError(f"config of model_type {model_type!r} must have a 'text_config' dict")
            text = dict(config["text_config"])
            text.setdefault("model_type", model_type + "_text")
            # The wrapper decides the tying (transformers reads the top-level value).
            text["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
            for key in ("bos_token_id", "eos_token_id"):
                if text.get(key) is None and config.get(key) is not None:
                    text[key] = config[key]
            return cls.from_hf(text)
        if model_type not in TEXT_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; expected one of "
                f"{sorted(TEXT_MODEL_TYPES) + sorted(WRAPPER_MODEL_TYPES)}"
            )
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {config['hidden_act']!r}; Qwen3.5 uses 'silu'")
        rope = dict(config.get("rope_parameters") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported rope_type {rope_type!r}; only 'default' is implemented")
        num_layers = config.get("num_hidden_layers", 32)
        layer_types = config.get("layer_types")
        if layer_types is None:
            interval = config.get("full_attention_interval", 4)
            layer_types = [
                FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)
            ]
        unknown = set(layer_types) - {LINEAR_ATTENTION, FULL_ATTENTION}
        if unknown or len(layer_types) != num_layers:
            raise ValueError(
                f"layer_types must list {num_layers} of {LINEAR_ATTENTION!r}/{FULL_ATTENTION!r}, got {layer_types}"
            )
        is_moe = TEXT_MODEL_TYPES[model_type]
        # A MoE model of no experts would pass for a dense one (is_moe counts experts).
        if is_moe and (isinstance(config["num_experts"], bool) or not isinstance(config["num_experts"], int)
                       or config["num_experts"] < 1):
            raise ValueError(f"num_experts must be a positive integer, got {config['num_experts']!r}")
        eos = config.get("eos_token_id")
        eos_token_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            layer_types=tuple(layer_types),
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            # transformers' config class fills an absent head_dim with its default, not hidden_size / heads.
            head_dim=config.get("head_dim", TRANSFORMERS_DEFAULT_HEAD_DIM),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            partial_rotary_factor=float(
                rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
            ),
            linear_num_key_heads=config["linear_num_key_heads"],
            linear_num_value_heads=config["linear_num_value_heads"],
            linear_key_head_dim=config["linear_key_head_dim"],
            linear_value_head_dim=config["linear_value_head_dim"],
            linear_conv_kernel_dim=config.get("linear_conv_kernel_dim", 4),
            intermediate_size=0 if is_moe else config["intermediate_size"],
            num_experts=config["num_experts"] if is_moe else 0,
            num_experts_per_tok=config["num_experts_per_tok"] if is_moe else 0,
            moe_intermediate_size=config["moe_intermediate_size"] if is_moe else 0,
            shared_expert_intermediate_size=config["shared_expert_intermediate_size"] if is_moe else 0,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            attention_bias=config.get("attention_bias", False),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            max_position_embeddings=config.get("max_position_embeddings", 32768),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_token_ids,
        )


def mean_of_squares(x32: torch.Tensor) -> torch.Tensor:
    """The mean of x² over the last dim, kept: what an RMSNorm divides by (a backend may compute it
    another way: the norms call it through ``self``)."""
    return x32.pow(2).mean(-1, keepdim=True)


class RMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: zero-centered weight, scaled by (1 + weight), computed in fp32."""

    mean_of_squares = staticmethod(mean_of_squares)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(self.mean_of_squares(x32) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """RMSNorm (plain weight) of the recurrence output, then multiplied by SiLU(z)."""

    mean_of_squares = staticmethod(mean_of_squares)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(self.mean_of_squares(x32) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(z.float())).to(x.dtype)


class PerTokenRecurrence(nn.Module):
    """The recurrence as the plain per-token loop of the reference (exports at a fixed T only).

    Takes the conv+SiLU output ``mixed_qkv [B, T, 2*Hk*Dk + Hv*Dv]`` and the raw
    gate projections ``a``, ``b [B, T, Hv]``; returns ``[B, T, Hv, Dv]`` and leaves
    the final state in ``state``. Same signature as ``gdn::fused_gated_delta_rule``.
    """

    def forward(self, mixed_qkv, a, b, A_log, dt_bias, state):
        _, query, key, value = split_heads(mixed_qkv, state)
        g, beta = gating(a, b, A_log, dt_bias)
        output, final_state = reference.recurrent_gated_delta_rule(
            query, key, value, g, beta, state, use_qk_l2norm=True
        )
        state.copy_(final_state)
        return output


class GatedDeltaNet(nn.Module):
    # The decoding state this layer keeps (see Qwen35ForCausalLM.state_buffers): both
    # summarize every position seen, so neither has a position dim.
    STATE_POSITION_DIMS = {"conv_state": None, "recurrent_state": None}
    # The linear children that read the layer's input x (a backend may compute them as one product).
    INPUT_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")

    def __init__(self, config: Qwen35Config):
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.key_head_dim = config.linear_key_head_dim
        self.value_head_dim = config.linear_value_head_dim
        value_dim = self.num_v_heads * self.value_head_dim
        self.conv_dim = 2 * self.num_k_heads * self.key_head_dim + value_dim
        kernel_size = config.linear_conv_kernel_dim
        hidden = config.hidden_size
        self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.value_head_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, hidden, bias=False)
        self.recurrence: nn.Module = PerTokenRecurrence()
        # The conv's last kernel_size - 1 inputs, channels first as the conv reads them.
        self.register_buffer("conv_state", torch.zeros(1, self.conv_dim, kernel_size - 1), persistent=False)
        self.register_buffer(
            "recurrent_state",
            torch.zeros(1, self.num_v_heads, self.key_head_dim, self.value_head_dim, dtype=torch.float32),
            persistent=False,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``positions`` [T]: the tokens' positions; a call at position 0 starts a new sequence."""
        batch, length, _ = x.shape
        z = self.in_proj_z(x).reshape(batch, length, self.num_v_heads, self.value_head_dim)
        core = self.convolved_recurrence(self.in_proj_qkv(x), self.in_proj_a(x), self.in_proj_b(x), positions)
        core = self.norm(core, z)
        return self.out_proj(core.reshape(batch, length, -1))

    def convolved_recurrence(self, qkv, a, b, positions) -> torch.Tensor:
        """From the projections qkv [B, T, C], a and b [B, T, Hv] to the recurrence's output [B, T, Hv, Dv]: the
        causal conv over the conv state, the gates and the recurrence, both states updated. The CPU backends
        compute it as one op, ``gdn::conv_gated_delta_rule``, whose reference is this."""
        starting = positions[:1] == 0
        a = forget_previous_sequence(a, self.A_log, self.dt_bias, starting)
        mixed_qkv = causal_conv(qkv, self.conv_state, self.conv1d.weight, starting)
        return self.recurrence(mixed_qkv, a, b, self.A_log, self.dt_bias, self.recurrent_state)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary_embedding(positions: torch.Tensor, config: Qwen35Config, dtype: torch.dtype):
    """cos/sin [T, rotary_dim] for the first ``rotary_dim`` channels of each head, halves layout.

    Computed per call (a few small ops) rather than kept in a buffer, so a model
    built on the meta device needs no buffer but its caches filled in.
    """
    dim = config.rotary_dim
    if dim == 0:  # partial_rotary_factor 0: nothing rotated. Empty tables sliced from the positions, since
        # ExecuTorch cannot emit the tensor of a symbolic shape the products below make of an empty frequency list.
        empty = positions.to(dtype)[:, None][:, :0]
        return empty, empty
    channels = torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device)
    # A float divisor: an int one is a mixed-type division, the one op for which ExecuTorch's edge lowering
    # re-traces the whole program to insert a cast (runtime_ops.xnnpack_lowering's EDGE_PASS_REWRITES).
    inv_freq = 1.0 / (config.rope_theta ** (channels / float(dim)))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, dim / 2]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [H, T, D]; rotates the first cos.shape[-1] channels, passes the rest through."""
    rotary_dim = cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rotated * cos + rotate_half(rotated) * sin, passed), dim=-1)


class MaskedCacheAttention(nn.Module):
    """Attention of the new tokens over the whole cache with a causal mask: plain tensor ops any backend takes."""

    def forward(self, query, k_cache, v_cache, positions, mask):
        """query [H, T, D], k_cache [Hkv, D, S], v_cache [Hkv, S, D], mask [T, S] -> [H, T, D]."""
        num_heads, length, head_dim = query.shape
        num_kv_heads = k_cache.shape[0]
        # GQA without repeating the cache: each KV head attends for its group of
        # query heads, stacked along the time axis.
        group = num_heads // num_kv_heads
        grouped_query = query.reshape(num_kv_heads, group * length, head_dim)
        scores = torch.bmm(grouped_query, k_cache.to(query.dtype)) * head_dim**-0.5
        scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))  # [Hkv, G*T, S]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        attended = torch.bmm(weights, v_cache.to(query.dtype)).unflatten(1, (group, length))  # [Hkv, G, T, D]
        # The KV heads' [G, T, D] blocks concatenated, not viewed as one [H, T, D]: a view
        # merges two dims strided by T, whose stride min(G*T*D, T*D) torch.export cannot
        # prove equal to T*D over a named range of T (2.13 with view or reshape, 2.11 with
        # flatten too). cat writes a fresh contiguous tensor, so no such guard arises.
        return torch.cat(attended.unbind(0), dim=0)


class GatedAttention(nn.Module):
    # The decoding state this layer keeps: one cache entry per position, along these dims.
    STATE_POSITION_DIMS = {"k_cache": 2, "v_cache": 1}
    # The linear children that read the layer's input x (a backend may compute them as one product).
    INPUT_PROJECTIONS = ("q_proj", "k_proj", "v_proj")

    def __init__(self, config: Qwen35Config, max_seq_len: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        # q and the output gate interleaved per head: [q_h | gate_h] for each head h.
        self.q_proj = nn.Linear(hidden, 2 * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        # Batch 1, so no batch dim. Keys are stored transposed ([Hkv, D, S]) so that
        # scores and outputs are plain batched matmuls over the caches as they lie:
        # no per-step permute or expand copy of a cache in the exported program.
        self.register_buffer("k_cache", torch.zeros(self.num_kv_heads, self.head_dim, max_seq_len), persistent=False)
        self.register_buffer("v_cache", torch.zeros(self.num_kv_heads, max_seq_len, self.head_dim), persistent=False)
        # Swappable like GatedDeltaNet.recurrence: gdn_export.passes.rewrite may put an op here.
        self.attend = MaskedCacheAttention()

    def forward(self, x, positions, cos, sin, mask):
        length = x.shape[1]
        query, gate = self.q_proj(x).view(length, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        query = self.q_norm(query).transpose(0, 1)  # [H, T, D]
        key = self.k_norm(self.k_proj(x).view(length, self.num_kv_heads, self.head_dim)).transpose(0, 1)
        value = self.v_proj(x).view(length, self.num_kv_heads, self.head_dim).transpose(0, 1)
        query = apply_rotary(query, cos, sin)
        key = apply_rotary(key, cos, sin)
        # index_put_ (not index_copy_): ExecuTorch's reinplace pass updates it in place. Called
        # as the op, not as `cache[:, :, positions] = x`: Python indexing strips the value's
        # leading size-1 dims (one KV head), and ExecuTorch's in-place index_put kernel takes
        # only values of the cache's rank (it fails the call otherwise).
        torch.ops.aten.index_put_(self.k_cache, [None, None, positions], key.transpose(1, 2).to(self.k_cache.dtype))
        torch.ops.aten.index_put_(self.v_cache, [None, positions], value.to(self.v_cache.dtype))
        attended = self.attend(query, self.k_cache, self.v_cache, positions, mask)  # [H, T, D]
        attended = attended.transpose(0, 1).reshape(1, length, -1)  # [1, T, H*D]
        return self.o_proj(attended * torch.sigmoid(gate.reshape(1, length, -1)))


class MLP(nn.Module):
    # The linear children that read the layer's input x (a backend may compute them as one product).
    INPUT_PROJECTIONS = ("gate_proj", "up_proj")

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TopKRouter(nn.Module):
    def __init__(self, config: Qwen35Config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (weights [N, k] renormalized to sum 1, expert ids [N, k])."""
        logits = F.linear(x, self.weight)
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_weights, top_ids = torch.topk(probabilities, self.top_k, dim=-1)
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        return top_weights.to(logits.dtype), top_ids


class Experts(nn.Module):
    """All experts' weights stacked (transformers' layout): gate|up [E, 2I, H], down [E, H, I]."""

    def __init__(self, config: Qwen35Config):
        super().__init__()
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.zeros(experts, hidden, inner))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """x [N, H]; gathers each token's k experts (as gpt-fast does), so there is no data-dependent loop."""
        gate_up = torch.einsum("nh,nkoh->nko", x, self.gate_up_proj[expert_ids])  # [N, k, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        expert_out = torch.einsum("nki,nkhi->nkh", F.silu(gate) * up, self.down_proj[expert_ids])
        return (expert_out * weights.unsqueeze(-1)).sum(dim=1)


class SparseMoE(nn.Module):
    def __init__(self, config: Qwen35Config):
        super().__init__()
        self.gate = TopKRouter(config)
        self.experts = Experts(config)
        self.shared_expert = MLP(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, expert_ids = self.gate(tokens)
        routed = self.experts(tokens, weights, expert_ids)
        shared = torch.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)
        return (routed + shared).reshape(x.shape)


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen35Config, layer_type: str, max_seq_len: int):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config, max_seq_len)
        self.mlp = SparseMoE(config) if config.is_moe else MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, positions, cos, sin, mask):
        normed = self.input_layernorm(x)
        if self.layer_type == LINEAR_ATTENTION:
            x = x + self.linear_attn(normed, positions)
        else:
            x = x + self.self_attn(normed, positions, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35ForCausalLM(nn.Module):
    """Batch-1 Qwen3.5 with its caches and recurrent states as buffers.

    Parameter names follow transformers' ``Qwen3_5ForCausalLM`` without the
    ``model.`` prefix (``embed_tokens``, ``layers.N...``, ``norm``, ``lm_head``).
    """

    def __init__(self, config: Qwen35Config, max_seq_len: int = 2048, dtype: torch.dtype = torch.float32):
        super().__init__()
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.config = config
        self.max_seq_len = max_seq_len
        # Export sets this False: logits of the last position only.
        self.all_logits = True
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind, max_seq_len) for kind in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.to(dtype)
        for layer in self.layers:
            if layer.layer_type == LINEAR_ATTENTION:  # the state stays fp32 whatever the weights' dtype
                layer.linear_attn.recurrent_state = layer.linear_attn.recurrent_state.float()

    def tie_weights(self) -> None:
        """Share the embedding with lm_head when the config ties them (again after loading weights)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def reset(self) -> None:
        """Zero every cache and state: the next call starts a new sequence."""
        for buffer, _ in self.state_buffers().values():
            buffer.zero_()

    def state_buffers(self) -> dict:
        """The decoding state: ``{buffer name: (buffer, its position dim or None)}``, in layer order.

        Other buffers (int8 weights, scales) are not state. A buffer with a
        position dim holds one entry per position, of which the first
        ``position`` are live; one without summarizes all positions at once (a
        Gated DeltaNet state cannot be cut back to an earlier position).
        """
        state = {}
        for module_name, module in self.named_modules():
            for buffer_name, position_dim in getattr(module, "STATE_POSITION_DIMS", {}).items():
                state[f"{module_name}.{buffer_name}"] = (getattr(module, buffer_name), position_dim)
        return state

    def read_state(self, positions: torch.Tensor) -> tuple:
        """The state's tensors in ``state_buffers`` order, caches at ``positions`` only ([L], int64)."""
        # Whole buffers are returned as they are: a copy of an unmutated buffer would be
        # folded into a constant by ExecuTorch's constant propagation.
        return tuple(
            buffer if dim is None else buffer.index_select(dim, positions)
            for buffer, dim in self.state_buffers().values()
        )

    def write_state(self, positions: torch.Tensor, *values: torch.Tensor) -> tuple:
        """Put ``values`` (as ``read_state(positions)`` returns them) back into the state buffers."""
        for (buffer, dim), value in zip(self.state_buffers().values(), values, strict=True):
            if dim is None:
                buffer.copy_(value)
            else:
                # index_put_, as forward writes the caches: updated in place after ExecuTorch's reinplace pass.
                buffer[(slice(None),) * dim + (positions,)] = value
        return ()

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [1, T], input_pos [1] (position of tokens[0, 0]) -> logits [1, T or 1, vocab]."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must have shape [1, T], got {list(tokens.shape)}")
        if input_pos.dim() != 1 or input_pos.shape[0] != 1:
            raise ValueError(f"input_pos must have shape [1], got {list(input_pos.shape)}")
        length = tokens.shape[1]
        # Eager calls only: a traced graph cannot branch on input_pos's value.
        if not torch.compiler.is_compiling() and int(input_pos[0]) + length > self.max_seq_len:
            raise ValueError(
                f"input_pos ({int(input_pos[0])}) + T ({length}) exceeds max_seq_len ({self.max_seq_len})"
            )
        # At one token (a decode method's static T) the positions are input_pos itself: in a GPU program each
        # kernel that reads them would otherwise get a kernel of its own computing them.
        one_token = guard_or_false(length == 1)
        positions = input_pos if one_token else input_pos + torch.arange(length, device=tokens.device)  # [T]
        cache_positions = torch.arange(self.max_seq_len, device=tokens.device)
        mask = positions[:, None] >= cache_positions[None, :]  # [T, max_seq_len], causal
        x = self.embed_tokens(tokens)
        cos, sin = rotary_embedding(positions, self.config, x.dtype)
        for layer in self.layers:
            x = layer(x, positions, cos, sin, mask)
        if not self.all_logits:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))
