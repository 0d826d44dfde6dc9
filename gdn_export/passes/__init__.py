"""Graph rewrites applied before export: ``rewrite(model, backend)``."""

from gdn_export.passes.recurrence import (
    CachedAttentionOp,
    ConvOpGatedDeltaNet,
    FusedOpRecurrence,
    InplaceOpRecurrence,
    give_layers_the_conv_op,
    rewrite,
)

__all__ = ["CachedAttentionOp", "ConvOpGatedDeltaNet", "FusedOpRecurrence", "InplaceOpRecurrence",
           "give_layers_the_conv_op", "rewrite"]
