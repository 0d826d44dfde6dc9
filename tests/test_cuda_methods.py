"""The CUDA program's two methods (``decode``, ``prefill``) and ExecuTorch's CUDA runtime around them.

Without a GPU: ``CudaTritonBackend.export_methods`` is traced on the CPU (the triton_ops through
their fake implementations), and the exported programs run in a child under
Triton's interpreter, sharing one set of state buffers as the CUDA runtime
shares them, against the reference model (the per-token Python recurrence).
The runtime's loader, its matching lowering and the source folder are checked
with stand-ins; the runtime itself needs a GPU (``run_on_device.sh e2e``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch

pytest.importorskip("triton")  # the CUDA rewrite's ops are triton_ops

from tests.triton_interpreter import INTERPRETED, REPO_ROOT, rerun_module, run_under_triton_interpreter  # noqa: E402

if INTERPRETED:  # torch.export cannot trace the interpreter's kernels: rerun without it

    def test_method_tests_without_the_interpreter():
        rerun_module(__file__, interpret=False)


directly = pytest.mark.skipif(INTERPRETED, reason="rerun without TRITON_INTERPRET by the test above")

from cuda_backend import executorch_runtime  # noqa: E402
from cuda_backend.backend import CUDA  # noqa: E402
from cuda_backend.lowering import cuda_decompositions  # noqa: E402

PREFILL_CHUNK = 8
MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, module_seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), key_head_dim=64, value_head_dim=64, seed=module_seed)


def _cuda_model(checkpoint, dtype=torch.float32):
    from gdn_export.loading import load_qwen35
    from gdn_export.passes import rewrite

    model = rewrite(load_qwen35(checkpoint, dtype=dtype, max_seq_len=MAX_SEQ_LEN), "cuda")
    model.all_logits = False  # as export_qwen35 exports it
    return model


@pytest.fixture(scope="module")
def methods(checkpoint):
    return CUDA.export_methods(_cuda_model(checkpoint), PREFILL_CHUNK)


def _gdn_ops(program) -> list[str]:
    return [str(node.target) for node in program.graph.nodes if "gdn" in str(node.target)]


@pytest.fixture(scope="module")
def decomposed(methods):
    """What lower_to_cuda hands to CudaBackend: the gdn_cuda ops as their Triton kernel launches,
    and the graph functionalized (state updates as buffer mutations)."""
    return {name: program.run_decompositions(cuda_decompositions(), decompose_custom_triton_ops=True)
            for name, program in methods.items()}


def _triton_kernels(decomposed) -> set[str]:
    """The Triton kernels a decomposed program launches."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    names = set()
    for node in decomposed.graph.nodes:
        if "triton_kernel_wrapper" in str(node.target):
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            names.add(getattr(kernel, "fn", kernel).__name__)
    return names


@directly
def test_every_kernel_the_programs_launch_compiles_for_the_h100(decomposed):
    """Triton's front end (source to TTIR) on each launch in the decomposed programs, with its arguments and
    constants, for an sm_90 target: no GPU needed. Triton's interpreter runs Python and misses what only the
    compiler refuses (a prefill kernel once reused a [BLOCK_T] mask's name for a [TAPS] one inside an ``if``,
    and the first export on the H100 failed)."""
    import triton
    from torch._higher_order_ops.triton_kernel_wrap import generate_ttir, kernel_side_table
    from triton.backends.compiler import GPUTarget

    class H100:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    compiled, failed = set(), {}
    triton.runtime.driver.set_active(H100())
    try:
        for name, program in decomposed.items():
            for node in program.graph.nodes:
                if "triton_kernel_wrapper" not in str(node.target):
                    continue
                kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
                arguments = {key: value.meta["val"] if isinstance(value, torch.fx.Node) else value
                             for key, value in node.kwargs["kwargs"].items()}
                arguments.update(kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"]))
                kernel_name = getattr(kernel, "fn", kernel).__name__
                try:
                    generate_ttir(kernel, arguments, {})
                    compiled.add(kernel_name)
                except Exception as error:  # noqa: BLE001  (every kernel's verdict, then one assertion)
                    failed[f"{name}: {kernel_name}"] = str(error)[:400]
    finally:
        triton.runtime.driver._active = None
    assert not failed, failed
    assert compiled == _triton_kernels(decomposed["decode"]) | _triton_kernels(decomposed["prefill"]), compiled


def _decode_linear_arguments(node) -> dict:
    names = ("x", "weight", "bias", "norm_weight", "eps", "gated", "residual", "gate", "gate_start", "head_dim",
             "gate_head_stride", "sigmoid_gate")
    return dict(zip(names, node.args), **node.kwargs)


def _decode_linear_form(node) -> str:
    """Which input a gdn_cuda::decode_linear call takes: silu-gated, RMSNormed in its kernel, Gated DeltaNet's
    gated per-head RMSNorm in its kernel ("head-normed"), attention's per-head sigmoid gate in its kernel
    ("head-gated"), or plain."""
    arguments = _decode_linear_arguments(node)
    if arguments.get("head_dim"):
        return "head-gated" if arguments.get("sigmoid_gate") else "head-normed"
    return "gated" if arguments.get("gated") else "normed" if arguments.get("norm_weight") is not None else "plain"


@directly
def test_decode_holds_the_per_token_kernel_and_prefill_the_chunked_ones(checkpoint, methods, decomposed):
    assert sorted(methods) == ["decode", "prefill"]
    # The tiny model's layers: linear, linear, full attention.
    # Decode's Gated DeltaNet layers: one op from their projection on (conv, gates, recurrence).
    # Prefill's: one op from their projection on (conv and gates in one kernel, then the chunked ones).
    recurrent, chunked = "gdn_cuda.decode_gated_delta_net.default", "gdn_cuda.prefill_gated_delta_net.default"
    attention, linear = "gdn_cuda.cached_attention.default", "gdn_cuda.decode_linear.default"
    attention_inputs = "gdn_cuda.decode_attention_inputs.default"
    decode_ops, prefill_ops = _gdn_ops(methods["decode"]), _gdn_ops(methods["prefill"])
    # Decode's attention layer: one op from its projection to its query (norms, rotary, cache writes).
    assert [op for op in decode_ops if op != linear] == [recurrent, recurrent, attention_inputs, attention]
    assert [op for op in prefill_ops if op != linear] == [chunked, chunked, attention]
    for method in ("decode", "prefill"):
        convolutions = [node.name for node in methods[method].graph.nodes
                        if node.op == "call_function" and "conv" in str(node.target)]
        assert not convolutions, (method, convolutions)
    # Decode takes every linear layer through the matrix-vector kernel: each layer's two normed inputs (the
    # mixer's merged projections, the MLP's gate/up) with the norm inside, the MLP's down projection with its
    # silu-gated input, each Gated DeltaNet output projection with the gated per-head norm inside and the
    # attention's with its sigmoid gate; prefill only the output layer, which sees the last position alone.
    model = _cuda_model(checkpoint)
    linears = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    layers, linear_layers = 3, 2
    forms = [_decode_linear_form(node) for node in methods["decode"].graph.nodes
             if str(node.target) == linear]
    assert (forms.count("plain"), forms.count("gated"), forms.count("normed"), forms.count("head-normed"),
            forms.count("head-gated")) == (linears - 4 * layers, layers, 2 * layers, linear_layers,
                                           layers - linear_layers)
    # No silu(z) of a gated norm, sigmoid of attention's gate, rotate_half of the rotary embedding or cache
    # write outside the kernels (cos and sin, once a step, are the model's), and no RMSNorm but the model's last.
    outside = [node.name for node in methods["decode"].graph.nodes if str(node.target) in (
        "aten.silu.default", "aten.sigmoid.default", "aten.neg.default", "aten.index_put_.default",
        "aten.index_put.default")]
    assert not outside, outside
    norms = [node.name for node in methods["decode"].graph.nodes if str(node.target) == "aten.rsqrt.default"]
    assert len(norms) == 1, norms
    # Each layer's two residual adds happen in the products that end its mixer (head-normed, plain for
    # attention) and its MLP (gated): the residual they take is the layer's input, and the decode method has no
    # other add of hidden vectors.
    with_residual = [(_decode_linear_form(node), _decode_linear_arguments(node)["residual"].meta["val"].shape)
                     for node in methods["decode"].graph.nodes
                     if str(node.target) == linear and _decode_linear_arguments(node).get("residual") is not None]
    hidden = torch.Size([1, 1, model.config.hidden_size])
    assert sorted(with_residual) == sorted([("head-normed", hidden)] * linear_layers + [("head-gated", hidden)]
                                           + [("gated", hidden)] * layers), with_residual
    adds = [node for node in methods["decode"].graph.nodes if str(node.target) == "aten.add.Tensor"
            and node.meta["val"].shape == hidden]
    assert not adds, [node.name for node in adds]
    assert prefill_ops.count(linear) == 1 and _decode_linear_form(next(
        node for node in methods["prefill"].graph.nodes if str(node.target) == linear)) == "plain"
    decode_kernels, prefill_kernels = _triton_kernels(decomposed["decode"]), _triton_kernels(decomposed["prefill"])
    # Decode splits the cache between programs and merges their spans; prefill walks it in one pass.
    assert decode_kernels == {"decode_convolution_kernel", "recurrent_gated_delta_rule_kernel",
                              "decode_attention_inputs_kernel", "cached_attention_kernel", "merge_spans_kernel",
                              "decode_linear_kernel"}, decode_kernels
    assert {"prefill_convolution_kernel", "chunk_prepare_kernel", "chunk_state_kernel",
            "cached_attention_kernel"} <= prefill_kernels, \
        prefill_kernels
    assert not {"recurrent_gated_delta_rule_kernel", "merge_spans_kernel"} & prefill_kernels


# Each kernel's tensor arguments and the stride arguments it reads them through (cuda_backend/kernels).
PACKED_HEAD_DIMS = {"q_ptr": "DK", "k_ptr": "DK", "v_ptr": "DV"}
KERNEL_STRIDES = {"q_ptr": "sq", "k_ptr": "sk", "v_ptr": "sv", "g_ptr": "sg", "beta_ptr": "sbeta",
                  "state_in_ptr": "ss", "state_out_ptr": "ss", "out_ptr": "so", "part_ptr": "sp", "lse_ptr": "sl",
                  "w_ptr": "sw", "k_cache_ptr": "skc", "v_cache_ptr": "svc", "projected_ptr": "sproj"}


def _value(argument):
    value = argument.meta["val"] if isinstance(argument, torch.fx.Node) else argument
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)


@directly
def test_kernels_in_the_lowered_programs_read_their_inputs_through_the_inputs_strides(decomposed):
    """In the edge programs CudaBackend compiles, every view is a copy (slice_copy, view_copy): a
    kernel launch must be given the strides of the dense tensor it receives there, not those of the
    view it was traced with. (It once was, and the CUDA prefill read q/k/v at the wrong elements.)"""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    # As gdn_export.lowering.lower_programs makes them for lower_to_cuda (skip_dim_order=True).
    edge = to_edge_transform_and_lower(
        dict(decomposed), compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True))
    checked = 0
    for name in ("decode", "prefill"):
        for node in edge.exported_program(name).graph.nodes:
            if "triton_kernel_wrapper" not in str(node.target):
                continue
            arguments = node.kwargs["kwargs"]
            for tensor_name, prefix in KERNEL_STRIDES.items():
                tensor = arguments.get(tensor_name)
                strides = [value for key, value in arguments.items() if key.startswith(prefix + "_")]
                if not isinstance(tensor, torch.fx.Node) or not strides:
                    continue
                fake = tensor.meta["val"]
                expected = list(fake.stride())
                if tensor_name in PACKED_HEAD_DIMS and fake.dim() == 3 and len(strides) == 4:
                    # The decode kernel reads q/k/v [B, T, H, D] in place from mixed_qkv [B, T, C]:
                    # a head is D channels, and the dims split from C are never size 1 here.
                    head_dim = _value(arguments[PACKED_HEAD_DIMS[tensor_name]])
                    fake = fake.view(*fake.shape[:2], -1, int(head_dim))
                    expected = expected[:2] + [head_dim * expected[2], expected[2]]
                for dim, (size, stride) in enumerate(zip(fake.shape, expected)):
                    if size == 1:  # never stepped along
                        continue
                    baked = _value(strides[dim])
                    assert sympy.simplify(baked - _value(stride)) == 0, (
                        f"{name}: {tensor_name} dim {dim} (size {size}) is read with stride {baked}, "
                        f"the tensor's is {stride} (from {tensor.target})")
                    checked += 1
    assert checked >= 20, checked


@directly
def test_prefill_reads_every_weight_in_place_not_through_a_transposed_copy(checkpoint, decomposed):
    """The prefill's products reach CudaBackend as ``aten.linear`` of the weight itself. Decomposed into
    ``mm`` of its transpose, ``to_edge`` made that a ``permute_copy``, and AOTInductor copied every weight on
    every prefill call (a sixth of the 4B's 2048-token prefill on the H100)."""
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    class Partitioned(Exception):
        """Stops the lowering where CudaPartitioner gets the edge program (compiling it needs the GPU)."""

    class SeesWhatCudaBackendGets(CudaPartitioner):
        def partition(self, program):
            raise Partitioned(program)

    with pytest.raises(Partitioned) as stopped:
        to_edge_transform_and_lower(
            {"prefill": decomposed["prefill"]}, partitioner=[SeesWhatCudaBackendGets([])],
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True))
    edge = stopped.value.args[0]
    parameters = edge.graph_signature.inputs_to_parameters
    transposed = [node.name for node in edge.graph.nodes if node.op == "call_function" and node.args
                  and isinstance(node.args[0], torch.fx.Node) and node.args[0].name in parameters
                  and "permute" in str(node.target)]
    assert not transposed, transposed
    read = {parameters[node.args[1].name] for node in edge.graph.nodes if "aten.linear" in str(node.target)}
    # Every linear layer's weight but the output layer's, which sees the last position alone (decode_linear).
    model = _cuda_model(checkpoint)
    expected = {f"{name}.weight" for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and name != "lm_head"}
    assert read == expected, sorted(read ^ expected)


@directly
def test_prefill_takes_two_to_prefill_chunk_tokens(methods):
    decode_tokens = methods["decode"].graph_signature.user_inputs[0]
    shapes = {node.name: node.meta["val"].shape for node in methods["decode"].graph.nodes if node.op == "placeholder"}
    assert list(shapes[decode_tokens]) == [1, 1]
    prefill = methods["prefill"]
    tokens = next(node for node in prefill.graph.nodes if node.name == prefill.graph_signature.user_inputs[0])
    length = tokens.meta["val"].shape[1]
    assert isinstance(length, torch.SymInt)
    bounds = prefill.range_constraints[length.node.expr]
    assert (int(bounds.lower), int(bounds.upper)) == (2, PREFILL_CHUNK)


@directly
def test_both_methods_update_the_same_state_buffers(checkpoint, decomposed):
    model = _cuda_model(checkpoint)
    states = {name for name, _ in model.named_buffers()}
    assert any(name.endswith("recurrent_state") for name in states) and any(name.endswith("k_cache") for name in states)
    for name, program in decomposed.items():
        mutated = set(program.graph_signature.buffers_to_mutate.values())
        assert mutated == states, f"{name} mutates {sorted(mutated)}, the model's states are {sorted(states)}"


@directly
def test_bf16_methods_keep_the_recurrent_state_fp32(checkpoint):
    program = CUDA.export_methods(_cuda_model(checkpoint, torch.bfloat16), 4)["decode"]
    dtypes = {name: tensor.dtype for name, tensor in program.state_dict.items()}
    dtypes.update({name: tensor.dtype for name, tensor in program.constants.items()})
    assert {dtype for name, dtype in dtypes.items() if name.endswith("recurrent_state")} == {torch.float32}
    assert dtypes["lm_head.weight"] == torch.bfloat16 and dtypes["layers.2.self_attn.k_cache"] == torch.bfloat16


@directly
def test_prefill_chunk_of_one_exports_decode_alone(checkpoint):
    assert sorted(CUDA.export_methods(_cuda_model(checkpoint), 1)) == ["decode"]


# In a child under Triton's interpreter: both programs with ONE set of state buffers (the CUDA
# runtime shares them by name between the methods), against the reference model, call by call.
RUN_METHODS = """
import json, sys, torch
import cuda_backend  # defines the gdn_cuda ops the programs call
from gdn_export.loading import load_qwen35
decode_path, prefill_path, checkpoint, calls = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
decode, prefill = torch.export.load(decode_path).module(), torch.export.load(prefill_path).module()
for name, buffer in decode.named_buffers():
    buffer.zero_()
    owner, _, leaf = name.rpartition(".")
    prefill.get_submodule(owner)._buffers[leaf] = buffer  # prefill now updates decode's tensors
assert all(a.data_ptr() == b.data_ptr() for a, b in zip(decode.buffers(), prefill.buffers()))
reference = load_qwen35(checkpoint, max_seq_len=int(sys.argv[5]))
reference.all_logits = False
errors = []
with torch.no_grad():
    for tokens, position in calls:
        tokens, position = torch.tensor([tokens]), torch.tensor([position])
        program = decode if tokens.shape[1] == 1 else prefill
        expected, actual = reference(tokens, position), program(tokens, position)
        errors.append(((actual - expected).abs().max() / expected.abs().max()).item())
print(json.dumps(errors))
"""


@directly
def test_decode_and_prefill_programs_continue_each_other_like_the_reference(checkpoint, methods, tmp_path,
                                                                           generator):
    """Prefill, decode steps, a full-size chunk, more decode, then a new sequence at position 0:
    each call's logits are the reference model's (one state, whichever method runs)."""
    paths = {}
    for name, program in methods.items():
        paths[name] = tmp_path / f"{name}.pt2"
        torch.export.save(program, paths[name])
    def tokens(count):
        return torch.randint(0, 300, (count,), generator=generator).tolist()

    calls = [(tokens(7), 0), (tokens(1), 7), (tokens(1), 8), (tokens(PREFILL_CHUNK), 9), (tokens(1), 17),
             (tokens(2), 18), (tokens(3), 0), (tokens(1), 3)]
    output = run_under_triton_interpreter(RUN_METHODS, str(paths["decode"]), str(paths["prefill"]), str(checkpoint),
                                          json.dumps(calls), str(MAX_SEQ_LEN))
    errors = json.loads(output.strip().splitlines()[-1])
    assert len(errors) == len(calls) and max(errors) <= 1e-5, f"relative errors per call {errors}"


# --- ProgramRunner on a two-method program ----------------------------------------------------


class _RecordingMethod:
    def __init__(self, name, calls, vocab):
        self.name, self.calls, self.vocab = name, calls, vocab

    def execute(self, inputs):
        tokens, position = inputs
        self.calls.append((self.name, tokens.shape[1], int(position[0])))
        return [torch.zeros(1, 1, self.vocab)]


def test_runner_feeds_chunks_to_prefill_and_single_tokens_to_decode():
    from gdn_export.runner import ProgramRunner

    calls = []
    runner = ProgramRunner.__new__(ProgramRunner)
    runner.steps = {name: _RecordingMethod(name, calls, 11) for name in ("prefill", "decode")}
    runner.max_chunk, runner.max_context, runner.position = 4, 64, 0
    runner.feed(list(range(9)))
    runner.feed([5])
    assert calls == [("prefill", 4, 0), ("prefill", 4, 4), ("decode", 1, 8), ("decode", 1, 9)]
    calls.clear()
    runner.steps = {"forward": _RecordingMethod("forward", calls, 11)}  # a CPU program: forward for every chunk
    runner.position = 0
    runner.feed(list(range(5)))
    assert calls == [("forward", 4, 0), ("forward", 1, 4)]


# --- the runtime's loader, lowering and source folder ------------------------------------------


def test_missing_runtime_library_is_one_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "libgdn_executorch_cuda.so"
    monkeypatch.setenv(executorch_runtime.ENV_VAR, str(missing))
    monkeypatch.setattr(executorch_runtime, "_loaded", None)
    with pytest.raises(executorch_runtime.CudaRuntimeUnavailable) as error:
        executorch_runtime.load()
    message = str(error.value)
    assert str(missing) in message and "$GDN_CUDA_RUNTIME_LIB" in message and "make cuda-runtime" in message
    assert "\n" not in message


def test_default_runtime_library_is_in_the_build_folder(monkeypatch):
    monkeypatch.delenv(executorch_runtime.ENV_VAR, raising=False)
    assert executorch_runtime.library_path() == REPO_ROOT / "build" / "cuda_runtime" / "libgdn_executorch_cuda.so"


def test_lowering_without_the_built_runtime_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(executorch_runtime.ENV_VAR, str(tmp_path / "libgdn_executorch_cuda.so"))
    monkeypatch.setattr(executorch_runtime, "_finder", None)
    with pytest.raises(executorch_runtime.CudaRuntimeUnavailable, match="no lowering at .*make cuda-runtime"):
        executorch_runtime.use_matching_lowering()
    assert not any(isinstance(finder, executorch_runtime._LoweringFinder) for finder in sys.meta_path)


def test_gemm_choices_add_cublas_for_the_lowering_alone(monkeypatch):
    """CudaBackend compiles with AOTInductor's GEMM choices of $GDN_CUDA_GEMM_BACKENDS (default cuBLAS beside
    the Triton templates), ATen's mm then a supported fallback (the runtime's cuBLAS shim); outside the lowering
    CudaBackend is as ExecuTorch wrote it, and a bad value is refused naming the variable before any export."""
    from executorch.backends.cuda.cuda_backend import CudaBackend

    from cuda_backend.lowering import CudaLoweringError, check_lowering_prerequisites, gemm_backends, gemm_choices

    def choices():
        return (CudaBackend.get_aoti_compile_options([])["max_autotune_gemm_backends"],
                "aoti_torch_cuda_mm_out" in CudaBackend.get_supported_fallback_kernels())

    monkeypatch.delenv("GDN_CUDA_GEMM_BACKENDS", raising=False)
    assert gemm_backends() == "ATEN,TRITON"
    before = choices()
    assert before == ("TRITON", False)
    with gemm_choices(gemm_backends()):
        assert choices() == ("ATEN,TRITON", True)
    monkeypatch.setenv("GDN_CUDA_GEMM_BACKENDS", "triton")
    with gemm_choices(gemm_backends()):
        assert choices() == ("TRITON", False)
    assert choices() == before
    monkeypatch.setenv("GDN_CUDA_GEMM_BACKENDS", "ATEN,CUTLASS")
    with pytest.raises(CudaLoweringError, match=r"GDN_CUDA_GEMM_BACKENDS='ATEN,CUTLASS': expected .*ATEN, TRITON"):
        check_lowering_prerequisites()


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# A child process: the finder changes what `executorch.backends.cuda` is for the whole process.
IMPORT_LOWERING = """
import json, sys
from cuda_backend import executorch_runtime
executorch_runtime.use_matching_lowering()
import executorch.backends.cuda.cuda_backend as backend, executorch.backends.aoti.aoti_backend as aoti
found = {"marker": backend.MARKER, "cuda": backend.__file__, "aoti": aoti.__file__}
try:
    import executorch.backends.cuda.cuda_partitioner  # only in the wheel
    found["wheel"] = "imported"
except ModuleNotFoundError as error:
    found["wheel"] = str(error)
print(json.dumps(found))
"""


def test_lowering_imports_the_runtimes_revision_not_the_wheels(tmp_path):
    build = tmp_path / "cuda_runtime"
    package = build / "python" / "executorch" / "backends"
    _write(package / "cuda" / "__init__.py")
    _write(package / "cuda" / "cuda_backend.py", "MARKER = 'runtime revision'\n")
    _write(package / "aoti" / "aoti_backend.py")  # a folder without __init__.py, as in ExecuTorch
    environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT),
                       **{executorch_runtime.ENV_VAR: str(build / executorch_runtime.LIBRARY_NAME)})
    child = subprocess.run([sys.executable, "-c", IMPORT_LOWERING], cwd=REPO_ROOT, env=environment,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["marker"] == "runtime revision"
    assert found["cuda"].startswith(str(package)) and found["aoti"].startswith(str(package))
    assert "not in the CUDA runtime's lowering" in found["wheel"]


def _git(*arguments, cwd):
    return subprocess.run(["git", *arguments], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_source_folder_is_the_revisions_subfolders_and_build_checks_the_revision(tmp_path):
    repository = tmp_path / "executorch"
    for path in ("backends/cuda/runtime/cuda_backend.cpp", "backends/aoti/aoti_backend.py",
                 "extension/cuda/caller_stream.cpp", "docs/elsewhere.md"):
        _write(repository / path, f"// {path}\n")
    _git("init", "-q", cwd=repository)
    _git("add", ".", cwd=repository)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "source", cwd=repository)
    revision = _git("rev-parse", "HEAD", cwd=repository)

    out = executorch_runtime.make_source(tmp_path / "src", mirror=repository / ".git", revision=revision)
    assert (out / "executorch" / "backends" / "cuda" / "runtime" / "cuda_backend.cpp").is_file()
    assert (out / "executorch" / "extension" / "cuda" / "caller_stream.cpp").is_file()
    assert not (out / "executorch" / "docs").exists()  # only the subfolders the runtime needs
    assert executorch_runtime.source_revision(out) == revision != executorch_runtime.PINNED_REVISION
    with pytest.raises(executorch_runtime.CudaRuntimeUnavailable, match="not the pinned"):
        executorch_runtime.build(out, tmp_path / "build")
    assert not (tmp_path / "build").exists()


def test_build_stamp_follows_what_the_library_is_made_from(tmp_path, monkeypatch):
    """``build`` skips compiling when the stamp matches: the stamp must change with the revision, any
    compile flag and the text of our own sources, and not with the temporary object folder."""
    own = tmp_path / "own.cpp"
    own.write_text("// ours\n")
    monkeypatch.setattr(executorch_runtime, "OWN_SOURCES", (own,))

    def commands(objects, *flags):
        target = tmp_path / objects / "x.o"
        return [(["g++", *flags, "-c", "x.cpp", "-o", str(target)], target)]

    stamp = executorch_runtime._build_stamp(commands("a", "-O2"), "rev", tmp_path)
    assert executorch_runtime._build_stamp(commands("b", "-O2"), "rev", tmp_path) == stamp
    assert executorch_runtime._build_stamp(commands("a", "-O0"), "rev", tmp_path) != stamp
    assert executorch_runtime._build_stamp(commands("a", "-O2"), "other", tmp_path) != stamp
    own.write_text("// ours, edited\n")
    assert executorch_runtime._build_stamp(commands("a", "-O2"), "rev", tmp_path) != stamp


EAGER_LIKE_THE_REFERENCE = """
import json, sys, torch
from gdn_export.loading import load_qwen35
from gdn_export.passes import rewrite
checkpoint, calls = sys.argv[1], json.loads(sys.argv[2])
reference = load_qwen35(checkpoint, max_seq_len=64)
cuda = rewrite(load_qwen35(checkpoint, max_seq_len=64), "cuda")
classes = sorted({type(layer).__name__ for layer in cuda.layers})
mixers = sorted({type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__ for layer in cuda.layers})
errors = []
with torch.no_grad():
    for tokens, position in calls:
        expected = reference(torch.tensor([tokens]), torch.tensor([position]))
        actual = cuda(torch.tensor([tokens]), torch.tensor([position]))
        errors.append(((actual - expected).abs().max() / expected.abs().max()).item())
print(json.dumps([classes, mixers, errors]))
"""


@directly
@pytest.mark.parametrize("options", [dict(moe=True), dict(num_k_heads=2, num_v_heads=6)], ids=["moe", "hv-hk-3"])
def test_cuda_rewrite_runs_like_the_reference_with_moe_and_odd_head_ratios(tmp_path, options, seed):
    """Every CUDA rewrite at once (merged projections, norms and residual adds inside the products, the kernels),
    eager under Triton's interpreter, against the model as loaded: a sparse MoE keeps its norm and its add."""
    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny", key_head_dim=64, value_head_dim=64, seed=seed, **options)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 500, (12,), generator=generator).tolist()
    # The last call starts a new sequence with one token: the decode kernels must forget the conv and
    # recurrent states of the first.
    calls = [(tokens[0:4], 0), (tokens[4:5], 4), (tokens[5:8], 5), (tokens[8:9], 8), (tokens[9:10], 9),
             (tokens[10:11], 0), (tokens[11:12], 1)]
    classes, mixers, errors = json.loads(run_under_triton_interpreter(
        EAGER_LIKE_THE_REFERENCE, str(checkpoint), json.dumps(calls)).strip().splitlines()[-1])
    assert classes == ["ResidualInProducts"], classes
    assert mixers == ["DecodeGatedAttention", "DecodeGatedDeltaNet"], mixers
    assert max(errors) <= 1e-5, f"seed={seed}: relative errors per call {errors}"
