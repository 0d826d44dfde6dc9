"""The Metal kernels run on the CPU: the Linux check of ``metal_backend``.

``emulation/emulated_kernels.cpp`` compiles the unchanged
``kernels/gated_delta_rule.metal`` as C++ (``emulation/include/metal_stdlib`` is
the compatibility header) and runs each threadgroup's threads as fibers in
lockstep, so ``simd_sum`` behaves as on the GPU. Launches are planned by the
host dispatch's own ``runtime/launch.h``. This module builds that library with
the system C++ compiler (once per source change, into ``build/``) and exposes
the ops' entry points on CPU tensors, for the tests.

``KernelLibrary`` is the ctypes side of ``emulation/harness_api.h``'s C API,
which the CUDA port of the same kernels (``metal_backend/device/``) shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCES = (
    PACKAGE_DIR / "emulation" / "emulated_kernels.cpp",
    PACKAGE_DIR / "emulation" / "simd_lockstep.cpp",
)
HEADERS = (
    PACKAGE_DIR / "emulation" / "simd_lockstep.h",
    PACKAGE_DIR / "emulation" / "harness_api.h",
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
# metal_emulation::ExecutionOrder
EXECUTION_ORDERS = {"in_order": 0, "reversed": 1, "shuffled": 2}


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


def build_cached(target_name: str, inputs, command: Callable[[Path], list], what: str) -> Path:
    """``BUILD_DIR/<hash of inputs>/target_name``, built by ``command(output path)`` if absent."""
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(path.read_bytes())
    target = BUILD_DIR / digest.hexdigest()[:16] / target_name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=target.suffix, delete=False) as partial:
            partial_path = Path(partial.name)
        arguments = command(partial_path)
        result = subprocess.run(arguments, capture_output=True, text=True)
        if result.returncode != 0:
            partial_path.unlink(missing_ok=True)
            raise RuntimeError(f"building {what} failed:\n{' '.join(arguments)}\n{result.stderr}")
        partial_path.replace(target)  # atomic: a concurrent build never sees a partial file
    return target


def _build_emulation() -> Path:
    return build_cached(
        "libgdn_metal_emulation.so", SOURCES + HEADERS,
        lambda output: [
            _compiler(), "-std=c++17", "-O2", "-shared", "-fPIC", "-Wall", "-Wno-attributes",
            "-Wno-unused-function", "-I", str(PACKAGE_DIR / "emulation" / "include"),
            *map(str, SOURCES), "-o", str(output),
        ],
        "the Metal emulation",
    )


def declare_c_api(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of emulation/harness_api.h's C API."""
    views = ctypes.POINTER(TensorView)
    pointers = ctypes.POINTER(ctypes.c_void_p)
    text, size, grid = ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32)
    lib.gdn_gated_delta_rule.argtypes = [views, pointers, ctypes.c_int, ctypes.c_double, ctypes.c_int, text, size]
    lib.gdn_fused_gated_delta_rule.argtypes = [views, pointers, ctypes.c_int, ctypes.c_double, text, size]
    lib.gdn_kernel_names.argtypes = [text, size]
    lib.gdn_plan_gated_delta_rule.argtypes = [
        views, pointers, ctypes.c_int, ctypes.c_double, ctypes.c_int, text, size, grid, ctypes.c_void_p, size, text,
        size,
    ]
    lib.gdn_plan_fused_gated_delta_rule.argtypes = [
        views, ctypes.c_int, ctypes.c_double, text, size, grid, ctypes.c_void_p, size, text, size,
    ]
    return lib


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The emulation library, compiled on first use and cached by source hash."""
    lib = declare_c_api(ctypes.CDLL(str(_build_emulation())))
    lib.gdn_set_execution_order.argtypes = [ctypes.c_int, ctypes.c_uint64]
    return lib


@contextlib.contextmanager
def execution_order(order: str, seed: int = 0):
    """Run the emulator's threadgroups, and each round the threads of a threadgroup, in
    ``order`` ("in_order", "reversed" or "shuffled" by ``seed``) inside the block."""
    library().gdn_set_execution_order(EXECUTION_ORDERS[order], seed)
    try:
        yield
    finally:
        library().gdn_set_execution_order(EXECUTION_ORDERS["in_order"], 0)


def _check(status: int, error) -> None:
    if status != 0:
        raise _STATUS_ERRORS.get(status, RuntimeError)(error.value.decode())


class KernelLibrary:
    """The ops' entry points through a harness library of emulation/harness_api.h's C API,
    on tensors of ``device`` (the emulation: "cpu"; the CUDA port: "cuda")."""

    def __init__(self, load: Callable[[], ctypes.CDLL], device: str, name: str):
        self._load = load
        self.device = device
        self.name = name

    def implementation(self, **options):
        """The library as a conformance-suite implementation (gdn_export.ops.conformance), with ``options``.

        Cases of head dims the kernels do not take are unsupported: they must raise before writing.
        """
        from gdn_export.ops.conformance import Implementation, unsupported_head_dims
        from metal_backend.mps_eager import SUPPORTED_HEAD_DIMS

        return Implementation(
            name=f"metal-{self.name}", functional=self.gated_delta_rule, out=self.gated_delta_rule_out,
            inplace=self.gated_delta_rule_inplace_out, device=self.device, fused=self.fused_gated_delta_rule_out,
            unsupported=unsupported_head_dims(SUPPORTED_HEAD_DIMS, "the Metal kernels"), **options,
        )

    def kernel_names(self) -> set[str]:
        """Host names of every kernel instantiation the library holds."""
        buffer = ctypes.create_string_buffer(1 << 16)
        if self._load().gdn_kernel_names(buffer, len(buffer)) != 0:
            raise RuntimeError("kernel name list does not fit the buffer")
        return set(buffer.value.decode().split())

    def _view(self, name: str, tensor: torch.Tensor) -> TensorView:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn metal {self.name}: {name} must be a Tensor, got {type(tensor).__name__}")
        if tensor.device.type != self.device:
            raise RuntimeError(f"gdn metal {self.name}: {name} must be on {self.device}, got {tensor.device}")
        if tensor.dim() > 4:
            raise ValueError(f"gdn metal {self.name}: {name} has {tensor.dim()} dims, at most 4 expected")
        view = TensorView(name.encode(), SCALAR_TYPE_CODES.get(tensor.dtype, -1), tensor.dim())
        for d in range(tensor.dim()):
            view.sizes[d] = tensor.shape[d]
            view.strides[d] = tensor.stride(d)
        return view

    def _views(self, named: dict):
        return (TensorView * len(named))(*(self._view(name, t) for name, t in named.items()))

    @staticmethod
    def _pointers(named: dict):
        return (ctypes.c_void_p * len(named))(*(t.data_ptr() for t in named.values()))

    def call(self, entry: str, named: dict, *extra) -> None:
        """Calls C entry ``entry``(views, data pointers, *extra, error buffer, its size) on ``named`` tensors."""
        error = ctypes.create_string_buffer(_ERROR_BUFFER_BYTES)
        status = getattr(self._load(), entry)(self._views(named), self._pointers(named), *extra, error, len(error))
        _check(status, error)

    def _plan(self, entry: str, leading: tuple, params_size: int, *extra):
        name = ctypes.create_string_buffer(256)
        grid = (ctypes.c_uint32 * 6)()
        params = ctypes.create_string_buffer(params_size)
        error = ctypes.create_string_buffer(_ERROR_BUFFER_BYTES)
        status = getattr(self._load(), entry)(*leading, *extra, name, len(name), grid, params, params_size, error,
                                               len(error))
        _check(status, error)
        return name.value.decode(), tuple(grid[:3]), tuple(grid[3:]), params.raw

    def plan_gated_delta_rule(
        self, query, key, value, g, beta, initial_state, output, final_state, *, scale, use_qk_l2norm, params_size
    ):
        """runtime/launch.h's plan: (kernel name, threadgroups, threads per threadgroup, params bytes)."""
        named = {
            "query": query, "key": key, "value": value, "g": g, "beta": beta,
            "initial_state": initial_state, "output": output, "final_state": final_state,
        }
        return self._plan(
            "gdn_plan_gated_delta_rule", (self._views(named), self._pointers(named)), params_size,
            int(scale is not None), float(scale or 0.0), int(use_qk_l2norm),
        )

    def plan_fused_gated_delta_rule(self, mixed_qkv, a, b, A_log, dt_bias, state, output, *, scale, params_size):
        """runtime/launch.h's plan of a fused call, as ``plan_gated_delta_rule``."""
        named = {
            "mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "state": state,
            "output": output,
        }
        return self._plan(
            "gdn_plan_fused_gated_delta_rule", (self._views(named),), params_size,
            int(scale is not None), float(scale or 0.0),
        )

    def gated_delta_rule_out(
        self, query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state
    ):
        """``gdn.gated_delta_rule.out`` through the kernel (final_state may be initial_state)."""
        named = {
            "query": query, "key": key, "value": value, "g": g, "beta": beta,
            "initial_state": initial_state, "output": output, "final_state": final_state,
        }
        self.call("gdn_gated_delta_rule", named, int(scale is not None), float(scale or 0.0), int(use_qk_l2norm))
        return output, final_state

    def gated_delta_rule(self, query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
        output = torch.empty(value.shape, dtype=value.dtype, device=value.device)
        final_state = torch.empty(initial_state.shape, dtype=torch.float32, device=initial_state.device)
        return self.gated_delta_rule_out(
            query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
            output=output, final_state=final_state,
        )

    def gated_delta_rule_inplace_out(
        self, query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output
    ):
        self.gated_delta_rule_out(
            query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm,
            output=output, final_state=state,
        )
        return output

    def fused_gated_delta_rule_out(self, mixed_qkv, a, b, A_log, dt_bias, state, *, scale=None, output):
        """``gdn.fused_gated_delta_rule.out`` through the kernel; ``state`` is updated in place."""
        named = {
            "mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias,
            "state": state, "output": output,
        }
        self.call("gdn_fused_gated_delta_rule", named, int(scale is not None), float(scale or 0.0))
        return output


EMULATION = KernelLibrary(library, "cpu", "emulation")
kernel_names = EMULATION.kernel_names
plan_gated_delta_rule = EMULATION.plan_gated_delta_rule
plan_fused_gated_delta_rule = EMULATION.plan_fused_gated_delta_rule
gated_delta_rule_out = EMULATION.gated_delta_rule_out
gated_delta_rule = EMULATION.gated_delta_rule
gated_delta_rule_inplace_out = EMULATION.gated_delta_rule_inplace_out
fused_gated_delta_rule_out = EMULATION.fused_gated_delta_rule_out
