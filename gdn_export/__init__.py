"""gdn-export: Qwen3.5 (Gated DeltaNet + gated attention) to ExecuTorch programs.

Importing the package defines the ``gdn`` ops (``torch.ops.gdn.*``) and loads
the C++ CPU kernels when they are built. The public entry points are imported
on first use so that ``import gdn_export`` stays light.
"""

from gdn_export import ops

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
