"""The C++ CPU kernel (runtime_ops/): loading, in-place state, bad input, .pte state.

Numerical conformance over the whole case table runs in tests/conformance/
(``runtime-ops-eager``, ``runtime-ops-pte`` inside ExecuTorch programs); these
tests cover what the table does not.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from gdn_export.ops import contract, reference
from gdn_export.ops.conformance import OpCase, make_inputs, relative_error
from runtime_ops import loader
from runtime_ops.build import ATEN_LIBRARY_NAME
from runtime_ops.conformance import export_program


def fresh_inputs(generator, **case_fields):
    case = OpCase(**case_fields)
    return case, make_inputs(case, generator)


def test_cpu_dispatch_runs_the_cpp_kernel():
    assert loader.is_loaded(), f"no C++ kernels at {loader.library_path()}: run python -m runtime_ops.build"
    for op in ("gated_delta_rule", "gated_delta_rule.out", "conv_gated_delta_rule", "conv_gated_delta_rule.out"):
        table = torch._C._dispatch_dump_table(f"gdn::{op}")
        cpu_line = next(line for line in table.splitlines() if line.startswith("CPU:"))
        assert "aten_kernel.cpp" in cpu_line, cpu_line


@pytest.mark.parametrize("length", [1, 40])  # token by token, and the chunked form
@pytest.mark.parametrize("gate", ["scalar", "per_channel"])
def test_out_in_place_matches_functional(length, gate, generator):
    case, inputs = fresh_inputs(generator, length=length, gate=gate)
    args = inputs.as_args()
    expected_output, expected_state = torch.ops.gdn.gated_delta_rule(*args[:5], args[5], use_qk_l2norm=True)
    state = args[5].clone()
    output = torch.full_like(args[2], float("nan"))
    result = torch.ops.gdn.gated_delta_rule.out(
        *args[:5], state, use_qk_l2norm=True, output=output, final_state=state
    )
    assert result[1].data_ptr() == state.data_ptr()
    assert torch.equal(output, expected_output)
    assert torch.equal(state, expected_state)
    reference_output, reference_state = reference.recurrent_gated_delta_rule(
        *[t.double() for t in args], use_qk_l2norm=True
    )
    assert relative_error(output, reference_output) <= case.tolerance
    assert relative_error(state, reference_state) <= case.tolerance


@pytest.mark.parametrize("length", [1, 3, 40])  # token by token, and the chunked form
@pytest.mark.parametrize("gate", ["scalar", "per_channel"])
@pytest.mark.parametrize("key_dim, value_dim", [(5, 7), (20, 150)])
def test_head_dims_off_the_vector_width(length, gate, key_dim, value_dim, generator):
    """Dv not a multiple of the vector width: the decode passes' leftover columns, the chunked form's padded states."""
    case, inputs = fresh_inputs(
        generator, length=length, gate=gate, key_dim=key_dim, value_dim=value_dim, num_k_heads=2, num_v_heads=6
    )
    args = inputs.as_args()
    output, final_state = torch.ops.gdn.gated_delta_rule(*args[:5], args[5], use_qk_l2norm=True)
    reference_output, reference_state = reference.recurrent_gated_delta_rule(
        *[t.double() for t in args], use_qk_l2norm=True
    )
    assert relative_error(output, reference_output) <= case.tolerance
    assert relative_error(final_state, reference_state) <= case.tolerance
    state = args[5].clone()
    in_place_output = torch.empty_like(args[2])
    torch.ops.gdn.gated_delta_rule.out(
        *args[:5], state, use_qk_l2norm=True, output=in_place_output, final_state=state
    )
    assert torch.equal(in_place_output, output)
    assert torch.equal(state, final_state)


def test_eager_kernel_is_built_with_torchs_openmp():
    """at::parallel_for is a header template: compiled without OpenMP it runs every head on the calling thread."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch does not thread with OpenMP")
    nm = shutil.which("nm") or "nm"  # binutils, which the gcc that built the library needs too
    aten_library = loader.library_path().with_name(ATEN_LIBRARY_NAME)
    undefined = subprocess.run(
        [nm, "-D", "--undefined-only", str(aten_library)], capture_output=True, text=True, check=True
    ).stdout
    assert "GOMP_parallel" in undefined, f"{aten_library} does not call OpenMP: rebuild with python -m runtime_ops.build"


def test_out_with_strided_state_and_output(generator):
    """Out tensors that are views with unit stride nowhere still receive the results."""
    case, inputs = fresh_inputs(generator, length=20)
    args = inputs.as_args()
    expected_output, expected_state = reference.recurrent_gated_delta_rule(
        *[t.double() for t in args], use_qk_l2norm=True
    )
    output = torch.full(args[2].shape[::-1], float("nan")).permute(3, 2, 1, 0)
    final_state = torch.full(args[5].shape[::-1], float("nan")).permute(3, 2, 1, 0)
    torch.ops.gdn.gated_delta_rule.out(*args, use_qk_l2norm=True, output=output, final_state=final_state)
    assert relative_error(output, expected_output) <= case.tolerance
    assert relative_error(final_state, expected_state) <= case.tolerance


def error_of(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the type and text are what is compared
        return type(error), str(error).split("\n")[0]
    return None


@pytest.mark.parametrize(
    "breakage",
    [
        lambda a: a.__setitem__(4, a[4][:, :-1]),  # beta one token short
        lambda a: a.__setitem__(3, a[3][..., :1]),  # KDA gate with Dk = 1
        lambda a: a.__setitem__(5, a[5].double()),  # fp64 state
        lambda a: a.__setitem__(0, a[0].int()),  # integer query
        lambda a: a.__setitem__(5, a[5][0]),  # state without batch dim
    ],
    ids=["beta-length", "g-channels", "state-dtype", "query-dtype", "state-rank"],
)
def test_bad_input_raises_the_reference_error(breakage, generator):
    _, inputs = fresh_inputs(generator, length=6, gate="per_channel")
    args = list(inputs.as_args())
    breakage(args)
    expected = error_of(lambda: contract.check_inputs(*args))
    assert expected is not None
    assert error_of(lambda: torch.ops.gdn.gated_delta_rule(*args, use_qk_l2norm=True)) == expected


def test_bad_out_tensor_raises_before_writing(generator):
    _, inputs = fresh_inputs(generator, length=3)
    args = inputs.as_args()
    output = torch.full((1, 3, 4, 31), float("nan"))
    final_state = torch.full_like(args[5], float("nan"))
    with pytest.raises(ValueError, match="output must have shape"):
        torch.ops.gdn.gated_delta_rule.out(*args, output=output, final_state=final_state)
    assert final_state.isnan().all()


class StatefulDecode(torch.nn.Module):
    """One token per call; the recurrent state is a buffer the program updates in place."""

    def __init__(self, state_shape):
        super().__init__()
        self.register_buffer("state", torch.zeros(state_shape))

    def forward(self, query, key, value, g, beta):
        return torch.ops.gdn.gated_delta_rule_inplace(query, key, value, g, beta, self.state, use_qk_l2norm=True)


def test_pte_decode_keeps_its_state_across_calls(generator):
    case, inputs = fresh_inputs(generator, length=8, gate="per_channel")
    args = inputs.as_args()
    program = export_program(StatefulDecode(args[5].shape), tuple(t[:, :1] for t in args[:5]))
    # ExecuTorch plans mutable buffers as zeroed memory, without the eager initial value.
    state = torch.zeros(args[5].shape, dtype=torch.float64)
    for t in range(case.length):
        step = [x[:, t : t + 1] for x in args[:5]]
        (output,) = program.execute(step)
        expected_output, state = reference.recurrent_gated_delta_rule(
            *[x.double() for x in step], state, use_qk_l2norm=True
        )
        assert relative_error(output, expected_output) <= case.tolerance, f"token {t}"


class Functional(torch.nn.Module):
    def forward(self, query, key, value, g, beta, initial_state):
        return torch.ops.gdn.gated_delta_rule(query, key, value, g, beta, initial_state)


def test_pte_rejects_inconsistent_shapes_without_crashing(generator):
    """Lengths that disagree pass the runtime's per-input bounds; the kernel must refuse them."""
    case, inputs = fresh_inputs(generator, length=6)
    args = list(inputs.as_args())
    program = export_program(Functional(), tuple(args), dynamic_length_args=5)
    bad = list(args)
    bad[4] = args[4][:, :4]  # beta for 4 tokens, query for 6
    with pytest.raises(RuntimeError):
        program.execute(bad)
    bad = list(args)
    bad[0] = args[0][:, :5]  # query for 5 tokens, the rest for 6
    with pytest.raises(RuntimeError):
        program.execute(bad)
    output, final_state = program.execute(args)  # still usable afterwards
    expected_output, expected_state = reference.recurrent_gated_delta_rule(*[t.double() for t in args])
    assert relative_error(output, expected_output) <= case.tolerance
    assert relative_error(final_state, expected_state) <= case.tolerance


def computes_subnormals() -> bool:
    """Whether this thread and torch's threads still make subnormal results (nothing left flushing them)."""
    tiny = torch.full((1 << 16,), 1e-39) * 1.5  # float32 subnormals, on torch's threads at this size
    return 1e-310 * 1.5 != 0.0 and bool((tiny > 0).all())  # and a float64 one on this thread


@pytest.mark.parametrize("length", [1, 64])  # a decode step, and the chunked form (two chunks)
def test_decays_below_float_range_match_the_reference_and_leave_the_callers_floats_alone(length, generator):
    """Gates of -20 to -40 a token (as the random-weight benchmark checkpoint's: a chunk's summed gates pass
    log(FLT_MIN) = -87) and an initial state holding subnormals: the kernels read and make subnormals as zero
    (runtime_ops/subnormals.h), which moves no output beyond the float64 reference's tolerance, eagerly and in a
    program; afterwards the calling thread and torch's threads compute subnormals again."""
    assert computes_subnormals()
    case, inputs = fresh_inputs(generator, length=length, gate="scalar")
    args = list(inputs.as_args())
    args[3] = -20.0 - 20.0 * torch.rand(args[3].shape, generator=generator)
    args[5] = args[5] * torch.where(torch.rand(args[5].shape, generator=generator) < 0.5, 1e-39, 1.0)
    assert (args[5].abs() < torch.finfo(torch.float32).tiny).any()  # subnormals in the state
    reference_output, reference_state = reference.recurrent_gated_delta_rule(*[t.double() for t in args])
    output, final_state = torch.ops.gdn.gated_delta_rule(*args)
    assert relative_error(output, reference_output) <= case.tolerance, f"length {length}"
    assert relative_error(final_state, reference_state) <= case.tolerance, f"length {length}"
    assert computes_subnormals()
    program = export_program(Functional(), tuple(args))
    output, final_state = program.execute(args)
    assert relative_error(output, reference_output) <= case.tolerance, f"length {length}, in a program"
    assert relative_error(final_state, reference_state) <= case.tolerance, f"length {length}, in a program"
    assert computes_subnormals()


def test_missing_library_keeps_the_reference_and_names_the_path(tmp_path, seed):
    missing = tmp_path / "libgdn_runtime_ops.so"
    script = (
        "import sys, warnings, torch\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import gdn_export\n"
        "from runtime_ops import loader\n"
        "assert not loader.is_loaded()\n"
        "print([str(w.message) for w in caught if 'runtime ops' in str(w.message)][0])\n"
        "torch.manual_seed(int(sys.argv[1]))\n"
        "q = torch.randn(1, 3, 1, 4); v = torch.randn(1, 3, 1, 4)\n"
        "out, state = torch.ops.gdn.gated_delta_rule(q, q, v, -torch.rand(1, 3, 1), torch.rand(1, 3, 1),"
        " torch.randn(1, 1, 4, 4))\n"
        "print('reference ok', tuple(out.shape))\n"
    )
    env = dict(os.environ, GDN_RUNTIME_OPS_LIB=str(missing))
    result = subprocess.run(
        [sys.executable, "-c", script, str(seed)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert str(missing) in result.stdout and "runtime_ops.build" in result.stdout
    assert "reference ok (1, 3, 1, 4)" in result.stdout


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_int8_embedding_delegate_reads_the_rows_and_refuses_ids_outside_the_table(dtype, generator):
    """GdnEmbeddingBackend (runtime_ops/embedding_delegate.py) in a program against the table's int8 rows times
    their scales, computed here; an id outside the table fails the call instead of reading past it."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from gdn_export.quantize import quantize_module
    from gdn_export.runner import program_delegate_ids
    from runtime_ops.embedding_delegate import GdnEmbeddingPartitioner

    rows, width = 37, 24
    embedding = torch.nn.Embedding(rows, width)
    with torch.no_grad():
        embedding.weight.copy_(torch.randn(rows, width, generator=generator))
    quantize_module(embedding, "8da8w")
    table, scales = embedding.weight.qdata, embedding.weight.scale.reshape(rows, 1)
    tokens = torch.randint(0, rows, (2, 5), generator=generator, dtype=dtype)
    length = torch.export.Dim("length", min=1, max=8)
    program = torch.export.export(embedding, (tokens,), dynamic_shapes=({1: length},), strict=False)
    edge = to_edge_transform_and_lower(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    manager = edge.to_backend(GdnEmbeddingPartitioner()).to_executorch()
    path = loader.library_path().parent / f"embedding_delegate_test_{os.getpid()}.pte"
    try:
        path.write_bytes(manager.buffer)
        assert program_delegate_ids(path) == {"GdnEmbeddingBackend"}
        loader.load()
        forward = Runtime.get().load_program(str(path)).load_method("forward")
        # The method's inputs must be contiguous: the one-token prompt is a new tensor, not a slice.
        one = torch.tensor(tokens[:, :1].tolist(), dtype=dtype)
        for ids in (tokens, one, torch.tensor([[0, rows - 1]], dtype=dtype)):
            (rows_read,) = forward.execute([ids])
            expected = table.to(torch.float32)[ids.long()] * scales[ids.long()]
            assert torch.equal(rows_read, expected)
        for bad in (rows, -1):
            with pytest.raises(RuntimeError):
                forward.execute([torch.tensor([[1, bad]], dtype=dtype)])
    finally:
        path.unlink(missing_ok=True)


# The C++ kernels' own tests against the PyTorch reference, run on a library built for another target.
KERNEL_TESTS = ["tests/test_vocabulary_planes.py", "tests/test_cached_attention.py", "tests/test_grouped_int8_linear.py",
                "tests/test_grouped_int4_linear.py", "tests/test_grouped_linear_fusion.py", "tests/test_gated_rms_norm.py",
                "tests/test_gated_attention.py",
                "tests/test_conv_recurrence.py", "tests/test_runtime_ops.py::test_head_dims_off_the_vector_width",
                "tests/test_runtime_ops.py::test_out_in_place_matches_functional"]
# The macros the kernels' #if tests, as the names the library reports them by (runtime_ops/vector_extensions.cpp).
EXTENSION_MACROS = {"__AVX__": "avx", "__AVX2__": "avx2", "__AVXVNNI__": "avx_vnni", "__AVX512F__": "avx512f",
                    "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni"}


def compiler_extensions(build_dir, target_flags: list) -> set:
    """The extensions the build's own C++ compiler targets with these flags: its predefined macros."""
    cache = (build_dir / "CMakeCache.txt").read_text()
    compiler = next(line.split("=", 1)[1] for line in cache.splitlines() if line.startswith("CMAKE_CXX_COMPILER:"))
    macros = subprocess.run([compiler, *target_flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                            text=True, check=True).stdout
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    return {name for macro, name in EXTENSION_MACROS.items() if macro in defined}


def run_kernel_tests_on(library, seed) -> None:
    """KERNEL_TESTS in a child process that loads ``library`` instead of the installed one; all must pass."""
    env = dict(os.environ, GDN_RUNTIME_OPS_LIB=str(library), GDN_TEST_SEED=str(seed))
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS],
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                           capture_output=True, text=True, timeout=1200)
    assert child.returncode == 0, f"seed {seed}:\n{child.stdout[-3000:]}"
    assert " passed" in child.stdout and "skipped" not in child.stdout, child.stdout[-1000:]


def test_installed_library_reports_the_extensions_its_compiler_targets():
    """The installed library (-march=native) says which vector extensions its loops use, as its compiler's own
    predefined macros for the host say (gdn-bench e2e --hide-avx512 refuses a library by this report)."""
    from gdn_bench.x86_isa import runtime_ops_extensions
    from runtime_ops.build import BUILD_DIR
    from runtime_ops.loader import library_path

    if os.environ.get("GDN_RUNTIME_OPS_LIB"):
        pytest.skip("GDN_RUNTIME_OPS_LIB names another build: the parametrized test below checks those")
    assert set(runtime_ops_extensions(library_path())) == compiler_extensions(BUILD_DIR, ["-march=native"])


@pytest.mark.parametrize("target", ["portable", "x86-64-v3"])
def test_other_targets_build_and_their_kernels_match_the_reference(target, request, tmp_path, seed):
    """``python -m runtime_ops.build --portable`` (no -march: the kernels' plain C++ paths) and ``--march
    x86-64-v3`` (an AVX2-only x86 CPU: the 256-bit loops, which a machine with AVX-512 never runs otherwise)
    compile; each reports the extensions its compiler targets and uses no wider register; and the kernels they
    make pass the C++ kernels' own tests against the PyTorch reference, in a child process."""
    from gdn_bench.x86_isa import runtime_ops_extensions
    from runtime_ops.build import LIBRARY_NAME, build

    if target == "portable":
        built = build(tmp_path / "portable", native=False, install=False) / LIBRARY_NAME
        flags, wider = [], ("%ymm", "%zmm")
    else:
        built = request.getfixturevalue("x86_64_v3_library")
        flags, wider = ["-march=x86-64-v3"], ("%zmm",)
    assert set(runtime_ops_extensions(built)) == compiler_extensions(built.parent, flags)
    disassembly = subprocess.run(["objdump", "-d", str(built)], capture_output=True, text=True)
    if disassembly.returncode == 0:
        assert not [register for register in wider if register in disassembly.stdout]
    run_kernel_tests_on(built, seed)


@pytest.mark.parametrize("flags, message", [
    (["--march", " "], "--march must name a target"),
    (["--no-install"], "--no-install needs --build-dir"),
    (["--portable", "--march", "x86-64-v3"], "not allowed with argument"),
])
def test_build_command_refuses_bad_flags_before_building(flags, message, capsys):
    from runtime_ops.build import main

    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
