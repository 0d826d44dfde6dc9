"""ExecuTorch's to_edge → partition → to_executorch steps and the writing of the files, for every backend.

A backend's ``lower`` says only what differs: its partitioners (one list per
method, since CudaBackend and MetalBackend name each compiled method), whether
dim-order ops are kept, and extra ``ExecutorchBackendConfig`` fields.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional

# Where lower_programs announces its stages: set by the export around ``Backend.lower``, so
# a backend's lowering shows progress without a parameter in every backend's signature.
_stage_reporter: contextvars.ContextVar[Callable[[str], None]] = contextvars.ContextVar(
    "gdn_export_lowering_stages", default=lambda message: None
)


# Whether the lowering may free the weights that delegates have copied: set by the export, which owns the model.
_freeing_weights: contextvars.ContextVar[bool] = contextvars.ContextVar("gdn_export_freeing_weights", default=False)


@contextlib.contextmanager
def weights_freed_when_serialized() -> Iterator[None]:
    """While open, lowerings free the memory of each weight that only delegates use once they have copied it
    (``free_delegated_weights``, ``runtime_ops.xnnpack_lowering.weights_freed_once_serialized``).

    The weights are the model's tensors: whoever opens this must not use the model or its exported programs
    afterwards. ``export_qwen35`` builds both for the call alone."""
    token = _freeing_weights.set(True)
    try:
        yield
    finally:
        _freeing_weights.reset(token)


def freeing_weights() -> bool:
    """Whether ``weights_freed_when_serialized`` is open."""
    return _freeing_weights.get()


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    library = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(library).malloc_trim if library else None
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Give the pages that the heap holds free back to the system, where the C library can.

    Quantizing layer by layer frees each layer's float weights, but glibc keeps
    most of what it freed mapped (blocks below its mmap threshold stay in the
    heap), so the resident size after loading stays near its peak. Trimming at
    each stage boundary, and after weights are freed, lowers the base that
    ExecuTorch's lowering then grows from.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@contextlib.contextmanager
def reporting_stages(report: Callable[[str], None]) -> Iterator[None]:
    """While open, ``lower_programs`` calls ``report`` with one line as each of its stages begins."""
    token = _stage_reporter.set(report)
    try:
        yield
    finally:
        _stage_reporter.reset(token)


@contextlib.contextmanager
def replaced_attribute(owner, name: str, value) -> Iterator[None]:
    """``owner.name`` is ``value`` while open, and what it was afterwards: how a lowering changes one step of a
    library (ExecuTorch's, Inductor's) for its own call only. A class's own entry is restored as it stood in the
    class (a classmethod stays one); one the class inherited is removed again, so the base's shows through."""
    inherited = isinstance(owner, type) and name not in owner.__dict__
    original = None if inherited else owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if inherited:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


@contextlib.contextmanager
def aoti_int_arrays_declared_at_each_use() -> Iterator[None]:
    """While open, AOTInductor's C++ wrapper declares a fresh size/stride array wherever one is used.

    Its ``codegen_int_array_var`` caches each array's name by the id of the
    buffer it was declared in, and some of those buffers live for one line:
    once one is freed, the next buffer may get its id, hit the cache and refer to
    an array declared nowhere in it. The 0.8B CUDA program failed to compile so
    on the H100 (torch 2.11: "'int_array_34' was not declared in this scope").
    Declaring at each use costs a few lines of wrapper code and cannot miss.
    """
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:  # no Inductor: nothing to patch
        yield
        return
    cached = CppWrapperCpu.__dict__.get("codegen_int_array_var")
    if cached is None or not hasattr(CppWrapperCpu, "_codegen_int_array_var_impl"):
        yield  # another torch's wrapper: left as it is
        return

    def declared_at_each_use(self, int_array, writeline, known_statically=False, graph=None):
        return self._codegen_int_array_var_impl(int_array, writeline, known_statically)

    with replaced_attribute(CppWrapperCpu, "codegen_int_array_var", declared_at_each_use):
        yield


def lower_programs(
    programs: dict,
    *,
    metadata: Optional[dict] = None,
    partitioners: Optional[Callable[[str], list]] = None,
    edge_partitioners: Optional[Callable[[str], list]] = None,
    skip_dim_order: bool = False,
    share_mutable_buffers: bool = False,
    free_delegated: bool = False,
    **backend_config,
):
    """The ExecutorchProgramManager of ``programs`` ({method name: ExportedProgram}).

    ``partitioners(method)`` gives each method's partitioner list (None: no
    delegate, ExecuTorch's portable kernels and ours run every op);
    ``edge_partitioners(method)`` gives partitioners applied afterwards, one
    ``to_backend`` call each, to the edge program that the first ones left
    (they are not added to ``partitioners`` because, given a partitioner that
    keeps no op whole, ``to_edge_transform_and_lower`` runs the default
    decompositions, which split ops that the list's others keep whole, such as
    XNNPACK's linears);
    ``metadata`` becomes constant methods; ``share_mutable_buffers`` makes
    every method read and write one copy of each buffer of the model, found by
    its name (see ``gdn_export.state_methods``); ``free_delegated`` frees the
    weights only delegates use before ``to_executorch`` while
    ``weights_freed_when_serialized`` is open (``free_delegated_weights``: for
    backends whose delegates copy their weights when they preprocess);
    ``backend_config`` overrides fields of ``ExecutorchBackendConfig``.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    report = _stage_reporter.get()
    report(f"to_edge and partition ({', '.join(programs)})")
    # CudaBackend and MetalBackend compile their delegates with AOTInductor inside these calls.
    with aoti_int_arrays_declared_at_each_use():
        edge = to_edge_transform_and_lower(
            programs,
            partitioner={name: partitioners(name) for name in programs} if partitioners else None,
            # The gdn ops are outside the core ATen opset the IR validity check knows.
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=skip_dim_order),
            constant_methods=metadata,
        )
        extra = {name: edge_partitioners(name) for name in programs} if edge_partitioners else {}
        for index in range(max(map(len, extra.values()), default=0)):
            edge = edge.to_backend({name: found[index] for name, found in extra.items() if index < len(found)})
    config = dict(
        extract_delegate_segments=True,
        do_quant_fusion_and_const_prop=True,
        # Graph inputs are the caller's tensors: don't plan memory for them.
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=share_mutable_buffers),
        emit_mutable_buffer_names=share_mutable_buffers,
    )
    config.update(backend_config)
    if free_delegated and freeing_weights():
        if free_delegated_weights(edge):
            return_freed_memory()
        check_weights_resident(edge)
    report("to_executorch (memory planning, serialization passes)")
    return edge.to_executorch(ExecutorchBackendConfig(**config))


def copy_sharing_weights(edge_program):
    """A deep copy of ``edge_program`` (an ExportedProgram) whose state dict and constants hold the same tensors:
    what a backend's ``copy_exported_program_for_preprocess`` can give when its preprocessing writes into no weight."""
    import copy

    import torch

    shared = {
        id(tensor): tensor
        for values in (edge_program.state_dict, edge_program.constants)
        for tensor in values.values()
        if isinstance(tensor, torch.Tensor)
    }
    return copy.deepcopy(edge_program, shared)


def write_atomically(path: Path, write: Callable[[object], None]) -> None:
    """Write through a temporary file in the same folder, renamed into place when complete."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_program(manager, output: Path) -> list[Path]:
    """Write the ``.pte`` and any ``.ptd`` weight files beside it; returns the ``.ptd`` paths.

    CudaBackend and MetalBackend keep the weights in ``.ptd`` files. Everything is
    written into a hidden folder beside ``output`` first and renamed into place
    only once all of it is complete (the ``.pte``, which names the others, last),
    so a failure leaves no file behind.
    """
    staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}."))
    try:
        if getattr(manager, "_tensor_data", None):
            manager.write_tensor_data_to_file(str(staging))
        data_files = sorted(staging.iterdir())
        with open(staging / output.name, "wb") as handle:
            manager.write_to_file(handle)
        for staged in data_files:
            os.replace(staged, output.parent / staged.name)
        os.replace(staging / output.name, output)
        return [output.parent / staged.name for staged in data_files]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def weight_storages(values):
    """The storages of the plain tensors among ``values`` that hold any bytes."""
    import torch

    for value in values:
        if type(value) in (torch.Tensor, torch.nn.Parameter) and value.untyped_storage().nbytes():
            yield value.untyped_storage()


def free_storages(storages) -> int:
    """Resize each storage to nothing; returns the bytes freed. Storages that cannot be resized (a mapped file's
    pages, which the system can drop anyway) are left alone."""
    freed = 0
    for storage in storages:
        size = storage.nbytes()
        try:
            storage.resize_(0)
        except RuntimeError:
            continue
        freed += size
    return freed


def free_delegated_weights(edge) -> int:
    """Free the memory of every weight that only delegates use, once all are lowered; returns the bytes freed.

    Each delegate carries its own copy of its weights (XNNPACK's serialized, our embedding's named data), but its
    ``LoweredBackendModule`` keeps the partition as it was (``original_module``), whose weights are the model's
    tensors. The model and the programs ``torch.export`` made refer to them too from further up the stack, so
    they stay resident through ``to_executorch``, which reads only ``original_module``'s graph (its debug
    handles) and adds the serialized program on top: the fp32 0.8B export peaked there. A weight that some
    method's own program still holds is kept.
    """
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    kept, delegated = set(), {}
    for name in edge.methods:
        program = edge.exported_program(name)
        kept.update(storage.data_ptr() for storage in weight_storages([*program.state_dict.values(),
                                                                      *program.constants.values()]))
        for module in program.graph_module.modules():
            if isinstance(module, LoweredBackendModule):
                original = module.original_module
                for storage in weight_storages([*original.state_dict.values(), *original.constants.values()]):
                    delegated[storage.data_ptr()] = storage
    return free_storages(storage for pointer, storage in delegated.items() if pointer not in kept)


def check_weights_resident(edge) -> None:
    """Raise if a weight that some method's program serializes has had its memory freed: a freeing that took a
    storage for a delegate's alone when it was not, caught before the emitter reads freed memory."""
    import torch

    for name in edge.methods:
        program = edge.exported_program(name)
        for fqn, tensor in [*program.state_dict.items(), *program.constants.items()]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() and not tensor.untyped_storage().nbytes():
                raise RuntimeError(f"internal error: {name}'s weight {fqn} was freed while the program still holds it")
