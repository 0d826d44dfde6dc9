"""Graph rewrites applied before export: ``rewrite(model, backend)``."""

from gdn_export.passes.recurrence import (
    CachedAttentionOp,
    ConvOpGatedDeltaNet,
    FusedOpRecurrence,
    GatedRMSNormOp,
    InplaceOpRecurrence,
    give_gated_norms_the_op,
    give_layers_the_conv_op,
    rewrite,
)

__all__ = ["CachedAttentionOp", "ConvOpGatedDeltaNet", "FusedOpRecurrence", "GatedRMSNormOp", "InplaceOpRecurrence",
           "give_gated_norms_the_op", "give_layers_the_conv_op", "rewrite"]
