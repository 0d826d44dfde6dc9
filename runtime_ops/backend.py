"""The CPU backends, ``portable`` and ``xnnpack``: our C++ kernels beside ExecuTorch's.

Both give each Gated DeltaNet layer ``gdn::gated_delta_rule_inplace`` and each
float32 full-attention layer ``gdn::cached_attention``, whose kernels this
package builds and ``import gdn_export`` loads (the ``gdn_export.kernels``
entry point). XNNPACK also takes the linear layers (float, 8da4w and int8)
into its delegate; portable leaves every op to ExecuTorch's portable kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from gdn_export.backends import Backend
from gdn_export.passes import CachedAttentionOp, InplaceOpRecurrence
from gdn_export.state_methods import STATE_METHODS, export_state_methods


class CpuBackend(Backend):
    def recurrence(self) -> nn.Module:
        return InplaceOpRecurrence()

    def attention(self, layer) -> Optional[nn.Module]:
        # The C++ attention kernel reads float32 caches; caches of other dtypes keep the masked form.
        return CachedAttentionOp() if layer.k_cache.dtype == torch.float32 else None

    def partitioners(self, method: str) -> list:
        return []

    def export_methods(self, model, prefill_chunk: int) -> dict:
        # forward, and the methods that read and write its state (snapshots, prompt cache, chat).
        return {**super().export_methods(model, prefill_chunk), **export_state_methods(model)}

    def lower(self, programs: dict, metadata: dict):
        from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

        from gdn_export.lowering import lower_programs

        return lower_programs(
            programs, metadata=metadata, partitioners=self.partitioners,
            # Bounds from the dynamic T's constraint size the memory plan; the in-place ops stay in place.
            sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(), run_reinplace_pass=True,
            share_mutable_buffers=True,
        )

    def conformance_implementations(self) -> list:
        from runtime_ops.conformance import IMPLEMENTATIONS

        return IMPLEMENTATIONS


class XnnpackBackend(CpuBackend):
    name = "xnnpack"
    summary = "CPU: XNNPACK runs the linear layers (float, 8da4w, int8), our C++ kernels the rest"
    quantizations = ("none", "8da4w", "int8wo")

    def partitioners(self, method: str) -> list:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        # The state methods only copy buffers: ExecuTorch's portable kernels do that.
        return [] if method in STATE_METHODS else [XnnpackPartitioner()]


class PortableBackend(CpuBackend):
    name = "portable"
    summary = "CPU: ExecuTorch's portable kernels and ours, no delegate"
    quantizations = ("none", "int8wo")


XNNPACK = XnnpackBackend()
PORTABLE = PortableBackend()
