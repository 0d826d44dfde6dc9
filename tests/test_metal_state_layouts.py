"""The Metal kernels' state layouts, run by the lockstep emulator against the fp64 reference.

* Decode's contiguous fast path: a state whose 4 columns per SIMD group are
  adjacent (column stride 1, the op contract's packed state) is read and
  written as one vector per row; a state stored transposed (column stride Dk)
  takes the strided path. Both must match the reference, and each other bit
  for bit: the paths differ in loads and stores only.
* In place, a non-packed state view is refused before anything is written:
  ExecuTorch's Metal runtime would hand the kernel a temporary packed copy of
  it and the update would be lost. The same view is fine as a read-only
  initial state (the final state goes to another tensor), and a permuted
  (packed) state is fine in place.
* Since that copy arrives packed, the runtime cannot see it: lower_to_metal
  refuses a program whose gdn op updates a non-packed view, before and after
  functionalization, and passes Qwen3.5 rewritten for Metal (whole-buffer states).

Inputs come from the ``seed`` fixture (a failure prints the replay command);
results go through the conformance table's check (``check_results``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gdn_export import load_qwen35, rewrite
from gdn_export.ops.conformance import (
    OpCase, check_results, expected_fused_outputs, expected_outputs, make_fused_inputs, make_inputs,
)
from gdn_export.tiny import make_tiny_checkpoint
from metal_backend import emulation, lowering

DECODE = OpCase(batch=2, length=1, num_k_heads=2, num_v_heads=4, key_dim=128, value_dim=64)
PREFILL_KDA = OpCase(length=9, num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=128, gate="per_channel")


def transposed_storage(state: torch.Tensor) -> torch.Tensor:
    """The same values, stored [B, Hv, Dv, Dk]: a packed view whose column stride is Dk."""
    return state.transpose(2, 3).contiguous().transpose(2, 3)


def holed_view(state: torch.Tensor) -> torch.Tensor:
    """The same values as a non-packed view: every row padded by 8 unused columns."""
    batch, heads, key_dim, value_dim = state.shape
    padded = torch.full((batch, heads, key_dim, value_dim + 8), float("nan"))
    padded[..., :value_dim] = state
    return padded[..., :value_dim]


@pytest.mark.parametrize("case", [DECODE, PREFILL_KDA], ids=lambda case: case.name)
def test_contiguous_and_strided_state_paths_agree_bit_for_bit(case, generator):
    inputs = make_inputs(case, generator)
    expected_output, expected_state = expected_outputs(case, inputs)
    results = {}
    for layout, relayout in (("contiguous", torch.Tensor.contiguous), ("column-strided", transposed_storage)):
        state = relayout(inputs.initial_state.clone())
        assert (state.stride(3) == 1) == (layout == "contiguous")
        output = torch.full_like(inputs.value, float("nan"))
        emulation.gated_delta_rule_inplace_out(
            *inputs.as_args()[:5], state, scale=case.scale, use_qk_l2norm=case.use_qk_l2norm, output=output
        )
        check_results(case, output, expected_output, state, expected_state)
        results[layout] = (output, state)
    for contiguous, strided in zip(results["contiguous"], results["column-strided"]):
        assert torch.equal(contiguous, strided), "the two state paths differ"


def test_non_packed_state_is_refused_in_place_before_writing(generator):
    inputs = make_inputs(DECODE, generator)
    state = holed_view(inputs.initial_state)
    untouched = state.clone()
    output = torch.full_like(inputs.value, float("nan"))
    message = r"state is updated in place but is a non-packed view .*temporary packed copy"
    with pytest.raises(NotImplementedError, match=message):
        emulation.gated_delta_rule_inplace_out(*inputs.as_args()[:5], state, output=output)
    with pytest.raises(NotImplementedError, match=message):
        emulation.gated_delta_rule_out(*inputs.as_args()[:5], state, output=output, final_state=state)
    assert output.isnan().all() and torch.equal(state, untouched), "written before refusing"


def test_non_packed_state_is_read_as_an_initial_state(generator):
    inputs = make_inputs(DECODE, generator)
    expected_output, expected_state = expected_outputs(DECODE, inputs)
    output, final_state = emulation.gated_delta_rule(
        *inputs.as_args()[:5], holed_view(inputs.initial_state), use_qk_l2norm=DECODE.use_qk_l2norm
    )
    check_results(DECODE, output, expected_output, final_state, expected_state)


def test_fused_kernel_refuses_a_non_packed_state_and_takes_a_permuted_one(generator):
    case = OpCase(length=2, num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=64)
    inputs = make_fused_inputs(case, generator)
    expected_output, expected_state = expected_fused_outputs(case, inputs)
    output = torch.full((case.batch, case.length, case.num_v_heads, case.value_dim), float("nan"))
    holed = holed_view(inputs.state)
    with pytest.raises(NotImplementedError, match="non-packed view"):
        emulation.fused_gated_delta_rule_out(*inputs.as_args()[:5], holed, output=output)
    assert output.isnan().all() and torch.equal(holed, inputs.state)
    permuted = transposed_storage(inputs.state.clone())
    emulation.fused_gated_delta_rule_out(*inputs.as_args()[:5], permuted, output=output)
    check_results(case, output, expected_output, permuted, expected_state)


class FusedCall(nn.Module):
    """One fused op call on a [1, 2, 64, 64] state kept in a buffer, whole or as a slice with holes."""

    def __init__(self, holed: bool):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 64, 64 + (8 if holed else 0)))
        self.register_buffer("A_log", torch.zeros(2))
        self.register_buffer("dt_bias", torch.zeros(2))

    def forward(self, mixed_qkv, a, b):
        return torch.ops.gdn.fused_gated_delta_rule(mixed_qkv, a, b, self.A_log, self.dt_bias, self.cache[..., :64])


def _exported(module: nn.Module):
    args = (torch.randn(1, 1, 2 * 64 + 2 * 64), torch.randn(1, 1, 2), torch.randn(1, 1, 2))
    return torch.export.export(module, args, strict=False)


def test_lowering_refuses_a_non_packed_in_place_state_before_and_after_functionalization():
    exported = _exported(FusedCall(holed=True))
    for program in (exported, exported.run_decompositions({})):
        with pytest.raises(ValueError, match=r"non-packed view \(sizes \[1, 2, 64, 64\], strides \[9216, 4608, 72, 1\]\)"):
            lowering.check_in_place_states(program)
    whole = _exported(FusedCall(holed=False))
    for program in (whole, whole.run_decompositions({})):
        lowering.check_in_place_states(program)


def test_qwen35_rewritten_for_metal_updates_whole_states(tmp_path):
    checkpoint = make_tiny_checkpoint(tmp_path, key_head_dim=64, value_head_dim=64)
    model = rewrite(load_qwen35(checkpoint, max_seq_len=32), "metal")
    tokens, input_pos = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        exported = torch.export.export(model, (tokens, input_pos), strict=False)
    assert len(lowering.metal_op_nodes(exported)) == 2
    lowering.check_in_place_states(exported)
    lowering.check_in_place_states(exported.run_decompositions({}))
