"""examples/metal_runner off Apple: everything but the Apple parts builds, and the Apple parts refuse clearly.

The runner for Metal programs is examples/cpp_runner's main.cpp and tokenizer
linked with ExecuTorch's Metal backend and our gdn_metal_ops, whole-archive
(macOS). Here it is configured with -DGDN_METAL_RUNNER_APPLE_PARTS=OFF against
the executorch wheel and built; the binary must run (its usage text). With the
Apple parts on, configuring off macOS must fail with a message saying so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from examples.cpp_runner import build as cpp_runner
from runtime_ops.build import find_cmake

SOURCE_DIR = cpp_runner.REPO_ROOT / "examples" / "metal_runner"
BUILD_DIR = cpp_runner.REPO_ROOT / "build" / "metal_runner"


def _configure(build_dir: Path, apple_parts: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [find_cmake(), "-S", str(SOURCE_DIR), "-B", str(build_dir),
         f"-Dexecutorch_DIR={cpp_runner.executorch_root() / 'share' / 'cmake'}",
         f"-DCMAKE_CXX_COMPILER={cpp_runner.find_compiler()}",
         f"-DGDN_METAL_RUNNER_APPLE_PARTS={'ON' if apple_parts else 'OFF'}"],
        capture_output=True, text=True,
    )


def test_runner_builds_without_the_apple_parts():
    configured = _configure(BUILD_DIR, apple_parts=False)
    assert configured.returncode == 0, configured.stdout + configured.stderr
    built = subprocess.run([find_cmake(), "--build", str(BUILD_DIR), "--parallel", "2"], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    usage = subprocess.run([str(BUILD_DIR / "gdn_metal_runner"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--model MODEL.pte" in usage.stdout + usage.stderr


def test_apple_parts_refuse_to_configure_off_macos(tmp_path):
    configured = _configure(tmp_path / "apple", apple_parts=True)
    assert configured.returncode != 0
    assert "links the Metal framework, which only macOS has" in configured.stderr
    assert "-DGDN_METAL_RUNNER_APPLE_PARTS=OFF" in configured.stderr
