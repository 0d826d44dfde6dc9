"""gdn::cached_attention: reference against per-row math, the C++ kernel inside .pte programs, the rewrite."""

import pytest
import torch

from gdn_export.ops.attention import reference_cached_attention
from tests.conformance.runtime_ops_implementations import LoadedProgram


def per_row_attention(query, k_cache, v_cache, start, scale=None):
    """Row by row in float64: row t of head h sees positions 0..start+t of KV head h // group."""
    num_heads, length, head_dim = query.shape
    group = num_heads // k_cache.shape[0]
    scale = head_dim**-0.5 if scale is None else scale
    output = torch.empty(num_heads, length, head_dim, dtype=torch.float64)
    for head in range(num_heads):
        keys, values = k_cache[head // group].double(), v_cache[head // group].double()
        for token in range(length):
            visible = start + token + 1
            weights = torch.softmax(scale * (query[head, token].double() @ keys[:, :visible]), dim=-1)
            output[head, token] = weights @ values[:visible]
    return output


def random_problem(num_heads, num_kv_heads, length, head_dim, max_len, start):
    generator = torch.Generator().manual_seed(torch.seed())
    query = torch.randn(num_heads, length, head_dim, generator=generator)
    k_cache = torch.randn(num_kv_heads, head_dim, max_len, generator=generator)
    v_cache = torch.randn(num_kv_heads, max_len, head_dim, generator=generator)
    return query, k_cache, v_cache, torch.tensor([start])


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("length,start", [(1, 0), (1, 37), (7, 0), (9, 20)])
def test_reference_matches_per_row_attention(heads, length, start):
    query, k_cache, v_cache, input_pos = random_problem(*heads, length, 16, 64, start)
    expected = per_row_attention(query, k_cache, v_cache, start)
    result = torch.ops.gdn.cached_attention(query, k_cache, v_cache, input_pos)
    torch.testing.assert_close(result.double(), expected, rtol=1e-5, atol=1e-5)
    output = torch.full_like(query, float("nan"))
    torch.ops.gdn.cached_attention.out(query, k_cache, v_cache, input_pos, scale=0.3, output=output)
    torch.testing.assert_close(output.double(), per_row_attention(query, k_cache, v_cache, start, 0.3), rtol=1e-5,
                               atol=1e-5)


class Attend(torch.nn.Module):
    """The op over caches held as buffers, as the rewritten model holds them."""

    def __init__(self, k_cache, v_cache):
        super().__init__()
        self.register_buffer("k_cache", k_cache)
        self.register_buffer("v_cache", v_cache)

    def forward(self, query, input_pos):
        return torch.ops.gdn.cached_attention(query, self.k_cache, self.v_cache, input_pos)


def attention_program_of(num_heads, num_kv_heads, head_dim, max_len, max_length):
    """A .pte of the op with T dynamic (1..max_length) over random caches held as buffers."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.runtime import Runtime

    _, k_cache, v_cache, _ = random_problem(num_heads, num_kv_heads, 1, head_dim, max_len, 0)
    module = Attend(k_cache, v_cache)
    length = torch.export.Dim("length", min=1, max=max_length)
    exported = torch.export.export(
        module, (torch.randn(num_heads, 2, head_dim), torch.tensor([0])), dynamic_shapes=({1: length}, None)
    )
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    return LoadedProgram(Runtime.get().load_program(program.buffer)), k_cache, v_cache


@pytest.fixture(scope="module")
def attention_program():
    """8 query heads over 2 KV heads of 64 positions, D = 48, T up to 16."""
    return attention_program_of(8, 2, 48, 64, 16)


@pytest.mark.parametrize("length,start", [(40, 0), (33, 67), (1, 99), (17, 5)])
def test_pte_kernel_with_partial_tiles_and_panels(length, start):
    """6 query heads over 1 KV head, D = 20: row blocks, row tiles and column panels all end part-full."""
    program, k_cache, v_cache = attention_program_of(6, 1, 20, 100, 40)
    query = torch.randn(6, length, 20, generator=torch.Generator().manual_seed(torch.seed()))
    (output,) = program.execute([query, torch.tensor([start])])
    torch.testing.assert_close(output.double(), per_row_attention(query, k_cache, v_cache, start), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("length,start", [(1, 0), (1, 63), (16, 0), (5, 30), (16, 48)])
def test_pte_kernel_matches_per_row_attention(attention_program, length, start):
    program, k_cache, v_cache = attention_program
    query = torch.randn(8, length, 48, generator=torch.Generator().manual_seed(torch.seed()))
    (output,) = program.execute([query, torch.tensor([start])])
    assert output.shape == (8, length, 48)
    torch.testing.assert_close(output.double(), per_row_attention(query, k_cache, v_cache, start), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("start", [-1, 60, 1 << 40])
def test_position_past_the_cache_is_an_error_not_a_read(attention_program, start):
    program, k_cache, v_cache = attention_program
    query = torch.randn(8, 5, 48)
    with pytest.raises(RuntimeError):
        program.execute([query, torch.tensor([start])])
    with pytest.raises(ValueError, match="input_pos"):
        reference_cached_attention(query, k_cache, v_cache, torch.tensor([start]))
    (output,) = program.execute([query, torch.tensor([3])])  # still usable afterwards
    torch.testing.assert_close(output.double(), per_row_attention(query, k_cache, v_cache, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda q, k, v, p: (q, k, v, p.int()), "input_pos must be an int64"),
        (lambda q, k, v, p: (q[0], k, v, p), r"query must be \[Hq, T, D\]"),
        (lambda q, k, v, p: (q, k[:, :-1], v, p), "k_cache must be"),
        (lambda q, k, v, p: (q, k, v[:, :-1], p), "v_cache must be"),
        (lambda q, k, v, p: (q[:3], k, v, p), "multiple"),
    ],
)
def test_bad_input_names_the_argument(breakage, message):
    args = breakage(*random_problem(4, 2, 3, 16, 32, 5))
    with pytest.raises((TypeError, ValueError), match=message):
        torch.ops.gdn.cached_attention(*args)
