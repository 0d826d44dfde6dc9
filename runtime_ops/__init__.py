"""The gdn ops' C++ CPU kernel, for eager PyTorch and inside ExecuTorch programs.

``python -m runtime_ops.build`` compiles it; ``runtime_ops.loader.load()``
(called by ``import gdn_export``) loads it.
"""
