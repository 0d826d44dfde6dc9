"""The gdn ops' C++ CPU kernel, for eager PyTorch and inside ExecuTorch programs.

``python -m runtime_ops.build`` compiles it; ``runtime_ops.loader.load()``
(called by ``import gdn_export``) loads it.
"""

# Submodules, imported on use: importing the loader here would import build too,
# and `python -m runtime_ops.build` would then run a second copy of it.
__all__ = ["build", "loader"]
