"""gdn::gated_attention: the C++ kernel inside a program against the PyTorch reference over a prompt and the
decode steps after it, the reference against the model's own full-attention layer, and bad arguments refused by
name."""

import pytest
import torch

from gdn_export.models.qwen35 import GatedAttention, Qwen35Config, rotary_embedding
from gdn_export.ops.gated_attention import gated_attention_out
from gdn_export.passes import CachedAttentionOp, GatedAttentionOp
from gdn_export.tiny import tiny_config

EPS = 1e-6


def config(heads: int, kv_heads: int, head_dim: int, rotary_factor: float) -> Qwen35Config:
    return Qwen35Config.from_hf(tiny_config(num_attention_heads=heads, num_key_value_heads=kv_heads,
                                            head_dim=head_dim, partial_rotary_factor=rotary_factor).to_dict())


class CachedLayer(torch.nn.Module):
    """The op on a layer's caches and norm weights, as a full-attention layer of a CPU program calls it."""

    def __init__(self, weights, kv_heads: int, head_dim: int, max_len: int):
        super().__init__()
        self.q_norm_weight = torch.nn.Parameter(weights[0], requires_grad=False)
        self.k_norm_weight = torch.nn.Parameter(weights[1], requires_grad=False)
        self.register_buffer("k_cache", torch.zeros(kv_heads, head_dim, max_len))
        self.register_buffer("v_cache", torch.zeros(kv_heads, max_len, head_dim))

    def forward(self, q_gate, key, value, cos, sin, input_pos):
        return torch.ops.gdn.gated_attention(q_gate, key, value, self.q_norm_weight, self.k_norm_weight, cos, sin,
                                             input_pos, self.k_cache, self.v_cache, eps=EPS)


def call_inputs(shape, start: int, length: int, generator) -> tuple:
    """q_gate, key, value (projections of varied scale), cos, sin at start.., input_pos."""
    heads, kv_heads, head_dim, rotary_dim = shape
    def projection(width):
        return torch.randn(1, length, width, generator=generator) * (0.5 + 3 * torch.rand(1, length, 1, generator=generator))
    angles = (start + torch.arange(length, dtype=torch.float32))[:, None] * torch.rand(rotary_dim // 2, generator=generator)
    angles = torch.cat((angles, angles), dim=-1)
    return (projection(2 * heads * head_dim), projection(kv_heads * head_dim), projection(kv_heads * head_dim),
            angles.cos(), angles.sin(), torch.tensor([start]))


# (H, Hkv, D, R): the 0.8B's attention, heads of an odd width with a short rotation, and none rotated
# (partial_rotary_factor 0: GDN_TEST_SEED=148903906 drew it in test_config_space).
SHAPES = [(8, 2, 256, 64), (4, 2, 24, 6), (4, 2, 24, 0)]


@pytest.mark.parametrize("shape", SHAPES, ids=["0.8B", "narrow", "unrotated"])
def test_program_kernel_matches_the_reference(shape, seed, generator):
    """A prompt of 19 tokens (cached_attention's tiled path), decode steps, then a chunk of 5: each call reads the
    keys and values the earlier ones wrote."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.runtime import Runtime

    heads, kv_heads, head_dim, _ = shape
    max_len = 40
    weights = [torch.randn(head_dim, generator=generator) * 0.5 for _ in range(2)]
    example = call_inputs(shape, 0, 19, generator)
    length = torch.export.Dim("length", min=1, max=32)
    exported = torch.export.export(CachedLayer(weights, kv_heads, head_dim, max_len), example,
                                   dynamic_shapes=({1: length}, {1: length}, {1: length}, {0: length}, {0: length},
                                                   None))
    lowered = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch(
        ExecutorchBackendConfig(run_reinplace_pass=True))
    method = Runtime.get().load_program(lowered.buffer).load_method("forward")
    # ExecuTorch plans mutable buffers as zeroed memory: the reference's caches start so too.
    caches = [torch.zeros(kv_heads, head_dim, max_len), torch.zeros(kv_heads, max_len, head_dim)]
    # The last call fills the caches to their end: 13 tokens of 10 rows each for the 0.8B's heads, shared
    # across the threads.
    calls = [example] + [call_inputs(shape, 19 + t, 1, generator) for t in range(3)] + \
        [call_inputs(shape, 22, 5, generator), call_inputs(shape, 27, 13, generator)]
    for step, args in enumerate(calls):
        (actual,) = method.execute(list(args))
        expected = torch.full_like(actual, float("nan"))
        gated_attention_out(*args[:3], *weights, *args[3:], *caches, eps=EPS, output=expected)
        # Another order of the norms' and the scores' sums, another exp: a few float32 roundings apart.
        assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item()), \
            f"seed {seed} call {step}: largest difference {(actual - expected).abs().max().item()}"


@pytest.mark.parametrize("shape", [(8, 2, 40, 0.5), (4, 4, 16, 0.25), (4, 2, 16, 0.0)],
                         ids=["grouped", "one-per-head", "unrotated"])
def test_reference_is_the_models_layer(shape, seed, generator):
    """The model's layer (its attention through ``gdn::cached_attention``) and the same layer through the op give
    the same floats and leave the same caches, over a prompt and a step."""
    heads, kv_heads, head_dim, rotary_factor = shape
    settings = config(heads, kv_heads, head_dim, rotary_factor)
    model_layer = GatedAttention(settings, max_seq_len=24)
    with torch.no_grad():
        for parameter in model_layer.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model_layer.attend = CachedAttentionOp()
    op_layer = GatedAttention(settings, max_seq_len=24)
    op_layer.load_state_dict(model_layer.state_dict())
    op_layer.attend = CachedAttentionOp()
    op_layer.__class__ = GatedAttentionOp
    for start, length in ((0, 9), (9, 1)):
        x = torch.randn(1, length, settings.hidden_size, generator=generator) * 2
        positions = start + torch.arange(length)
        cos, sin = rotary_embedding(positions, settings, torch.float32)
        with torch.no_grad():
            expected = model_layer(x, positions, cos, sin, None)
            actual = op_layer(x, positions, cos, sin, None)
        assert torch.equal(actual, expected), f"seed {seed} start {start}"
    assert torch.equal(op_layer.k_cache, model_layer.k_cache) and torch.equal(op_layer.v_cache, model_layer.v_cache)


def test_out_form_writes_its_output(seed, generator):
    shape = (4, 2, 24, 6)
    weights = [torch.randn(24, generator=generator) for _ in range(2)]
    args = call_inputs(shape, 3, 4, generator)
    caches = [torch.randn(2, 24, 10, generator=generator), torch.randn(2, 10, 24, generator=generator)]
    copies = [cache.clone() for cache in caches]
    before = [cache.clone() for cache in caches]
    out = torch.full((1, 4, 96), float("nan"))
    torch.ops.gdn.gated_attention.out(*args[:3], *weights, *args[3:], *caches, eps=EPS, output=out)
    expected = torch.ops.gdn.gated_attention(*args[:3], *weights, *args[3:], *copies, eps=EPS)
    assert torch.equal(out, expected), f"seed {seed}"
    assert torch.equal(caches[0], copies[0]) and torch.equal(caches[1], copies[1]), f"seed {seed}"
    # The new tokens' positions (3..6) were written, no others.
    for cache, old, dim in ((caches[0], before[0], 2), (caches[1], before[1], 1)):
        kept = torch.ones(10, dtype=torch.bool)
        kept[3:7] = False
        assert torch.equal(cache.index_select(dim, kept.nonzero()[:, 0]), old.index_select(dim, kept.nonzero()[:, 0]))
        assert not torch.equal(cache.narrow(dim, 3, 4), old.narrow(dim, 3, 4)), f"seed {seed}"


def good_arguments(generator) -> dict:
    q_gate, key, value, cos, sin, input_pos = call_inputs((4, 2, 24, 6), 2, 3, generator)
    return dict(q_gate=q_gate, key=key, value=value, q_norm_weight=torch.randn(24, generator=generator),
                k_norm_weight=torch.randn(24, generator=generator), cos=cos, sin=sin, input_pos=input_pos,
                k_cache=torch.randn(2, 24, 8, generator=generator), v_cache=torch.randn(2, 8, 24, generator=generator))


@pytest.mark.parametrize(
    "argument,breakage,error",
    [
        ("q_gate", lambda a: a["q_gate"][..., :-1], ValueError),
        ("key", lambda a: a["key"][:, :2], ValueError),
        ("value", lambda a: a["value"].double(), TypeError),
        ("k_norm_weight", lambda a: a["k_norm_weight"][:-2], ValueError),
        ("cos", lambda a: a["cos"][:, :5], ValueError),
        ("sin", lambda a: a["sin"][:, :4], ValueError),
        ("input_pos", lambda a: a["input_pos"].int(), TypeError),
        ("v_cache", lambda a: a["v_cache"][:, :7], ValueError),
        ("input_pos", lambda a: torch.tensor([6]), ValueError),  # 6 + 3 tokens past the caches' 8 positions
    ],
)
def test_bad_arguments_are_refused_by_name(argument, breakage, error, generator):
    arguments = good_arguments(generator)
    arguments[argument] = breakage(arguments)
    caches = [arguments["k_cache"].clone(), arguments["v_cache"].clone()]
    with pytest.raises(error, match=f"gdn.gated_attention: {argument} must"):
        torch.ops.gdn.gated_attention(**arguments, eps=EPS)
    # Refused before anything was written.
    if argument not in ("v_cache",):
        assert torch.equal(arguments["k_cache"], caches[0]) and torch.equal(arguments["v_cache"], caches[1])
