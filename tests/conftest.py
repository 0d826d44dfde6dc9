"""Seeded random inputs, so any failure replays with one command; the conformance suite's unsupported report.

Every run has one seed: ``GDN_TEST_SEED`` from the environment when set, else a
fresh one (the session header prints it). Each test draws its random inputs
from the ``seed`` fixture, derived from the run's seed and the test's node id,
so a test draws the same values whether it runs alone, in a full run or on an
xdist worker. A failing test's report carries a ``replay`` section with the
command that reruns it on the same values. torch's global generator is seeded
from ``seed`` before each test too, for the randomness a test does not draw
itself (a module's initial weights).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex

import pytest
import torch

RUN_SEED_VARIABLE = "GDN_TEST_SEED"
# Reported by tests that run an implementation on cases it does not support (see tests/conformance/).
UNSUPPORTED_PROPERTY = "unsupported"
UNSUPPORTED_SECTION = "conformance: unsupported cases (each raised a clear error)"


def run_seed() -> int:
    return int(os.environ[RUN_SEED_VARIABLE])


def derived_seed(name: str) -> int:
    """A seed for ``name`` (a node id) in this run: the same in every process that shares the run's seed."""
    digest = hashlib.sha256(f"{run_seed()} {name}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % 2**31


def replay_command(nodeid: str) -> str:
    # A test that reruns itself under Triton's interpreter fails inside a child that has it on; so must its replay.
    interpreter = "TRITON_INTERPRET=1 " if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else ""
    return f"{RUN_SEED_VARIABLE}={run_seed()} {interpreter}pytest {shlex.quote(nodeid)}"


def pytest_configure(config):
    # In the environment, the run's seed reaches xdist workers and the child processes tests start.
    value = os.environ.setdefault(RUN_SEED_VARIABLE, str(secrets.randbelow(2**31)))
    if not value.isdigit():
        raise pytest.UsageError(f"{RUN_SEED_VARIABLE} must be a non-negative integer, got {value!r}")


def pytest_report_header(config):
    return f"random inputs: {RUN_SEED_VARIABLE}={run_seed()} (set it to draw this run's values again)"


@pytest.fixture
def seed(request) -> int:
    """This test's seed, from the run's seed and the test's node id."""
    return derived_seed(request.node.nodeid)


@pytest.fixture(scope="module")
def module_seed(request) -> int:
    """The seed of a module's shared fixtures (checkpoints built once per module)."""
    return derived_seed(request.node.nodeid)


@pytest.fixture
def generator(seed) -> torch.Generator:
    """A CPU generator seeded with this test's seed."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def _seed_torch_global_generator(seed):
    torch.manual_seed(seed)


# The tiny dense and MoE checkpoints that loading and rewrite tests read; each module
# builds its own from its module seed.
@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory, module_seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("dense"), seed=module_seed)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory, module_seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("moe"), moe=True, wrapper=True, seed=module_seed)


# The C++ runner and a CPU program it runs, for the benchmarks' runner protocol (test_bench_e2e*.py).
@pytest.fixture(scope="module")
def cpu_program(tmp_path_factory, module_seed):
    """test_cpp_runner's stateful LLM program (XNNPACK, CPU) and its tokenizer: the runner's protocol without a GPU."""
    from tests import test_cpp_runner as cpp

    tokenizer_path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer = cpp.save_tokenizer(cpp.train_tokenizer("qwen35"), tokenizer_path)
    program = cpp.make_llm_program(tmp_path_factory, tokenizer, module_seed, int8_embedding=False)[0]
    return program, tokenizer_path


@pytest.fixture(scope="session")
def runner():
    from examples.cpp_runner import build as cpp_runner

    try:
        return cpp_runner.build()
    except cpp_runner.BuildError as error:
        pytest.fail(f"the C++ runner must build here: {error}")


@pytest.fixture(scope="session")
def x86_64_v3_library(tmp_path_factory):
    """``python -m runtime_ops.build --march x86-64-v3``'s ExecuTorch library (an AVX2-only x86 CPU's loops),
    built once; skipped where this machine cannot run x86-64-v3 code."""
    import platform

    from gdn_bench.x86_isa import cpu_flags
    from runtime_ops.build import LIBRARY_NAME, build

    if platform.machine() != "x86_64" or not {"avx2", "fma", "bmi2"} <= cpu_flags():
        pytest.skip("x86-64-v3 code runs only on an x86-64 CPU with AVX2, FMA and BMI2")
    return build(tmp_path_factory.mktemp("x86-64-v3"), native=False, install=False, march="x86-64-v3") / LIBRARY_NAME


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        report.sections.append(("replay", replay_command(item.nodeid)))
    return report


def pytest_terminal_summary(terminalreporter):
    # From the reports rather than a list in the test module: xdist workers send reports, not module state.
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == UNSUPPORTED_PROPERTY
    ]
    if lines:
        terminalreporter.section(UNSUPPORTED_SECTION)
        for line in lines:
            terminalreporter.line(line)
