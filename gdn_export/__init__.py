"""gdn-export: Qwen3.5 (Gated DeltaNet + gated attention) to ExecuTorch programs."""

from gdn_export import ops

__all__ = ["ops"]
