"""Loads the gdn ops' C++ CPU kernels into this process.

Two libraries built from one core: ``libgdn_runtime_ops.so`` registers the
ExecuTorch kernels (static registration into libexecutorch.so's operator
registry; opened with RTLD_GLOBAL before any program runs) and its sibling
``libgdn_runtime_ops_aten.so`` the ATen CPU kernels of the ``gdn`` ops (through
``torch.ops.load_library``). They are looked up where ``python -m
runtime_ops.build`` puts them (``build/runtime_ops/lib/``), or at ``$GDN_RUNTIME_OPS_LIB`` (the
ExecuTorch library; the ATen one sits next to it). ``import gdn_export`` calls
``load`` through its ``gdn_export.kernels`` entry point.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from runtime_ops.build import ATEN_LIBRARY_NAME, INSTALLED_LIBRARY

ENV_VAR = "GDN_RUNTIME_OPS_LIB"
REBUILD_HINT = "build it with `make install` or `.venv/bin/python -m runtime_ops.build`"


class RuntimeOpsUnavailable(RuntimeError):
    """The C++ kernel library is missing or cannot be loaded."""


_loaded: Path | None = None


def is_loaded() -> bool:
    """Whether the C++ kernels are loaded (else the pure-PyTorch reference runs the gdn ops on CPU)."""
    return _loaded is not None


def library_path() -> Path:
    """``$GDN_RUNTIME_OPS_LIB`` when set, else the library inside the installed package."""
    override = os.environ.get(ENV_VAR)
    return Path(override) if override else INSTALLED_LIBRARY


def load() -> Path:
    """Load both libraries once; raises RuntimeOpsUnavailable naming the path tried."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = library_path()
    aten_path = path.with_name(ATEN_LIBRARY_NAME)
    source = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the installed package"
    for candidate in (path, aten_path):
        if not candidate.is_file():
            raise RuntimeOpsUnavailable(f"gdn runtime ops: no library at {candidate} (from {source}); {REBUILD_HINT}")
    import torch

    for candidate, load_one in (
        (path, lambda: ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)),
        (aten_path, lambda: torch.ops.load_library(str(aten_path))),
    ):
        try:
            load_one()
        except OSError as error:
            raise RuntimeOpsUnavailable(
                f"gdn runtime ops: cannot load {candidate} (from {source}): {error}; {REBUILD_HINT}"
            ) from error
    _loaded = path
    return path
