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
