"""The ``cuda`` backend: Triton kernels compiled into the program by ExecuTorch's CudaBackend."""

from __future__ import annotations

from typing import Optional

from torch import nn

from cuda_backend.kernels import SUPPORTED_HEAD_DIMS
from gdn_export.backends import Backend


class CudaTritonBackend(Backend):
    name = "cuda"
    summary = "NVIDIA GPU: Triton kernels inside ExecuTorch's CudaBackend (AOTInductor); weights in a .ptd"
    head_dims = SUPPORTED_HEAD_DIMS
    writes_data_files = True

    def unavailable_reason(self) -> Optional[str]:
        from cuda_backend.lowering import CudaLoweringError, check_lowering_prerequisites

        try:
            check_lowering_prerequisites()
        except CudaLoweringError as error:
            return str(error)
        return None

    def recurrence(self) -> nn.Module:
        from cuda_backend.recurrence import CudaFusedRecurrence

        return CudaFusedRecurrence()

    def lower(self, programs: dict, metadata: dict):
        from cuda_backend.lowering import lower_to_cuda

        return lower_to_cuda(programs, metadata=metadata)

    def conformance_implementations(self) -> list:
        from cuda_backend.conformance import IMPLEMENTATIONS

        return IMPLEMENTATIONS


CUDA = CudaTritonBackend()
