"""ExecuTorch's to_edge → partition → to_executorch steps, shared by every backend.

A backend's ``lower`` says only what differs: its partitioners (one list per
method, since CudaBackend and MetalBackend name each compiled method), whether
dim-order ops are kept, and extra ``ExecutorchBackendConfig`` fields.
"""

from __future__ import annotations

from typing import Callable, Optional


def lower_programs(
    programs: dict,
    *,
    metadata: Optional[dict] = None,
    partitioners: Optional[Callable[[str], list]] = None,
    skip_dim_order: bool = False,
    **backend_config,
):
    """The ExecutorchProgramManager of ``programs`` ({method name: ExportedProgram}).

    ``partitioners(method)`` gives each method's partitioner list (None: no
    delegate, ExecuTorch's portable kernels and ours run every op);
    ``metadata`` becomes constant methods; ``backend_config`` overrides fields
    of ``ExecutorchBackendConfig``.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    edge = to_edge_transform_and_lower(
        programs,
        partitioner={name: partitioners(name) for name in programs} if partitioners else None,
        # The gdn ops are outside the core ATen opset the IR validity check knows.
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=skip_dim_order),
        constant_methods=metadata,
    )
    config = dict(
        extract_delegate_segments=True,
        do_quant_fusion_and_const_prop=True,
        # Graph inputs are the caller's tensors: don't plan memory for them.
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
    )
    config.update(backend_config)
    return edge.to_executorch(ExecutorchBackendConfig(**config))
