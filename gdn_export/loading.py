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
from typing import Callable, Optional

import torch
from torch import nn

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
    """Yield (our name, tensor in ``dtype``, origin) for every text-model tensor, one at a time; experts stacked.

    Tensors are read from the memory-mapped files one by one, so a caller that
    consumes each before asking for the next never holds every weight in
    memory. Each tensor is read through a mapping of its own, closed once it is
    converted: the pages read stay resident as long as their mapping lives, so
    one mapping per file would keep the whole file in the resident set (all 8
    GB of a bf16 4B checkpoint) until its last tensor. Per-expert MoE weights
    are held until the end, then stacked.
    ``origin`` names the file and checkpoint name, for errors.
    """
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, file in weight_files.items():
        by_file.setdefault(file, []).append(name)
    per_expert: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    expert_origins: dict[str, str] = {}
    skipped: dict[str, int] = {}
    for file, names in by_file.items():
        if not file.is_file():
            raise CheckpointError(f"{file}: missing weight file (listed for tensor {names[0]!r})")
        try:
            for name in names:
                ours = _text_model_name(name)
                if ours is None:
                    what = next(v for p, v in _SKIPPED_PREFIXES.items() if name.startswith(p))
                    skipped[what] = skipped.get(what, 0) + 1
                    continue
                reading = "its header"
                with safe_open(file, framework="pt") as handle:
                    reading = f"tensor {name!r}"
                    tensor = handle.get_tensor(name)
                    if not tensor.is_floating_point():
                        raise CheckpointError(f"{file}: tensor {name!r} has dtype {tensor.dtype}, expected a float")
                    # A copy (clone where the dtype already matches), so nothing refers to the mapping after it closes.
                    tensor = tensor.to(dtype, copy=True)
                origin = f"{file}: tensor {name!r}"
                expert = _PER_EXPERT.match(ours)
                if expert:
                    module, index, projection = expert.groups()
                    per_expert.setdefault(module, {}).setdefault(int(index), {})[projection] = tensor
                    expert_origins[module] = origin
                    continue
                yield ours, tensor, origin
                del tensor
        except CheckpointError:
            raise
        except Exception as error:  # corrupt header or data: name the file and the tensor being read
            raise CheckpointError(
                f"{file}: corrupt or unreadable safetensors file while reading {reading} ({error})"
            ) from error
    for what, count in skipped.items():
        logger.info("ignoring %d %s tensors: gdn_export loads the text model only", count, what)
    for module in list(per_expert):  # pop as we go: one layer's experts are held twice at most
        for stacked, tensor in _stack_experts(module, per_expert.pop(module)).items():
            yield stacked, tensor, expert_origins[module]


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


def load_model(
    checkpoint: Checkpoint,
    *,
    dtype: torch.dtype,
    max_seq_len: int,
    transform: Optional[Callable[[str, nn.Module], nn.Module]] = None,
) -> Qwen35ForCausalLM:
    """``load_qwen35`` of a checkpoint already read by ``gdn_export.checkpoint.read_checkpoint``.

    ``transform(name, module)`` (the export's quantizer; ``name`` is the module's in
    the model) is applied to each module as soon as its last weight is read and
    returns the module to keep in its place;
    the float weights it replaces are then dropped, so at most one layer's worth
    of them is in memory at a time.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    folder, config, config_file = checkpoint.folder, checkpoint.config, checkpoint.config_file
    tensors = _read_tensors(checkpoint.weight_files, dtype)  # a generator: nothing is read before the loop below
    with torch.device("meta"):
        model = Qwen35ForCausalLM(config, max_seq_len=max_seq_len, dtype=dtype)
    expected = {name: tensor.shape for name, tensor in model.state_dict().items()}
    # A tied checkpoint's embedding is also the output head; a stored copy of the head is ignored.
    tied = {"embed_tokens.weight": "lm_head.weight"} if config.tie_word_embeddings else {}
    unread = {module_name: {name for name, _ in module.named_parameters(recurse=False)}
              for module_name, module in model.named_modules()}
    loaded: set[str] = set()
    for name, tensor, origin in tensors:
        if name in tied.values():
            continue
        if name not in expected:
            raise CheckpointError(
                f"{origin} is not a parameter of the Qwen3.5 text model that {config_file} describes (as {name!r})"
            )
        if tensor.shape != expected[name]:
            raise CheckpointError(f"{origin} has shape {list(tensor.shape)}, expected {list(expected[name])} from {config_file}")
        weight = nn.Parameter(tensor, requires_grad=False)
        for target in (name, tied.get(name)):
            if target is None:
                continue
            module_name, _, leaf = target.rpartition(".")
            model.get_submodule(module_name)._parameters[leaf] = weight
            loaded.add(target)
            unread[module_name].discard(leaf)
            if not unread[module_name] and transform is not None:
                _replace_module(model, module_name, transform(module_name, model.get_submodule(module_name)))
        del tensor, weight
    missing = sorted(set(expected) - loaded)
    if missing:
        raise CheckpointError(
            f"{folder}: missing tensor {missing[0]!r} (HF name model.language_model.{missing[0]} or "
            f"model.{missing[0]}){f' and {len(missing) - 1} more' if len(missing) > 1 else ''}"
        )
    # Every buffer is a cache or state, which starts at zero.
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device.type == "meta":
                module._buffers[name] = torch.zeros_like(buffer, device="cpu")
    # An inference model: no autograd, which also lets export lower the cache updates in place.
    return model.requires_grad_(False).eval()


def _replace_module(model: nn.Module, name: str, replacement: nn.Module) -> None:
    if replacement is not model.get_submodule(name):
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, replacement)
