"""The ``gdn`` ops: contract, reference and the conformance case table.

Importing this package defines ``torch.ops.gdn.gated_delta_rule`` (and its
``.out``, in-place and fused forms), ``torch.ops.gdn.cached_attention`` and the
two-plane token table's ``planes_embedding`` and ``planes_logits``, ``grouped_int8_linear`` (int8 weights with
a scale per group of 32) and ``grouped_int4_linear`` (4-bit weights, the same), each with its pure-PyTorch reference as the default implementation; backends
register faster kernels for them. ``fit_int4_scales`` is the export's own (8da4w's search for 4-bit scales),
an op so that it runs in C++. ``conv_gated_delta_rule`` is a Gated DeltaNet layer from its projections to its
recurrence's output (the causal conv and its state, the gates, the recurrence), one call in the CPU programs,
and ``gated_rms_norm`` the norm that follows it; ``gated_attention`` is a full-attention layer between its
projections (norms, rotations, cache writes, attention, gate).
"""

from gdn_export.ops import (attention, contract, conv_recurrence, fused, gated_attention, gated_rms_norm, grouped_int4_linear,
                           grouped_int8_linear, int4_scales, reference, vocabulary_planes)
from gdn_export.ops.reference import chunked_gated_delta_rule, recurrent_gated_delta_rule

__all__ = [
    "attention", "contract", "conv_recurrence", "fused", "gated_attention", "gated_rms_norm", "grouped_int4_linear", "grouped_int8_linear", "int4_scales", "reference",
    "vocabulary_planes",
    "chunked_gated_delta_rule", "recurrent_gated_delta_rule",
]
