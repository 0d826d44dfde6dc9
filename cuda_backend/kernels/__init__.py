"""Triton kernels of the gated delta rule: per-token (decode) and chunk-parallel (prefill)."""
