"""Triton kernels of the gated delta rule: per-token (decode) and chunk-parallel (prefill)."""

# Head dims (Dk and Dv each) the kernels are written for; others are refused before export.
SUPPORTED_HEAD_DIMS = (64, 128, 256)

# Launch shapes besides the launchers' own choice, as ``launch_shape`` arguments of
# ``cuda_backend.launch_kernel``: ``gdn-bench cuda --sweep`` times the per-token ones
# (value block, warps) and ``--chunked-sweep`` the chunked ones, each of which
# ``cuda_backend/device/chunked_variants.py`` checks against the reference on a GPU.
LAUNCH_SHAPE_SWEEPS = {
    "recurrent": tuple(
        dict(value_block=block, num_warps=warps)
        for block, warps in ((8, 1), (16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4), (64, 8),
                             (128, 4), (128, 8))
    ),
    "chunked": (
        dict(scratch="fp32"), dict(fused_output=False), dict(fused_output=False, state_stages=3),
        dict(state_block=16), dict(state_block=64), dict(state_warps=8), dict(state_stages=3),
    ),
}
