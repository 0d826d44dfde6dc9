"""The registered gdn ops on MPS tensors, as conformance implementations (macOS).

With MPS available, ``METAL_IMPLEMENTATIONS`` runs the whole case table
through ``torch.ops.gdn.*`` on MPS, i.e. the Metal kernels of
``mps_eager`` (and, for head dims they do not cover, its documented fallback
to the reference, which must still conform). Elsewhere it is empty; the
emulation tests cover the kernels instead.
"""

from __future__ import annotations

import torch

from gdn_export.ops.conformance import Implementation
from metal_backend import mps_eager

METAL_IMPLEMENTATIONS = (
    [
        Implementation(
            name="metal-mps",
            functional=torch.ops.gdn.gated_delta_rule,
            out=torch.ops.gdn.gated_delta_rule.out,
            inplace=torch.ops.gdn.gated_delta_rule_inplace.out,
            device="mps",
            fused=torch.ops.gdn.fused_gated_delta_rule.out,
        )
    ]
    if mps_eager.register()
    else []
)
