"""Lower Qwen3.5's ``decode`` and ``prefill`` methods through ExecuTorch's CudaBackend (AOTInductor).

``export_methods`` exports the two methods of a CUDA program, as ExecuTorch's
own Qwen3.5 CUDA export does: ``decode`` (one token: the per-token Triton
kernel) and ``prefill`` (2 to ``prefill_chunk`` tokens: the chunked kernels).
Both update the same state buffers (KV caches, conv and recurrent states) in
place; the runtime shares them between the methods by name
(``cuda_backend.executorch_runtime.prepare_for_programs``).

``lower_to_cuda`` lowers with the CudaBackend Python of the revision the CUDA
runtime was built from (``cuda_backend.executorch_runtime``), so the ``.pte``
holds what that runtime reads. The ``gdn_cuda`` ops in the graph are
``triton_op``s: AOTInductor compiles their Triton kernels into the delegate,
so the program needs no custom-op library at run time. CudaBackend keeps the
weights out of the ``.pte``, in a ``.ptd`` data file (``gdn_export.export``
writes both).
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional, Union

import torch


class CudaLoweringError(RuntimeError):
    """The machine cannot lower for CUDA (no GPU, no Triton, no ExecuTorch CUDA runtime built)."""


def check_lowering_prerequisites() -> None:
    """Raise ``CudaLoweringError`` naming what is missing for a CudaBackend lowering.

    Also points ``executorch.backends.cuda`` at the CUDA runtime's own revision
    (``executorch_runtime.use_matching_lowering``), before anything imports it.
    """
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


def export_methods(model: torch.nn.Module, prefill_chunk: int) -> dict:
    """``{"decode": ..., "prefill": ...}``: the exported programs of a CUDA ``.pte``.

    * ``decode(tokens [1, 1], input_pos [1])``: T is static, so each Gated
      DeltaNet layer holds ``gdn_cuda::fused_recurrent_gated_delta_rule``.
    * ``prefill(tokens [1, T], input_pos [1])`` with T dynamic from 2 to
      ``prefill_chunk``: ``gdn_cuda::fused_chunked_gated_delta_rule``. Traced at
      T = ``prefill_chunk``, so the compiled kernels' buffers are sized for the
      longest chunk. Left out when ``prefill_chunk`` is 1 (every call decodes).

    ``model`` returns the last position's logits (``all_logits`` False) and has
    the CUDA rewrite (``rewrite(model, "cuda")``). Both methods share the
    model's buffers, which they update in place.
    """
    if prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
    input_pos = torch.zeros(1, dtype=torch.long)
    methods = {}
    with torch.no_grad():
        methods["decode"] = torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), input_pos), strict=False)
        if prefill_chunk >= 2:
            tokens = torch.zeros(1, prefill_chunk, dtype=torch.long)
            # A range of one length is that length, static (torch.export refuses min == max).
            shapes = ({1: torch.export.Dim("prefill_tokens", min=2, max=prefill_chunk)}, None) \
                if prefill_chunk > 2 else None
            methods["prefill"] = torch.export.export(model, (tokens, input_pos), dynamic_shapes=shapes, strict=False)
    return methods


# CudaBackend's compile specs and Inductor settings for a faster compile. Coordinate descent
# recompiles every kernel to try neighbouring launch configurations, and the wrapper only launches
# kernels, so -O0 compiles it several times faster than -O1. max_autotune stays on (CudaBackend's
# default): CudaBackend lets AOTInductor choose among Triton GEMM templates only, and the runtime
# has no cuBLAS fallback; autotuning at compile time (a second codegen pass) is off.
FAST_COMPILE_SPECS = {"max_autotune": b"ON", "autotune_at_compile_time": b"OFF"}
FAST_INDUCTOR_CONFIG = {
    "coordinate_descent_tuning": False,
    "aot_inductor.compile_wrapper_opt_level": "O0",
}


@contextlib.contextmanager
def fast_compile_config():
    """``FAST_INDUCTOR_CONFIG`` for the duration (settings this torch lacks are skipped)."""
    import torch._inductor.config as inductor_config

    settings = {}
    for key, value in FAST_INDUCTOR_CONFIG.items():
        owner = inductor_config
        *parents, leaf = key.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is not None and hasattr(owner, leaf):
            settings[key] = value
    with inductor_config.patch(settings):
        yield


def lower_to_cuda(
    program: Union[torch.export.ExportedProgram, dict],
    *,
    metadata: Optional[dict] = None,
):
    """Lower ``program`` (one ExportedProgram, or ``{method name: ExportedProgram}``).

    Returns the ExecutorchProgramManager; the caller writes its ``.pte`` and
    ``.ptd`` (``gdn_export.export.write_program``).
    """
    check_lowering_prerequisites()
    import cuda_backend  # noqa: F401  (defines the gdn_cuda triton ops the graph calls)
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.passes import MemoryPlanningPass

    programs = program if isinstance(program, dict) else {"forward": program}
    # The gdn_cuda ops update the state in place. Left whole, to_edge would wrap them in
    # auto_functionalized and AOTInductor would need a C++ fallback for them; decomposed
    # here, each becomes its Triton kernel launches, which AOTInductor compiles in.
    programs = {
        name: ep.run_decompositions(cuda_decompositions(), decompose_custom_triton_ops=True)
        for name, ep in programs.items()
    }
    # GDN_CUDA_COMPILE_DEFAULTS=1 compiles with CudaBackend's own defaults (to measure what the fast
    # settings save).
    fast = os.environ.get("GDN_CUDA_COMPILE_DEFAULTS", "") in ("", "0")
    specs = [CompileSpec(key, value) for key, value in FAST_COMPILE_SPECS.items()] if fast else []
    partitioners = {
        name: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(name), *specs])] for name in programs
    }
    with fast_compile_config() if fast else contextlib.nullcontext():
        edge = to_edge_transform_and_lower(
            programs,
            partitioner=partitioners,
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
            constant_methods=metadata,
        )
    manager = edge.to_executorch(
        ExecutorchBackendConfig(
            extract_delegate_segments=True,
            do_quant_fusion_and_const_prop=True,
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        )
    )
    return manager


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
    """The decomposition table of ``lower_to_cuda`` (with ``decompose_custom_triton_ops=True``)."""
    table = torch.export.default_decompositions()
    table[torch.ops.aten.convolution.default] = depthwise_conv1d_as_products
    return table
