"""The Metal kernels run on the CPU: the Linux check of ``metal_backend``.

``emulation/emulated_kernels.cpp`` compiles the unchanged
``kernels/gated_delta_rule.metal`` as C++ (``emulation/include/metal_stdlib`` is
the compatibility header) and runs each threadgroup's threads as fibers in
lockstep, so ``simd_sum`` behaves as on the GPU. Launches are planned by the
host dispatch's own ``runtime/launch.h``. This module builds that library with
the system C++ compiler (once per source change, into ``build/``) and exposes
the ops' entry points on CPU tensors, for the tests.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCES = (
    PACKAGE_DIR / "emulation" / "emulated_kernels.cpp",
    PACKAGE_DIR / "emulation" / "simd_lockstep.cpp",
)
HEADERS = (
    PACKAGE_DIR / "emulation" / "simd_lockstep.h",
    PACKAGE_DIR / "emulation" / "include" / "metal_stdlib",
    PACKAGE_DIR / "kernels" / "gated_delta_rule.metal",
    PACKAGE_DIR / "kernels" / "gated_delta_rule_params.h",
    PACKAGE_DIR / "runtime" / "launch.h",
)
BUILD_DIR = PACKAGE_DIR.parent / "build" / "metal_emulation"

# c10::ScalarType codes, as runtime/launch.h and AOTI tensor handles use them.
SCALAR_TYPE_CODES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}

_ERROR_BUFFER_BYTES = 1024
_STATUS_ERRORS = {1: ValueError, 2: NotImplementedError, 3: RuntimeError}


class TensorView(ctypes.Structure):
    """``gdn_metal::TensorView`` of runtime/launch.h."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int64),
        ("sizes", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
    ]


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("metal_backend emulation needs a C++17 compiler (g++ or clang++, or set CXX)")
    return compiler


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The emulation library, compiled on first use and cached by source hash."""
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    target = BUILD_DIR / digest.hexdigest()[:16] / "libgdn_metal_emulation.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
            partial_path = Path(partial.name)
        command = [
            _compiler(), "-std=c++17", "-O2", "-shared", "-fPIC", "-Wall", "-Wno-attributes",
            "-Wno-unused-function", "-I", str(PACKAGE_DIR / "emulation" / "include"),
            *map(str, SOURCES), "-o", str(partial_path),
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            partial_path.unlink(missing_ok=True)
            raise RuntimeError(f"building the Metal emulation failed:\n{' '.join(command)}\n{result.stderr}")
        partial_path.replace(target)  # atomic: a concurrent build never sees a partial file
    lib = ctypes.CDLL(str(target))
    views = ctypes.POINTER(TensorView)
    pointers = ctypes.POINTER(ctypes.c_void_p)
    lib.gdn_emulate_gated_delta_rule.argtypes = [
        views, pointers, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
    ]
    lib.gdn_emulate_fused_gated_delta_rule.argtypes = [
        views, pointers, ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_size_t,
    ]
    lib.gdn_emulated_kernel_names.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    grid = ctypes.POINTER(ctypes.c_uint32)
    lib.gdn_plan_gated_delta_rule.argtypes = [
        views, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, grid,
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
    ]
    lib.gdn_plan_fused_gated_delta_rule.argtypes = [
        views, ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_size_t, grid,
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
    ]
    return lib


def kernel_names() -> set[str]:
    """Host names of every kernel instantiation the emulation holds."""
    buffer = ctypes.create_string_buffer(1 << 16)
    if library().gdn_emulated_kernel_names(buffer, len(buffer)) != 0:
        raise RuntimeError("kernel name list does not fit the buffer")
    return set(buffer.value.decode().split())


def _view(name: str, tensor: torch.Tensor) -> TensorView:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gdn metal emulation: {name} must be a Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise RuntimeError(f"gdn metal emulation: {name} must be on the CPU, got {tensor.device}")
    if tensor.dim() > 4:
        raise ValueError(f"gdn metal emulation: {name} has {tensor.dim()} dims, at most 4 expected")
    view = TensorView(name.encode(), SCALAR_TYPE_CODES.get(tensor.dtype, -1), tensor.dim())
    for d in range(tensor.dim()):
        view.sizes[d] = tensor.shape[d]
        view.strides[d] = tensor.stride(d)
    return view


def _views(named: dict):
    return (TensorView * len(named))(*(_view(name, t) for name, t in named.items()))


def _check(status: int, error) -> None:
    if status != 0:
        raise _STATUS_ERRORS.get(status, RuntimeError)(error.value.decode())


def _launch(entry, named: dict, *extra) -> None:
    data = (ctypes.c_void_p * len(named))(*(t.data_ptr() for t in named.values()))
    error = ctypes.create_string_buffer(_ERROR_BUFFER_BYTES)
    _check(entry(_views(named), data, *extra, error, len(error)), error)


def _plan(entry, named: dict, params_size: int, *extra):
    name = ctypes.create_string_buffer(256)
    grid = (ctypes.c_uint32 * 6)()
    params = ctypes.create_string_buffer(params_size)
    error = ctypes.create_string_buffer(_ERROR_BUFFER_BYTES)
    _check(entry(_views(named), *extra, name, len(name), grid, params, params_size, error, len(error)), error)
    return name.value.decode(), tuple(grid[:3]), tuple(grid[3:]), params.raw


def plan_gated_delta_rule(
    query, key, value, g, beta, initial_state, output, final_state, *, scale, use_qk_l2norm, params_size
):
    """runtime/launch.h's plan: (kernel name, threadgroups, threads per threadgroup, params bytes)."""
    named = {
        "query": query, "key": key, "value": value, "g": g, "beta": beta,
        "initial_state": initial_state, "output": output, "final_state": final_state,
    }
    return _plan(
        library().gdn_plan_gated_delta_rule, named, params_size,
        int(scale is not None), float(scale or 0.0), int(use_qk_l2norm),
    )


def plan_fused_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, output, *, scale, params_size):
    """runtime/launch.h's plan of a fused call, as ``plan_gated_delta_rule``."""
    named = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "state": state, "output": output}
    return _plan(
        library().gdn_plan_fused_gated_delta_rule, named, params_size, int(scale is not None), float(scale or 0.0)
    )


def gated_delta_rule_out(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state
):
    """``gdn.gated_delta_rule.out`` through the emulated Metal kernel (final_state may be initial_state)."""
    named = {
        "query": query, "key": key, "value": value, "g": g, "beta": beta,
        "initial_state": initial_state, "output": output, "final_state": final_state,
    }
    _launch(
        library().gdn_emulate_gated_delta_rule, named,
        int(scale is not None), float(scale or 0.0), int(use_qk_l2norm),
    )
    return output, final_state


def gated_delta_rule(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
    output = torch.empty(value.shape, dtype=value.dtype)
    final_state = torch.empty(initial_state.shape, dtype=torch.float32)
    return gated_delta_rule_out(
        query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
        output=output, final_state=final_state,
    )


def gated_delta_rule_inplace_out(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output):
    gated_delta_rule_out(
        query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm,
        output=output, final_state=state,
    )
    return output


def fused_gated_delta_rule_out(mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
    """``gdn.fused_gated_delta_rule.out`` through the emulated Metal kernel; ``state`` is updated in place."""
    named = {
        "mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias,
        "state": state, "output": output,
    }
    _launch(library().gdn_emulate_fused_gated_delta_rule, named, int(scale is not None), float(scale or 0.0))
    return output
