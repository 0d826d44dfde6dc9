"""The Triton kernels of ``cuda_backend`` as conformance implementations.

On a machine with CUDA, ``TRITON_IMPLEMENTATIONS`` holds the registered ``gdn``
ops on CUDA tensors (so the whole case table runs against the kernels);
elsewhere it is empty, and ``tests/test_cuda_kernels.py`` runs a subset of the
table under Triton's interpreter instead (``triton_implementation("cpu")``).
"""

from __future__ import annotations

from typing import Optional

import torch

from cuda_backend import SUPPORTED_HEAD_DIMS
from gdn_export.ops.conformance import Implementation, OpCase


def unsupported_head_dims(case: OpCase) -> Optional[str]:
    if case.key_dim in SUPPORTED_HEAD_DIMS and case.value_dim in SUPPORTED_HEAD_DIMS:
        return None
    return f"Dk={case.key_dim}, Dv={case.value_dim}: the Triton kernels take 64, 128 or 256"


def triton_implementation(device: str) -> Implementation:
    """``cuda_backend``'s public launchers (any device the kernels can run on)."""
    import cuda_backend

    def out(*args, output, final_state, **kwargs):
        return cuda_backend.gated_delta_rule(*args, output=output, final_state=final_state, **kwargs)

    def inplace(query, key, value, g, beta, state, *, output, **kwargs):
        return cuda_backend.gated_delta_rule(
            query, key, value, g, beta, state, output=output, final_state=state, **kwargs
        )[0]

    return Implementation(
        name=f"triton-{device}",
        functional=cuda_backend.gated_delta_rule,
        out=out,
        inplace=inplace,
        device=device,
        fused=cuda_backend.fused_gated_delta_rule,
        unsupported=unsupported_head_dims,
    )


def _cuda_implementations() -> list[Implementation]:
    if not torch.cuda.is_available():
        return []
    import cuda_backend  # noqa: F401  (registers the CUDA kernels of the gdn ops)

    return [
        Implementation(
            name="op-cuda",
            functional=torch.ops.gdn.gated_delta_rule,
            out=torch.ops.gdn.gated_delta_rule.out,
            inplace=torch.ops.gdn.gated_delta_rule_inplace.out,
            device="cuda",
            fused=torch.ops.gdn.fused_gated_delta_rule.out,
            unsupported=unsupported_head_dims,
        )
    ]


TRITON_IMPLEMENTATIONS = _cuda_implementations()
