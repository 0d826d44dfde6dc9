"""Every implementation of the gdn ops over the one case table (gdn_export.ops.conformance).

The rows: the core's (``op-cpu``, the registered ops, which run runtime_ops'
C++ kernels once they are loaded; ``reference``) and those of every registered
backend (``Backend.conformance_implementations``): runtime_ops' C++ kernels
inside ``.pte`` programs (the portable and xnnpack backends share them),
cuda_backend's Triton kernels, metal_backend's kernels on MPS and emulated.
Each implementation runs ``CASES`` and ``FUSED_CASES`` (as its ``op_cases``
selects them) and, if it implements ``gdn::cached_attention``,
``ATTENTION_CASES``. Every row is the table's one check,
``gdn_export.ops.conformance.check_case`` (the GPU device scripts run it too):
fp64 references, outputs NaN-poisoned before the call, inputs left as they were.

A case an implementation does not support must raise a clear error having
written nothing; it is listed in the run's summary ("conformance: unsupported
cases"), never skipped.

Triton's kernels: on a GPU, the whole table runs on CUDA tensors (``op-cuda``,
in this process). Without one they run under Triton's interpreter, which must
be on before Triton is imported: ``test_rows_in_a_child_process`` reruns this
module for those rows in a child started with ``TRITON_INTERPRET=1``
(tests/triton_interpreter.py). The interpreter takes seconds per case, so
there the rows are a documented subset (``cuda_backend.conformance.INTERPRETED_CASES``
and every refused case). ``-k cuda`` selects the Triton rows; ``-k metal``
Metal's.
"""

import itertools
import os

import pytest

from gdn_export.backends import backend_names, get_backend
from gdn_export.ops.conformance import ATTENTION_CASES, CASES, FUSED_CASES, REFERENCE_IMPLEMENTATIONS, check_case
from tests.conftest import UNSUPPORTED_PROPERTY, UNSUPPORTED_SECTION
from tests.triton_interpreter import run_pytest_child


def registered_implementations() -> list:
    """The core's implementations, then each registered backend's, each once."""
    implementations = {impl.name: impl for impl in REFERENCE_IMPLEMENTATIONS}
    for backend_name in backend_names():
        for impl in get_backend(backend_name).conformance_implementations():
            if implementations.setdefault(impl.name, impl) is not impl:
                raise ValueError(f"two implementations are named {impl.name!r} (backend {backend_name!r} lists one)")
    return list(implementations.values())


def runs_here(impl) -> bool:
    return all(os.environ.get(name) == value for name, value in impl.environment)


IMPLEMENTATIONS = registered_implementations()
HERE = [impl for impl in IMPLEMENTATIONS if runs_here(impl)]
IN_CHILD = [impl for impl in IMPLEMENTATIONS if not runs_here(impl)]


def rows(tables: dict) -> list:
    """pytest params (impl, case), id "<impl>-<case>", of each implementation in ``tables`` {impl: cases}."""
    return [pytest.param(impl, case, id=f"{impl.name}-{case.name}") for impl, cases in tables.items() for case in cases]


def check(impl, case, generator, request, fused=False) -> None:
    """The table's one check (``check_case``); a refused case goes into the run's unsupported summary."""
    outcome = check_case(impl, case, generator, fused=fused)
    if outcome.refused is not None:
        request.node.user_properties.append((UNSUPPORTED_PROPERTY, f"{impl.name}: {case.name}: {outcome.refused}"))


@pytest.mark.parametrize("impl,case", rows({impl: impl.op_cases(CASES) for impl in HERE}))
def test_case(impl, case, generator, request):
    check(impl, case, generator, request)


@pytest.mark.parametrize("impl,case", rows({impl: impl.op_cases(FUSED_CASES) for impl in HERE if impl.fused}))
def test_fused_case(impl, case, generator, request):
    """gdn.fused_gated_delta_rule against the unfused reference after reference gating."""
    check(impl, case, generator, request, fused=True)


@pytest.mark.parametrize("impl,case", rows({impl: ATTENTION_CASES for impl in HERE if impl.cached_attention}))
def test_attention_case(impl, case, generator, request):
    """gdn::cached_attention against fp64 attention computed row by row."""
    check(impl, case, generator, request)


def reported_unsupported(child_output: str, impl) -> list[str]:
    """The lines of a child run's unsupported-cases summary: those after its header naming ``impl``."""
    _, header, summary = child_output.partition(f" {UNSUPPORTED_SECTION} ")
    lines = summary.splitlines()[1:] if header else []
    return list(itertools.takewhile(lambda line: line.startswith(f"{impl.name}: "), lines))


@pytest.mark.parametrize("impl", IN_CHILD, ids=lambda impl: impl.name)
def test_rows_in_a_child_process(impl, request):
    """The rows of ``impl``, in a child process started with the environment it needs."""
    output = run_pytest_child([__file__, "-k", impl.name], dict(impl.environment))
    reported = reported_unsupported(output, impl)
    assert reported or not any(impl.unsupported(case) for case in impl.op_cases(CASES)), "no unsupported summary"
    request.node.user_properties += [(UNSUPPORTED_PROPERTY, line) for line in reported]
