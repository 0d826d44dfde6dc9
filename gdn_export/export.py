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

A backend may export other methods (``Backend.export_methods``). Steps: check
every argument, file and the machine (before anything is loaded or written),
load (quantizing each layer as it is read), rewrite for the backend, ``torch.export``, lower (the backend,
through ``gdn_export.lowering``), write the files into place atomically.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from gdn_export.backends import Backend, backend_names, default_backend, get_backend
from gdn_export.checkpoint import Checkpoint, read_checkpoint
from gdn_export.lowering import reporting_stages, return_freed_memory, weights_freed_when_serialized, write_program
from gdn_export.ops.conv_recurrence import STATE_DTYPES as CONV_OP_STATE_DTYPES
from gdn_export.quantize import MODES as QUANTIZATIONS
from gdn_export.quantize import Quantizer, share_tied_vocabulary
from gdn_export.state_methods import STATE_METHODS, state_metadata

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# --state-dtype: the Gated DeltaNet layers' recurrent state. float16 halves the bytes a decode step reads and
# writes of it (gdn_export/ops/conv_recurrence.py); a backend lists what its kernels take (Backend.state_dtypes).
STATE_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in CONV_OP_STATE_DTYPES}
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

    checkpoint: Checkpoint
    output: Path
    backend: Backend
    dtype: torch.dtype
    max_seq_len: int
    quantize: str
    prefill_chunk: int
    state_dtype: torch.dtype = torch.float32


def _check_backend(name: str, quantize: str) -> Backend:
    names = backend_names()
    if name not in names:
        raise ExportError(f"--backend must be one of {', '.join(names)}, got {name!r}")
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    backend = get_backend(name)
    if quantize not in backend.quantizations:
        takers = [other for other in names if quantize in get_backend(other).quantizations]
        raise ExportError(
            f"--quantize {quantize} needs --backend {' or '.join(takers)} (its kernels), got --backend {name}"
        )
    return backend


def _check_output(output) -> Path:
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
    return output


def _check_state_dtype(state_dtype, backend: Backend, dtype: str, quantize: str) -> str:
    """--state-dtype checked against the backend and --dtype; None: float16 for a quantized program whose backend
    takes it (a decode step's state traffic halved, for a KL change far below the quantization's), else float32."""
    if state_dtype is None:
        takes_half = "float16" in backend.state_dtypes and dtype == "fp32"
        return "float16" if takes_half and quantize != "none" else "float32"
    if state_dtype not in STATE_DTYPES:
        raise ExportError(f"--state-dtype must be one of {', '.join(STATE_DTYPES)}, got {state_dtype!r}")
    if state_dtype not in backend.state_dtypes:
        takers = [name for name in backend_names() if state_dtype in get_backend(name).state_dtypes]
        raise ExportError(f"--state-dtype {state_dtype} needs --backend {' or '.join(takers)} (its kernels), got "
                          f"--backend {backend.name}")
    if state_dtype != "float32" and dtype != "fp32":
        raise ExportError(f"--state-dtype {state_dtype} needs --dtype fp32 (the kernel that keeps it), got "
                          f"--dtype {dtype}")
    return state_dtype


def check_request(
    checkpoint, output, *, backend, dtype, max_seq_len, quantize, prefill_chunk, state_dtype=None
) -> ExportRequest:
    """Every argument and input file checked before anything is loaded or written.

    Raises ExportError for arguments and the machine, CheckpointError for the checkpoint.
    """
    chosen = _check_backend(backend, quantize)
    if dtype is None:
        dtype = chosen.default_dtype
    if dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    state_dtype = _check_state_dtype(state_dtype, chosen, dtype, quantize)
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ExportError(f"--max-seq-len must be an integer >= 2, got {max_seq_len!r}")
    if prefill_chunk is None:
        prefill_chunk = min(DEFAULT_PREFILL_CHUNK, max_seq_len)
    if not isinstance(prefill_chunk, int) or not 1 <= prefill_chunk <= max_seq_len:
        raise ExportError(
            f"--prefill-chunk must be an integer from 1 to --max-seq-len ({max_seq_len}), got {prefill_chunk!r}"
        )
    if not Path(checkpoint).is_dir():
        raise ExportError(f"--checkpoint {checkpoint}: no such folder")
    read = read_checkpoint(checkpoint)
    if read.tokenizer_file is None:
        raise ExportError(f"--checkpoint {read.folder}: missing tokenizer.json (the runners need it)")
    reason = chosen.unavailable_reason()
    if reason is not None:
        raise ExportError(reason)
    for field_name in ("linear_key_head_dim", "linear_value_head_dim"):
        value = getattr(read.config, field_name)
        if chosen.head_dims is not None and value not in chosen.head_dims:
            raise ExportError(
                f"{read.config_file}: {field_name} {value} is not covered by --backend {chosen.name}'s "
                f"kernels (they take {', '.join(map(str, chosen.head_dims))}); export with another --backend"
            )
    output = _check_output(output)
    return ExportRequest(read, output, chosen, DTYPES[dtype], max_seq_len, quantize, prefill_chunk,
                         STATE_DTYPES[state_dtype])


# Python's cyclic collector while exporting: a young generation of 50,000 objects instead of 700 (see below).
EXPORT_GC_THRESHOLDS = (50_000, 20, 100)


@contextlib.contextmanager
def collections_sized_for_graphs() -> Iterator[None]:
    """While open, Python's cyclic collector runs with ``EXPORT_GC_THRESHOLDS``.

    Tracing and lowering a program make and drop about a million small objects that
    refer to each other (graph nodes, fake tensors, symbolic sizes). With Python's
    default thresholds the collector ran 9,978 times during the 0.8B 8da4w export,
    25 of them over every object alive, 16.6 s of its 120 s; with these, 630 times
    (3 full) and 4.7 s, at the same peak RSS within 2% (docs/benchmarks.md)."""
    before = gc.get_threshold()
    gc.set_threshold(*EXPORT_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def count_delegated_nodes(manager) -> tuple[int, int]:
    """(operator nodes inside delegates, all operator nodes) of every lowered method's graph."""
    delegated = total = 0
    for method in manager.methods:
        graph_module = manager.exported_program(method).graph_module
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


def export_qwen35(
    checkpoint,
    output,
    *,
    backend: Optional[str] = None,
    dtype: Optional[str] = None,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    quantize: str = "none",
    prefill_chunk: Optional[int] = None,
    progress: Callable[[str], None] = lambda message: None,
    state_dtype: Optional[str] = None,
) -> ExportSummary:
    """Export the Qwen3.5 checkpoint folder ``checkpoint`` to the program ``output`` (.pte).

    ``backend`` is a registered backend's name (``gdn_export.backends``; None:
    the default, XNNPACK); ``dtype`` None is the backend's default; ``state_dtype``
    (``STATE_DTYPES``) None is float16 for a quantized program on a backend that takes it, else float32.
    ``progress`` receives one line as each long stage begins (loading,
    quantization, ``torch.export``, to_edge and partition, to_executorch,
    writing), headed by the seconds since the call began.
    Raises ``ExportError`` or ``CheckpointError`` for bad arguments, files or
    machine before anything is written; ``output`` appears only once complete.
    """
    from gdn_export import loading
    from gdn_export.passes import keep_recurrent_states_in, rewrite

    started = time.perf_counter()
    request = check_request(
        checkpoint, output, backend=backend or default_backend(), dtype=dtype, max_seq_len=max_seq_len,
        quantize=quantize, prefill_chunk=prefill_chunk, state_dtype=state_dtype,
    )

    def step(message: str) -> None:
        return_freed_memory()
        progress(f"[{time.perf_counter() - started:6.1f} s] {message}")

    with collections_sized_for_graphs():
        metadata = request.checkpoint.program_metadata(max_seq_len=request.max_seq_len,
                                                       prefill_chunk=request.prefill_chunk)
        quantizing = f", quantizing each layer as it is read ({request.quantize})" if request.quantize != "none" else ""
        step(f"loading {request.checkpoint.folder}{quantizing}")
        quantizer = None if request.quantize == "none" else Quantizer(request.quantize)
        model = loading.load_model(request.checkpoint, dtype=request.dtype, max_seq_len=request.max_seq_len,
                                   transform=quantizer)
        share_tied_vocabulary(model)  # a tied 8-bit table and head: held once from here on
        model.all_logits = False  # the runners sample from the last position only
        rewrite(model, backend=request.backend.name)
        keep_recurrent_states_in(model, request.state_dtype)
        step(f"exporting (tokens up to {request.prefill_chunk} a call)")
        programs = request.backend.export_methods(model, request.prefill_chunk)
        if set(STATE_METHODS) <= set(programs):
            step("fingerprinting the program's state (config, weights, options)")
            options = dict(backend=request.backend.name, dtype=str(request.dtype), max_seq_len=request.max_seq_len,
                           quantize=request.quantize, prefill_chunk=request.prefill_chunk)
            metadata.update(state_metadata(request.checkpoint, model, options))
        step(f"lowering for {request.backend.name}")
        # The model and its programs are this call's alone: the lowering may free each weight once its delegate
        # has serialized its own copy (gdn_export.lowering.weights_freed_when_serialized).
        with reporting_stages(lambda stage: step(f"lowering: {stage}")), weights_freed_when_serialized():
            manager = request.backend.lower(programs, metadata)
        step(f"writing {request.output}")
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
