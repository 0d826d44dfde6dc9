"""cuda_backend's Triton kernels: what the conformance table does not cover.

The table's rows of these kernels run in tests/conformance (``op-cuda`` on a
GPU, ``cuda-triton-interpreter`` under Triton's interpreter). Here: the
in-place state is the caller's own tensor, refused head sizes and bad shapes
raise before anything is written, the decode linear kernel (no gdn op of its
own) against fp64 products, and on CUDA the full-size cases. Without a
GPU these run under Triton's interpreter, in a child process
(tests/triton_interpreter.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdn_export.ops import reference
from gdn_export.ops.conformance import OpCase, check_results, expected_outputs, make_inputs
from tests.triton_interpreter import DEVICE, INTERPRETED, ON_CUDA, rerun_module


if not (INTERPRETED or ON_CUDA):

    def test_kernels_under_triton_interpreter():
        rerun_module(__file__)

else:
    import cuda_backend

    base = OpCase(batch=2, num_k_heads=2, num_v_heads=4, key_dim=64, value_dim=128, call="out_inplace")

    def test_in_place_state_is_the_callers_tensor(generator):
        """final_state=initial_state: the kernel writes the caller's buffer itself (no copy)."""
        case = dataclasses.replace(base, length=1)
        inputs = make_inputs(case, generator, device=DEVICE)
        expected_output, expected_state = expected_outputs(case, inputs)
        state = inputs.initial_state
        pointer = state.data_ptr()
        output, final_state = cuda_backend.gated_delta_rule(
            *inputs.as_args()[:5], state, use_qk_l2norm=True, final_state=state
        )
        assert final_state is state and state.data_ptr() == pointer
        check_results(case, output, expected_output, state, expected_state)

    def test_unsupported_head_size_raises_before_writing(generator):
        case = dataclasses.replace(base, key_dim=32, length=1)
        inputs = make_inputs(case, generator, device=DEVICE)
        state = inputs.initial_state.clone()
        with pytest.raises(NotImplementedError, match="Dk=32"):
            cuda_backend.gated_delta_rule(*inputs.as_args()[:5], state, final_state=state)
        assert torch.equal(state, inputs.initial_state)

    def test_bad_shapes_raise_before_writing(generator):
        inputs = make_inputs(dataclasses.replace(base, length=1), generator, device=DEVICE)
        state = inputs.initial_state.clone()
        with pytest.raises(ValueError, match="beta"):
            cuda_backend.gated_delta_rule(*inputs.as_args()[:4], inputs.beta[:, :, :2], state, final_state=state)
        with pytest.raises(ValueError, match="output"):
            cuda_backend.gated_delta_rule(
                *inputs.as_args()[:5], state, output=inputs.value[:, :, :2].clone(), final_state=state
            )
        assert torch.equal(state, inputs.initial_state)

    # The decode linear kernel (cuda_backend.kernels.linear) against fp64 products: out_features that no row
    # block divides and in_features that no tile width divides, with and without bias; Qwen3.5-0.8B's
    # output layer's width on a GPU only.
    LINEAR_SHAPES = [(7, 33, True), (300, 1000, False), (1024, 96, True)] + ([(248320, 1024, False)] if ON_CUDA else [])

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("out_features, in_features, has_bias", LINEAR_SHAPES,
                             ids=lambda value: str(value))
    def test_decode_linear_matches_the_fp64_product(out_features, in_features, has_bias, dtype, generator):
        def randn(*shape):
            return torch.randn(*shape, generator=generator).to(dtype).to(DEVICE)

        x, weight = randn(1, 1, in_features), randn(out_features, in_features)
        bias = randn(out_features) if has_bias else None
        expected = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
        actual = cuda_backend.decode_linear(x, weight, bias)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_gated_decode_linear_is_the_mlps_down_projection(dtype, generator):
        """x = [gate | up]: the product is W (silu(gate) * up), the model's MLP after its gate/up products."""
        in_features, out_features = 300, 70
        gate_up = torch.randn(1, 1, 2 * in_features, generator=generator).to(dtype).to(DEVICE)
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype).to(DEVICE)
        gate, up = gate_up.double().chunk(2, dim=-1)
        expected = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight.double())
        actual = cuda_backend.decode_linear(gate_up, weight, gated=True)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error
        with pytest.raises(ValueError, match=r"one token of 600 features .* \(gated: 2K\)"):
            cuda_backend.decode_linear(gate_up[..., :in_features], weight, gated=True)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("has_bias", [False, True], ids=["no-bias", "bias"])
    def test_normed_decode_linear_is_the_norm_then_the_product(dtype, has_bias, generator):
        """norm_weight: the product of Qwen3.5's RMSNorm of x (gdn_export's RMSNorm, in fp64) and W."""
        from gdn_export.models.qwen35 import RMSNorm

        in_features, out_features, eps = 520, 90, 1e-6
        x = (3 * torch.randn(1, 1, in_features, generator=generator)).to(dtype).to(DEVICE)
        norm = RMSNorm(in_features, eps).double()
        with torch.no_grad():
            norm.weight.copy_(0.5 * torch.randn(in_features, generator=generator))
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype).to(DEVICE)
        bias = torch.randn(out_features, generator=generator).to(dtype).to(DEVICE) if has_bias else None
        expected = torch.nn.functional.linear(norm(x.cpu().double()), weight.cpu().double(),
                                              None if bias is None else bias.cpu().double())
        actual = cuda_backend.decode_linear(x, weight, bias, norm_weight=norm.weight.to(dtype).to(DEVICE), eps=eps)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.cpu().double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error
        with pytest.raises(ValueError, match=r"norm_weight must be \[520\]"):
            cuda_backend.decode_linear(x, weight, norm_weight=norm.weight[:8].to(dtype).to(DEVICE))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
    def test_decode_linear_adds_the_residual_to_its_product(dtype, gated, generator):
        """residual: a decoder layer's residual stream, added to the product (an out_proj's, or the MLP's down
        projection with its gated input) in fp32 before the one rounding."""
        in_features, out_features = 200, 130
        x = torch.randn(1, 1, in_features * (2 if gated else 1), generator=generator).to(dtype).to(DEVICE)
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype).to(DEVICE)
        residual = (10 * torch.randn(1, 1, out_features, generator=generator)).to(dtype).to(DEVICE)
        if gated:
            gate, up = x.double().chunk(2, dim=-1)
            product = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight.double())
        else:
            product = torch.nn.functional.linear(x.double(), weight.double())
        expected = product + residual.double()
        actual = cuda_backend.decode_linear(x, weight, gated=gated, residual=residual)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error
        with pytest.raises(ValueError, match="residual must hold 130 elements"):
            cuda_backend.decode_linear(x, weight, gated=gated, residual=residual[..., :7])

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_head_normed_decode_linear_is_the_gated_norm_then_the_product(dtype, generator):
        """head_dim: the product of Gated DeltaNet's GatedRMSNorm(x, z) (the model's, in fp64) and W, with x in
        [1, 1, heads, head_dim] as the recurrence writes it and z read from inside a larger tensor."""
        from cuda_backend.triton_ops import decode_linear_op
        from gdn_export.models.qwen35 import GatedRMSNorm

        heads, head_dim, out_features, eps, z_start = 3, 64, 70, 1e-6, 11
        core = (2 * torch.randn(1, 1, heads, head_dim, generator=generator)).to(dtype).to(DEVICE)
        projected = torch.randn(1, 1, z_start + heads * head_dim + 5, generator=generator).to(dtype).to(DEVICE)
        norm = GatedRMSNorm(head_dim, eps).double()
        with torch.no_grad():
            norm.weight.copy_(1 + 0.5 * torch.randn(head_dim, generator=generator))
        weight = torch.randn(out_features, heads * head_dim, generator=generator).to(dtype).to(DEVICE)
        residual = torch.randn(1, 1, out_features, generator=generator).to(dtype).to(DEVICE)
        z = projected.cpu().double()[..., z_start:z_start + heads * head_dim].reshape(1, 1, heads, head_dim)
        expected = torch.nn.functional.linear(norm(core.cpu().double(), z).reshape(1, 1, -1),
                                              weight.cpu().double()) + residual.cpu().double()
        actual = decode_linear_op(core, weight, None, norm.weight.to(dtype).to(DEVICE), eps, False, residual,
                                  projected, z_start, head_dim)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.cpu().double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error
        with pytest.raises(ValueError, match="gate must hold 3 heads of 64 elements, 64 apart from gate_start 11"):
            decode_linear_op(core, weight, None, norm.weight.to(dtype).to(DEVICE), eps, False, None,
                             projected[..., :100], z_start, head_dim)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_head_gated_decode_linear_is_the_sigmoid_gate_then_the_product(dtype, generator):
        """sigmoid_gate: the product of full attention's gated output, attended * sigmoid(gate), and W (fp64),
        with attended [heads, 1, head_dim] as the attention writes it and each head's gate read after its
        query in the q/k/v projection, 2 head_dim apart."""
        from cuda_backend.triton_ops import decode_linear_op

        heads, head_dim, out_features = 3, 16, 70
        attended = torch.randn(heads, 1, head_dim, generator=generator).to(dtype).to(DEVICE)
        projected = (2 * torch.randn(1, 1, 2 * heads * head_dim + 40, generator=generator)).to(dtype).to(DEVICE)
        weight = torch.randn(out_features, heads * head_dim, generator=generator).to(dtype).to(DEVICE)
        residual = torch.randn(1, 1, out_features, generator=generator).to(dtype).to(DEVICE)
        gate = projected.cpu().double()[0, 0, :2 * heads * head_dim].view(heads, 2 * head_dim)[:, head_dim:]
        gated = attended.cpu().double().reshape(heads, head_dim) * torch.sigmoid(gate)
        expected = torch.nn.functional.linear(gated.reshape(1, 1, -1), weight.cpu().double()) \
            + residual.cpu().double()
        actual = decode_linear_op(attended, weight, None, None, 0.0, False, residual, projected, head_dim, head_dim,
                                  2 * head_dim, True)
        assert actual.shape == (1, 1, out_features) and actual.dtype == dtype
        error = ((actual.cpu().double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= (1e-5 if dtype == torch.float32 else 1e-2), error
        with pytest.raises(ValueError, match="sigmoid_gate takes no norm_weight"):
            decode_linear_op(attended, weight, None, weight[0, :head_dim], 0.0, False, None, projected, head_dim,
                             head_dim, 2 * head_dim, True)
        with pytest.raises(ValueError, match=r"3 heads of 16 elements, 32 apart from gate_start 16 on \(96"):
            decode_linear_op(attended, weight, None, None, 0.0, False, None, projected[..., :90], head_dim,
                             head_dim, 2 * head_dim, True)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_decode_attention_inputs_are_the_models_norms_rotary_and_cache_writes(dtype, generator):
        """gdn_cuda::decode_attention_inputs against GatedAttention's own steps in fp64 (q_norm/k_norm,
        apply_rotary with rotary_embedding's cos/sin at a partial rotary width, the caches' index_put): the
        query it returns, the key and value at the position, and every other cache entry untouched."""
        import types

        from cuda_backend.triton_ops import decode_attention_inputs
        from gdn_export.models.qwen35 import RMSNorm, apply_rotary, rotary_embedding

        heads, kv_heads, head_dim, max_len, position, eps = 6, 2, 32, 700, 613, 1e-6
        rope = types.SimpleNamespace(rope_theta=10000.0 * (1 + torch.rand(1, generator=generator).item()),
                                     rotary_dim=16)
        projected = (3 * torch.randn(1, 1, 2 * (heads + kv_heads) * head_dim, generator=generator)).to(dtype)
        norms = [RMSNorm(head_dim, eps).double() for _ in range(2)]
        with torch.no_grad():
            for norm in norms:
                norm.weight.copy_(0.5 * torch.randn(head_dim, generator=generator))
        cos, sin = (angle.double() for angle in rotary_embedding(torch.tensor([position]), rope, dtype))
        k_cache = torch.randn(kv_heads, head_dim, max_len, generator=generator).to(dtype)
        v_cache = torch.randn(kv_heads, max_len, head_dim, generator=generator).to(dtype)
        k_before, v_before = k_cache.clone(), v_cache.clone()

        flat = projected.double()[0, 0]
        query_and_gate = flat[:2 * heads * head_dim].view(heads, 1, 2 * head_dim)
        keys = flat[2 * heads * head_dim:(2 * heads + kv_heads) * head_dim].view(kv_heads, 1, head_dim)
        values = flat[(2 * heads + kv_heads) * head_dim:].view(kv_heads, head_dim)
        expected_query = apply_rotary(norms[0](query_and_gate[..., :head_dim]), cos, sin)
        expected_keys = apply_rotary(norms[1](keys), cos, sin)[:, 0]

        k_device, v_device = k_cache.to(DEVICE), v_cache.to(DEVICE)
        query = decode_attention_inputs(projected.to(DEVICE), norms[0].weight.to(dtype).to(DEVICE),
                                        norms[1].weight.to(dtype).to(DEVICE), eps, rope.rope_theta, rope.rotary_dim,
                                        torch.tensor([position], device=DEVICE), k_device, v_device)
        # fp32: at position 613 an angle's ulp is 6e-5 rad, and the kernel's fp32 inverse frequencies may differ
        # from torch's pow by one; bf16: the norm's output and cos/sin are rounded to bf16, as in the model.
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        assert query.shape == (heads, 1, head_dim) and query.dtype == dtype
        for name, actual, expected in (("query", query.cpu().double(), expected_query),
                                       ("key", k_device.cpu().double()[:, :, position], expected_keys),
                                       ("value", v_device.cpu().double()[:, position], values)):
            error = ((actual - expected).abs().max() / expected.abs().max()).item()
            assert error <= tolerance, f"{name}: {error}"
        others = [column for column in range(max_len) if column != position]
        assert torch.equal(k_device.cpu()[:, :, others], k_before[:, :, others])
        assert torch.equal(v_device.cpu()[:, others], v_before[:, others])

        # A position past the caches writes nothing; shapes that do not fit one layer's token are refused.
        k_device, v_device = k_before.to(DEVICE), v_before.to(DEVICE)
        decode_attention_inputs(projected.to(DEVICE), norms[0].weight.to(dtype).to(DEVICE),
                                norms[1].weight.to(dtype).to(DEVICE), eps, rope.rope_theta, rope.rotary_dim,
                                torch.tensor([max_len], device=DEVICE), k_device, v_device)
        assert torch.equal(k_device.cpu(), k_before) and torch.equal(v_device.cpu(), v_before)
        with pytest.raises(ValueError, match=r"projected must be one token's \[q \| gate\] heads"):
            decode_attention_inputs(projected[..., :-head_dim].to(DEVICE), norms[0].weight.to(DEVICE),
                                    norms[1].weight.to(DEVICE), eps, rope.rope_theta, rope.rotary_dim,
                                    torch.tensor([0], device=DEVICE), k_device, v_device)
        with pytest.raises(ValueError, match="rotary_dim must be even, from 2 to 32, got 3"):
            decode_attention_inputs(projected.to(DEVICE), norms[0].weight.to(DEVICE), norms[1].weight.to(DEVICE),
                                    eps, rope.rope_theta, 3, torch.tensor([0], device=DEVICE), k_device, v_device)
        assert torch.equal(k_device.cpu(), k_before) and torch.equal(v_device.cpu(), v_before)

    # Chunks shorter than the conv's window, across token blocks (PREFILL_CONVOLUTION_TILE: 32 tokens), at a new
    # sequence and continuing one.
    @pytest.mark.parametrize("length,start", [(2, 0), (2, 7), (37, 0), (70, 9)], ids=lambda value: str(value))
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_prefill_gated_delta_net_is_the_layers_conv_gates_and_recurrence(length, start, dtype, generator):
        """gdn_cuda::prefill_gated_delta_net against GatedDeltaNet's own steps in fp64 from the same projection
        (conv window with the state cleared at position 0, conv1d, SiLU, forget_previous_sequence, the
        reference recurrence): its output, the conv state and the recurrent state after the chunk. Hv/Hk = 3,
        and the channels' split between q, k and v falls inside a prologue program's block."""
        import torch.nn.functional as F

        from cuda_backend.triton_ops import prefill_gated_delta_net
        from gdn_export.ops.conv_recurrence import forget_previous_sequence

        heads_k, heads_v, key_dim, value_dim, taps = 1, 3, 64, 64, 4
        key_channels = heads_k * key_dim
        channels = 2 * key_channels + heads_v * value_dim
        width = channels + heads_v * value_dim + 2 * heads_v
        projected = torch.randn(1, length, width, generator=generator).to(dtype)
        conv_state = torch.randn(1, channels, taps - 1, generator=generator).to(dtype)
        conv_weight = (0.5 * torch.randn(channels, 1, taps, generator=generator)).to(dtype)
        a_log = torch.rand(heads_v, generator=generator)
        dt_bias = torch.randn(heads_v, generator=generator)
        state = torch.randn(1, heads_v, key_dim, value_dim, generator=generator)
        positions = torch.arange(start, start + length)

        starting = positions[:1] == 0
        window = torch.cat([conv_state.double() * (~starting).double(), projected.double()[..., :channels]
                            .transpose(1, 2)], dim=-1)
        expected_conv_state = window[:, :, length:]
        mixed = F.silu(F.conv1d(window, conv_weight.double(), groups=channels)).transpose(1, 2)
        query = mixed[..., :key_channels].reshape(1, length, heads_k, key_dim)
        key = mixed[..., key_channels:2 * key_channels].reshape(1, length, heads_k, key_dim)
        value = mixed[..., 2 * key_channels:].reshape(1, length, heads_v, value_dim)
        a = forget_previous_sequence(projected.double()[..., width - heads_v:], a_log.double(), dt_bias.double(),
                                     starting)
        b = projected.double()[..., width - 2 * heads_v:width - heads_v]
        g = -a_log.double().exp() * F.softplus(a + dt_bias.double())
        expected, expected_state = reference.recurrent_gated_delta_rule(query, key, value, g, b.sigmoid(),
                                                                        state.double(), use_qk_l2norm=True)

        conv_device, state_device = conv_state.to(DEVICE), state.to(DEVICE)
        output = prefill_gated_delta_net(projected.to(DEVICE), conv_device, conv_weight.to(DEVICE),
                                         positions.to(DEVICE), a_log.to(DEVICE), dt_bias.to(DEVICE), state_device)
        # bf16: the conv's output (q, k, v) and the chunk tensors are rounded to bf16 as in the bf16 program.
        tolerance = 1e-4 if dtype == torch.float32 else 4e-2
        for name, actual, wanted in (("output", output, expected), ("recurrent state", state_device, expected_state),
                                     ("conv state", conv_device, expected_conv_state)):
            error = ((actual.cpu().double() - wanted).abs().max() / wanted.abs().max()).item()
            assert error <= tolerance, f"{name}: {error}"
        with pytest.raises(ValueError, match=r"projected must be a chunk's \[qkv \| z \| b \| a\]"):
            prefill_gated_delta_net(projected[..., 1:].to(DEVICE), conv_device, conv_weight.to(DEVICE),
                                    positions.to(DEVICE), a_log.to(DEVICE), dt_bias.to(DEVICE), state_device)

    # Launches the sweep of gdn_bench.cuda_layers may choose: one row per program, tiles wider than K,
    # narrow tiles over many rows; 8 warps and 3 stages.
    @pytest.mark.parametrize("launch_shape", [dict(rows=1, width=512, num_warps=8, num_stages=3),
                                              dict(rows=32, width=64), dict(rows=4, width=128, num_warps=8)],
                             ids=lambda shape: "-".join(f"{key}{value}" for key, value in shape.items()))
    def test_decode_linear_launch_shapes_compute_the_same_product(launch_shape, generator):
        from cuda_backend.triton_ops import run_decode_linear

        in_features, out_features = 300, 70
        gate_up = torch.randn(1, 1, 2 * in_features, generator=generator).to(DEVICE)
        weight = torch.randn(out_features, in_features, generator=generator).to(DEVICE)
        residual = torch.randn(1, 1, out_features, generator=generator).to(DEVICE)
        gate, up = gate_up.double().chunk(2, dim=-1)
        expected = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight.double()) + residual.double()
        output = torch.full((1, 1, out_features), float("nan"), device=DEVICE)
        run_decode_linear(gate_up, weight, None, output, gated=True, residual=residual, launch_shape=launch_shape)
        error = ((output.double() - expected).abs().max() / expected.abs().max()).item()
        assert error <= 1e-5, error

    def test_decode_linear_refuses_more_than_one_token(generator):
        weight = torch.randn(8, 16, generator=generator).to(DEVICE)
        with pytest.raises(ValueError, match="x must hold one token of 16 features"):
            cuda_backend.decode_linear(torch.randn(1, 2, 16, generator=generator).to(DEVICE), weight)
        with pytest.raises(ValueError, match=r"bias must be \[8\]"):
            cuda_backend.decode_linear(torch.randn(1, 1, 16, generator=generator).to(DEVICE), weight,
                                       torch.randn(9, generator=generator).to(DEVICE))

    if ON_CUDA:
        # Full size on the GPU: Qwen3.5's larger models (Hk = 16, Hv = 32, Dk = Dv = 128).
        qwen = OpCase(num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, call="out_inplace")
        FULL_SIZE_CASES = [
            dataclasses.replace(qwen, batch=batch, length=1, dtype=dtype)
            for batch in (1, 8, 32, 128) for dtype in (torch.float32, torch.bfloat16)
        ] + [
            dataclasses.replace(qwen, batch=1, length=length, dtype=dtype)
            for length in (128, 512, 2048, 8192) for dtype in (torch.float32, torch.bfloat16)
        ] + [dataclasses.replace(qwen, batch=4, length=1000, gate="per_channel")]

        @pytest.mark.parametrize("case", FULL_SIZE_CASES, ids=lambda case: case.name)
        def test_full_size_on_cuda(case, generator):
            inputs = make_inputs(case, generator, device="cuda")
            # fp64 chunked reference on the GPU (the per-token form would take minutes at T = 8192).
            args = [t.to(torch.float64) for t in inputs.as_args()]
            expected_output, expected_state = reference.chunked_gated_delta_rule(*args, use_qk_l2norm=True)
            output = torch.full_like(inputs.value, float("nan"))
            state = inputs.initial_state.clone()
            torch.ops.gdn.gated_delta_rule.out(
                *inputs.as_args()[:5], state, use_qk_l2norm=True, output=output, final_state=state
            )
            check_results(case, output, expected_output, state, expected_state)
