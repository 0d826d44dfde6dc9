"""Launchers of the Triton kernels, their ``triton_op`` wrappers, and the CUDA registration.

Importing this module:

* defines the ``gdn_cuda`` ops with ``torch.library.triton_op``, so
  ``torch.export`` keeps them whole and AOTInductor (ExecuTorch's CudaBackend)
  compiles the Triton kernels inside them into the program:
  ``gdn_cuda::gated_delta_rule`` (writes output and final_state, which may be
  the initial state), ``gdn_cuda::fused_recurrent_gated_delta_rule`` (decode)
  and ``gdn_cuda::fused_chunked_gated_delta_rule`` (prefill), the last two
  updating ``state`` in place, ``gdn_cuda::decode_gated_delta_net`` (a Gated
  DeltaNet layer's decode from its input projection: conv, gates and
  recurrence, conv and recurrent state in place) and its prefill counterpart
  ``gdn_cuda::prefill_gated_delta_net`` (conv and gates, then the chunked
  kernels), ``gdn_cuda::cached_attention``,
  ``gdn_cuda::decode_attention_inputs`` (a full-attention layer's decode from
  its q/k/v projection to its query: norms, rotary embedding, the caches'
  writes in place) and ``gdn_cuda::decode_linear`` (a linear layer at one
  token, which may take an MLP's silu-gated input, RMSNorm its input itself,
  or apply Gated DeltaNet's gated per-head RMSNorm or attention's per-head
  sigmoid gate to it);
* registers them as the CUDA implementation of ``gdn::gated_delta_rule``
  (+ ``.out``), ``gdn::gated_delta_rule_inplace`` (+ ``.out``),
  ``gdn::fused_gated_delta_rule`` (+ ``.out``) and ``gdn::cached_attention``
  (+ ``.out``).

Sequences shorter than the contract's ``CHUNKED_MIN_LENGTH`` tokens take the
per-token kernel (decode), longer ones the chunked kernels (prefill).
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
import triton
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from gdn_export.ops.attention import check_attention_inputs
from gdn_export.ops.contract import CHUNKED_MIN_LENGTH, NAMESPACE, check_inputs, check_out_tensors
from gdn_export.ops.fused import check_fused_inputs, num_key_heads, num_key_heads_of, split_heads

from cuda_backend.kernels import SUPPORTED_HEAD_DIMS
from cuda_backend.kernels.attention import cached_attention_kernel, merge_spans_kernel
from cuda_backend.kernels.attention_inputs import decode_attention_inputs_kernel
from cuda_backend.kernels.linear import decode_linear_kernel
from cuda_backend.kernels.chunked import chunk_output_kernel, chunk_prepare_kernel, chunk_state_kernel
from cuda_backend.kernels.convolution import decode_convolution_kernel, prefill_convolution_kernel
from cuda_backend.kernels.recurrent import recurrent_gated_delta_rule_kernel

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


def _decode_launch(batch_heads: int, key_dim: int, value_dim: int) -> tuple:
    """(value block, warps) of the per-token kernel.

    The widest block (fewest, longest state rows per program) that still gives
    about DECODE_TARGET_PROGRAMS programs, down to 16 columns; warps keep about
    128 state elements per thread. On an H100 (Hv = 32, Dk = Dv = 128, fp32
    state, `gdn-bench cuda --sweep`) 128 a thread beat 32 to 64 a thread at every
    B: 16.9 -> 14.8 us at B = 8, 53.1 -> 51.9 at B = 32, 193.0 -> 189.1 at B = 128,
    as each thread has more loads in flight before the reductions wait on them.
    """
    block = 64 if key_dim < 256 else 32
    while block > 16 and batch_heads * triton.cdiv(value_dim, block) < DECODE_TARGET_PROGRAMS:
        block //= 2
    block = min(block, value_dim)
    warps = max(1, min(4, key_dim * block // (128 * 32)))
    return block, warps


def _packed_qkv(mixed_qkv, num_k_heads: int, key_dim: int, value_dim: int) -> tuple:
    """((q, k, v) tensors, their [B, T, H, D] strides, element starts) of the query, key and value that
    lie side by side in mixed_qkv [B, T, C], for a kernel that reads them there: the split of
    ``split_heads`` without its views, which a traced program turns into a copy kernel each."""
    batch_stride, time_stride, channel_stride = mixed_qkv.stride()
    key_strides = (batch_stride, time_stride, key_dim * channel_stride, channel_stride)
    value_strides = (batch_stride, time_stride, value_dim * channel_stride, channel_stride)
    key_channels = num_k_heads * key_dim * channel_stride
    return (mixed_qkv,) * 3, (key_strides, key_strides, value_strides), (0, key_channels, 2 * key_channels)


def run_recurrent(query, key, value, g, beta, state_in, state_out, output, *, scale, use_qk_l2norm,
                  a_log=None, dt_bias=None, value_block=None, num_warps=None, packed=None, gate_starts=(0, 0)):
    """Per-token kernel. With ``a_log``/``dt_bias`` given, ``g``/``beta`` are the raw a/b.

    ``value_block``/``num_warps`` override the launch shape (``gdn-bench cuda`` sweeps them).
    ``packed`` = (mixed_qkv, num_k_heads): query, key and value (then None) are read in place
    from mixed_qkv [B, T, C] (``_packed_qkv``); ``gate_starts``: the elements where g's and beta's reads
    begin (both may lie in one tensor).
    """
    if packed is not None:
        mixed_qkv, num_k_heads = packed
        batch, length = mixed_qkv.shape[:2]
        num_v_heads, key_dim, value_dim = state_in.shape[1:]
        tensors, strides, starts = _packed_qkv(mixed_qkv, num_k_heads, key_dim, value_dim)
    else:
        batch, length, num_k_heads, key_dim = query.shape
        num_v_heads, value_dim = value.shape[2], value.shape[3]
        tensors, strides, starts = (query, key, value), (query.stride(), key.stride(), value.stride()), (0, 0, 0)
    raw_gates = a_log is not None
    block, warps = _decode_launch(batch * num_v_heads, key_dim, value_dim)
    block, warps = value_block or block, num_warps or warps
    grid = (batch * num_v_heads, triton.cdiv(value_dim, block))
    wrap_triton(recurrent_gated_delta_rule_kernel)[grid](
        *tensors, g, beta, a_log if raw_gates else g, dt_bias if raw_gates else g,
        state_in, state_out, output,
        length, scale, *starts, *gate_starts,
        *strides[0], *strides[1], *strides[2], *_gate_strides(g), *beta.stride(),
        *state_in.stride(), *output.stride(),
        NUM_V_HEADS=num_v_heads, GROUP=num_v_heads // num_k_heads, DK=key_dim, DV=value_dim, BV=block,
        GATE_PER_CHANNEL=g.dim() == 4, RAW_GATES=raw_gates, USE_QK_L2NORM=use_qk_l2norm,
        num_warps=warps, num_stages=1,
    )


# Shared memory the state kernel may fill with its pipelined chunk loads (H100: 227 KiB a block).
STATE_KERNEL_SHARED_BYTES = 160 * 1024


def _chunked_launch(batch_heads: int, key_dim: int, value_dim: int, chunk_size: int, scratch_bytes: int,
                    per_channel: bool) -> dict:
    """Launch shape of the chunked kernels (``gdn-bench cuda --chunked-sweep`` times others).

    The state kernel is the sequential part: per chunk each program loads w and
    kg whole ([BT, Dk] each, whatever its value block), so a narrow value block
    buys programs (SMs working on the chain) with repeated w/kg reads from L2.
    Its loads do not depend on the state, so with two stages the next chunk's
    arrive while the current one computes, where shared memory allows.

    The output goes in the state kernel too (``fused_output``): on an H100 at
    B = 1, Hv = 32, Dk = Dv = 128, bf16, that took T = 2048 from 219 to 188 us
    (T = 8192: 807 to 678 us) against a separate output launch, whose h
    round trip through memory costs more than the longer sequential step.
    """
    fused_output = True
    state_block = 32 if batch_heads < 128 else 64
    state_block = min(state_block if key_dim < 256 else state_block // 2, value_dim)
    # Loads pipelined per chunk: w, kg, u; and qg, aqk when the output is fused.
    per_stage = (2 * chunk_size * key_dim + chunk_size * state_block) * scratch_bytes
    if fused_output:
        per_stage += (chunk_size * key_dim + chunk_size * chunk_size) * scratch_bytes
    return dict(
        fused_output=fused_output,
        state_block=state_block,
        state_warps=4,
        state_stages=2 if 2 * per_stage + key_dim * state_block * scratch_bytes <= STATE_KERNEL_SHARED_BYTES else 1,
        output_block=min(64, value_dim),
        output_warps=4,
        prepare_warps=8 if per_channel or key_dim * value_dim > 128 * 128 else 4,
    )


def run_chunked(query, key, value, g, beta, state_in, state_out, output, *, scale, use_qk_l2norm,
                a_log=None, dt_bias=None, tuning=None):
    """Chunk-parallel kernels (see ``cuda_backend.kernels.chunked``).

    With ``a_log``/``dt_bias`` given, ``g``/``beta`` are Qwen3.5's raw a/b (the
    gating is computed in the prepare kernel). ``tuning`` overrides entries of
    the launch shape (``_chunked_launch``) and ``scratch`` ("fp32" or "bf16").
    """
    batch, length, num_k_heads, key_dim = query.shape
    num_v_heads, value_dim = value.shape[2], value.shape[3]
    per_channel = g.dim() == 4
    raw_gates = a_log is not None
    chunk_size = CHUNK_SIZE["per_channel" if per_channel else "scalar"]
    num_chunks = triton.cdiv(length, chunk_size)
    batch_heads = batch * num_v_heads
    precision = _dot_precision(query, key, value)
    # fp32 callers keep fp32 scratch (their 1e-5 contract); bf16/fp16 callers store
    # the chunk tensors in bf16 and multiply them at the tensor cores' bf16 rate.
    tuning = dict(tuning or {})
    scratch_name = tuning.pop("scratch", "fp32" if precision == "ieee" else "bf16")
    scratch_dtype = torch.float32 if scratch_name == "fp32" else torch.bfloat16
    launch = _chunked_launch(batch_heads, key_dim, value_dim, chunk_size, scratch_dtype.itemsize, per_channel)
    launch.update(tuning)

    rows = batch_heads * num_chunks * chunk_size
    scratch = dict(dtype=scratch_dtype, device=query.device)
    w = torch.empty(rows, key_dim, **scratch)
    query_gated = torch.empty(rows, key_dim, **scratch)
    key_gated = torch.empty(rows, key_dim, **scratch)
    updates = torch.empty(rows, value_dim, **scratch)
    query_key = torch.empty(rows, chunk_size, **scratch)
    chunk_decay = torch.empty(batch_heads * num_chunks, key_dim if per_channel else 1,
                              dtype=torch.float32, device=query.device)
    wrap_triton(chunk_prepare_kernel)[(num_chunks, batch_heads)](
        query, key, value, g, beta, a_log if raw_gates else g, dt_bias if raw_gates else g,
        w, updates, query_gated, key_gated, query_key, chunk_decay,
        length, scale,
        *query.stride(), *key.stride(), *value.stride(), *_gate_strides(g), *beta.stride(),
        NUM_V_HEADS=num_v_heads, GROUP=num_v_heads // num_k_heads, DK=key_dim, DV=value_dim,
        BT=chunk_size, BK=PER_CHANNEL_BLOCK, GATE_PER_CHANNEL=per_channel, RAW_GATES=raw_gates,
        USE_QK_L2NORM=use_qk_l2norm, DOT_PRECISION=precision, WIDEN=interpreting(),
        num_warps=launch["prepare_warps"], num_stages=1,
    )
    fused_output = launch["fused_output"]
    # h: each chunk's starting state, [B * Hv, chunks, Dk, Dv] (not needed when fused).
    starts = w if fused_output else torch.empty(batch_heads * num_chunks * key_dim, value_dim, **scratch)
    block = launch["state_block"]
    wrap_triton(chunk_state_kernel)[(value_dim // block, batch_heads)](
        w, updates, key_gated, chunk_decay, state_in, state_out, starts,
        query_gated, query_key, output,
        length,
        *state_in.stride(), *output.stride(),
        NUM_V_HEADS=num_v_heads, DK=key_dim, DV=value_dim, BT=chunk_size, BV=block,
        GATE_PER_CHANNEL=per_channel, FUSED_OUTPUT=fused_output, DOT_PRECISION=precision, WIDEN=interpreting(),
        num_warps=launch["state_warps"], num_stages=launch["state_stages"],
    )
    if not fused_output:
        block = launch["output_block"]
        wrap_triton(chunk_output_kernel)[(num_chunks, value_dim // block, batch_heads)](
            query_gated, query_key, starts, updates, output,
            length,
            *output.stride(),
            NUM_V_HEADS=num_v_heads, DK=key_dim, DV=value_dim, BT=chunk_size, BV=block,
            DOT_PRECISION=precision, WIDEN=interpreting(), num_warps=launch["output_warps"], num_stages=1,
        )


def _dense_when_traced(*tensors: torch.Tensor) -> tuple:
    """The kernels' inputs as they lie in eager; dense while a launch is traced into a program.

    A kernel reads its inputs through the strides it is given, and a traced launch
    bakes in the strides of the tensors it saw. ExecuTorch's edge dialect, which
    CudaBackend compiles, turns every view into a copy (``slice_copy``,
    ``view_copy``), so in the program each kernel receives a dense tensor: with the
    strides of a view (q/k/v are views of mixed_qkv, and with T > 1 their element
    stride is T) a prefill read the wrong elements, while decode (T = 1) happened to
    agree. Dense tensors at trace time make the baked strides the received ones; in
    eager nothing is copied.
    """
    if not any(is_fake(tensor) for tensor in tensors):
        return tensors
    return tuple(tensor.contiguous() for tensor in tensors)


def _run(query, key, value, g, beta, state_in, state_out, output, scale, use_qk_l2norm):
    query, key, value, g, beta = _dense_when_traced(query, key, value, g, beta)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[3])
    form = run_recurrent if query.shape[1] < CHUNKED_MIN_LENGTH else run_chunked
    form(query, key, value, g, beta, state_in, state_out, output, scale=scale, use_qk_l2norm=use_qk_l2norm)


@triton_op("gdn_cuda::gated_delta_rule", mutates_args={"output", "final_state"})
def _gated_delta_rule_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor, output: torch.Tensor, final_state: torch.Tensor,
    scale: Optional[float], use_qk_l2norm: bool,
) -> None:
    _run(query, key, value, g, beta, initial_state, final_state, output, scale, use_qk_l2norm)


def _fused_run(form, mixed_qkv, a, b, A_log, dt_bias, state, output, scale):
    scale = scale if scale is not None else 1.0 / math.sqrt(state.shape[2])
    if form is run_recurrent:
        # Decode reads q/k/v where they lie in mixed_qkv: in a program, the views would be three copy kernels.
        (mixed_qkv,) = _dense_when_traced(mixed_qkv)
        gate_starts = (0, 0)
        if is_fake(a):
            # In a program b is a slice of the merged projection, which would be a copy kernel of its own; one
            # [a | b] tensor is one kernel with a's gating, and the kernel reads both there.
            a = b = torch.cat([a, b], dim=-1)
            gate_starts = (0, state.shape[1] * a.stride(-1))
        run_recurrent(None, None, None, a, b, state, state, output, scale=scale, use_qk_l2norm=True,
                      a_log=A_log, dt_bias=dt_bias, packed=(mixed_qkv, num_key_heads(mixed_qkv, state)),
                      gate_starts=gate_starts)
        return
    _, query, key, value = split_heads(mixed_qkv, state)
    query, key, value, a, b = _dense_when_traced(query, key, value, a, b)
    # Both forms compute the gating from the raw a/b themselves (no extra launches).
    form(query, key, value, a, b, state, state, output, scale=scale, use_qk_l2norm=True,
         a_log=A_log, dt_bias=dt_bias)


def _fused_output(mixed_qkv, state):
    batch, length = mixed_qkv.shape[0], mixed_qkv.shape[1]
    return torch.empty(batch, length, state.shape[1], state.shape[3], dtype=mixed_qkv.dtype, device=mixed_qkv.device)


def _fused_op(name: str, form, doc: str):
    """The ``gdn_cuda::{name}`` op running ``form`` on views of mixed_qkv, state in place.

    One op per form, not one op with a flag: the recurrence picks the op when it
    exports, so each program holds only the kernels it runs."""

    @triton_op(f"gdn_cuda::{name}", mutates_args={"state"})
    def fused_op(
        mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
        state: torch.Tensor, scale: Optional[float] = None,
    ) -> torch.Tensor:
        output = _fused_output(mixed_qkv, state)
        _fused_run(form, mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
        return output

    fused_op.__doc__ = doc
    return fused_op


fused_recurrent_gated_delta_rule = _fused_op(
    "fused_recurrent_gated_delta_rule", run_recurrent,
    "Decode: split, L2 norm, head repeat, gating and recurrence in one kernel; state in place.")
fused_chunked_gated_delta_rule = _fused_op(
    "fused_chunked_gated_delta_rule", run_chunked, "Prefill: the chunked kernels on views of mixed_qkv; state in place.")


# Channels of the conv a decode prologue program takes.
DECODE_CONVOLUTION_BLOCK = 256


def run_decode_convolution(projected, conv_state, conv_weight, input_pos, A_log, dt_bias, mixed_qkv, gates) -> None:
    """``decode_convolution_kernel``: from a Gated DeltaNet layer's projection [1, 1, C + V + 2 Hv] of one token
    (``[qkv | z | b | a]``), SiLU(conv) of its C channels into ``mixed_qkv`` [1, 1, C], the conv state [1, C, W - 1]
    shifted in place, and ``gates`` [1, 1, 2 Hv] = [a | b], a raised where ``input_pos`` [1] (the token's
    position) is 0 (``gdn_export.ops.conv_recurrence.forget_previous_sequence``)."""
    from gdn_export.ops.conv_recurrence import FORGET_LOG_DECAY

    channels, taps, num_v_heads = conv_state.shape[1], conv_weight.shape[-1], A_log.shape[0]
    width = projected.shape[-1]
    wrap_triton(decode_convolution_kernel)[(triton.cdiv(channels, DECODE_CONVOLUTION_BLOCK) + 1,)](
        projected, conv_state, conv_weight, input_pos, A_log, dt_bias, mixed_qkv, gates,
        channels, num_v_heads, width - 2 * num_v_heads, width - num_v_heads,
        conv_state.stride(1), conv_state.stride(2), conv_weight.stride(0), conv_weight.stride(2),
        TAPS=taps, TAPS_P2=triton.next_power_of_2(taps), BLOCK=DECODE_CONVOLUTION_BLOCK,
        HEADS_P2=triton.next_power_of_2(num_v_heads), FORGET_LOG_DECAY=FORGET_LOG_DECAY, num_warps=4,
    )


def _layer_problems(conv_state, conv_weight, A_log, dt_bias, state) -> tuple[list, int]:
    """(what does not fit one Gated DeltaNet layer among its conv state, conv weight, gates' parameters and
    recurrent state; the width of its merged projection [qkv | z | b | a])."""
    channels = conv_state.shape[1] if conv_state.dim() == 3 else -1
    num_v_heads, value_dim = state.shape[1], state.shape[3]
    problems = []
    if conv_state.dim() != 3 or conv_state.shape[0] != 1:
        problems.append(f"conv_state must be [1, C, W - 1], got {list(conv_state.shape)}")
    elif list(conv_weight.shape) != [channels, 1, conv_state.shape[2] + 1]:
        problems.append(f"conv_weight must be [{channels}, 1, {conv_state.shape[2] + 1}], got {list(conv_weight.shape)}")
    for name, tensor in (("A_log", A_log), ("dt_bias", dt_bias)):
        if list(tensor.shape) != [num_v_heads]:
            problems.append(f"{name} must be [{num_v_heads}], got {list(tensor.shape)}")
    return problems, channels + num_v_heads * value_dim + 2 * num_v_heads


def check_decode_gated_delta_net_inputs(projected, conv_state, conv_weight, input_pos, A_log, dt_bias, state) -> None:
    """ValueError naming the input whose shape does not fit one token of one Gated DeltaNet layer."""
    problems, width = _layer_problems(conv_state, conv_weight, A_log, dt_bias, state)
    if list(projected.shape) != [1, 1, width]:
        problems.append(f"projected must be one token's [qkv | z | b | a], [1, 1, {width}], got {list(projected.shape)}")
    if list(input_pos.shape) != [1] or input_pos.dtype != torch.long:
        problems.append(f"input_pos must be one int64 position, got {list(input_pos.shape)} {input_pos.dtype}")
    if problems:
        raise ValueError("gdn_cuda.decode_gated_delta_net: " + "; ".join(problems))


@triton_op("gdn_cuda::decode_gated_delta_net", mutates_args={"conv_state", "state"})
def decode_gated_delta_net(
    projected: torch.Tensor, conv_state: torch.Tensor, conv_weight: torch.Tensor, input_pos: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, scale: Optional[float] = None,
) -> torch.Tensor:
    """A Gated DeltaNet layer's decode from its input projection of one token to the recurrence's output
    [1, 1, Hv, Dv]: the prologue kernel (conv, conv state, gates; ``run_decode_convolution``), then the recurrent
    kernel reading its q/k/v and gates where the prologue wrote them; conv and recurrent state in place.
    ``input_pos`` [1]: the token's position (0 starts a new sequence)."""
    check_decode_gated_delta_net_inputs(projected, conv_state, conv_weight, input_pos, A_log, dt_bias, state)
    projected = projected.contiguous()  # one token's dense vector: the kernel reads it by element
    channels, num_v_heads = conv_state.shape[1], state.shape[1]
    mixed_qkv = torch.empty(1, 1, channels, dtype=projected.dtype, device=projected.device)
    gates = torch.empty(1, 1, 2 * num_v_heads, dtype=projected.dtype, device=projected.device)
    output = _fused_output(mixed_qkv, state)
    run_decode_convolution(projected, conv_state, conv_weight, input_pos, A_log, dt_bias, mixed_qkv, gates)
    run_recurrent(None, None, None, gates, gates, state, state, output,
                  scale=scale if scale is not None else 1.0 / math.sqrt(state.shape[2]), use_qk_l2norm=True,
                  a_log=A_log, dt_bias=dt_bias, packed=(mixed_qkv, num_key_heads(mixed_qkv, state)),
                  gate_starts=(0, num_v_heads * gates.stride(-1)))
    return output


# A prefill prologue program's tile: tokens x channels (BLOCK_T >= the conv's taps - 1, so only the first
# token block reads the old conv state).
PREFILL_CONVOLUTION_TILE = (32, 128)


def run_prefill_convolution(projected, conv_state, conv_weight, positions, A_log, dt_bias,
                            query, key, value, a, b) -> None:
    """``prefill_convolution_kernel``: from a Gated DeltaNet layer's projection [1, T, C + V + 2 Hv] of a chunk
    (``[qkv | z | b | a]``, read where it lies), SiLU(conv) of its C channels into query, key [1, T, Hk, Dk]
    and value [1, T, Hv, Dv], the conv state [1, C, W - 1] moved on by T tokens in place, and a, b [1, T, Hv],
    a raised on the first token when ``positions[0]`` is 0
    (``gdn_export.ops.conv_recurrence.forget_previous_sequence``)."""
    from gdn_export.ops.conv_recurrence import FORGET_LOG_DECAY

    block_t, block_c = PREFILL_CONVOLUTION_TILE
    length, width = projected.shape[1], projected.shape[2]
    channels, taps, num_v_heads = conv_state.shape[1], conv_weight.shape[-1], A_log.shape[0]
    if taps - 1 > block_t:
        raise ValueError(f"gdn_cuda.prefill_gated_delta_net: a conv of {taps} taps needs a token block of "
                         f"at least {taps - 1}, the launcher's is {block_t}")
    key_channels = query.shape[2] * query.shape[3]
    wrap_triton(prefill_convolution_kernel)[(triton.cdiv(channels, block_c) + 1, triton.cdiv(length, block_t))](
        projected, conv_state, conv_weight, positions, A_log, dt_bias, query, key, value, a, b,
        length, channels, key_channels, num_v_heads, width - 2 * num_v_heads, width - num_v_heads,
        *projected.stride(), conv_state.stride(1), conv_state.stride(2), conv_weight.stride(0), conv_weight.stride(2),
        TAPS=taps, TAPS_P2=triton.next_power_of_2(taps), BLOCK_T=block_t, BLOCK_C=block_c,
        HEADS_P2=triton.next_power_of_2(num_v_heads), FORGET_LOG_DECAY=FORGET_LOG_DECAY, num_warps=4,
    )


def check_prefill_gated_delta_net_inputs(projected, conv_state, conv_weight, positions, A_log, dt_bias,
                                         state) -> None:
    """ValueError naming the input whose shape does not fit a chunk of one Gated DeltaNet layer."""
    problems, width = _layer_problems(conv_state, conv_weight, A_log, dt_bias, state)
    if projected.dim() != 3 or projected.shape[0] != 1 or projected.shape[2] != width:
        problems.append(f"projected must be a chunk's [qkv | z | b | a], [1, T, {width}], got {list(projected.shape)}")
    elif projected.stride(2) != 1:
        problems.append(f"projected's channels must be adjacent (stride 1), got strides {list(projected.stride())}")
    if positions.dim() != 1 or positions.dtype != torch.long:
        problems.append(f"positions must be int64 [T] (or its first, [1]), got {list(positions.shape)} {positions.dtype}")
    if problems:
        raise ValueError("gdn_cuda.prefill_gated_delta_net: " + "; ".join(problems))


@triton_op("gdn_cuda::prefill_gated_delta_net", mutates_args={"conv_state", "state"})
def prefill_gated_delta_net(
    projected: torch.Tensor, conv_state: torch.Tensor, conv_weight: torch.Tensor, positions: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, scale: Optional[float] = None,
) -> torch.Tensor:
    """A Gated DeltaNet layer's prefill from its input projection of a chunk [1, T, C + V + 2 Hv] to the
    recurrence's output [1, T, Hv, Dv]: the prologue kernel (conv, conv state, gates;
    ``run_prefill_convolution``) writes dense q, k, v, a and b, then the chunked kernels; conv and recurrent
    state in place. ``positions`` [T]: the chunk's positions (the first, 0, starts a new sequence)."""
    check_prefill_gated_delta_net_inputs(projected, conv_state, conv_weight, positions, A_log, dt_bias, state)
    length, channels = projected.shape[1], conv_state.shape[1]
    num_v_heads, key_dim, value_dim = state.shape[1], state.shape[2], state.shape[3]
    num_k_heads = num_key_heads_of(channels, state)
    like = dict(dtype=projected.dtype, device=projected.device)
    query = torch.empty(1, length, num_k_heads, key_dim, **like)
    key = torch.empty(1, length, num_k_heads, key_dim, **like)
    value = torch.empty(1, length, num_v_heads, value_dim, **like)
    a = torch.empty(1, length, num_v_heads, **like)
    b = torch.empty(1, length, num_v_heads, **like)
    output = torch.empty(1, length, num_v_heads, value_dim, **like)
    run_prefill_convolution(projected, conv_state, conv_weight, positions, A_log, dt_bias, query, key, value, a, b)
    run_chunked(query, key, value, a, b, state, state, output,
                scale=scale if scale is not None else 1.0 / math.sqrt(key_dim), use_qk_l2norm=True,
                a_log=A_log, dt_bias=dt_bias)
    return output


def gated_delta_rule(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output=None, final_state=None
):
    """``gdn::gated_delta_rule`` on the Triton kernels; returns (output, final_state).

    Picks the per-token kernel for T < CHUNKED_MIN_LENGTH, the chunked ones
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
    form = run_recurrent if mixed_qkv.shape[1] < CHUNKED_MIN_LENGTH else run_chunked
    _fused_run(form, mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
    return output


def launch_kernel(kernel, query, key, value, g, beta, initial_state, final_state, output, *, scale=None,
                  use_qk_l2norm=False, A_log=None, dt_bias=None, launch_shape=None) -> None:
    """Launch one of the op's kernels, ``"recurrent"`` (per token) or ``"chunked"``, whatever T.

    For benchmarks and launch-shape checks: ``gated_delta_rule`` and
    ``fused_gated_delta_rule`` pick the kernel and its launch shape themselves.
    Writes ``output`` and ``final_state``, which may be ``initial_state`` (in
    place). With ``A_log``/``dt_bias`` given, ``g``/``beta`` are Qwen3.5's raw
    a/b, gated inside the kernel as the fused op does. ``launch_shape``
    overrides entries of the launcher's own choice: ``value_block`` and
    ``num_warps`` of the per-token kernel; the entries of ``_chunked_launch``
    and ``scratch`` ("fp32" or "bf16") of the chunked ones
    (``LAUNCH_SHAPE_SWEEPS`` lists those worth timing). Only the head dims and
    the device are checked.
    """
    if kernel not in ("recurrent", "chunked"):
        raise ValueError(f"cuda_backend.launch_kernel: kernel must be 'recurrent' or 'chunked', got {kernel!r}")
    check_supported(query.shape[3], value.shape[3], query.device, "cuda_backend.launch_kernel")
    arguments = (query, key, value, g, beta, initial_state, final_state, output)
    options = dict(scale=scale if scale is not None else 1.0 / math.sqrt(query.shape[3]),
                   use_qk_l2norm=use_qk_l2norm, a_log=A_log, dt_bias=dt_bias)
    if kernel == "recurrent":
        run_recurrent(*arguments, **options, **(launch_shape or {}))
    else:
        run_chunked(*arguments, **options, tuning=launch_shape)


# Programs a decode step's attention spreads over (an H100 has 132 SMs), and the most rows (query heads times
# tokens, per KV head) for which the cache is split between programs rather than walked whole by each.
ATTENTION_TARGET_PROGRAMS = 128
ATTENTION_SPLIT_MAX_ROWS = 64
LOG2_E = 1.4426950408889634


def _attention_launch(rows, num_kv_heads: int, head_dim: int, max_len: int, element_bytes: int,
                      overrides: Optional[dict] = None) -> dict:
    """Launch shape of ``cached_attention_kernel``; ``rows`` (G * T) is an int, or symbolic in a traced prefill.

    A known, small row count (decode) splits the cache into spans so that about
    ATTENTION_TARGET_PROGRAMS programs share it; a symbolic one (a prefill traced
    over a range of T) walks it in one pass, its row blocks giving the programs.
    Tiles: 64 rows, 64 (fp32 at D > 128: 32) positions per step, two stages of
    K/V tiles in shared memory (fp32: one). ``overrides`` sets any of split,
    block_m, block_n, num_warps, num_stages (``gdn_bench.cuda_layers attention`` times them).
    """
    overrides = dict(overrides or {})
    block_d = triton.next_power_of_2(head_dim)
    known = isinstance(rows, int)
    split = overrides.pop("split", known and rows <= ATTENTION_SPLIT_MAX_ROWS)
    half = element_bytes <= 2
    block_n = overrides.pop("block_n", 64 if half or block_d <= 128 else 32)
    default_m = min(64, max(16, triton.next_power_of_2(rows))) if split else (128 if half else 64)
    block_m = overrides.pop("block_m", default_m)
    row_blocks = triton.cdiv(rows, block_m)
    span = max_len
    if split:
        wanted = max(1, ATTENTION_TARGET_PROGRAMS // (num_kv_heads * row_blocks))
        span = block_n * triton.cdiv(triton.cdiv(max_len, wanted), block_n)
    launch = dict(
        split=split, block_m=block_m, block_n=block_n, block_d=block_d, row_blocks=row_blocks, span=span,
        splits=triton.cdiv(max_len, span), num_warps=8 if block_m * block_d >= 64 * 256 or (split and half) else 4,
        num_stages=1 if block_m >= 128 or not half else 2,
    )
    unknown = set(overrides) - {"num_warps", "num_stages"}
    if unknown:
        raise ValueError(f"attention launch overrides: unknown {sorted(unknown)}")
    return {**launch, **overrides}


def run_cached_attention(query, k_cache, v_cache, input_pos, output, *, scale=None, launch_shape=None) -> None:
    """``cached_attention_kernel`` (and, split, ``merge_spans_kernel``) into ``output`` [Hq, T, D];
    ``launch_shape`` overrides entries of ``_attention_launch``'s choice."""
    num_heads, length, head_dim = query.shape
    num_kv_heads, _, max_len = k_cache.shape
    group = num_heads // num_kv_heads
    launch = _attention_launch(group * length, num_kv_heads, head_dim, max_len, query.element_size(), launch_shape)
    scale = head_dim**-0.5 if scale is None else scale
    splits = launch["splits"] if launch["split"] else 1
    # The spans' partial outputs and log2-sum-exps; one pass writes neither (one-element stand-ins).
    scratch = (splits, num_heads, length) if launch["split"] else (1, 1, 1)
    partial = torch.empty(*scratch, head_dim if launch["split"] else 1, dtype=torch.float32, device=query.device)
    log_sums = torch.empty(*scratch, dtype=torch.float32, device=query.device)
    wrap_triton(cached_attention_kernel)[(launch["row_blocks"], num_kv_heads, splits)](
        query, k_cache, v_cache, input_pos, output, partial, log_sums,
        length, launch["span"], scale * LOG2_E,
        *query.stride(), *k_cache.stride(), *v_cache.stride(), *output.stride(), *partial.stride(),
        *log_sums.stride(),
        GROUP=group, D=head_dim, BD=launch["block_d"], BM=launch["block_m"], BN=launch["block_n"],
        SPLIT=launch["split"], DOT_PRECISION=_dot_precision(query), WIDEN=interpreting(),
        num_warps=launch["num_warps"], num_stages=launch["num_stages"],
    )
    if launch["split"]:
        wrap_triton(merge_spans_kernel)[(num_heads * length,)](
            partial, log_sums, output,
            length,
            *partial.stride(), *log_sums.stride(), *output.stride(),
            SPLITS=splits, BS=triton.next_power_of_2(splits), D=head_dim, BD=launch["block_d"], num_warps=4,
        )


@triton_op("gdn_cuda::cached_attention", mutates_args={})
def cached_attention_op(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, input_pos: torch.Tensor,
    scale: Optional[float] = None,
) -> torch.Tensor:
    (query,) = _dense_when_traced(query)
    output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    run_cached_attention(query, k_cache, v_cache, input_pos, output, scale=scale)
    return output


def cached_attention(query, k_cache, v_cache, input_pos, *, scale=None, output=None):
    """``gdn::cached_attention`` on the Triton kernels; writes ``output`` when given, returns it.

    The position is read on the device, so unlike the reference this does not
    check that input_pos + T fits the caches.
    """
    check_attention_inputs(query, k_cache, v_cache, input_pos)
    if query.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"cuda_backend.cached_attention: the Triton kernels need CUDA tensors (got {query.device}); "
            "set TRITON_INTERPRET=1 before importing triton to run them on the CPU"
        )
    if output is None:
        return torch.ops.gdn_cuda.cached_attention(query, k_cache, v_cache, input_pos, scale)
    if list(output.shape) != list(query.shape) or output.dtype != query.dtype:
        raise ValueError(
            f"gdn.cached_attention.out: output must be {list(query.shape)} {query.dtype}, "
            f"got {list(output.shape)} {output.dtype}"
        )
    run_cached_attention(query, k_cache, v_cache, input_pos, output, scale=scale)
    return output


def check_decode_attention_inputs(projected, q_norm_weight, k_norm_weight, rotary_dim, input_pos, k_cache,
                                  v_cache) -> None:
    """ValueError naming the input whose shape does not fit one token of one full-attention layer."""
    problems = []
    if k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError(f"gdn_cuda.decode_attention_inputs: k_cache must be [Hkv, D, S] and v_cache [Hkv, S, D], "
                         f"got {list(k_cache.shape)} and {list(v_cache.shape)}")
    num_kv_heads, head_dim, max_len = k_cache.shape
    if list(v_cache.shape) != [num_kv_heads, max_len, head_dim]:
        problems.append(f"v_cache must be [{num_kv_heads}, {max_len}, {head_dim}], got {list(v_cache.shape)}")
    width = projected.shape[-1]
    num_heads = (width - 2 * num_kv_heads * head_dim) // (2 * head_dim)
    if projected.numel() != width or num_heads < 1 or num_heads % num_kv_heads \
            or width != 2 * (num_heads + num_kv_heads) * head_dim:
        problems.append(f"projected must be one token's [q | gate] heads, k and v ([1, 1, 2 (H + {num_kv_heads}) "
                        f"* {head_dim}], H a multiple of {num_kv_heads}), got {list(projected.shape)}")
    for name, weight in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if list(weight.shape) != [head_dim]:
            problems.append(f"{name} must be [{head_dim}], got {list(weight.shape)}")
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        problems.append(f"rotary_dim must be even, from 2 to {head_dim}, got {rotary_dim}")
    if list(input_pos.shape) != [1] or input_pos.dtype != torch.long:
        problems.append(f"input_pos must be one int64 position, got {list(input_pos.shape)} {input_pos.dtype}")
    if problems:
        raise ValueError("gdn_cuda.decode_attention_inputs: " + "; ".join(problems))


@triton_op("gdn_cuda::decode_attention_inputs", mutates_args={"k_cache", "v_cache"})
def decode_attention_inputs(
    projected: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, eps: float,
    rope_theta: float, rotary_dim: int, input_pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
) -> torch.Tensor:
    """A full-attention layer's decode prologue (``decode_attention_inputs_kernel``) from its merged q/k/v
    projection of one token, ``[q_0 | gate_0 | ... | k | v]`` [1, 1, 2 (H + Hkv) D]: returns the query
    [H, 1, D], q_norm'd and rotated (the first ``rotary_dim`` channels of each head, base ``rope_theta``, at
    ``input_pos`` [1]); writes the k_norm'd, rotated key into k_cache [Hkv, D, S] and the value into v_cache
    [Hkv, S, D] at that position. One ``eps`` for both norms (the model gives them its config's)."""
    check_decode_attention_inputs(projected, q_norm_weight, k_norm_weight, rotary_dim, input_pos, k_cache, v_cache)
    projected = projected.contiguous()  # one token's dense vector: the kernel reads it by element
    num_kv_heads, head_dim, max_len = k_cache.shape
    num_heads = projected.shape[-1] // (2 * head_dim) - num_kv_heads
    query = torch.empty(num_heads, 1, head_dim, dtype=projected.dtype, device=projected.device)
    k_start = 2 * num_heads * head_dim
    wrap_triton(decode_attention_inputs_kernel)[(num_heads + num_kv_heads,)](
        projected, q_norm_weight, k_norm_weight, input_pos, query, k_cache, v_cache,
        eps, math.log2(rope_theta), k_start, k_start + num_kv_heads * head_dim, max_len,
        *k_cache.stride(), *v_cache.stride(),
        NUM_HEADS=num_heads, D=head_dim, BD=triton.next_power_of_2(head_dim), ROTARY=rotary_dim, num_warps=2,
    )
    return query


# A decode linear's launch: at least two programs per SM of an H100 (132), each loading W in tiles of
# DECODE_LINEAR_TILE elements (8 KiB of bf16) per step.
DECODE_LINEAR_MIN_PROGRAMS = 264
DECODE_LINEAR_TILE = 4096
# The 0.8B's and 4B's decode linears, (out, in) -> (rows, width, num_warps): the fastest of
# ``gdn_bench.cuda_layers linear``'s sweep on the H100 (2026-11-26, weights cold, replayed from a CUDA graph;
# docs/benchmarks.md). Together 0.8B's step reads its linears in 729 us where the rule above takes 790,
# and 4B's in 3077 us where it takes 3318. Other shapes take the rule.
DECODE_LINEAR_MEASURED = {
    (1024, 2048): (2, 2048, 8), (1024, 3584): (2, 4096, 4), (5120, 1024): (8, 512, 4),
    (7168, 1024): (8, 1024, 4), (8224, 1024): (8, 1024, 4), (248320, 1024): (2, 1024, 4),
    (2560, 4096): (2, 4096, 4), (2560, 9216): (8, 1024, 4), (10240, 2560): (32, 256, 8),
    (12352, 2560): (16, 256, 4), (18432, 2560): (8, 256, 4), (248320, 2560): (2, 1024, 4),
}


def _decode_linear_launch(out_features: int, in_features: int, launch_shape: Optional[dict] = None) -> dict:
    """``decode_linear_kernel``'s launch: DECODE_LINEAR_MEASURED's for its shapes; otherwise the most rows a
    program that still give DECODE_LINEAR_MIN_PROGRAMS programs, then as wide as the tile allows, 4 warps;
    2 stages. ``launch_shape`` overrides entries (rows, width, num_warps, num_stages: what
    ``gdn_bench.cuda_layers linear`` sweeps)."""
    launch = dict(zip(("rows", "width", "num_warps"), DECODE_LINEAR_MEASURED.get((out_features, in_features), ())))
    launch.update(launch_shape or {})
    if "rows" not in launch:
        launch["rows"] = 32
        while launch["rows"] > 1 and triton.cdiv(out_features, launch["rows"]) < DECODE_LINEAR_MIN_PROGRAMS:
            launch["rows"] //= 2
    launch.setdefault("width", min(triton.next_power_of_2(in_features), max(64, DECODE_LINEAR_TILE // launch["rows"])))
    launch.setdefault("num_warps", 4)
    launch.setdefault("num_stages", 2)
    return launch


def run_decode_linear(x, weight, bias, output, *, gated=False, norm_weight=None, eps=0.0, residual=None,
                      gate=None, gate_start=0, head_dim=0, gate_head_stride=0, sigmoid_gate=False,
                      launch_shape=None) -> None:
    """``decode_linear_kernel``: output [..., N] = x [..., K] (one token, dense) @ weight [N, K].T + bias;
    ``gated``: x holds [gate | up] (2K values) and the input is silu(gate) * up; ``norm_weight``: the input
    is Qwen3.5's RMSNorm of x with that weight and ``eps``; ``residual`` (N values, dense): added to the output.
    ``head_dim`` > 0: x is heads of ``head_dim``, each with a gate z of ``head_dim`` elements of ``gate``,
    head h's from ``gate_start + h * gate_head_stride`` on (0: ``head_dim``, the gates side by side); the
    input is Gated DeltaNet's GatedRMSNorm of x (weight ``norm_weight`` [head_dim], ``eps``) times silu(z), or
    with ``sigmoid_gate`` attention's x * sigmoid(z). ``launch_shape`` overrides entries of
    ``_decode_linear_launch``'s choice."""
    out_features, in_features = weight.shape
    launch = _decode_linear_launch(out_features, in_features, launch_shape)
    if head_dim:  # a tile holds whole heads (both powers of two)
        launch["width"] = max(launch["width"], head_dim)
    wrap_triton(decode_linear_kernel)[(triton.cdiv(out_features, launch["rows"]),)](
        x, weight, weight if bias is None else bias, output, weight if norm_weight is None else norm_weight,
        weight if residual is None else residual, weight if gate is None else gate,
        out_features, in_features, eps, gate_start, gate_head_stride or head_dim,
        *weight.stride(),
        HAS_BIAS=bias is not None, BN=launch["rows"], BK=launch["width"], GATED=gated,
        NORM=norm_weight is not None and not head_dim, RESIDUAL=residual is not None,
        HEAD=head_dim, HEAD_NORM=not sigmoid_gate,
        num_warps=launch["num_warps"], num_stages=launch["num_stages"],
    )


def check_head_gate_inputs(x, weight, norm_weight, gate, gate_start: int, head_dim: int, gate_head_stride: int,
                           sigmoid_gate: bool) -> None:
    """ValueError naming what does not fit ``decode_linear``'s per-head gate of its input (Gated DeltaNet's
    gated RMSNorm, or with ``sigmoid_gate`` attention's sigmoid gate)."""
    in_features = weight.shape[-1]
    problems = []
    if head_dim < 1 or head_dim & (head_dim - 1) or in_features % head_dim:
        problems.append(f"head_dim must be a power of two dividing in_features {in_features}, got {head_dim}")
    if x.numel() != in_features:
        problems.append(f"x must hold one token's {in_features} features, got {list(x.shape)}")
    if sigmoid_gate and norm_weight is not None:
        problems.append("sigmoid_gate takes no norm_weight")
    if not sigmoid_gate and (norm_weight is None or list(norm_weight.shape) != [head_dim]):
        problems.append(f"norm_weight must be [{head_dim}], got "
                        f"{None if norm_weight is None else list(norm_weight.shape)}")
    stride = gate_head_stride or head_dim
    end = gate_start + (in_features // max(head_dim, 1) - 1) * stride + head_dim
    if gate is None or gate_start < 0 or stride < head_dim or gate.numel() < end:
        problems.append(f"gate must hold {in_features // max(head_dim, 1)} heads of {head_dim} elements, "
                        f"{stride} apart from gate_start {gate_start} on ({end} elements), got "
                        f"{None if gate is None else list(gate.shape)}")
    if problems:
        raise ValueError("gdn_cuda.decode_linear: " + "; ".join(problems))


@triton_op("gdn_cuda::decode_linear", mutates_args={})
def decode_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0, gated: bool = False,
                     residual: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
                     gate_start: int = 0, head_dim: int = 0, gate_head_stride: int = 0,
                     sigmoid_gate: bool = False) -> torch.Tensor:
    """One token through ``decode_linear_kernel`` (``run_decode_linear`` says what ``gated``, ``norm_weight``,
    ``residual``, ``head_dim``, ``gate_head_stride`` and ``sigmoid_gate`` do); the flags are constants of the
    traced launch, so a program's kernel has only the branches it takes. With ``head_dim``, x may be any shape
    of K elements ([1, 1, heads, head_dim], the recurrence's output; [heads, 1, head_dim], the attention's:
    each taken without a view, which a program would copy) and the output is [1, 1, N]."""
    if head_dim:
        check_head_gate_inputs(x, weight, norm_weight, gate, gate_start, head_dim, gate_head_stride, sigmoid_gate)
        gate = gate.contiguous()
    x = x.contiguous()  # the kernel reads x (and the residual) as consecutive elements
    residual = None if residual is None else residual.contiguous()
    leading = (1, 1) if head_dim else x.shape[:-1]
    output = torch.empty(*leading, weight.shape[0], dtype=x.dtype, device=x.device)
    run_decode_linear(x, weight, bias, output, gated=gated, norm_weight=norm_weight, eps=eps, residual=residual,
                      gate=gate, gate_start=gate_start, head_dim=head_dim, gate_head_stride=gate_head_stride,
                      sigmoid_gate=sigmoid_gate)
    return output


def decode_linear(x, weight, bias=None, *, gated=False, norm_weight=None, eps=1e-6, residual=None):
    """``F.linear(x, weight, bias)`` for one token (x [..., K] holding K elements) on the decode kernel.

    ``gated``: x [..., 2K] holds an MLP's gate and up projections, and the result is
    ``F.linear(F.silu(gate) * up, weight)`` (no bias). ``norm_weight`` [K]: the input is Qwen3.5's
    RMSNorm of x, x / sqrt(mean(x²) + eps) * (1 + norm_weight), computed in fp32 inside the kernel.
    ``residual`` (N elements, x's dtype): added to the result in fp32 before it is rounded.
    """
    if residual is not None and (residual.numel() != weight.shape[0] or residual.dtype != x.dtype):
        raise ValueError(f"cuda_backend.decode_linear: residual must hold {weight.shape[0]} elements of {x.dtype}, "
                         f"got {list(residual.shape)} {residual.dtype}")
    if norm_weight is not None:
        if gated:
            raise ValueError("cuda_backend.decode_linear: gated and norm_weight do not go together")
        if list(norm_weight.shape) != [weight.shape[-1]]:
            raise ValueError(f"cuda_backend.decode_linear: norm_weight must be [{weight.shape[-1]}], "
                             f"got {list(norm_weight.shape)}")
    width = weight.shape[-1] * (2 if gated else 1)
    if weight.dim() != 2 or x.shape[-1] != width or x.numel() != width:
        raise ValueError(
            f"cuda_backend.decode_linear: x must hold one token of {width} features for a weight "
            f"[N, K={weight.shape[-1]}]{' (gated: 2K)' if gated else ''}, got x {list(x.shape)} and weight "
            f"{list(weight.shape)}"
        )
    if gated and bias is not None:
        raise ValueError("cuda_backend.decode_linear: gated takes no bias")
    if bias is not None and list(bias.shape) != [weight.shape[0]]:
        raise ValueError(f"cuda_backend.decode_linear: bias must be [{weight.shape[0]}], got {list(bias.shape)}")
    if x.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"cuda_backend.decode_linear: the Triton kernels need CUDA tensors (got {x.device}); "
            "set TRITON_INTERPRET=1 before importing triton to run them on the CPU"
        )
    return torch.ops.gdn_cuda.decode_linear(x, weight, bias, norm_weight, eps, gated, residual)


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
        ("cached_attention", lambda *args, scale=None: cached_attention(*args, scale=scale)),
        ("cached_attention.out", lambda *args, scale=None, output: cached_attention(*args, scale=scale, output=output)),
    ):
        library.impl(name, implementation, "CUDA")
    # Kept alive with the module: dropping the Library would unregister the kernels.
    _register_cuda_implementations.library = library


_register_cuda_implementations()
