"""A decode step's linear layers: y = W x (+ b) for one token, at the speed the weights stream.

At one token a linear layer is a matrix-vector product: every weight byte is
read once and used for two flops, so the step is bound by how fast the weights
come from memory. The matrix templates AOTInductor picks among (CudaBackend
lets it pick Triton templates only) tile for matrix products and read a
[1, K] x [K, N] product at a fraction of the copy bandwidth. Here each program
owns BN rows of W and walks K in BK-wide steps, loading [BN, BK] tiles along
the rows as they lie (coalesced) and keeping per-lane fp32 partial sums, which
it reduces once at the end; many small programs keep every SM's loads in flight.
The MLP's down projection computes its input, silu(gate) * up, as it loads it
(one launch and one vector round trip fewer a layer).
"""

import triton
import triton.language as tl


@triton.jit
def decode_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    N, K,
    sw_n, sw_k,
    HAS_BIAS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr,
):
    """y = W x (+ b); with ``GATED``, x holds [gate | up] (2K values) and the product is W (silu(gate) * up),
    the MLP's down projection taking its input as the gate/up projection wrote it."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    row_ok = rows < N
    lanes = tl.arange(0, BK)
    partial = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + lanes
        col_ok = cols < K
        w = tl.load(w_ptr + rows[:, None] * sw_n + cols[None, :] * sw_k,
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if GATED:
            up = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0).to(tl.float32)
            x = x * tl.sigmoid(x) * up
        partial += w.to(tl.float32) * x[None, :]
    y = tl.sum(partial, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)
