"""Build libgdn_runtime_ops.so from source: ``python -m runtime_ops.build``.

Configures runtime_ops/CMakeLists.txt against the torch and executorch
packages installed in this interpreter's environment (never a pip build
environment's own torch), compiles it in ``build/runtime_ops/`` beside the
package (git ignores ``build/``: the source tree gets no build output), and
places the libraries where the loader looks:
``build/runtime_ops/lib/libgdn_runtime_ops.so`` and its ``_aten`` sibling (each
written to a temporary name first, then renamed, so a running process never
sees half a file).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY_NAME = "libgdn_runtime_ops.so"  # the ExecuTorch kernels (no torch dependency)
ATEN_LIBRARY_NAME = "libgdn_runtime_ops_aten.so"  # the eager PyTorch kernels, found next to it
BUILD_DIR = SOURCE_DIR.parent / "build" / "runtime_ops"
INSTALLED_LIBRARY = BUILD_DIR / "lib" / LIBRARY_NAME
MIN_CMAKE = (3, 19)  # what executorch-config.cmake asks for


def _cmake_version(cmake: str) -> tuple[int, ...]:
    first_line = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    return tuple(int(part) for part in first_line.split()[-1].split("-")[0].split(".")[:2])


def find_cmake() -> str:
    """A CMake new enough for the executorch package: the pip ``cmake`` package's, else the system one."""
    candidates = []
    try:
        import cmake  # the package index's CMake, when the system one is too old

        candidates.append(str(Path(cmake.CMAKE_BIN_DIR) / "cmake"))
    except ImportError:
        pass
    if shutil.which("cmake"):
        candidates.append(shutil.which("cmake"))
    for candidate in candidates:
        if _cmake_version(candidate) >= MIN_CMAKE:
            return candidate
    raise RuntimeError(
        f"runtime_ops build: CMake >= {'.'.join(map(str, MIN_CMAKE))} not found (tried {candidates or 'PATH'}); "
        f"install it with `{sys.executable} -m pip install cmake`"
    )


def package_cmake_dirs() -> list[str]:
    import torch.utils

    import executorch

    executorch_root = Path(next(iter(executorch.__path__)))
    return [torch.utils.cmake_prefix_path, str(executorch_root / "share" / "cmake")]


def build(build_dir: Path, native: bool = True, jobs: int | None = None, install: bool = True,
          march: str | None = None) -> Path:
    """The folder holding the built libraries: the loader's (``install``), else ``build_dir`` itself.

    ``march`` compiles for that ``-march`` (x86-64-v3: an AVX2-only x86 CPU) instead of the host's."""
    cmake = find_cmake()
    configure = [
        cmake, "-S", str(SOURCE_DIR), "-B", str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_PREFIX_PATH={';'.join(package_cmake_dirs())}",
        f"-DGDN_NATIVE_ARCH={'ON' if native else 'OFF'}",
        f"-DGDN_MARCH={march or ''}",  # always given: a build folder's cache keeps the last one otherwise
    ]
    subprocess.run(configure, check=True)
    subprocess.run([cmake, "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 1)], check=True)
    if not install:
        return build_dir
    INSTALLED_LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    for name in (LIBRARY_NAME, ATEN_LIBRARY_NAME):
        staging = INSTALLED_LIBRARY.with_name(f".{name}.{os.getpid()}.tmp")
        shutil.copy2(build_dir / name, staging)
        os.replace(staging, INSTALLED_LIBRARY.with_name(name))
    return INSTALLED_LIBRARY.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime_ops.build", description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=BUILD_DIR)
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--portable", action="store_true", help="compile without -march=native")
    target.add_argument("--march", default=None, metavar="ARCH",
                        help="compile for this -march instead of the host's (x86-64-v3: an AVX2-only x86 CPU, as "
                             "gdn-bench e2e --hide-avx512 times it)")
    parser.add_argument("--no-install", action="store_true",
                        help="leave the libraries in --build-dir instead of where the loader looks "
                             "(then point $GDN_RUNTIME_OPS_LIB at them)")
    parser.add_argument("-j", "--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.march is not None and not args.march.strip():
        parser.error("--march must name a target, e.g. x86-64-v3")
    if args.no_install and args.build_dir == BUILD_DIR:
        parser.error(f"--no-install needs --build-dir: {BUILD_DIR} is the installed build's own folder")
    built = build(args.build_dir, native=not args.portable, jobs=args.jobs, install=not args.no_install,
                  march=args.march)
    print(f"runtime_ops: built {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
