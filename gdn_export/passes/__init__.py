"""Graph rewrites applied before export: ``rewrite(model, backend)``."""

from gdn_export.passes.recurrence import CachedAttentionOp, FusedOpRecurrence, InplaceOpRecurrence, rewrite

__all__ = ["CachedAttentionOp", "FusedOpRecurrence", "InplaceOpRecurrence", "rewrite"]
