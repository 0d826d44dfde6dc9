"""``gdn::conv_gated_delta_rule``: the C++ kernel (eager and inside a .pte) against the op's PyTorch reference.

The reference composes the model's own conv and forget steps with the recurrence's reference
(gdn_export/ops/conv_recurrence.py); tests/test_rewrite.py checks whole programs built on the op against the
eager model, tests/test_runtime_ops.py that eager PyTorch dispatches the op to the C++ kernel.
"""

import dataclasses

import pytest
import torch

from gdn_export.ops.conformance import relative_error
from gdn_export.ops.conv_recurrence import causal_conv, check_conv_inputs, conv_gated_delta_rule_out
from gdn_export.ops.fused import unfuse
from tests.test_runtime_ops import error_of

# The recurrence's chunked form and the conv's order of sums move last bits; the values are O(1).
TOLERANCE = 2e-5


@dataclasses.dataclass(frozen=True)
class Shape:
    num_k_heads: int = 2
    num_v_heads: int = 4
    key_dim: int = 16
    value_dim: int = 24
    taps: int = 4

    @property
    def channels(self) -> int:
        return 2 * self.num_k_heads * self.key_dim + self.num_v_heads * self.value_dim


# Channels enough that a prompt of 70 tokens takes the kernel's threaded conv (T * C * W >= 2^18), in blocks of 512.
WIDE = Shape(num_k_heads=4, num_v_heads=8, key_dim=64, value_dim=64)
# Channels enough (>= 2048) that one token's conv is split between threads, an odd count of them: 2055. The key
# dim is Qwen3.5's 128: over 512 keys (GDN_TEST_SEED=284345005) a head's output cancels to where float32's
# rounding of its sums, the same before the split, is 5.6e-5 of it.
WIDE_TOKEN = Shape(num_k_heads=3, num_v_heads=3, key_dim=128, value_dim=429)


def random_inputs(shape: Shape, length: int, first_position: int, generator, batch: int = 1) -> list:
    """The op's arguments in schema order, random (states too: a sequence in progress, or one to forget)."""
    def normal(*sizes, scale=1.0):
        return torch.randn(*sizes, generator=generator) * scale

    heads = shape.num_v_heads
    return [
        normal(batch, length, shape.channels),
        normal(batch, length, heads),
        normal(batch, length, heads),
        normal(shape.channels, 1, shape.taps, scale=0.5),
        normal(heads, scale=0.5),
        normal(heads),
        torch.arange(first_position, first_position + length),
        normal(batch, shape.channels, shape.taps - 1),
        normal(batch, heads, shape.key_dim, shape.value_dim, scale=0.1),
    ]


def reference_call(args: list) -> tuple:
    """(output, conv_state, state) of the reference, on copies of the states."""
    conv_state, state = args[7].clone(), args[8].clone()
    output = torch.full((args[0].shape[0], args[0].shape[1], args[8].shape[1], args[8].shape[3]), float("nan"))
    conv_gated_delta_rule_out(*args[:7], conv_state, state, output=output)
    return output, conv_state, state


def output_error(actual, expected, args: list) -> float:
    """relative_error of an output, read against the larger of its own magnitude and its updates' (beta v, the
    values each token writes, which a unit query's product with a unit key, at most 1, scales into the output).
    At a sequence's first token the output is (q.k) beta v, which cancels to near zero where q and k are near
    orthogonal while its rounding stays that of beta v: GDN_TEST_SEED=1988132220 gave an output of 6.4e-6 where
    beta v reached 0.25, 1.4e-9 from the reference: 2.2e-4 of the output, 5.6e-9 of beta v."""
    if relative_error(actual, expected) == float("inf"):
        return float("inf")
    conv_state = args[7].clone()
    starting = args[6][:1] == 0
    mixed = causal_conv(args[0], conv_state, args[3], starting)
    _, _, value, _, beta = unfuse(mixed, args[1], args[2], args[4], args[5], args[8])
    scale = max(expected.abs().max().item(), (beta[..., None] * value).abs().max().item(), 1e-30)
    return (actual.double() - expected.double()).abs().max().item() / scale


def state_error(actual, expected, initial) -> float:
    """relative_error of a final state, read against the larger of its own and its initial state's magnitude.
    With one key and one value channel a head's state is one number, which can cancel to near zero while its
    rounding stays that of the values it was summed from: GDN_TEST_SEED=1223257505 ended at -3.8e-5 from 0.075,
    the chunked form 3e-9 from the reference, a relative error of 8e-5."""
    if relative_error(actual, expected) == float("inf"):  # a NaN or infinity in the kernel's state
        return float("inf")
    scale = max(expected.abs().max().item(), initial.abs().max().item(), 1e-30)
    return (actual.double() - expected.double()).abs().max().item() / scale


@pytest.mark.parametrize("first_position", [0, 9])  # a new sequence (states forgotten), one going on
@pytest.mark.parametrize("shape, length", [
    *[(shape, length) for length in (1, 3, 16, 40)  # token by token, the chunked form from 16
      for shape in (Shape(), Shape(num_k_heads=1, num_v_heads=3, key_dim=20, value_dim=7, taps=2),
                    Shape(num_k_heads=2, num_v_heads=2, key_dim=8, value_dim=130, taps=3),
                    Shape(num_k_heads=1, num_v_heads=1, key_dim=1, value_dim=1, taps=1))],  # no conv state
    (WIDE, 70),  # the threaded conv
    (WIDE_TOKEN, 1), (dataclasses.replace(WIDE_TOKEN, taps=3), 1),  # one token's split conv: packed, and not
], ids=lambda value: f"T{value}" if isinstance(value, int) else
        f"Hk{value.num_k_heads}-Hv{value.num_v_heads}-Dk{value.key_dim}-Dv{value.value_dim}-W{value.taps}")
def test_kernel_matches_the_reference(shape, length, first_position, generator, seed):
    args = random_inputs(shape, length, first_position, generator)
    expected_output, expected_conv_state, expected_state = reference_call(args)
    conv_state, state = args[7].clone(), args[8].clone()
    output = torch.full_like(expected_output, float("nan"))
    result = torch.ops.gdn.conv_gated_delta_rule.out(*args[:7], conv_state, state, output=output)
    assert result.data_ptr() == output.data_ptr()
    for name, actual, expected in (("output", output, expected_output), ("conv_state", conv_state, expected_conv_state),
                                   ("state", state, expected_state)):
        error = {"output": lambda: output_error(actual, expected, args), "conv_state": lambda: relative_error(
            actual, expected), "state": lambda: state_error(actual, expected, args[8])}[name]()
        assert error <= TOLERANCE, f"seed={seed} {name}: relative error {error}"
    # The functional form updates the states it is given, as the out form does.
    conv_state, state = args[7].clone(), args[8].clone()
    functional = torch.ops.gdn.conv_gated_delta_rule(*args[:7], conv_state, state)
    assert torch.equal(functional, output) and state_error(state, expected_state, args[8]) <= TOLERANCE


def half_spacing(x: torch.Tensor) -> torch.Tensor:
    """The gap between adjacent float16 values at each |x| (2^-24 among the subnormals)."""
    exponent = torch.frexp(x.abs().clamp_min(2.0 ** -14))[1]  # x in [2^(e-1), 2^e)
    return torch.ldexp(torch.ones_like(x), exponent - 11)


@pytest.mark.parametrize("first_position", [0, 9])
@pytest.mark.parametrize("length", [1, 3, 16, 40])  # token by token, the chunked form from 16
@pytest.mark.parametrize("shape", [Shape(), Shape(num_k_heads=1, num_v_heads=3, key_dim=20, value_dim=7, taps=2),
                                   Shape(num_k_heads=2, num_v_heads=2, key_dim=8, value_dim=130, taps=3)],
                         ids=lambda s: f"Hk{s.num_k_heads}-Hv{s.num_v_heads}-Dk{s.key_dim}-Dv{s.value_dim}")
def test_float16_state_is_the_float32_recurrence_rounded_once_a_call(shape, length, first_position, generator,
                                                                     seed):
    """A float16 state: the kernel computes in float32 from its values and stores the result rounded, so its
    output is the float32 reference's from the widened state, and each state value lies within half a float16
    step of that reference's plus the float32 kernel's own error (TOLERANCE of the state's scale, as
    state_error reads it), one step allowed for the rounding of a value the error moved across a step."""
    args = random_inputs(shape, length, first_position, generator)
    args[8] = args[8].half()
    widened = [*args[:8], args[8].float()]
    expected_output, _, expected_state = reference_call(widened)
    conv_state, state = args[7].clone(), args[8].clone()
    output = torch.full_like(expected_output, float("nan"))
    torch.ops.gdn.conv_gated_delta_rule.out(*args[:7], conv_state, state, output=output)
    error = output_error(output, expected_output, widened)
    assert error <= TOLERANCE, f"seed={seed} output: relative error {error}"
    assert state.dtype == torch.float16
    scale = max(expected_state.abs().max().item(), args[8].abs().max().item())
    allowed = half_spacing(expected_state) + TOLERANCE * scale
    excess = ((state.float() - expected_state).abs() / allowed).max().item()
    assert excess <= 1.0, f"seed={seed} state: {excess} of the allowed distance from the reference"
    # The reference itself keeps the same contract: its float16 state is its float32 result rounded.
    reference_output, _, reference_state = reference_call(args)
    assert reference_state.dtype == torch.float16 and torch.equal(reference_state, expected_state.half())
    assert torch.equal(reference_output, expected_output)


def test_prefill_then_decode_carries_both_states(generator, seed):
    """A prompt, then tokens one at a time, on the kernel's own states: the same as the reference's chain."""
    shape = Shape()
    prompt = random_inputs(shape, 7, 0, generator)
    states = {"kernel": [prompt[7].clone(), prompt[8].clone()], "reference": [prompt[7].clone(), prompt[8].clone()]}
    # Each token's inputs with the layer's weights (the prompt's).
    calls = [prompt] + [random_inputs(shape, 1, 7 + t, generator)[:3] + prompt[3:6] + [torch.tensor([7 + t])]
                        for t in range(5)]
    for step, args in enumerate(calls):
        kernel_output = torch.ops.gdn.conv_gated_delta_rule(*args[:7], *states["kernel"])
        reference_output = torch.full_like(kernel_output, float("nan"))
        conv_gated_delta_rule_out(*args[:7], *states["reference"], output=reference_output)
        error = relative_error(kernel_output, reference_output)
        assert error <= TOLERANCE, f"seed={seed} call {step}: relative error {error}"
    assert relative_error(states["kernel"][1], states["reference"][1]) <= TOLERANCE, f"seed={seed}"


@pytest.mark.parametrize("index, breakage", [
    (0, lambda t: t.double()),  # qkv float64
    (6, lambda t: t.int()),  # positions int32
    (1, lambda t: t[:, :-1]),  # a one token short
    (3, lambda t: t[:, :, :0]),  # a conv without taps
    (7, lambda t: t[:, :, :-1]),  # conv_state for a narrower conv
    (8, lambda t: t[0]),  # state without its batch dim
    (8, lambda t: t.bfloat16()),  # a state of neither float32 nor float16
], ids=["qkv-dtype", "positions-dtype", "a-length", "conv-no-taps", "conv-state-width", "state-rank", "state-dtype"])
def test_bad_input_raises_the_reference_error_and_writes_nothing(index, breakage, generator):
    args = random_inputs(Shape(), 3, 5, generator)
    args[index] = breakage(args[index])
    expected = error_of(lambda: check_conv_inputs(*args))
    assert expected is not None
    before = [args[7].clone(), args[8].clone()]
    assert error_of(lambda: torch.ops.gdn.conv_gated_delta_rule(*args)) == expected
    assert torch.equal(args[7], before[0]) and torch.equal(args[8], before[1])


def test_bad_out_tensor_raises_before_writing(generator):
    args = random_inputs(Shape(), 3, 5, generator)
    before = [args[7].clone(), args[8].clone()]
    output = torch.full((1, 3, 4, 23), float("nan"))
    with pytest.raises(ValueError, match="output must be a float32 cpu tensor of shape"):
        torch.ops.gdn.conv_gated_delta_rule.out(*args, output=output)
    assert output.isnan().all() and torch.equal(args[7], before[0]) and torch.equal(args[8], before[1])


class StatefulLayer(torch.nn.Module):
    """The op on a layer's buffers, as a Gated DeltaNet layer of a CPU program calls it."""

    def __init__(self, weights: list, states: list):
        super().__init__()
        for name, value in zip(("conv_weight", "A_log", "dt_bias"), weights):
            self.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        self.register_buffer("conv_state", states[0].clone())
        self.register_buffer("state", states[1].clone())

    def forward(self, qkv, a, b, positions):
        return torch.ops.gdn.conv_gated_delta_rule(qkv, a, b, self.conv_weight, self.A_log, self.dt_bias, positions,
                                                   self.conv_state, self.state)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.float16])
def test_pte_prefill_and_decode_match_the_reference(state_dtype, generator, seed):
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.runtime import Runtime

    shape = WIDE
    prompt = random_inputs(shape, 70, 0, generator)  # the threaded conv, then the chunked recurrence
    prompt[8] = prompt[8].to(state_dtype)
    # A float16 state rounds after each call in the program and in the reference alike, but float32's last bits
    # may tip a near-tie one float16 step (2^-11 of a value) apart, which later calls carry: an output, the
    # state's values summed against a unit query, then moves by up to that share of the state's scale (4e-5 seen).
    tolerance = TOLERANCE if state_dtype == torch.float32 else 2.0 ** -11
    length = torch.export.Dim("length", min=1, max=80)
    example = (*prompt[:3], prompt[6])
    exported = torch.export.export(StatefulLayer(prompt[3:6], prompt[7:]), example,
                                   dynamic_shapes=({1: length}, {1: length}, {1: length}, {0: length}))
    lowered = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch(
        ExecutorchBackendConfig(run_reinplace_pass=True))
    method = Runtime.get().load_program(lowered.buffer).load_method("forward")
    # ExecuTorch plans mutable buffers as zeroed memory: the program's first call starts a sequence at position 0,
    # where the op forgets both states, so the reference may start from any states.
    states = [prompt[7].clone(), prompt[8].clone()]
    calls = [prompt] + [random_inputs(shape, 1, 70 + t, generator) for t in range(4)] + \
        [random_inputs(shape, 3, 74, generator)]
    for step, args in enumerate(calls):
        (actual,) = method.execute([*args[:3], args[6]])
        expected = torch.full_like(actual, float("nan"))
        conv_gated_delta_rule_out(*args[:3], *prompt[3:6], args[6], *states, output=expected)
        error = relative_error(actual, expected)
        assert error <= tolerance, f"seed={seed} call {step}: relative error {error}"
