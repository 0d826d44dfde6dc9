"""``make demo``: the op contract end to end on a small recurrence."""

import torch

import gdn_export  # noqa: F401  (defines torch.ops.gdn)
from gdn_export.ops import reference
from gdn_export.ops.conformance import OpCase, make_inputs, relative_error


def main() -> None:
    case = OpCase(batch=1, length=48, num_k_heads=2, num_v_heads=4, key_dim=64, value_dim=64)
    inputs = make_inputs(case, torch.Generator().manual_seed(0))
    print(f"gdn.gated_delta_rule on {case.name}")
    output, final_state = torch.ops.gdn.gated_delta_rule(*inputs.as_args(), use_qk_l2norm=True)
    args64 = [t.double() for t in inputs.as_args()]
    expected_output, expected_state = reference.recurrent_gated_delta_rule(*args64, use_qk_l2norm=True)
    print(f"  output {list(output.shape)}, final_state {list(final_state.shape)}")
    print(f"  relative error vs fp64 per-token reference: output "
          f"{relative_error(output, expected_output):.2e}, state {relative_error(final_state, expected_state):.2e}")


if __name__ == "__main__":
    main()
