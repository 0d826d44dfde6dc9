"""The op contract: reference forms, Hugging Face parity, bad input, export."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

import gdn_export  # noqa: F401  (defines torch.ops.gdn)
from gdn_export.ops import reference
from gdn_export.ops.conformance import OpCase, make_inputs, relative_error


@pytest.mark.parametrize("gate", ["scalar", "per_channel"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64, 100])
@pytest.mark.parametrize("length", [1, 31, 130])
def test_chunked_form_equals_recurrent_form(gate, chunk_size, length, generator):
    case = OpCase(batch=2, length=length, num_k_heads=2, num_v_heads=6, key_dim=16, value_dim=24, gate=gate)
    args = [t.double() for t in make_inputs(case, generator).as_args()]
    expected = reference.recurrent_gated_delta_rule(*args, use_qk_l2norm=True, scale=0.2)
    actual = reference.chunked_gated_delta_rule(*args, use_qk_l2norm=True, scale=0.2, chunk_size=chunk_size)
    assert relative_error(actual[0], expected[0]) < 1e-12
    assert relative_error(actual[1], expected[1]) < 1e-12


def test_chunked_form_survives_extreme_decay(generator):
    # Exponents are of gate differences s <= t only: g = -30 per token must not overflow.
    case = OpCase(length=100, gate="per_channel", extreme="g_min")
    args = [t.double() for t in make_inputs(case, generator).as_args()]
    expected = reference.recurrent_gated_delta_rule(*args, use_qk_l2norm=True)
    actual = reference.chunked_gated_delta_rule(*args, use_qk_l2norm=True, chunk_size=64)
    assert torch.isfinite(actual[0]).all() and torch.isfinite(actual[1]).all()
    assert relative_error(actual[0], expected[0]) < 1e-12


@pytest.mark.parametrize("use_qk_l2norm", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (2, 8)])
@pytest.mark.parametrize("length", [1, 23])
def test_matches_hugging_face_recurrent_gated_delta_rule(use_qk_l2norm, heads, length, generator):
    """Our op is exactly transformers' torch_recurrent_gated_delta_rule (GDA, Qwen3.5)."""
    num_k_heads, num_v_heads = heads
    case = OpCase(batch=2, length=length, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                  key_dim=32, value_dim=48, use_qk_l2norm=use_qk_l2norm)
    inputs = make_inputs(case, generator)
    expected_output, expected_state = torch_recurrent_gated_delta_rule(
        *inputs.as_args()[:5], initial_state=inputs.initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
    )
    output, final_state = torch.ops.gdn.gated_delta_rule(*inputs.as_args(), use_qk_l2norm=use_qk_l2norm)
    torch.testing.assert_close(output, expected_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_state, expected_state, rtol=1e-5, atol=1e-5)


def test_out_variant_updates_state_in_place(generator):
    case = OpCase(length=9, gate="per_channel")
    inputs = make_inputs(case, generator)
    expected_output, expected_state = torch.ops.gdn.gated_delta_rule(*inputs.as_args())
    state = inputs.initial_state.clone()
    output = torch.full_like(inputs.value, float("nan"))
    returned = torch.ops.gdn.gated_delta_rule.out(*inputs.as_args()[:5], state, output=output, final_state=state)
    assert returned[0] is output and returned[1] is state
    torch.testing.assert_close(output, expected_output, rtol=0, atol=0)
    torch.testing.assert_close(state, expected_state, rtol=0, atol=0)


def _valid_args(generator):
    return list(make_inputs(OpCase(length=3), generator).as_args())


@pytest.mark.parametrize(
    "index, bad, error, message",
    [
        (0, lambda t: t[..., :-1], ValueError, "key must have shape"),
        (1, lambda t: t[:, :, :1], ValueError, "key must have shape"),
        (2, lambda t: t[:, :2], ValueError, "value must have shape"),
        (2, lambda t: t[:, :, :3], ValueError, "multiple of"),
        (3, lambda t: t[..., None].expand(*t.shape, 5), ValueError, "g must have shape"),
        (3, lambda t: t[0], ValueError, "g must be"),
        (4, lambda t: t[:, :, :, None], ValueError, "beta must have 3 dims"),
        (5, lambda t: t.double(), TypeError, "initial_state must be float32"),
        (5, lambda t: t.half(), TypeError, "initial_state must be float32"),
        (5, lambda t: t[:, :, :, :-1], ValueError, "initial_state must have shape"),
        (0, lambda t: t.to(torch.int32), TypeError, "query must be float32, bfloat16 or float16"),
        (2, lambda t: t.to(torch.float64), TypeError, "value must be float32"),
        (1, lambda t: t[0], ValueError, "key must have 4 dims"),
        (2, lambda t: t.to("meta"), RuntimeError, "one device"),
    ],
)
def test_bad_input_names_the_argument(index, bad, error, message, generator):
    args = _valid_args(generator)
    args[index] = bad(args[index])
    with pytest.raises(error, match=message):
        torch.ops.gdn.gated_delta_rule(*args)


@pytest.mark.parametrize(
    "name, make_bad, message",
    [
        ("output", lambda value, state: value[:, :1].clone(), "output must have shape"),
        ("output", lambda value, state: value.double(), "output must have shape .* dtype"),
        ("final_state", lambda value, state: state.bfloat16(), "final_state must have shape .* dtype"),
        ("final_state", lambda value, state: state[:, :1].clone(), "final_state must have shape"),
    ],
)
def test_bad_out_tensors_are_rejected_before_writing(name, make_bad, message, generator):
    args = _valid_args(generator)
    outs = {
        "output": torch.full_like(args[2], float("nan")),
        "final_state": torch.full_like(args[5], float("nan")),
    }
    outs[name] = make_bad(args[2], args[5]).fill_(7.0)
    before = {key: t.clone() for key, t in outs.items()}
    with pytest.raises(ValueError, match=message):
        torch.ops.gdn.gated_delta_rule.out(*args, **outs)
    for key in outs:
        torch.testing.assert_close(outs[key], before[key], equal_nan=True, rtol=0, atol=0)


def test_fake_implementation_gives_export_the_shapes(generator):
    class Layer(torch.nn.Module):
        def forward(self, query, key, value, g, beta, state):
            return torch.ops.gdn.gated_delta_rule(query, key, value, g, beta, state, use_qk_l2norm=True)

    case = OpCase(length=5, gate="per_channel", num_k_heads=1, num_v_heads=3, key_dim=8, value_dim=12)
    args = make_inputs(case, generator).as_args()
    length = torch.export.Dim("T", max=128)
    dynamic = ({1: length},) * 5 + (None,)
    program = torch.export.export(Layer(), args, dynamic_shapes=dynamic)
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.gdn.gated_delta_rule.default in targets
    longer = make_inputs(OpCase(**{**case.__dict__, "length": 40}), generator).as_args()
    output, state = program.module()(*longer)
    expected = reference.recurrent_gated_delta_rule(*longer, use_qk_l2norm=True)
    assert output.shape == (1, 40, 3, 12)
    assert relative_error(output, expected[0]) < 1e-5 and relative_error(state, expected[1]) < 1e-5


def test_mutating_form_exports_without_a_state_copy(generator):
    """gated_delta_rule_inplace on a buffer: the ExecuTorch program updates it in place."""
    from executorch.exir import to_edge_transform_and_lower

    case = OpCase(length=4, num_k_heads=1, num_v_heads=2, key_dim=8, value_dim=8)
    inputs = make_inputs(case, generator)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("recurrent_state", inputs.initial_state.clone())

        def forward(self, query, key, value, g, beta):
            return torch.ops.gdn.gated_delta_rule_inplace(query, key, value, g, beta, self.recurrent_state)

    layer = Layer()
    eager_output = layer(*inputs.as_args()[:5])
    expected_output, expected_state = reference.recurrent_gated_delta_rule(*inputs.as_args())
    assert relative_error(eager_output, expected_output) < 1e-5
    assert relative_error(layer.recurrent_state, expected_state) < 1e-5

    program = torch.export.export(Layer(), inputs.as_args()[:5])
    executorch_program = to_edge_transform_and_lower(program).to_executorch()
    targets = [str(node.target) for node in executorch_program.exported_program().graph.nodes
               if node.op == "call_function"]
    assert any("gdn.gated_delta_rule_inplace.out" in target for target in targets)
    assert not any("copy" in target for target in targets), targets
