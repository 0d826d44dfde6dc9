"""Running a test module's Triton kernels on a machine without a GPU.

Triton's interpreter must be switched on before Triton compiles anything, so a
module whose kernels need it holds, in the main test process, one test that
reruns the module in a child process with TRITON_INTERPRET=1; nothing leaks
into other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
REPO_ROOT = Path(__file__).resolve().parent.parent


def rerun_under_triton_interpreter(module_file: str) -> None:
    """Run ``module_file``'s tests in a child under the interpreter; all must pass, none skip."""
    environment = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT))
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module_file],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=900,
    )
    name = Path(module_file).name
    assert child.returncode == 0, f"{name} under the interpreter failed:\n{child.stdout[-6000:]}\n{child.stderr[-3000:]}"
    assert " passed" in child.stdout and "skipped" not in child.stdout, child.stdout[-2000:]


def run_under_triton_interpreter(code: str, *arguments: str) -> str:
    """Run Python ``code`` (with ``arguments`` as sys.argv[1:]) in a child under the interpreter; its stdout."""
    environment = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT))
    child = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=900,
    )
    assert child.returncode == 0, f"child under the interpreter failed:\n{child.stdout[-3000:]}\n{child.stderr[-6000:]}"
    return child.stdout
