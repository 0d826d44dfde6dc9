"""Running tests with Triton's interpreter switched on, or off, in a child process.

Triton's interpreter must be switched on before Triton compiles anything, so a
module whose kernels need it holds, in the main test process, one test that
reruns the module in a child with TRITON_INTERPRET=1; nothing leaks into other
tests. The reverse also happens: torch.export cannot trace the interpreter's
kernels, so a module that exports reruns itself without it. Children inherit
the environment, so they draw from the run's seed (``GDN_TEST_SEED``, see
tests/conftest.py) and a failure inside one prints the command replaying it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _run_child(arguments: list, environment: dict) -> subprocess.CompletedProcess:
    """Python with ``arguments``, in this environment with ``environment`` added (TRITON_INTERPRET only if given)."""
    child_environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    child_environment["PYTHONPATH"] = str(REPO_ROOT)
    child_environment.update(environment)
    return subprocess.run(
        [sys.executable, *arguments], cwd=REPO_ROOT, env=child_environment, capture_output=True, text=True,
        timeout=900,
    )


def run_pytest_child(pytest_arguments: list, environment: dict) -> str:
    """Run pytest with ``pytest_arguments`` in a child with ``environment``; all must pass, none skip. Its stdout."""
    child = _run_child(["-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_arguments], environment)
    where = " ".join(["pytest", *(Path(argument).name for argument in pytest_arguments)]) + f" with {environment}"
    assert child.returncode == 0, f"{where} failed:\n{child.stdout[-6000:]}\n{child.stderr[-3000:]}"
    assert " passed" in child.stdout and "skipped" not in child.stdout, f"{where}:\n{child.stdout[-2000:]}"
    return child.stdout


def rerun_module(module_file: str, *, interpret: bool = True) -> None:
    """Run ``module_file``'s tests in a child with the interpreter on (or off); all must pass, none skip."""
    run_pytest_child([module_file], {"TRITON_INTERPRET": "1"} if interpret else {})


def run_under_triton_interpreter(code: str, *arguments: str) -> str:
    """Run Python ``code`` (with ``arguments`` as sys.argv[1:]) in a child under the interpreter; its stdout."""
    child = _run_child(["-c", code, *arguments], {"TRITON_INTERPRET": "1"})
    assert child.returncode == 0, f"child under the interpreter failed:\n{child.stdout[-3000:]}\n{child.stderr[-6000:]}"
    return child.stdout
