"""Graph rewrites applied before export: ``rewrite(model, backend)``."""

from gdn_export.passes.recurrence import (
    RECURRENCES,
    FusedOpRecurrence,
    InplaceOpRecurrence,
    register_recurrence,
    rewrite,
)

__all__ = ["RECURRENCES", "FusedOpRecurrence", "InplaceOpRecurrence", "register_recurrence", "rewrite"]
