"""Build the C++ example runner with CMake against the installed executorch wheel.

    python -m examples.cpp_runner.build [--build-dir build/cpp_runner]

prints the path of ``gdn_cpp_runner`` (``gdn_cpp_tokenize`` sits beside it), or
exits 1 saying why it cannot be built here (no cmake, no C++ compiler, a wheel
without the C++ runtime, a compile error). Rebuilding is incremental, and each
call configures again, so a ``build/runtime_ops/lib/libgdn_runtime_ops.so`` built
since the last call gets linked in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
REPO_ROOT = SOURCE_DIR.parents[1]
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "cpp_runner"
RUNNER_NAME = "gdn_cpp_runner"
TOKENIZE_NAME = "gdn_cpp_tokenize"
GDN_RUNTIME_OPS_LIBRARY = REPO_ROOT / "build" / "runtime_ops" / "lib" / (
    "libgdn_runtime_ops.dylib" if sys.platform == "darwin" else "libgdn_runtime_ops.so"
)


class BuildError(RuntimeError):
    """The runner cannot be built here; the message says why."""


def executorch_root() -> Path:
    """The installed executorch package, checked to carry the C++ headers, libraries and CMake config."""
    try:
        import executorch
    except ImportError:
        raise BuildError("the executorch Python package is not installed (run `make install`)") from None
    # A namespace package (the wheel has no __init__.py), so it has a path list, not a file.
    for location in map(Path, executorch.__path__):
        if (location / "share" / "cmake" / "executorch-config.cmake").is_file():
            root = location.resolve()
            break
    else:
        raise BuildError(f"executorch at {list(executorch.__path__)} has no share/cmake/executorch-config.cmake: "
                         "the wheel ships no C++ runtime to build against")
    if not (root / "include" / "executorch" / "extension" / "module" / "module.h").is_file():
        raise BuildError(f"the executorch wheel at {root} has no C++ headers (include/executorch)")
    if not any((root / "lib").glob("libexecutorch.*")):
        raise BuildError(f"the executorch wheel at {root} has no lib/libexecutorch.so to link against")
    return root


def find_compiler() -> str:
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++", "clang++")):
        path = shutil.which(name)
        if path:
            return path
    raise BuildError("no C++ compiler found (set CXX, or install g++: `apt-get install g++`)")


def _run(command: list, what: str) -> None:
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip().splitlines()
        tail = "\n".join(output[-30:])
        raise BuildError(f"{what} failed ({' '.join(map(str, command))}):\n{tail}")


def build(build_dir: Path = DEFAULT_BUILD_DIR) -> Path:
    """Configures and builds both executables; returns the runner's path."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH (install CMake >= 3.19: `apt-get install cmake`)")
    compiler = find_compiler()
    root = executorch_root()
    build_dir = Path(build_dir)
    configure = [cmake, "-S", SOURCE_DIR, "-B", build_dir, f"-DEXECUTORCH_ROOT={root}",
                 f"-DCMAKE_CXX_COMPILER={compiler}"]
    # A build folder keeps the generator it was first configured with.
    if not (build_dir / "CMakeCache.txt").is_file() and shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure, "configuring the C++ runner")
    _run([cmake, "--build", build_dir, "--parallel", str(os.cpu_count() or 1)], "building the C++ runner")
    runner = build_dir / RUNNER_NAME
    if not runner.is_file():
        raise BuildError(f"the build finished but {runner} is missing")
    if not GDN_RUNTIME_OPS_LIBRARY.is_file():
        print(f"note: {GDN_RUNTIME_OPS_LIBRARY} is not built, so {runner} cannot run programs that use gdn:: ops",
              file=sys.stderr)
    return runner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR)
    args = parser.parse_args(argv)
    try:
        print(build(args.build_dir))
    except BuildError as error:
        print(f"cannot build the C++ runner: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
