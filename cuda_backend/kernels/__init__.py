"""Triton kernels of the gated delta rule: per-token (decode) and chunk-parallel (prefill)."""

# Head dims (Dk and Dv each) the kernels are written for; others are refused before export.
SUPPORTED_HEAD_DIMS = (64, 128, 256)
