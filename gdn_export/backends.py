"""What a backend is, and the registry that finds the installed ones.

A backend (CPU portable or XNNPACK, CUDA, Metal) says which recurrence and
attention each layer of the model gets, which head dims and quantizations its
kernels cover, whether this machine can lower for it, and how an exported
program is lowered. Each lives in its own package and announces itself as an
entry point of the group ``gdn_export.backends`` (``name = module:attribute``
in ``pyproject.toml``), in the spirit of ggml's backend registry: the core
imports no backend module, it asks the registry by name, and the registry
imports a backend's module only when that backend is asked for.

The group ``gdn_export.kernels`` names functions that ``import gdn_export``
calls once: the CPU kernels register with PyTorch and ExecuTorch that way, so
any ``.pte`` of ours runs in ``executorch.runtime`` after ``import gdn_export``.

In a source checkout (installed in editable mode, or run from ``PYTHONPATH``
as on the lent GPU machines) the registry reads the two tables from the
checkout's ``pyproject.toml``; an installed package reads its metadata.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import nn

BACKENDS_GROUP = "gdn_export.backends"
KERNELS_GROUP = "gdn_export.kernels"
DISTRIBUTION = "gdn-export"
# export_qwen35's default: the CPU program people deploy.
DEFAULT_BACKEND = "xnnpack"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


class Backend:
    """One target of ``export_qwen35 --backend``; subclasses override what differs.

    The defaults describe a backend whose kernels take any head dims, that
    quantizes nothing, runs on any machine and keeps the model's attention.
    """

    name: str = ""
    summary: str = ""
    # Linear-attention head dims (Dk and Dv) the backend's kernels cover; None: any.
    head_dims: Optional[tuple[int, ...]] = None
    quantizations: tuple[str, ...] = ("none",)
    # export_qwen35's --state-dtype values its kernels take (the Gated DeltaNet layers' recurrent state).
    state_dtypes: tuple[str, ...] = ("float32",)
    # Where the program's weights go: False keeps them in the .pte, True in .ptd files beside it.
    writes_data_files: bool = False
    # export_qwen35's --dtype when none is given (weights and activations).
    default_dtype: str = "fp32"
    # ExecuTorch backend ids of the delegates in this backend's programs whose runtime
    # ``load_runtime`` provides (a program's runner asks for them by these ids).
    delegate_ids: tuple[str, ...] = ()

    def unavailable_reason(self) -> Optional[str]:
        """Why this machine cannot lower for the backend (one sentence), or None."""
        return None

    def recurrence(self) -> nn.Module:
        """A fresh recurrence module for one Gated DeltaNet layer (see ``gdn_export.passes``)."""
        raise NotImplementedError(f"backend {self.name!r} defines no recurrence")

    def attention(self, layer) -> Optional[nn.Module]:
        """The ``attend`` module for one full-attention layer, or None to keep the model's own."""
        return None

    def merged_linears(self, layer: nn.Module) -> list[tuple[str, ...]]:
        """Names of ``layer``'s linear children to compute as one product each (``gdn_export.passes.linear_groups``):
        a list of groups, by default none."""
        return []

    def mlp(self, layer: nn.Module) -> Optional[nn.Module]:
        """The module in place of one of the model's ``MLP`` layers, or None to keep it."""
        return None

    def linear(self, layer: nn.Linear) -> Optional[nn.Module]:
        """The module in place of one of the model's ``nn.Linear`` layers (its parameters under the same
        names), or None to keep it."""
        return None

    def finish_rewrite(self, model: nn.Module) -> None:
        """Changes across layers, once each layer has the backend's modules (``rewrite``'s last step)."""

    def export_methods(self, model, prefill_chunk: int) -> dict[str, torch.export.ExportedProgram]:
        """The program's methods, exported; by default ExecuTorch's LLM ``forward`` with a dynamic T."""
        return {"forward": export_llm_forward(model, prefill_chunk)}

    def lower(self, programs: dict, metadata: dict):
        """The ExecutorchProgramManager of ``programs`` ({method: ExportedProgram}) with ``metadata``."""
        raise NotImplementedError(f"backend {self.name!r} defines no lowering")

    def load_runtime(self) -> None:
        """Load what this backend's programs need at run time, beyond ``import gdn_export``.

        Raises ``RuntimeUnavailable`` (one sentence saying how to get it) when it is missing.
        """

    def conformance_implementations(self) -> list:
        """The backend's implementations of the gdn ops, for the conformance suite (may be empty)."""
        return []

    def __repr__(self) -> str:
        return f"<gdn_export backend {self.name!r}>"


def export_llm_forward(model, prefill_chunk: int) -> torch.export.ExportedProgram:
    """``torch.export`` of ExecuTorch's LLM ``forward(tokens, input_pos)``, T dynamic from 1 to ``prefill_chunk``."""
    tokens = torch.zeros(1, min(2, prefill_chunk), dtype=torch.long)
    input_pos = torch.zeros(1, dtype=torch.long)
    if prefill_chunk > 1:
        length = torch.export.Dim("token_dim", min=1, max=prefill_chunk)
        dynamic_shapes = ({1: length}, None)
    else:
        dynamic_shapes = None
    with torch.no_grad():
        return torch.export.export(model, (tokens, input_pos), dynamic_shapes=dynamic_shapes, strict=False)


def _pyproject_entry_points(group: str) -> dict[str, str]:
    """``{name: "module:attribute"}`` of ``group`` in the checkout's pyproject.toml."""
    import tomllib

    if not _PYPROJECT.is_file():
        return {}
    with open(_PYPROJECT, "rb") as handle:
        table = tomllib.load(handle)
    return dict(table.get("project", {}).get("entry-points", {}).get(group, {}))


@functools.lru_cache(maxsize=None)
def _entry_points(group: str) -> dict[str, str]:
    """``{name: "module:attribute"}`` of ``group`` (installed metadata lists them sorted by name).

    A source checkout's pyproject.toml is the truth for the modules beside it
    (an editable install's metadata may be older than the tree); an installed
    package has no pyproject.toml beside it and reads its metadata.
    """
    if _PYPROJECT.is_file():
        return _pyproject_entry_points(group)
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {entry.name: entry.value for entry in distribution.entry_points if entry.group == group}


def _load(reference: str):
    module_name, _, attribute = reference.partition(":")
    value = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        value = getattr(value, part)
    return value


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, the default first, the rest as declared (imports none of them)."""
    names = tuple(_entry_points(BACKENDS_GROUP))
    return tuple(sorted(names, key=lambda name: name != DEFAULT_BACKEND))


def default_backend() -> str:
    """The default backend's name where it is registered, else the first registered."""
    return backend_names()[0]


class RuntimeUnavailable(RuntimeError):
    """A backend's run-time part (``Backend.load_runtime``) is missing or cannot load."""


def backends_for_delegates(delegate_ids) -> dict[str, Backend]:
    """``{delegate id: backend}`` for each of ``delegate_ids`` that a registered backend provides.

    Imports the registered backends (only a runner that meets a delegate
    ExecuTorch's runtime lacks asks).
    """
    wanted = set(delegate_ids)
    found = {}
    for name in backend_names():
        backend = get_backend(name)
        for delegate_id in wanted.intersection(backend.delegate_ids):
            found.setdefault(delegate_id, backend)
    return found


class UnknownBackend(ValueError):
    """A backend name that no installed package registers."""


@functools.lru_cache(maxsize=None)
def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; raises UnknownBackend naming the registered ones."""
    entries = _entry_points(BACKENDS_GROUP)
    if name not in entries:
        raise UnknownBackend(f"unknown backend {name!r}; expected one of {', '.join(entries)}")
    backend = _load(entries[name])
    if not isinstance(backend, Backend) or backend.name != name:
        raise TypeError(f"entry point {name} = {entries[name]} is not the gdn_export Backend named {name!r}")
    return backend


def load_kernels() -> dict[str, Exception]:
    """Call each ``gdn_export.kernels`` entry once; returns {name: error} of those that failed.

    A failure is a warning, not an error: without the CPU kernels the ops'
    pure-PyTorch reference keeps serving every eager call.
    """
    failures = {}
    for name, reference in _entry_points(KERNELS_GROUP).items():
        try:
            _load(reference)()
        except (ImportError, OSError, RuntimeError) as error:
            failures[name] = error
            warnings.warn(f"{error}; using the pure-PyTorch reference on CPU", RuntimeWarning, stacklevel=3)
    return failures
