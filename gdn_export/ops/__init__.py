"""The ``gdn::gated_delta_rule`` op: contract, reference and loaded kernels.

Importing this package defines ``torch.ops.gdn.gated_delta_rule`` (and
``.out``) with the pure-PyTorch reference as its default implementation.
"""

from gdn_export.ops import contract, fused, reference
from gdn_export.ops.reference import chunked_gated_delta_rule, recurrent_gated_delta_rule

__all__ = ["contract", "fused", "reference", "chunked_gated_delta_rule", "recurrent_gated_delta_rule"]
