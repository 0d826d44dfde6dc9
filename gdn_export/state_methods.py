"""The methods that read and write a program's decoding state, beside ``forward``.

A Qwen3.5 conversation's state is every Gated DeltaNet layer's ``conv_state``
and ``recurrent_state`` and every attention layer's ``k_cache`` and
``v_cache`` (``Qwen35ForCausalLM.state_buffers``); the position is the
caller's. A program that snapshots its state has:

* ``get_state(positions [L]) -> (tensor, ...)``: the state's tensors in
  ``get_state_names`` order, the caches at ``positions`` only (a runner passes
  ``0 .. position - 1``: what is live);
* ``set_state(positions [L], tensor, ...) -> ()``: the same tensors put back;
* constant methods ``get_state_names`` (the buffers' names),
  ``get_state_position_dims`` (each tensor's position dim, -1 for none) and
  ``get_state_fingerprint`` (``program_fingerprint``).

Both methods are exported from the model itself, so their buffers have the
names ``forward``'s have, and the lowering shares them across methods
(``lower_programs(share_mutable_buffers=True)``): ExecuTorch's memory planning
then places each buffer once, in an arena of its own at the same offset in
every method, and names it in the program. ExecuTorch's Python runtime gives
all CPU methods of a program one set of arenas, so ``get_state`` reads what
``forward`` wrote; the CUDA runtime matches buffers across methods by those
names, so a program with ``decode`` and ``prefill`` methods shares the same
buffers with the same two state methods. Nothing is copied at a decode step,
and a snapshot copies only the live part of the caches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json

import torch

STATE_METHODS = ("get_state", "set_state")
STATE_NAMES = "get_state_names"
STATE_POSITION_DIMS = "get_state_position_dims"
STATE_FINGERPRINT = "get_state_fingerprint"
# Part of every fingerprint: a change to what the state methods mean changes it.
STATE_FORMAT = "gdn-export-state/1"


@contextlib.contextmanager
def _as_forward(model, method):
    """``model`` with ``method`` (bound to it) as its forward: torch.export traces ``forward``, and the
    buffers keep the names they have in the model's own ``forward``."""
    model.forward = method
    try:
        yield model
    finally:
        del model.forward


def export_state_methods(model) -> dict:
    """``{"get_state": ExportedProgram, "set_state": ExportedProgram}`` of ``model`` (a Qwen35ForCausalLM),
    the number of positions L dynamic from 1 to its ``max_seq_len``."""
    positions = torch.arange(min(2, model.max_seq_len))
    count = torch.export.Dim("positions", min=1, max=model.max_seq_len)
    position_dims = [dim for _, dim in model.state_buffers().values()]
    with torch.no_grad():
        with _as_forward(model, model.read_state):
            get_state = torch.export.export(model, (positions,), dynamic_shapes=({0: count},), strict=False)
        values = tuple(value.clone() for value in model.read_state(positions))
        value_shapes = tuple(None if dim is None else {dim: count} for dim in position_dims)
        with _as_forward(model, model.write_state):
            set_state = torch.export.export(
                model, (positions, *values), dynamic_shapes=({0: count}, value_shapes), strict=False
            )
    return {"get_state": get_state, "set_state": set_state}


def state_layout(model) -> list:
    """``[[name, shape, dtype, position dim or None], ...]`` of the model's state (shapes at ``max_seq_len``)."""
    return [
        [name, list(buffer.shape), str(buffer.dtype).removeprefix("torch."), dim]
        for name, (buffer, dim) in model.state_buffers().items()
    ]


def program_fingerprint(checkpoint, model, options: dict) -> str:
    """A sha256 (hex) of what decides a program's state: the checkpoint's config and weight files, the
    export ``options`` (backend, dtype, quantization, context) and the state's layout.

    A state is restored only into a program of the same fingerprint. Two exports
    of one checkpoint with the same options share it: their states are
    interchangeable. It is computed at export (hashing the weight files takes a
    second or two for a 0.8B checkpoint), not by hashing the ``.pte`` each time a
    runner loads it.
    """
    digest = hashlib.sha256()
    described = {
        "format": STATE_FORMAT,
        "config": dataclasses.asdict(checkpoint.config),
        "options": options,
        "layout": state_layout(model),
    }
    digest.update(json.dumps(described, sort_keys=True).encode())
    for path in sorted(set(checkpoint.weight_files.values())):
        with open(path, "rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def state_metadata(checkpoint, model, options: dict) -> dict:
    """The constant methods that describe the state methods' tensors (see the module's docstring)."""
    state = model.state_buffers()
    return {
        STATE_NAMES: list(state),
        STATE_POSITION_DIMS: [-1 if dim is None else dim for _, dim in state.values()],
        STATE_FINGERPRINT: program_fingerprint(checkpoint, model, options),
    }
