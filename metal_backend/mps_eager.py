"""The gdn ops on MPS tensors in eager PyTorch (macOS), through ``torch.mps.compile_shader``.

``register()`` adds MPS kernels for ``gdn::gated_delta_rule`` (+ ``.out``; the
in-place form reaches ``.out`` through its default) and
``gdn::fused_gated_delta_rule`` (+ ``.out``), compiled from the same
``kernels/gated_delta_rule.metal`` the ExecuTorch runtime uses. It does
nothing unless ``torch.backends.mps.is_available()``.

Calls the kernels do not cover (head dims outside {64, 128, 256}, inputs of
mixed or float64 dtypes) fall back, with a warning, to the op's pure-PyTorch
reference running on MPS.

The launch is planned here the way ``runtime/launch.h`` plans it for the
ExecuTorch runtime; ``tests/test_metal_mps_planning.py`` checks on Linux that
both give the same kernel, grid and parameter bytes.
"""

from __future__ import annotations

import math
import re
import struct
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from gdn_export.ops import contract, fused

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
# Head dims (Dk and Dv each) the kernels are written for; others are refused before export.
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SIMD_WIDTH = 32
SIMDGROUPS_PER_THREADGROUP = 4
COLUMNS_PER_THREADGROUP = 4 * SIMDGROUPS_PER_THREADGROUP
METAL_TYPE_NAMES = {torch.float32: "float", torch.bfloat16: "bfloat", torch.float16: "half"}


@lru_cache(maxsize=1)
def kernel_source() -> str:
    """gated_delta_rule.metal with its params header inlined (compile_shader resolves no includes).

    The header's ``#pragma once`` goes: in a main source file it draws a
    warning, which a loader that treats any compiler message as failure rejects.
    """
    params = (KERNELS_DIR / "gated_delta_rule_params.h").read_text().replace("#pragma once\n", "")
    return (KERNELS_DIR / "gated_delta_rule.metal").read_text().replace(
        '#include "gated_delta_rule_params.h"', params
    )


@lru_cache(maxsize=None)
def struct_fields(struct_name: str) -> tuple[tuple[str, str, int], ...]:
    """(type, name, count) of each field of ``struct_name`` in gated_delta_rule_params.h."""
    header = (KERNELS_DIR / "gated_delta_rule_params.h").read_text()
    body = re.search(rf"struct {struct_name} \{{(.*?)\}};", header, re.S)
    if body is None:
        raise RuntimeError(f"struct {struct_name} not found in gated_delta_rule_params.h")
    fields = re.findall(r"^\s*(int|float) (\w+)(?:\[(\d+)\])?;", body.group(1), re.M)
    return tuple((type_, name, int(count or 1)) for type_, name, count in fields)


def pack_params(struct_name: str, values: dict) -> bytes:
    """The struct's bytes (all fields 4 bytes, little endian) from {field: value or list}."""
    packed = b""
    for type_, name, count in struct_fields(struct_name):
        items = values[name] if count > 1 else [values[name]]
        if len(items) != count:
            raise ValueError(f"{struct_name}.{name}: {count} values expected, got {len(items)}")
        packed += struct.pack(f"<{count}{'f' if type_ == 'float' else 'i'}", *items)
    return packed


@dataclass(frozen=True)
class Launch:
    kernel_name: str
    threadgroups: tuple[int, int, int]
    threads_per_threadgroup: tuple[int, int, int]
    params: bytes


def _strides(tensor: torch.Tensor, count: int) -> list[int]:
    return list(tensor.stride()) + [0] * (count - tensor.dim())


def unsupported_reason(key_dim: int, value_dim: int, *tensors: torch.Tensor) -> str | None:
    """Why the Metal kernels cannot run a call (then the reference runs), or None."""
    if key_dim not in SUPPORTED_HEAD_DIMS or value_dim not in SUPPORTED_HEAD_DIMS:
        supported = ", ".join(map(str, SUPPORTED_HEAD_DIMS))
        return f"the Metal kernels support head dims Dk, Dv in {{{supported}}}, got Dk={key_dim}, Dv={value_dim}"
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(METAL_TYPE_NAMES):
        return f"the Metal kernels read one float32/bfloat16/float16 input dtype, got {sorted(map(str, dtypes))}"
    return None


def _grid(value_dim: int, num_v_heads: int, batch: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (value_dim // COLUMNS_PER_THREADGROUP, num_v_heads, batch), (SIMD_WIDTH, SIMDGROUPS_PER_THREADGROUP, 1)


def plan_gated_delta_rule(query, key, value, g, beta, initial_state, output, final_state, scale, use_qk_l2norm) -> Launch:
    """Kernel, grid and parameters of one ``gated_delta_rule.out`` call (inputs already validated)."""
    batch, length, num_k_heads, key_dim = query.shape
    num_v_heads, value_dim = value.shape[2], value.shape[3]
    per_channel_gate = g.dim() == 4
    g_strides = _strides(g, 4)
    if not per_channel_gate:
        g_strides[3] = 0
    params = pack_params("GatedDeltaRuleParams", {
        "batch": batch, "length": length, "num_k_heads": num_k_heads, "num_v_heads": num_v_heads,
        "value_dim": value_dim, "per_channel_gate": int(per_channel_gate), "use_qk_l2norm": int(use_qk_l2norm),
        "scale": scale if scale is not None else 1.0 / math.sqrt(key_dim),
        "query_strides": _strides(query, 4), "key_strides": _strides(key, 4),
        "value_strides": _strides(value, 4), "g_strides": g_strides, "beta_strides": _strides(beta, 3),
        "initial_state_strides": _strides(initial_state, 4), "output_strides": _strides(output, 4),
        "final_state_strides": _strides(final_state, 4),
    })
    threadgroups, threads = _grid(value_dim, num_v_heads, batch)
    name = f"gated_delta_rule_{METAL_TYPE_NAMES[query.dtype]}_dk{key_dim}"
    return Launch(name, threadgroups, threads, params)


def plan_fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, output, scale) -> Launch:
    """Kernel, grid and parameters of one ``fused_gated_delta_rule.out`` call (inputs already validated)."""
    batch, length, _ = mixed_qkv.shape
    num_v_heads, key_dim, value_dim = state.shape[1], state.shape[2], state.shape[3]
    num_k_heads = fused.num_key_heads(mixed_qkv, state)
    params = pack_params("FusedGatedDeltaRuleParams", {
        "batch": batch, "length": length, "num_k_heads": num_k_heads, "num_v_heads": num_v_heads,
        "value_dim": value_dim, "scale": scale if scale is not None else 1.0 / math.sqrt(key_dim),
        "mixed_qkv_strides": _strides(mixed_qkv, 3), "a_strides": _strides(a, 3), "b_strides": _strides(b, 3),
        "A_log_stride": A_log.stride(0), "dt_bias_stride": dt_bias.stride(0),
        "state_strides": _strides(state, 4), "output_strides": _strides(output, 4),
    })
    threadgroups, threads = _grid(value_dim, num_v_heads, batch)
    name = (
        f"fused_gated_delta_rule_{METAL_TYPE_NAMES[mixed_qkv.dtype]}_{METAL_TYPE_NAMES[A_log.dtype]}_dk{key_dim}"
    )
    return Launch(name, threadgroups, threads, params)


@lru_cache(maxsize=1)
def _shader_library():
    return torch.mps.compile_shader(kernel_source())


def _dispatch(launch: Launch, *tensors: torch.Tensor) -> None:
    words = torch.frombuffer(bytearray(launch.params), dtype=torch.int32).to("mps")
    kernel = getattr(_shader_library(), launch.kernel_name)
    # compile_shader dispatches a grid of threads (not of threadgroups).
    threads = tuple(n * per for n, per in zip(launch.threadgroups, launch.threads_per_threadgroup))
    kernel(*tensors, words, threads=threads, group_size=launch.threads_per_threadgroup)


def _fall_back(reason: str) -> None:
    warnings.warn(f"gdn metal: {reason}; running the PyTorch reference on MPS instead", stacklevel=3)


def gated_delta_rule_out(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state
):
    contract.check_inputs(query, key, value, g, beta, initial_state, scale)
    contract.check_out_tensors(value, initial_state, output, final_state)
    reason = unsupported_reason(query.shape[3], value.shape[3], query, key, value, g, beta)
    if reason is not None:
        _fall_back(reason)
        return contract.reference_gated_delta_rule_out(
            query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
            output=output, final_state=final_state,
        )
    launch = plan_gated_delta_rule(
        query, key, value, g, beta, initial_state, output, final_state, scale, use_qk_l2norm
    )
    _dispatch(launch, query, key, value, g, beta, initial_state, output, final_state)
    return output, final_state


def gated_delta_rule(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
    output = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    final_state = torch.empty(initial_state.shape, dtype=torch.float32, device=initial_state.device)
    return gated_delta_rule_out(
        query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
        output=output, final_state=final_state,
    )


def fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
    fused.check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    _, _, _, value = fused.split_heads(mixed_qkv, state)
    contract.check_out_tensors(value, state, output, state)
    reason = unsupported_reason(state.shape[2], state.shape[3], mixed_qkv, a, b) or unsupported_reason(
        state.shape[2], state.shape[3], A_log, dt_bias
    )
    if reason is not None:
        _fall_back(reason)
        return fused.fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, scale=scale, output=output)
    launch = plan_fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, output, scale)
    _dispatch(launch, mixed_qkv, a, b, A_log, dt_bias, state, output)
    return output


def fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None):
    fused.check_fused_inputs(mixed_qkv, a, b, A_log, dt_bias, state)
    _, _, _, value = fused.split_heads(mixed_qkv, state)
    output = torch.empty(value.shape, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    return fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, scale=scale, output=output)


_registered_library = None


def register() -> bool:
    """Register the MPS kernels (once); returns whether MPS is available."""
    global _registered_library
    if not torch.backends.mps.is_available():
        return False
    if _registered_library is None:
        library = torch.library.Library(contract.NAMESPACE, "IMPL")
        library.impl("gated_delta_rule", gated_delta_rule, "MPS")
        library.impl("gated_delta_rule.out", gated_delta_rule_out, "MPS")
        library.impl("fused_gated_delta_rule", fused_gated_delta_rule, "MPS")
        library.impl("fused_gated_delta_rule.out", fused_gated_delta_rule_out, "MPS")
        _registered_library = library
    return True
