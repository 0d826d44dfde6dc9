"""Lower an exported program through ExecuTorch's CudaBackend (AOTInductor) to ``.pte`` + ``.ptd``.

The ``gdn_cuda`` ops in the graph are ``triton_op``s: AOTInductor compiles
their Triton kernels into the delegate, so the program needs no custom-op
library at run time. CudaBackend keeps the weights out of the ``.pte``, in a
``.ptd`` data file (``gdn_export.export`` writes both).
"""

from __future__ import annotations

from typing import Optional, Union

import torch


class CudaLoweringError(RuntimeError):
    """The machine cannot lower for CUDA (no GPU, no Triton, no ExecuTorch CUDA backend)."""


def check_lowering_prerequisites() -> None:
    """Raise ``CudaLoweringError`` naming what is missing for a CudaBackend lowering."""
    if not torch.cuda.is_available():
        raise CudaLoweringError(
            "--backend cuda lowers with AOTInductor, which compiles the Triton kernels for the local GPU: "
            "this machine has no CUDA device (torch.cuda.is_available() is False)"
        )
    try:
        import triton  # noqa: F401
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner  # noqa: F401
    except ImportError as error:
        raise CudaLoweringError(f"--backend cuda needs triton and executorch's CUDA backend: {error}") from error


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
    from executorch.exir.passes import MemoryPlanningPass

    programs = program if isinstance(program, dict) else {"forward": program}
    # The gdn_cuda ops update the state in place. Left whole, to_edge would wrap them in
    # auto_functionalized and AOTInductor would need a C++ fallback for them; decomposed
    # here, each becomes its Triton kernel launches, which AOTInductor compiles in.
    programs = {
        name: ep.run_decompositions(cuda_decompositions(), decompose_custom_triton_ops=True)
        for name, ep in programs.items()
    }
    partitioners = {
        name: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(name)])] for name in programs
    }
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
