"""Export a Hugging Face Qwen3.5 folder to an ExecuTorch ``.pte`` program.

The program follows ExecuTorch's LLM conventions, so its stock runners
(``TextLLMRunner``, the C++ llama runner) run it unchanged:

* ``forward(tokens [1, T], input_pos [1]) -> logits [1, 1, vocab]`` with a
  dynamic T (1 to ``prefill_chunk``) and the caches kept inside the program as
  mutable buffers; ``input_pos`` is the position of ``tokens[0, 0]``.
* constant metadata methods (``get_max_seq_len``, ``get_max_context_len``,
  ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``, ``use_kv_cache``,
  ``enable_dynamic_shape``, ...) read from the checkpoint's config.json and
  generation_config.json.

Steps: check every argument and file (before anything is written), load,
rewrite for the backend, quantize, ``torch.export``, lower, serialize to a
temporary file and rename it into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from gdn_export.quantize import MODES as QUANTIZATIONS
from gdn_export.quantize import quantize_linears

BACKENDS = ("xnnpack", "portable", "cuda", "metal")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_MAX_SEQ_LEN = 4096
DEFAULT_PREFILL_CHUNK = 512


class ExportError(ValueError):
    """Bad arguments or input files for an export; the message names what is wrong."""


@dataclass
class ExportSummary:
    output: Path
    size_bytes: int
    methods: list
    delegated_nodes: int
    total_nodes: int
    seconds: float
    data_files: list = field(default_factory=list)

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0

    def describe(self) -> str:
        lines = [
            f"wrote {self.output} ({self.size_bytes / 2**20:.1f} MiB) in {self.seconds:.1f} s",
            f"  methods: {', '.join(self.methods)}",
            f"  delegated: {self.delegated_nodes} of {self.total_nodes} operator nodes "
            f"({100 * self.delegated_share:.0f}%)",
        ]
        lines += [f"  data file: {path}" for path in self.data_files]
        return "\n".join(lines)


@dataclass(frozen=True)
class ExportRequest:
    """Validated arguments of one export."""

    checkpoint: Path
    output: Path
    backend: str
    dtype: torch.dtype
    max_seq_len: int
    quantize: str
    prefill_chunk: int


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path}: not a readable JSON file ({error})") from None


def check_request(
    checkpoint, output, *, backend, dtype, max_seq_len, quantize, prefill_chunk
) -> ExportRequest:
    """Every argument and input file checked before anything is loaded or written."""
    if backend not in BACKENDS:
        raise ExportError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    if quantize == "8da4w" and backend != "xnnpack":
        raise ExportError(f"--quantize 8da4w needs --backend xnnpack (its kernels), got --backend {backend}")
    if quantize != "none" and backend in ("cuda", "metal"):
        raise ExportError(f"--quantize {quantize} is for the CPU backends, got --backend {backend}")
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ExportError(f"--max-seq-len must be an integer >= 2, got {max_seq_len!r}")
    if prefill_chunk is None:
        prefill_chunk = min(DEFAULT_PREFILL_CHUNK, max_seq_len)
    if not isinstance(prefill_chunk, int) or not 1 <= prefill_chunk <= max_seq_len:
        raise ExportError(
            f"--prefill-chunk must be an integer from 1 to --max-seq-len ({max_seq_len}), got {prefill_chunk!r}"
        )

    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise ExportError(f"--checkpoint {checkpoint}: no such folder")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise ExportError(f"--checkpoint {checkpoint}: missing config.json")
    config = _read_json(config_path)
    model_type = config.get("model_type")
    if model_type not in ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"):
        raise ExportError(
            f"{config_path}: model_type {model_type!r} is not a Qwen3.5 model "
            "(expected qwen3_5, qwen3_5_moe or their _text forms)"
        )
    if not any((checkpoint / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise ExportError(
            f"--checkpoint {checkpoint}: missing weights (model.safetensors or model.safetensors.index.json)"
        )
    if not (checkpoint / "tokenizer.json").is_file():
        raise ExportError(f"--checkpoint {checkpoint}: missing tokenizer.json (the runners need it)")

    output = Path(output)
    if output.suffix != ".pte":
        raise ExportError(f"--output must name a .pte file, got {output}")
    if output.is_dir():
        raise ExportError(f"--output {output} is a folder, expected a .pte file path")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"--output {output}: folder {parent} does not exist")
    try:  # a probe, since permission bits don't tell (root, read-only mounts, /proc)
        descriptor, probe = tempfile.mkstemp(dir=parent, prefix=f".{output.name}.", suffix=".probe")
    except OSError as error:
        raise ExportError(f"--output {output}: folder {parent} is not writable ({error.strerror})") from None
    os.close(descriptor)
    os.unlink(probe)
    _check_backend_machine(backend)
    return ExportRequest(checkpoint, output, backend, DTYPES[dtype], max_seq_len, quantize, prefill_chunk)


def _check_backend_machine(backend: str) -> None:
    """The GPU backends compile for the local GPU: say what is missing before the model is loaded."""
    if backend == "cuda":
        from cuda_backend.lowering import CudaLoweringError, check_lowering_prerequisites

        try:
            check_lowering_prerequisites()
        except CudaLoweringError as error:
            raise ExportError(str(error)) from None
    elif backend == "metal":
        from metal_backend.lowering import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise ExportError(
                f"--backend metal lowers only on macOS with Xcode and an Apple-silicon GPU: {reason}. "
                "Export with --backend xnnpack or portable here, or run this export on a Mac."
            )


def _token_ids(checkpoint: Path, config: dict) -> tuple[Optional[int], list]:
    """(bos id, eos ids) from generation_config.json, falling back to config.json."""
    sources = [config, config.get("text_config", {})]
    generation_config = checkpoint / "generation_config.json"
    if generation_config.is_file():
        sources.insert(0, _read_json(generation_config))
    bos = next((s["bos_token_id"] for s in sources if s.get("bos_token_id") is not None), None)
    eos = next((s["eos_token_id"] for s in sources if s.get("eos_token_id") is not None), [])
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    return bos, eos_ids


def program_metadata(request: ExportRequest, model) -> dict:
    """The constant methods ExecuTorch's LLM runners read."""
    config = _read_json(request.checkpoint / "config.json")
    bos, eos_ids = _token_ids(request.checkpoint, config)
    metadata = {
        "get_max_seq_len": request.prefill_chunk,
        "get_max_context_len": request.max_seq_len,
        "get_vocab_size": model.config.vocab_size,
        "get_n_layers": model.config.num_hidden_layers,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
        "get_eos_ids": eos_ids,
    }
    if bos is not None:
        metadata["get_bos_id"] = bos
    return metadata


def export_program(model, request: ExportRequest) -> torch.export.ExportedProgram:
    """``torch.export`` of ``forward(tokens, input_pos)`` with T dynamic up to the prefill chunk."""
    tokens = torch.zeros(1, min(2, request.prefill_chunk), dtype=torch.long)
    input_pos = torch.zeros(1, dtype=torch.long)
    if request.prefill_chunk > 1:
        length = torch.export.Dim("token_dim", min=1, max=request.prefill_chunk)
        dynamic_shapes = ({1: length}, None)
    else:
        dynamic_shapes = None
    with torch.no_grad():
        return torch.export.export(model, (tokens, input_pos), dynamic_shapes=dynamic_shapes, strict=False)


def lower(program: torch.export.ExportedProgram, request: ExportRequest, metadata: dict):
    """Edge program lowered for the backend (an ExecutorchProgramManager)."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    if request.backend == "cuda":
        from cuda_backend.lowering import lower_to_cuda

        return lower_to_cuda(program, metadata=metadata)
    if request.backend == "metal":
        from metal_backend.lowering import lower_to_metal

        return lower_to_metal(program, metadata=metadata)

    compile_config = EdgeCompileConfig(_check_ir_validity=False)
    if request.backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(
            program, partitioner=[XnnpackPartitioner()], compile_config=compile_config,
            constant_methods=metadata,
        )
    else:
        edge = to_edge(program, compile_config=compile_config, constant_methods=metadata)
    backend_config = ExecutorchBackendConfig(
        extract_delegate_segments=True,
        do_quant_fusion_and_const_prop=True,
        # Graph inputs are the caller's tensors: don't plan memory for them.
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
        run_reinplace_pass=True,
    )
    return edge.to_executorch(backend_config)


def count_delegated_nodes(manager) -> tuple[int, int]:
    """(operator nodes inside delegates, all operator nodes) of the lowered forward (or prefill) graph."""
    method = next(name for name in ("forward", "prefill", "decode") if name in manager.methods)
    graph_module = manager.exported_program(method).graph_module
    delegated = total = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        if "executorch_call_delegate" in str(node.target):
            lowered = getattr(graph_module, node.args[0].target)
            inner = sum(n.op == "call_function" for n in lowered.original_module.graph.nodes)
            delegated += inner
            total += inner
        elif "getitem" not in str(node.target):
            total += 1
    return delegated, total


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


def export_qwen35(
    checkpoint,
    output,
    *,
    backend: str = "xnnpack",
    dtype: str = "fp32",
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    quantize: str = "none",
    prefill_chunk: Optional[int] = None,
    progress: Callable[[str], None] = lambda message: None,
) -> ExportSummary:
    """Export the Qwen3.5 checkpoint folder ``checkpoint`` to the program ``output`` (.pte).

    ``progress`` receives one line per long step. Raises ``ExportError`` (or the
    loader's ``CheckpointError``) for bad arguments and files before anything is
    written; ``output`` appears only once it is complete.
    """
    from gdn_export.loading import load_qwen35
    from gdn_export.passes import rewrite

    started = time.perf_counter()
    request = check_request(
        checkpoint, output, backend=backend, dtype=dtype, max_seq_len=max_seq_len,
        quantize=quantize, prefill_chunk=prefill_chunk,
    )

    def step(message: str) -> None:
        progress(f"[{time.perf_counter() - started:6.1f} s] {message}")

    step(f"loading {request.checkpoint}")
    model = load_qwen35(request.checkpoint, dtype=request.dtype, max_seq_len=request.max_seq_len)
    model.all_logits = False  # the runners sample from the last position only
    rewrite(model, backend=request.backend)
    metadata = program_metadata(request, model)
    if request.quantize != "none":
        step(f"quantizing linear layers ({request.quantize})")
        quantize_linears(model, request.quantize)
    if request.backend == "cuda":  # decode and prefill methods, sharing the state buffers
        from cuda_backend.lowering import export_methods

        step(f"exporting decode(tokens[1, 1]) and prefill(tokens[1, 2..{request.prefill_chunk}])")
        program = export_methods(model, request.prefill_chunk)
    else:
        step(f"exporting forward(tokens[1, 1..{request.prefill_chunk}], input_pos[1])")
        program = export_program(model, request)
    step(f"lowering for {request.backend}")
    manager = lower(program, request, metadata)
    step(f"serializing to {request.output}")
    data_files = write_program(manager, request.output)
    delegated, total = count_delegated_nodes(manager)
    return ExportSummary(
        output=request.output,
        size_bytes=request.output.stat().st_size,
        methods=sorted(manager.methods) + sorted(manager.config_methods),
        delegated_nodes=delegated,
        total_nodes=total,
        seconds=time.perf_counter() - started,
        data_files=data_files,
    )
