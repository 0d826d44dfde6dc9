"""Every implementation of ``gdn::gated_delta_rule`` that the conformance suite runs.

A backend joins the suite by adding its ``Implementation`` to ``IMPLEMENTATIONS``
(with ``unsupported`` saying which cases it rejects, and why).
"""

import torch

from gdn_export.ops.conformance import Implementation
from gdn_export.ops.contract import (
    gated_delta_rule_inplace_out,
    reference_gated_delta_rule,
    reference_gated_delta_rule_out,
)

from .triton_implementations import TRITON_IMPLEMENTATIONS

IMPLEMENTATIONS = [
    # The registered op on CPU: the reference until a kernel registers for the CPU key.
    Implementation(
        name="op-cpu",
        functional=torch.ops.gdn.gated_delta_rule,
        out=torch.ops.gdn.gated_delta_rule.out,
        inplace=torch.ops.gdn.gated_delta_rule_inplace.out,
        fused=torch.ops.gdn.fused_gated_delta_rule.out,
    ),
    # The pure-PyTorch reference itself (per-token for short T, chunked for long T).
    Implementation(
        name="reference",
        functional=reference_gated_delta_rule,
        out=reference_gated_delta_rule_out,
        inplace=gated_delta_rule_inplace_out,
    ),
]

from .runtime_ops_implementations import RUNTIME_OPS_IMPLEMENTATIONS  # noqa: E402

IMPLEMENTATIONS += RUNTIME_OPS_IMPLEMENTATIONS
# cuda_backend's kernels on the GPU (empty without CUDA; the interpreter runs them in tests/test_cuda_kernels.py).
IMPLEMENTATIONS += TRITON_IMPLEMENTATIONS
# metal_backend's kernels on MPS (empty off macOS; the emulation harness runs them in tests/test_metal_*.py).
from metal_backend.conformance import METAL_IMPLEMENTATIONS  # noqa: E402

IMPLEMENTATIONS += METAL_IMPLEMENTATIONS
