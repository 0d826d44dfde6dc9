"""Launchers of the Triton kernels, their ``triton_op`` wrappers, and the CUDA registration.

Importing this module:

* defines the ``gdn_cuda`` ops with ``torch.library.triton_op``, so
  ``torch.export`` keeps them whole and AOTInductor (ExecuTorch's CudaBackend)
  compiles the Triton kernels inside them into the program:
  ``gdn_cuda::gated_delta_rule`` (writes output and final_state, which may be
  the initial state), ``gdn_cuda::fused_recurrent_gated_delta_rule`` (decode)
  and ``gdn_cuda::fused_chunked_gated_delta_rule`` (prefill), the last two
  updating ``state`` in place;
* registers them as the CUDA implementation of ``gdn::gated_delta_rule``
  (+ ``.out``), ``gdn::gated_delta_rule_inplace`` (+ ``.out``) and
  ``gdn::fused_gated_delta_rule`` (+ ``.out``).

Sequences of at most ``RECURRENT_MAX_LENGTH`` tokens take the per-token
kernel (decode), longer ones the chunked kernels (prefill).
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
import triton
from torch.library import triton_op, wrap_triton

from gdn_export.ops.contract import NAMESPACE, check_inputs, check_out_tensors
from gdn_export.ops.fused import check_fused_inputs, gating, split_heads

from cuda_backend.kernels.chunked import chunk_prepare_kernel, chunk_state_output_kernel
from cuda_backend.kernels.recurrent import recurrent_gated_delta_rule_kernel

SUPPORTED_HEAD_DIMS = (64, 128, 256)
RECURRENT_MAX_LENGTH = 16
# Chunk length of the WY form: 64 rows fill the matrix units for per-head gates; the
# per-channel form sums [BT, BT, BK] products in registers, so it takes shorter chunks.
CHUNK_SIZE = {"scalar": 64, "per_channel": 32}
PER_CHANNEL_BLOCK = 16


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_supported(key_dim: int, value_dim: int, device: torch.device, op: str) -> None:
    for name, dim in (("Dk", key_dim), ("Dv", value_dim)):
        if dim not in SUPPORTED_HEAD_DIMS:
            raise NotImplementedError(
                f"{op}: unsupported head size {name}={dim} for the CUDA kernels "
                f"(supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))})"
            )
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"{op}: the Triton kernels need CUDA tensors (got {device}); "
            "set TRITON_INTERPRET=1 before importing triton to run them on the CPU"
        )


def _dot_precision(*tensors: torch.Tensor) -> str:
    # fp32 callers get exact fp32 products (1e-5 contract); bf16/fp16 callers tf32.
    return "ieee" if any(t.dtype == torch.float32 for t in tensors) else "tf32"


def _gate_strides(g: torch.Tensor) -> tuple:
    return tuple(g.stride()) if g.dim() == 4 else (*g.stride(), 0)


# Programs the decode kernel should launch to keep every SM's memory pipe busy: the
# kernel moves the state once (read + write) and is bound by how many bytes are in flight.
DECODE_TARGET_PROGRAMS = 1024


def _value_block(batch_heads: int, key_dim: int, value_dim: int) -> int:
    """Value-block width of the chunked state kernel: enough programs at small batch, wider tiles at large."""
    block = 64 if batch_heads >= 256 else 32
    if key_dim == 256:
        block //= 2
    return min(block, value_dim)


def _decode_launch(batch_heads: int, key_dim: int, value_dim: int) -> tuple:
    """(value block, warps) of the per-token kernel.

    The widest block (fewest, longest state rows per program) that still gives
    about DECODE_TARGET_PROGRAMS programs, down to 16 columns; warps keep 32 to 64
    state elements per thread (4 warps at most), so narrow tiles leave no lane idle.
    """
    block = 64 if key_dim < 256 else 32
    while block > 16 and batch_heads * triton.cdiv(value_dim, block) < DECODE_TARGET_PROGRAMS:
        block //= 2
    block = min(block, value_dim)
    warps = max(1, min(4, key_dim * block // (32 * 32)))
    return block, warps


def run_recurrent(query, key, value, g, beta, state_in, state_out, output, *, scale, use_qk_l2norm,
                  a_log=None, dt_bias=None, value_block=None, num_warps=None):
    """Per-token kernel. With ``a_log``/``dt_bias`` given, ``g``/``beta`` are the raw a/b.

    ``value_block``/``num_warps`` override the launch shape (``gdn-bench cuda`` sweeps them).
    """
    batch, length, num_k_heads, key_dim = query.shape
    num_v_heads, value_dim = value.shape[2], value.shape[3]
    raw_gates = a_log is not None
    block, warps = _decode_launch(batch * num_v_heads, key_dim, value_dim)
    block, warps = value_block or block, num_warps or warps
    grid = (batch * num_v_heads, triton.cdiv(value_dim, block))
    wrap_triton(recurrent_gated_delta_rule_kernel)[grid](
        query, key, value, g, beta, a_log if raw_gates else g, dt_bias if raw_gates else g,
        state_in, state_out, output,
        length, scale,
        *query.stride(), *key.stride(), *value.stride(), *_gate_strides(g), *beta.stride(),
        *state_in.stride(), *output.stride(),
        NUM_V_HEADS=num_v_heads, GROUP=num_v_heads // num_k_heads, DK=key_dim, DV=value_dim, BV=block,
        GATE_PER_CHANNEL=g.dim() == 4, RAW_GATES=raw_gates, USE_QK_L2NORM=use_qk_l2norm,
        num_warps=warps, num_stages=1,
    )


def run_chunked(query, key, value, g, beta, state_in, state_out, output, *, scale, use_qk_l2norm):
    """Chunk-parallel kernels (see ``cuda_backend.kernels.chunked``)."""
    batch, length, num_k_heads, key_dim = query.shape
    num_v_heads, value_dim = value.shape[2], value.shape[3]
    per_channel = g.dim() == 4
    chunk_size = CHUNK_SIZE["per_channel" if per_channel else "scalar"]
    num_chunks = triton.cdiv(length, chunk_size)
    rows = batch * num_v_heads * num_chunks * chunk_size
    scratch = dict(dtype=torch.float32, device=query.device)
    w = torch.empty(rows, key_dim, **scratch)
    query_gated = torch.empty(rows, key_dim, **scratch)
    key_gated = torch.empty(rows, key_dim, **scratch)
    updates = torch.empty(rows, value_dim, **scratch)
    query_key = torch.empty(rows, chunk_size, **scratch)
    chunk_decay = torch.empty(batch * num_v_heads * num_chunks, key_dim if per_channel else 1, **scratch)
    precision = _dot_precision(query, key, value)
    wrap_triton(chunk_prepare_kernel)[(num_chunks, batch * num_v_heads)](
        query, key, value, g, beta,
        w, updates, query_gated, key_gated, query_key, chunk_decay,
        length, scale,
        *query.stride(), *key.stride(), *value.stride(), *_gate_strides(g), *beta.stride(),
        NUM_V_HEADS=num_v_heads, GROUP=num_v_heads // num_k_heads, DK=key_dim, DV=value_dim,
        BT=chunk_size, BK=PER_CHANNEL_BLOCK, GATE_PER_CHANNEL=per_channel, USE_QK_L2NORM=use_qk_l2norm,
        DOT_PRECISION=precision, num_warps=8, num_stages=1,
    )
    block = _value_block(batch * num_v_heads, key_dim, value_dim)
    wrap_triton(chunk_state_output_kernel)[(value_dim // block, batch * num_v_heads)](
        w, updates, query_gated, key_gated, query_key, chunk_decay,
        state_in, state_out, output,
        length, num_chunks,
        *state_in.stride(), *output.stride(),
        NUM_V_HEADS=num_v_heads, DK=key_dim, DV=value_dim, BT=chunk_size, BV=block,
        # One stage: pipelining the five [BT, D] chunk loads would overflow shared memory.
        GATE_PER_CHANNEL=per_channel, DOT_PRECISION=precision, num_warps=4, num_stages=1,
    )


def _run(query, key, value, g, beta, state_in, state_out, output, scale, use_qk_l2norm):
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[3])
    form = run_recurrent if query.shape[1] <= RECURRENT_MAX_LENGTH else run_chunked
    form(query, key, value, g, beta, state_in, state_out, output, scale=scale, use_qk_l2norm=use_qk_l2norm)


@triton_op("gdn_cuda::gated_delta_rule", mutates_args={"output", "final_state"})
def _gated_delta_rule_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor, output: torch.Tensor, final_state: torch.Tensor,
    scale: Optional[float], use_qk_l2norm: bool,
) -> None:
    _run(query, key, value, g, beta, initial_state, final_state, output, scale, use_qk_l2norm)


def _fused_run(form, mixed_qkv, a, b, A_log, dt_bias, state, output, scale):
    _, query, key, value = split_heads(mixed_qkv, state)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[3])
    if form is run_recurrent:
        form(query, key, value, a, b, state, state, output, scale=scale, use_qk_l2norm=True,
             a_log=A_log, dt_bias=dt_bias)
    else:
        g, beta = gating(a, b, A_log, dt_bias)
        form(query, key, value, g, beta, state, state, output, scale=scale, use_qk_l2norm=True)


def _fused_output(mixed_qkv, state):
    batch, length = mixed_qkv.shape[0], mixed_qkv.shape[1]
    return torch.empty(batch, length, state.shape[1], state.shape[3], dtype=mixed_qkv.dtype, device=mixed_qkv.device)


@triton_op("gdn_cuda::fused_recurrent_gated_delta_rule", mutates_args={"state"})
def fused_recurrent_gated_delta_rule(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    state: torch.Tensor, scale: Optional[float] = None,
) -> torch.Tensor:
    """Decode: split, L2 norm, head repeat, gating and recurrence in one kernel; state in place."""
    output = _fused_output(mixed_qkv, state)
    _fused_run(run_recurrent, mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
    return output


@triton_op("gdn_cuda::fused_chunked_gated_delta_rule", mutates_args={"state"})
def fused_chunked_gated_delta_rule(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    state: torch.Tensor, scale: Optional[float] = None,
) -> torch.Tensor:
    """Prefill: the chunked kernels on views of mixed_qkv; state in place."""
    output = _fused_output(mixed_qkv, state)
    _fused_run(run_chunked, mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
    return output


def gated_delta_rule(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output=None, final_state=None
):
    """``gdn::gated_delta_rule`` on the Triton kernels; returns (output, final_state).

    Picks the per-token kernel for T <= RECURRENT_MAX_LENGTH, the chunked ones
    above. ``output``/``final_state`` are written when given; ``final_state`` may
    be ``initial_state`` (the state is then updated in place, with no copy).
    """
    check_inputs(query, key, value, g, beta, initial_state, scale)
    output = torch.empty_like(value) if output is None else output
    final_state = torch.empty_like(initial_state) if final_state is None else final_state
    check_out_tensors(value, initial_state, output, final_state)
    check_supported(query.shape[3], value.shape[3], query.device, "cuda_backend.gated_delta_rule")
    torch.ops.gdn_cuda.gated_delta_rule(
        query, key, value, g, beta, initial_state, output, final_state, scale, use_qk_l2norm
    )
    return output, final_state


def fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output=None):
    """``gdn::fused_gated_delta_rule`` on the Triton kernels: state updated in place, returns output."""
    check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    if state.dtype != torch.float32:
        raise TypeError(f"gdn.fused_gated_delta_rule: state must be float32, got {state.dtype}")
    expected = _fused_output(mixed_qkv, state)  # meta-sized check only; small next to the kernel
    if output is None:
        output = expected
    elif list(output.shape) != list(expected.shape) or output.dtype != expected.dtype:
        raise ValueError(
            f"gdn.fused_gated_delta_rule.out: output must have shape {list(expected.shape)} and dtype "
            f"{expected.dtype}, got shape {list(output.shape)} and dtype {output.dtype}"
        )
    check_supported(state.shape[2], state.shape[3], mixed_qkv.device, "cuda_backend.fused_gated_delta_rule")
    form = run_recurrent if mixed_qkv.shape[1] <= RECURRENT_MAX_LENGTH else run_chunked
    _fused_run(form, mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
    return output


def _register_cuda_implementations() -> None:
    library = torch.library.Library(NAMESPACE, "IMPL")

    def functional(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
        return gated_delta_rule(query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm)

    def out(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state):
        return gated_delta_rule(
            query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
            output=output, final_state=final_state,
        )

    def inplace(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False):
        return gated_delta_rule(
            query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm, final_state=state
        )[0]

    def inplace_out(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output):
        return gated_delta_rule(
            query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm,
            output=output, final_state=state,
        )[0]

    def fused(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None):
        return fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, scale=scale)

    def fused_out(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
        return fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, scale=scale, output=output)

    for name, implementation in (
        ("gated_delta_rule", functional),
        ("gated_delta_rule.out", out),
        ("gated_delta_rule_inplace", inplace),
        ("gated_delta_rule_inplace.out", inplace_out),
        ("fused_gated_delta_rule", fused),
        ("fused_gated_delta_rule.out", fused_out),
    ):
        library.impl(name, implementation, "CUDA")
    # Kept alive with the module: dropping the Library would unregister the kernels.
    _register_cuda_implementations.library = library


_register_cuda_implementations()
