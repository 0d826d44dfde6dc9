"""The ``metal`` backend: our Metal kernels inside ExecuTorch's MetalBackend (AOTInductor for MPS)."""

from __future__ import annotations

import platform
from typing import Optional

from torch import nn

from gdn_export.backends import Backend

# Head dims (Dk and Dv each) the Metal kernels are written for; others are refused before export.
SUPPORTED_HEAD_DIMS = (64, 128, 256)


class MetalGdnBackend(Backend):
    name = "metal"
    summary = "Apple GPU: our Metal kernels inside ExecuTorch's MetalBackend; weights in a .ptd (lowers on macOS)"
    head_dims = SUPPORTED_HEAD_DIMS
    writes_data_files = True

    def unavailable_reason(self) -> Optional[str]:
        import torch

        if platform.system() != "Darwin":
            why = f"this machine runs {platform.system()}"
        elif not torch.backends.mps.is_available():
            why = "torch.backends.mps.is_available() is False (Apple silicon and macOS 14+ needed)"
        else:
            return None
        return (
            f"--backend metal lowers only on macOS with Xcode and an Apple-silicon GPU: {why}. "
            "Export with --backend xnnpack or portable here, or run this export on a Mac."
        )

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
