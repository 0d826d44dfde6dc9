"""Device functions the kernel files share: the per-token and the chunked kernels
must compute Qwen3.5's q/k norm and gating the same way, and every kernel that
multiplies bf16 tiles must do so the same way under Triton's interpreter."""

import triton
import triton.language as tl

L2NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def sequence_and_head(pid_bh, NUM_V_HEADS: tl.constexpr):
    """(sequence, value head) of a program on the B * Hv grid axis; the launchers
    size that axis batch * num_v_heads, sequence-major."""
    return pid_bh // NUM_V_HEADS, pid_bh % NUM_V_HEADS


@triton.jit
def softplus(x):
    # torch's softplus threshold: linear above 20, where log(1 + e^x) == x in fp32.
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def load_gate_coefficients(a_log_ptr, dt_bias_ptr, v_head):
    """(-exp(A_log), dt_bias) of one value head, in fp32; loaded once per program, outside the token loop."""
    neg_a = -tl.exp(tl.load(a_log_ptr + v_head).to(tl.float32))
    return neg_a, tl.load(dt_bias_ptr + v_head).to(tl.float32)


@triton.jit
def gate_from_raw(raw, neg_a, dt_bias):
    """Qwen3.5's log-decay g = -exp(A_log) * softplus(a + dt_bias) from the raw ``a``."""
    return neg_a * softplus(raw.to(tl.float32) + dt_bias)


@triton.jit
def dot_fp32(a, b, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """a @ b with fp32 accumulation. ``WIDEN`` (set under TRITON_INTERPRET=1 only):
    Triton's interpreter multiplies bf16 operands as their raw 16-bit integers, so
    they are widened first; the products are exact in fp32 either way, as on the GPU."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def narrow(x, dtype: tl.constexpr, WIDEN: tl.constexpr):
    """``x`` (fp32) in the scratch dtype, rounded to nearest even as the GPU does.

    Under the interpreter (``WIDEN``) fp32 -> bf16 truncates, which biases every
    rounding the same way; round the bits first so its tests see the GPU's numerics."""
    if WIDEN:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)
