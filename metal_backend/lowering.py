"""``export_qwen35 --backend metal``: lower an exported program through ExecuTorch's MetalBackend.

ExecuTorch's ``MetalPartitioner`` hands the whole graph to ``MetalBackend``,
which compiles it with AOTInductor for MPS. The gdn ops are not aten ops, so
AOTInductor calls them through the C shims of ``metal_backend.shims``; the
backend itself only knows its own shims, so ``gdn_shims_in_metal_backend()``
adds ours to the options it passes to AOTInductor (and to the fallback kernels
it accepts) for the duration of the lowering. At run time the runner must link
``gdn_metal_ops`` (``metal_backend/CMakeLists.txt``), which defines them.

Compiling for MPS needs macOS with the MPS device and Xcode's command-line
tools; elsewhere ``lower_to_metal`` raises a clear error before doing anything.
"""

from __future__ import annotations

import contextlib
import math
import platform
from typing import Optional

import torch

from metal_backend import shims
from metal_backend.mps_eager import SUPPORTED_HEAD_DIMS


def unavailable_reason() -> Optional[str]:
    """Why this machine cannot lower for Metal (the export's one-line error), or None."""
    if platform.system() != "Darwin":
        why = f"this machine runs {platform.system()}"
    elif not torch.backends.mps.is_available():
        why = "torch.backends.mps.is_available() is False (Apple silicon and macOS 14+ needed)"
    else:
        return None
    return (
        f"--backend metal lowers only on macOS with Xcode and an Apple-silicon GPU: {why}. "
        "Export with --backend xnnpack or portable here, or run this export on a Mac."
    )


@contextlib.contextmanager
def gdn_shims_in_metal_backend():
    """MetalBackend with the gdn C shims added to its AOTInductor options and supported fallbacks."""
    from executorch.backends.apple.metal.metal_backend import MetalBackend

    originals = {
        name: MetalBackend.__dict__[name] for name in ("get_aoti_compile_options", "get_supported_fallback_kernels")
    }
    compile_options = MetalBackend.get_aoti_compile_options
    fallback_kernels = MetalBackend.get_supported_fallback_kernels

    def get_aoti_compile_options(cls, compile_specs):
        options = compile_options(compile_specs)
        key = "aot_inductor.custom_ops_to_c_shims"
        options[key] = {**options.get(key, {}), **shims.C_SHIMS}
        return options

    def get_supported_fallback_kernels(cls):
        return {**fallback_kernels(), **dict.fromkeys(shims.fallback_kernel_names())}

    MetalBackend.get_aoti_compile_options = classmethod(get_aoti_compile_options)
    MetalBackend.get_supported_fallback_kernels = classmethod(get_supported_fallback_kernels)
    try:
        yield MetalBackend
    finally:
        for name, original in originals.items():
            setattr(MetalBackend, name, original)


def metal_op_nodes(program: torch.export.ExportedProgram) -> list:
    """The program's calls of gdn ops that have Metal C shims."""
    targets = set(shims.C_SHIMS)
    nodes = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        # Mutating ops appear wrapped: auto_functionalized(op, **kwargs).
        target = node.args[0] if "auto_functionalized" in str(node.target) and node.args else node.target
        if target in targets:
            nodes.append(node)
    return nodes


def _state_argument(node: torch.fx.Node):
    """The node of a gdn op call's ``state`` argument, however the call is spelled."""
    if "_all_bases" in node.kwargs:  # auto_functionalized_v2: mutated args become indexed bases
        return node.kwargs["_all_bases"][node.kwargs["_state_base_index"]]
    if "state" in node.kwargs:
        return node.kwargs["state"]
    op = node.target
    position = [arg.name for arg in op._schema.arguments].index("state")
    return node.args[position]


def check_head_dims(program: torch.export.ExportedProgram) -> None:
    """Refuse, before lowering, programs whose gdn heads the Metal kernels do not cover."""
    for node in metal_op_nodes(program):
        state = _state_argument(node)
        value = state.meta.get("val") if isinstance(state, torch.fx.Node) else None
        if value is None:
            raise RuntimeError(f"--backend metal: cannot tell the head dims of {node.name} (no shape on its state)")
        key_dim, value_dim = int(value.shape[-2]), int(value.shape[-1])
        if key_dim not in SUPPORTED_HEAD_DIMS or value_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"--backend metal: the Metal kernels support linear-attention head dims in "
                f"{{{', '.join(map(str, SUPPORTED_HEAD_DIMS))}}}, "
                f"this model has Dk={key_dim}, Dv={value_dim} (node {node.name}); export it with "
                "--backend xnnpack or --backend portable instead"
            )


def _state_layout(node: torch.fx.Node) -> tuple[list, list]:
    """(sizes, strides) of the view a gdn op call updates in place, however the call is spelled."""
    state = _state_argument(node)
    value = state.meta.get("val") if isinstance(state, torch.fx.Node) else None
    if value is None:
        raise RuntimeError(f"--backend metal: cannot tell the layout of {node.name}'s state (no value on it)")
    sizes, strides = list(value.shape), list(value.stride())
    if "_state_size" in node.kwargs:  # auto_functionalized_v2: the view as an as_strided of its base
        sizes, strides = list(node.kwargs["_state_size"]), list(node.kwargs["_state_stride"])
    elif "_state_slice_dim" in node.kwargs:  # ... or as a slice of it
        dim = node.kwargs["_state_slice_dim"]
        start, end = node.kwargs["_state_slice_start"] or 0, node.kwargs["_state_slice_end"]
        sizes[dim] = max(0, min(sizes[dim], end if end is not None else sizes[dim]) - start)
    return sizes, strides


def check_in_place_states(program: torch.export.ExportedProgram) -> None:
    """Refuse, before lowering, a gdn op whose in-place state is a non-packed view.

    ExecuTorch's Metal runtime gives such a view a temporary packed copy
    (aoti_torch__reinterpret_tensor), so the kernel would update the copy and
    the model's state would silently stay behind; the copy arrives packed, so
    the C shims cannot tell. Packed views (permutations, whole-buffer slices) are fine.
    """
    for node in metal_op_nodes(program):
        sizes, strides = _state_layout(node)
        elements = math.prod(sizes)
        extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(sizes, strides) if size > 1)
        if elements > 1 and extent != elements:
            raise ValueError(
                f"--backend metal: {node.name} updates its state in place, but the state is a non-packed view "
                f"(sizes {sizes}, strides {strides}); ExecuTorch's Metal runtime would run the kernel on a "
                "temporary copy and the update would be lost. Keep each layer's state a whole buffer "
                "(or a packed view of one)"
            )


def lower_to_metal(program, *, metadata: Optional[dict] = None):
    """Lower ``program`` (one ExportedProgram, or ``{method name: ExportedProgram}``) for Apple GPUs.

    Returns the ExecutorchProgramManager; the caller writes its ``.pte`` and
    ``.ptd`` (``gdn_export.export.write_program``). Raises RuntimeError off macOS
    and ValueError for head dims the Metal kernels do not cover or a state
    updated in place that is a non-packed view.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    programs = program if isinstance(program, dict) else {"forward": program}
    for exported in programs.values():
        check_head_dims(exported)
        check_in_place_states(exported)
    from executorch.backends.apple.metal.metal_partitioner import MetalPartitioner

    from gdn_export.lowering import lower_programs

    with gdn_shims_in_metal_backend() as metal_backend:
        return lower_programs(
            programs,
            metadata=metadata,
            partitioners=lambda name: [MetalPartitioner([metal_backend.generate_method_name_compile_spec(name)])],
            skip_dim_order=True,
        )
