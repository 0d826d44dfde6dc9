"""A decode step's linear layers: y = W x (+ b) for one token, at the speed the weights stream.

At one token a linear layer is a matrix-vector product: every weight byte is
read once and used for two flops, so the step is bound by how fast the weights
come from memory. The matrix templates AOTInductor picks among (CudaBackend
lets it pick Triton templates only) tile for matrix products and read a
[1, K] x [K, N] product at a fraction of the copy bandwidth. Here each program
owns BN rows of W and walks K in BK-wide steps, loading [BN, BK] tiles along
the rows as they lie (coalesced) and keeping per-lane fp32 partial sums, which
it reduces once at the end; many small programs keep every SM's loads in flight.
The MLP's down projection computes its input, silu(gate) * up, as it loads it,
a projection of a normed input applies the RMSNorm itself, Gated DeltaNet's
output projection its gated per-head RMSNorm, and full attention's its
per-head sigmoid gate (each one launch and one vector round trip fewer).
"""

import triton
import triton.language as tl


@triton.jit
def decode_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, norm_ptr, r_ptr, z_ptr,
    N, K, eps, z_start, z_head_stride,
    sw_n, sw_k,
    HAS_BIAS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, NORM: tl.constexpr,
    RESIDUAL: tl.constexpr, HEAD: tl.constexpr, HEAD_NORM: tl.constexpr,
):
    """y = W x (+ b). With ``GATED``, x holds [gate | up] (2K values) and the product is W (silu(gate) * up),
    the MLP's down projection taking its input as the gate/up projection wrote it. With ``NORM``, the product
    is W RMSNorm(x) (Qwen3.5's: x / rms(x) * (1 + norm weight)): the norm's scale is one number a token, so
    the program sums x² beside the product and scales the sums at the end. With ``RESIDUAL``, r [N] is added to
    the product: a decoder layer's residual stream, whose add is then no kernel of its own. With ``HEAD`` (a head
    size D; BK a multiple of it), x is gated per head by z, head h's D values read from ``z_ptr`` at element
    ``z_start + h * z_head_stride`` on, where the layer's input projection wrote them: with ``HEAD_NORM`` the
    product is W (GatedRMSNorm(x, z)), each head of x over its own rms, times the norm weight [D] and silu(z)
    (Gated DeltaNet's output gate); without, W (x * sigmoid(z)) (full attention's output gate)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    row_ok = rows < N
    lanes = tl.arange(0, BK)
    partial = tl.zeros([BN, BK], tl.float32)
    squares = tl.zeros([BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + lanes
        col_ok = cols < K
        w = tl.load(w_ptr + rows[:, None] * sw_n + cols[None, :] * sw_k,
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if GATED:
            up = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0).to(tl.float32)
            x = x * tl.sigmoid(x) * up
        if NORM:
            squares += x * x
            x = x * (1.0 + tl.load(norm_ptr + cols, mask=col_ok, other=0.0).to(tl.float32))
        if HEAD:
            z = tl.load(z_ptr + z_start + cols // HEAD * z_head_stride + cols % HEAD, mask=col_ok,
                        other=0.0).to(tl.float32)
            if HEAD_NORM:
                heads = tl.reshape(x, [BK // HEAD, HEAD])
                scale = tl.rsqrt((tl.sum(heads * heads, 1) / HEAD + eps).to(tl.float32))
                x = tl.reshape(heads * scale[:, None], [BK])
                x = x * tl.load(norm_ptr + cols % HEAD).to(tl.float32) * (z * tl.sigmoid(z))
            else:
                x = x * tl.sigmoid(z)
        partial += w.to(tl.float32) * x[None, :]
    y = tl.sum(partial, 1)
    if NORM:
        # AOTInductor passes float arguments as fp64: the scale is cast back to fp32.
        y = y * tl.rsqrt((tl.sum(squares, 0) / K + eps).to(tl.float32))
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if RESIDUAL:
        y += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)
