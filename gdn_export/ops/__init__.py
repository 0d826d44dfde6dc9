"""The ``gdn::gated_delta_rule`` op: contract, reference and loaded kernels.

Importing this package defines ``torch.ops.gdn.gated_delta_rule`` (and
``.out``) with the pure-PyTorch reference as its default implementation.
"""

import warnings

from gdn_export.ops import attention, contract, fused, reference
from gdn_export.ops.reference import chunked_gated_delta_rule, recurrent_gated_delta_rule
from runtime_ops import loader as _runtime_ops_loader

__all__ = [
    "attention", "contract", "fused", "reference", "chunked_gated_delta_rule", "recurrent_gated_delta_rule",
    "runtime_ops_available",
]

# The C++ CPU kernels (runtime_ops/) register for the CPU key once loaded; without
# them the pure-PyTorch reference keeps serving every call.
try:
    _runtime_ops_loader.load()
    _RUNTIME_OPS_ERROR = None
except _runtime_ops_loader.RuntimeOpsUnavailable as error:
    _RUNTIME_OPS_ERROR = error
    warnings.warn(f"{error}; using the pure-PyTorch reference on CPU", RuntimeWarning, stacklevel=2)


def runtime_ops_available() -> bool:
    """Whether the C++ kernels are loaded (else the reference runs on CPU)."""
    return _RUNTIME_OPS_ERROR is None
