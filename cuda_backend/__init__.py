"""Triton kernels of ``gdn::gated_delta_rule`` and ``gdn::cached_attention``, and of a decode step's linear
layers, for CUDA, lowered through ExecuTorch's CudaBackend.

Importing the package registers the kernels as the CUDA implementation of the
``gdn`` ops when Triton is installed; without Triton the package still
imports, and calling a kernel raises a clear error.
"""

from __future__ import annotations

import importlib.util

import gdn_export.ops  # noqa: F401  (defines the gdn ops the kernels implement)
from cuda_backend.kernels import LAUNCH_SHAPE_SWEEPS, SUPPORTED_HEAD_DIMS

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None

if TRITON_AVAILABLE:
    from cuda_backend.triton_ops import (
        cached_attention,
        decode_linear,
        fused_gated_delta_rule,
        gated_delta_rule,
        launch_kernel,
    )
else:

    def _needs_triton(*args, **kwargs):
        raise RuntimeError("cuda_backend needs Triton: install the 'triton' package (pip install triton)")

    gated_delta_rule = fused_gated_delta_rule = cached_attention = decode_linear = launch_kernel = _needs_triton

def triton_ops_for_rewrite():
    """``cuda_backend.triton_ops`` (importing it registers ``torch.ops.gdn_cuda.*``), for the modules
    ``rewrite(model, "cuda")`` puts in a model; without Triton, a RuntimeError saying how to get it."""
    try:
        import cuda_backend.triton_ops as kernels
    except ImportError as error:
        raise RuntimeError(
            f"rewrite(model, backend='cuda') needs Triton, whose kernels the CUDA program runs ({error}); "
            "install it with pip install triton"
        ) from error
    return kernels


__all__ = ["gated_delta_rule", "fused_gated_delta_rule", "cached_attention", "decode_linear", "launch_kernel",
           "LAUNCH_SHAPE_SWEEPS", "SUPPORTED_HEAD_DIMS"]
