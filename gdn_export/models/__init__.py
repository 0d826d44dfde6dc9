"""Export-friendly model definitions."""

from gdn_export.models.qwen35 import Qwen35Config, Qwen35ForCausalLM

__all__ = ["Qwen35Config", "Qwen35ForCausalLM"]
