"""The Metal kernels on an NVIDIA GPU: ``cuda_port.cu`` built with nvcc, driven like the emulation.

``CUDA_PORT`` is an ``emulation.KernelLibrary`` over CUDA tensors (the same C
API, launch plans from ``runtime/launch.h``), so the conformance table runs
through it unchanged; ``time_gated_delta_rule`` adds per-call timings. The
library is built once per source change into ``build/metal_emulation/``.

``GDN_CUDA_PORT_KERNEL`` names another ``.metal`` file to build instead (an
earlier revision of the kernels, for relative timings).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from functools import lru_cache
from pathlib import Path

from metal_backend import emulation

DEVICE_DIR = Path(__file__).resolve().parent
SOURCE = DEVICE_DIR / "cuda_port.cu"
PRELUDE = DEVICE_DIR / "include" / "metal_stdlib"
# Hopper (the lent H100/H200); nvcc embeds PTX too, so newer GPUs JIT it.
ARCHITECTURE = os.environ.get("GDN_CUDA_ARCH", "sm_90")


def kernel_source() -> Path:
    return Path(os.environ.get("GDN_CUDA_PORT_KERNEL", emulation.PACKAGE_DIR / "kernels" / "gated_delta_rule.metal"))


def _nvcc() -> str:
    found = os.environ.get("NVCC") or shutil.which("nvcc")
    if found is None:
        raise RuntimeError("the CUDA port needs nvcc (the CUDA toolkit), or set NVCC")
    return found


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    kernel = kernel_source().resolve()
    inputs = (SOURCE, PRELUDE, kernel, *(emulation.PACKAGE_DIR / path for path in (
        "emulation/harness_api.h", "runtime/launch.h", "kernels/gated_delta_rule_params.h")))
    target = emulation.build_cached(
        f"libgdn_metal_cuda_port_{ARCHITECTURE}.so", inputs,
        lambda output: [
            _nvcc(), "-std=c++17", "-O3", f"-gencode=arch=compute_{ARCHITECTURE[3:]},code=[{ARCHITECTURE},"
            f"compute_{ARCHITECTURE[3:]}]", "-shared", "-Xcompiler", "-fPIC",
            "-diag-suppress", "1098",  # the .metal's [[host_name]] on explicit instantiations
            "-I", str(DEVICE_DIR / "include"), "-I", str(emulation.PACKAGE_DIR / "kernels"),
            f'-DGDN_KERNEL_SOURCE="{kernel}"', str(SOURCE), "-o", str(output),
        ],
        "the CUDA port of the Metal kernels",
    )
    lib = emulation.declare_c_api(ctypes.CDLL(str(target)))
    lib.gdn_time_gated_delta_rule.argtypes = [
        ctypes.POINTER(emulation.TensorView), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_double,
        ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_size_t,
    ]
    return lib


CUDA_PORT = emulation.KernelLibrary(library, "cuda", "cuda-port")


def time_gated_delta_rule(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state,
    iterations: int = 200,
) -> float:
    """Microseconds per ``gated_delta_rule.out`` kernel, launched back to back (CUDA events)."""
    named = {
        "query": query, "key": key, "value": value, "g": g, "beta": beta,
        "initial_state": initial_state, "output": output, "final_state": final_state,
    }
    microseconds = ctypes.c_double()
    CUDA_PORT.call("gdn_time_gated_delta_rule", named, int(scale is not None), float(scale or 0.0),
                      int(use_qk_l2norm), iterations, ctypes.byref(microseconds))
    return microseconds.value
