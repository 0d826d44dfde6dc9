"""Lower Qwen3.5's ``decode`` and ``prefill`` methods through ExecuTorch's CudaBackend (AOTInductor).

A CUDA program has two methods (``CudaTritonBackend.export_methods``):
``decode`` and ``prefill``, sharing their state buffers. ``lower_to_cuda``
lowers them with the CudaBackend Python of the revision the CUDA runtime was
built from (``cuda_backend.executorch_runtime``), so the ``.pte``
holds what that runtime reads. The ``gdn_cuda`` ops in the graph are
``triton_op``s: AOTInductor compiles their Triton kernels into the delegate,
so the program needs no custom-op library at run time. CudaBackend keeps the
weights out of the ``.pte``, in a ``.ptd`` data file (``gdn_export.export``
writes both).
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import torch


class CudaLoweringError(RuntimeError):
    """The machine cannot lower for CUDA (no GPU, no Triton, no ExecuTorch CUDA runtime built)."""


def check_lowering_prerequisites() -> None:
    """Raise ``CudaLoweringError`` naming what is missing for a CudaBackend lowering.

    Also points ``executorch.backends.cuda`` at the CUDA runtime's own revision
    (``executorch_runtime.use_matching_lowering``), before anything imports it.
    """
    gemm_backends()  # a bad $GDN_CUDA_GEMM_BACKENDS is refused before the checkpoint is read
    if not torch.cuda.is_available():
        raise CudaLoweringError(
            "--backend cuda lowers with AOTInductor, which compiles the Triton kernels for the local GPU: "
            "this machine has no CUDA device (torch.cuda.is_available() is False)"
        )
    from cuda_backend import executorch_runtime

    try:
        import triton  # noqa: F401

        executorch_runtime.use_matching_lowering()
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner  # noqa: F401
    except executorch_runtime.CudaRuntimeUnavailable as error:
        raise CudaLoweringError(f"--backend cuda: {error}") from error
    except ImportError as error:
        raise CudaLoweringError(f"--backend cuda needs triton and executorch's CUDA backend: {error}") from error


# CudaBackend's compile spec and Inductor settings for a faster compile. Measured on the H100
# (docs/benchmarks.md, torch 2.11): with max_autotune on (CudaBackend's default) the tiny dense
# model's two methods had not compiled after 8 minutes; 25 GEMM autotunings (every distinct linear shape of decode and of
# prefill, 17 or 18 Triton templates each) took 260 s of it. max_autotune off leaves pointwise and
# reduction kernels at one heuristic configuration each; max_autotune_gemm keeps the GEMM template
# autotuning, which the program needs (it picks each product's GEMM among cuBLAS and the Triton
# templates: gemm_backends below). Coordinate descent recompiles every kernel to try
# neighbouring launch configurations, and the wrapper only launches kernels, so -O0 compiles it
# several times faster than -O1. autotune_at_compile_time stays unset, which AOTInductor takes as
# on: set to off, it compiles in two codegen passes, and the second pass of the two-method program
# failed there ("CudaKernelParamCache not populated for triton_per_fused_..._0").
FAST_COMPILE_SPECS = {"max_autotune": b"OFF"}
FAST_INDUCTOR_CONFIG = {
    "max_autotune_gemm": True,
    "coordinate_descent_tuning": False,
    "aot_inductor.compile_wrapper_opt_level": "O0",
}


# The GEMM implementations AOTInductor's autotuning chooses among for each matrix product shape.
# CudaBackend allows its Triton templates only ("TRITON"), since ExecuTorch's CUDA runtime has no
# shim for ATen's mm; ours adds one on cuBLAS (runtime/cublas_mm.cpp), so "ATEN" (cuBLAS) competes
# too. On the H100 cuBLAS took 20.4 ms of the 4B's 2048-token prefill products where the templates
# took 24.6 (docs/benchmarks.md). GDN_CUDA_GEMM_BACKENDS overrides: "TRITON" lowers as CudaBackend
# does (programs that run in a runtime without the shim), "ATEN" sends every product to cuBLAS.
GEMM_BACKENDS_ENV = "GDN_CUDA_GEMM_BACKENDS"
DEFAULT_GEMM_BACKENDS = "ATEN,TRITON"
GEMM_BACKEND_CHOICES = ("ATEN", "TRITON")
# How the AOTInductor wrapper names the call our runtime library serves (kernel.mm's ExternKernelChoice
# and the C shim it becomes), for CudaBackend's check that every fallback kernel has a shim.
CUBLAS_SHIM_KERNELS = ("at::mm_out", "aoti_torch_cuda_mm_out")


def gemm_backends() -> str:
    """``$GDN_CUDA_GEMM_BACKENDS`` (default ``ATEN,TRITON``), checked; raises CudaLoweringError."""
    value = os.environ.get(GEMM_BACKENDS_ENV, "").strip() or DEFAULT_GEMM_BACKENDS
    names = [name.strip().upper() for name in value.split(",")]
    if not names or any(name not in GEMM_BACKEND_CHOICES for name in names):
        raise CudaLoweringError(
            f"{GEMM_BACKENDS_ENV}={value!r}: expected a comma-separated subset of {', '.join(GEMM_BACKEND_CHOICES)}"
        )
    return ",".join(dict.fromkeys(names))


@contextlib.contextmanager
def gemm_choices(backends: str):
    """CudaBackend compiling with ``backends`` as AOTInductor's GEMM choices for the duration; with
    ATEN among them, ATen's mm (our runtime's cuBLAS shim) counts as a supported fallback kernel."""
    from executorch.backends.cuda.cuda_backend import CudaBackend

    from gdn_export.lowering import replaced_attribute

    compile_options = CudaBackend.__dict__["get_aoti_compile_options"].__func__
    fallback_kernels = CudaBackend.__dict__["get_supported_fallback_kernels"].__func__

    def with_gemm_backends(cls, compile_specs):
        return {**compile_options(cls, compile_specs), "max_autotune_gemm_backends": backends}

    def with_cublas_shim(cls):
        kernels = dict(fallback_kernels(cls))
        if "ATEN" in backends.split(","):
            kernels.update(dict.fromkeys(CUBLAS_SHIM_KERNELS))
        return kernels

    with replaced_attribute(CudaBackend, "get_aoti_compile_options", classmethod(with_gemm_backends)), \
            replaced_attribute(CudaBackend, "get_supported_fallback_kernels", classmethod(with_cublas_shim)):
        yield


@contextlib.contextmanager
def fast_compile_config():
    """``FAST_INDUCTOR_CONFIG`` for the duration (settings this torch lacks are skipped)."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(known_inductor_settings(FAST_INDUCTOR_CONFIG)):
        yield


def known_inductor_settings(settings: dict) -> dict:
    """``settings`` ({dotted Inductor config name: value}) without those this torch's Inductor lacks."""
    import torch._inductor.config as inductor_config

    known = {}
    for key, value in settings.items():
        owner = inductor_config
        *parents, leaf = key.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is not None and hasattr(owner, leaf):
            known[key] = value
    return known


@contextlib.contextmanager
def kernel_objects_per_name():
    """Give every kernel its own object file when AOTInductor embeds kernel binaries one at a time.

    torch 2.11's AOTInductor turns each kernel's binary into ``<binary>.o``
    (``cpp_builder.convert_cubin_to_obj``), its symbols renamed after the
    kernel. Two kernel names can share one binary: Triton caches by what it
    compiles, and Inductor names a user-defined kernel per call site's
    arguments. Then the second conversion overwrites the first's object and
    the link lists that one file twice: the 0.8B export failed there with
    "multiple definition of __decode_linear_kernel_3_start" (its mixer's and
    attention's output products, both 2048 -> 1024 with a residual). Here a
    binary met again under another name is converted from a copy named after
    that kernel. Newer torch embeds all binaries in one object and never
    calls this converter.
    """
    import shutil

    import torch._inductor.codecache as codecache
    import torch._inductor.cpp_builder as cpp_builder

    convert = cpp_builder.convert_cubin_to_obj
    first_name = {}

    def convert_per_name(binary: str, kernel_name: str, *args, **kwargs):
        if first_name.setdefault(binary, kernel_name) != kernel_name:
            stem, suffix = os.path.splitext(binary)
            copy = f"{stem}.{kernel_name}{suffix}"
            shutil.copyfile(binary, copy)
            binary = copy
        return convert(binary, kernel_name, *args, **kwargs)

    owners = [module for module in (cpp_builder, codecache) if getattr(module, "convert_cubin_to_obj", None) is convert]
    for module in owners:
        module.convert_cubin_to_obj = convert_per_name
    try:
        yield
    finally:
        for module in owners:
            module.convert_cubin_to_obj = convert


def lower_to_cuda(programs: dict, *, metadata: Optional[dict] = None):
    """Lower ``programs`` ({method name: ExportedProgram}) through CudaBackend.

    Returns the ExecutorchProgramManager; the caller writes its ``.pte`` and
    ``.ptd`` (``gdn_export.lowering.write_program``).
    """
    check_lowering_prerequisites()
    import cuda_backend  # noqa: F401  (defines the gdn_cuda triton ops the graph calls)
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from gdn_export.lowering import lower_programs

    # The gdn_cuda ops update the state in place. Left whole, to_edge would wrap them in
    # auto_functionalized and AOTInductor would need a C++ fallback for them; decomposed
    # here, each becomes its Triton kernel launches, which AOTInductor compiles in.
    programs = {
        name: ep.run_decompositions(cuda_decompositions(), decompose_custom_triton_ops=True)
        for name, ep in programs.items()
    }
    # GDN_CUDA_COMPILE_DEFAULTS=1 compiles with CudaBackend's and Inductor's defaults (to measure what the
    # fast settings save).
    fast = os.environ.get("GDN_CUDA_COMPILE_DEFAULTS", "") in ("", "0")
    specs = [CompileSpec(key, value) for key, value in FAST_COMPILE_SPECS.items()] if fast else []
    backends = gemm_backends()
    with kernel_objects_per_name(), gemm_choices(backends), fast_compile_config() if fast else contextlib.nullcontext():
        return lower_programs(
            programs,
            metadata=metadata,
            # CudaBackend compiles each method into its own delegate, named by a compile spec.
            partitioners=lambda name: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(name), *specs])],
            skip_dim_order=True,
        )


def depthwise_conv1d_as_products(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Qwen3.5's causal depthwise conv1d as K shifted multiply-adds.

    CudaBackend lets AOTInductor pick convolution kernels among Triton templates
    only, and none takes a depthwise 1-D convolution; K (4) fused multiply-adds
    compile to one Triton kernel instead. Other convolutions are left alone.
    """
    depthwise_1d = (
        not transposed and input.dim() == 3 and weight.shape[1] == 1 and groups == input.shape[1]
        and list(stride) == [1] and list(padding) == [0] and list(dilation) == [1]
    )
    if not depthwise_1d:
        return NotImplemented
    kernel_size = weight.shape[2]
    length = input.shape[2] - kernel_size + 1
    output = input[:, :, 0:length] * weight[:, :, 0]
    for tap in range(1, kernel_size):
        output = output + input[:, :, tap:tap + length] * weight[:, :, tap]
    return output if bias is None else output + bias[:, None]


def cuda_decompositions() -> dict:
    """The decomposition table of ``lower_to_cuda`` (with ``decompose_custom_triton_ops=True``).

    ``aten.linear`` stays whole. Decomposed here, it becomes ``mm`` of the weight's transpose, which
    ``to_edge`` turns into a ``permute_copy``: AOTInductor then copied every weight into its transpose on
    each prefill call (the 4B's 2048-token prefill spent 5.3 of its 42.5 ms on these copies, profiled on
    the H100). CudaPartitioner keeps every op it meets whole, and AOTInductor reads the weight transposed in
    place."""
    table = torch.export.default_decompositions()
    table[torch.ops.aten.convolution.default] = depthwise_conv1d_as_products
    del table[torch.ops.aten.linear.default]
    return table
