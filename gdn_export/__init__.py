"""gdn-export: Qwen3.5 (Gated DeltaNet + gated attention) to ExecuTorch programs.

Importing the package defines the ``gdn`` ops (``torch.ops.gdn.*``) and loads
the CPU kernels of the packages registered under the ``gdn_export.kernels``
entry point (runtime_ops' C++ kernels, when built), so ExecuTorch programs
that call them run. Backends (``gdn_export.backends``) are imported only when
asked for by name. The public entry points are imported on first use so that
``import gdn_export`` stays light.
"""

from gdn_export import ops
from gdn_export.backends import load_kernels

load_kernels()

_PUBLIC = {
    "load_qwen35": "gdn_export.loading",
    "rewrite": "gdn_export.passes",
    "export_qwen35": "gdn_export.export",
}

__all__ = ["ops", *_PUBLIC]


def __getattr__(name):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'gdn_export' has no attribute {name!r}")
