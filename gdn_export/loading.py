"""Load a Hugging Face Qwen3.5 checkpoint folder into ``Qwen35ForCausalLM``.

``gdn_export.checkpoint`` reads and validates the folder (config.json, and
where each tensor is); this module reads the safetensors weights. The model is built on the meta device and
each tensor is read once, memory-mapped, straight into its parameter, so the
weights are never held twice. Weights of the vision tower (``model.visual.``)
and of the multi-token-prediction head (``mtp.``) are not part of the text
model and are skipped with a note.

Accepted weight names (what released checkpoints and transformers'
``save_pretrained`` write): ``model.language_model.X`` (wrapper) or
``model.X`` (text-only), ``lm_head.weight`` at top level, and MoE experts
either stacked (``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj``
[E, H, I]) or per expert (``mlp.experts.N.{gate,up,down}_proj.weight``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from gdn_export.checkpoint import Checkpoint, CheckpointError, read_checkpoint
from gdn_export.models.qwen35 import Qwen35ForCausalLM

logger = logging.getLogger(__name__)

_TEXT_PREFIXES = ("model.language_model.", "model.")
_SKIPPED_PREFIXES = {"model.visual.": "vision tower", "visual.": "vision tower", "mtp.": "multi-token prediction"}
_PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _text_model_name(name: str) -> str | None:
    """The parameter name in Qwen35ForCausalLM, or None for weights outside the text model."""
    for prefix in _SKIPPED_PREFIXES:
        if name.startswith(prefix):
            return None
    if name == "lm_head.weight":
        return name
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _read_tensors(weight_files: dict[str, Path], dtype: torch.dtype):
    """Every text-model tensor, renamed to our parameter names, in ``dtype``; experts stacked.

    Returns (tensors, origins): origins names each tensor's file and checkpoint name, for errors.
    """
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, file in weight_files.items():
        by_file.setdefault(file, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    origins: dict[str, str] = {}
    per_expert: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    skipped: dict[str, int] = {}
    for file, names in by_file.items():
        if not file.is_file():
            raise CheckpointError(f"{file}: missing weight file (listed for tensor {names[0]!r})")
        reading = "its header"
        try:
            with safe_open(file, framework="pt") as handle:
                for name in names:
                    reading = f"tensor {name!r}"
                    ours = _text_model_name(name)
                    if ours is None:
                        what = next(v for p, v in _SKIPPED_PREFIXES.items() if name.startswith(p))
                        skipped[what] = skipped.get(what, 0) + 1
                        continue
                    tensor = handle.get_tensor(name)
                    if not tensor.is_floating_point():
                        raise CheckpointError(f"{file}: tensor {name!r} has dtype {tensor.dtype}, expected a float")
                    tensor = tensor.to(dtype)
                    expert = _PER_EXPERT.match(ours)
                    if expert:
                        module, index, projection = expert.groups()
                        per_expert.setdefault(module, {}).setdefault(int(index), {})[projection] = tensor
                        for stacked in ("gate_up_proj", "down_proj"):
                            origins[f"{module}.{stacked}"] = f"{file}: tensor {name!r}"
                    else:
                        tensors[ours] = tensor
                        origins[ours] = f"{file}: tensor {name!r}"
        except CheckpointError:
            raise
        except Exception as error:  # corrupt header or data: name the file and the tensor being read
            raise CheckpointError(
                f"{file}: corrupt or unreadable safetensors file while reading {reading} ({error})"
            ) from error
    for what, count in skipped.items():
        logger.info("ignoring %d %s tensors: gdn_export loads the text model only", count, what)
    for module in list(per_expert):  # pop as we go: one layer's experts are held twice at most
        tensors.update(_stack_experts(module, per_expert.pop(module)))
    return tensors, origins


def _stack_experts(module: str, experts: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-expert gate/up/down weights -> transformers' stacked gate_up_proj and down_proj."""
    count = max(experts) + 1
    for index in range(count):
        for projection in ("gate_proj", "up_proj", "down_proj"):
            if projection not in experts.get(index, {}):
                raise CheckpointError(f"missing tensor {module}.{index}.{projection}.weight in the checkpoint")
    gate_up = torch.stack([torch.cat([experts[i]["gate_proj"], experts[i]["up_proj"]]) for i in range(count)])
    down = torch.stack([experts[i]["down_proj"] for i in range(count)])
    return {f"{module}.gate_up_proj": gate_up, f"{module}.down_proj": down}


def load_qwen35(path, *, dtype: torch.dtype = torch.float32, max_seq_len: int = 2048) -> Qwen35ForCausalLM:
    """The Qwen3.5 text model of a Hugging Face checkpoint folder, in eval mode with zeroed caches."""
    return load_model(read_checkpoint(path), dtype=dtype, max_seq_len=max_seq_len)


def load_model(checkpoint: Checkpoint, *, dtype: torch.dtype, max_seq_len: int) -> Qwen35ForCausalLM:
    """``load_qwen35`` of a checkpoint already read by ``gdn_export.checkpoint.read_checkpoint``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    folder, config, config_file = checkpoint.folder, checkpoint.config, checkpoint.config_file
    tensors, origins = _read_tensors(checkpoint.weight_files, dtype)
    with torch.device("meta"):
        model = Qwen35ForCausalLM(config, max_seq_len=max_seq_len, dtype=dtype)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
        if "embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["embed_tokens.weight"]
            origins["lm_head.weight"] = origins["embed_tokens.weight"]
    expected = model.state_dict()
    for name, tensor in tensors.items():
        if name not in expected:
            raise CheckpointError(
                f"{origins[name]} is not a parameter of the Qwen3.5 text model that "
                f"{config_file} describes (as {name!r})"
            )
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{origins[name]} has shape {list(tensor.shape)}, expected "
                f"{list(expected[name].shape)} from {config_file}"
            )
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(
            f"{folder}: missing tensor {missing[0]!r} (HF name model.language_model.{missing[0]} or "
            f"model.{missing[0]}){f' and {len(missing) - 1} more' if len(missing) > 1 else ''}"
        )
    model.load_state_dict(tensors, assign=True, strict=True)
    model.tie_weights()
    # Every buffer is a cache or state, which starts at zero.
    for module in model.modules():
        for name, buffer in module._buffers.items():
            module._buffers[name] = torch.zeros_like(buffer, device="cpu")
    # An inference model: no autograd, which also lets export lower the cache updates in place.
    return model.requires_grad_(False).eval()
