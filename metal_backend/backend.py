"""The ``metal`` backend: our Metal kernels inside ExecuTorch's MetalBackend (AOTInductor for MPS)."""

from __future__ import annotations

from typing import Optional

from torch import nn

from gdn_export.backends import Backend
from metal_backend.mps_eager import SUPPORTED_HEAD_DIMS


class MetalGdnBackend(Backend):
    name = "metal"
    summary = "Apple GPU: our Metal kernels inside ExecuTorch's MetalBackend; weights in a .ptd (lowers on macOS)"
    head_dims = SUPPORTED_HEAD_DIMS
    writes_data_files = True

    def unavailable_reason(self) -> Optional[str]:
        from metal_backend.lowering import unavailable_reason

        return unavailable_reason()

    def recurrence(self) -> nn.Module:
        from gdn_export.passes import FusedOpRecurrence

        return FusedOpRecurrence()

    def lower(self, programs: dict, metadata: dict):
        from metal_backend.lowering import lower_to_metal

        return lower_to_metal(programs, metadata=metadata)

    def conformance_implementations(self) -> list:
        from metal_backend.conformance import IMPLEMENTATIONS

        return IMPLEMENTATIONS


METAL = MetalGdnBackend()
