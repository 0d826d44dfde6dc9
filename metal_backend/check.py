"""``make metal-check``: every Linux check of metal_backend, summarized as "N passed, M failed".

Runs ``tests/test_metal_*.py`` and the Metal rows of ``tests/conformance``:
the lockstep emulator, the kernels emulated over the conformance table
(``metal-emulation``; ``metal-mps`` too on macOS), the C shim agreement, the MPS launch planning,
graph selection and lowering entry, and the benchmark's off-macOS behaviour.
Then the stricter compilers of ``metal_backend.strict_check`` (clang needed;
each prints its name and count).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent


class OutcomeCounter:
    """Counts tests by outcome; an error in setup or teardown counts as a failure."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.when == "call" and report.passed:
            self.passed += 1
        elif report.skipped:
            self.skipped += 1


def main(argv=None) -> int:
    counter = OutcomeCounter()
    tests = sorted(str(path) for path in (REPOSITORY / "tests").glob("test_metal_*.py"))
    tests.append(str(REPOSITORY / "tests" / "conformance" / "test_conformance.py"))
    # "metal" names every test of test_metal_*.py (by module) and the conformance rows of Metal implementations.
    status = pytest.main(["-q", "-p", "no:cacheprovider", *tests, "-k", "metal", *(argv or [])], plugins=[counter])
    summary = f"metal-check: {counter.passed} passed, {counter.failed} failed"
    if counter.skipped:
        summary += f", {counter.skipped} skipped"
    print(summary)
    strict_ok = run_strict_checks()
    return 0 if status == 0 and counter.failed == 0 and strict_ok else 1


def run_strict_checks() -> bool:
    """metal_backend.strict_check's checks (clang's among them), each printed by name with its count."""
    from metal_backend import strict_check

    passed = True
    for name, summary, error in strict_check.run_all():
        print(f"metal-check: {name}: {summary}" if error is None else f"metal-check: {name}: FAILED: {error}")
        passed = passed and error is None
    return passed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
