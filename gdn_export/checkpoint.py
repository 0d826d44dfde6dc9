"""Read and validate a Hugging Face Qwen3.5 checkpoint folder, once.

``read_checkpoint(folder)`` checks config.json (text-only or the
vision-language wrapper, dense or MoE, a supported architecture), takes the
token ids from generation_config.json when it has them, and finds which
safetensors file holds each tensor; it reads no weights. Every problem is a
``CheckpointError`` naming the file and the field or tensor. The export
checks a checkpoint with it before anything is loaded or written, the loader
(``gdn_export.loading``) reads the weights it located, and the program's
metadata comes from its config.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gdn_export.models.qwen35 import Qwen35Config

SUPPORTED_ARCHITECTURES = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message names the file and the field or tensor."""


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint folder: its text-model config and where each tensor is."""

    folder: Path
    config: Qwen35Config  # with bos/eos ids from generation_config.json where it has them
    weight_files: dict  # checkpoint tensor name -> the safetensors file that holds it

    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def tokenizer_file(self) -> Optional[Path]:
        path = self.folder / TOKENIZER_FILE
        return path if path.is_file() else None

    def program_metadata(self, *, max_seq_len: int, prefill_chunk: int) -> dict:
        """The constant methods ExecuTorch's LLM runners read from a program of this model."""
        metadata = {
            "get_max_seq_len": prefill_chunk,
            "get_max_context_len": max_seq_len,
            "get_vocab_size": self.config.vocab_size,
            "get_n_layers": self.config.num_hidden_layers,
            "use_kv_cache": True,
            "use_sdpa_with_kv_cache": False,
            "enable_dynamic_shape": True,
            "get_eos_ids": list(self.config.eos_token_ids),
        }
        if self.config.bos_token_id is not None:
            metadata["get_bos_id"] = self.config.bos_token_id
        return metadata


def _read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _token_ids(generation_config: dict, config: Qwen35Config, path: Path) -> Qwen35Config:
    """``config`` with the bos/eos ids of generation_config.json where it sets them (what ``generate`` uses)."""
    changes = {}
    bos, eos = generation_config.get("bos_token_id"), generation_config.get("eos_token_id")
    if bos is not None:
        if not isinstance(bos, int):
            raise CheckpointError(f"{path}: bos_token_id must be an integer, got {bos!r}")
        changes["bos_token_id"] = bos
    if eos is not None:
        eos_ids = [eos] if isinstance(eos, int) else eos
        if not isinstance(eos_ids, list) or not all(isinstance(i, int) for i in eos_ids):
            raise CheckpointError(f"{path}: eos_token_id must be an integer or a list of integers, got {eos!r}")
        changes["eos_token_ids"] = tuple(eos_ids)
    return dataclasses.replace(config, **changes)


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (from the index, else each file's header)."""
    index_file = folder / WEIGHTS_INDEX_FILE
    if index_file.is_file():
        index = _read_json_object(index_file)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_file}: not a valid safetensors index (no 'weight_map' object)")
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: missing weights (no model.safetensors or {WEIGHTS_INDEX_FILE} in the folder)")
    from safetensors import safe_open

    located = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                located.update({name: file for name in handle.keys()})
        except Exception as error:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{file}: corrupt or unreadable safetensors file ({error})") from error
    return located


def read_checkpoint(path) -> Checkpoint:
    """The validated checkpoint at ``path``; raises CheckpointError naming what is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist or is not a folder")
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing config.json in the checkpoint folder")
    raw = _read_json_object(config_file)
    unknown = [name for name in raw.get("architectures") or [] if name not in SUPPORTED_ARCHITECTURES]
    if unknown:
        raise CheckpointError(
            f"{config_file}: unsupported architecture {unknown[0]!r}; expected one of {list(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        config = Qwen35Config.from_hf(raw)
    except KeyError as error:
        raise CheckpointError(f"{config_file}: missing field {error.args[0]!r}") from None
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{config_file}: {error}") from None
    generation_config_file = folder / GENERATION_CONFIG_FILE
    if generation_config_file.is_file():
        config = _token_ids(_read_json_object(generation_config_file), config, generation_config_file)
    return Checkpoint(folder=folder, config=config, weight_files=_weight_files(folder))
