"""Graph rewrites applied before export: ``rewrite(model, backend)``."""

from gdn_export.passes.recurrence import (
    CachedAttentionOp,
    ConvOpGatedDeltaNet,
    FusedOpRecurrence,
    GatedAttentionOp,
    GatedRMSNormOp,
    InplaceOpRecurrence,
    give_attention_layers_the_op,
    give_gated_norms_the_op,
    give_layers_the_conv_op,
    keep_recurrent_states_in,
    rewrite,
)

__all__ = ["CachedAttentionOp", "ConvOpGatedDeltaNet", "FusedOpRecurrence", "GatedAttentionOp", "GatedRMSNormOp", "InplaceOpRecurrence",
           "give_attention_layers_the_op", "give_gated_norms_the_op", "give_layers_the_conv_op",
           "keep_recurrent_states_in", "rewrite"]
