"""ExecuTorch's CUDA backend runtime, built from ExecuTorch's source at one pinned revision.

The executorch wheel ships ``libexecutorch.so``, its headers and its Python
runtime, but not the CUDA backend runtime (``backends/cuda/runtime`` and
``backends/aoti`` in ExecuTorch's repository). This module builds that runtime
as a dependency, never a copy of it in this repository:

    python -m cuda_backend.executorch_runtime source --mirror GIT_DIR   # or --clone [URL]
    python -m cuda_backend.executorch_runtime build [--executorch-src DIR] [--out DIR]

(``make cuda-runtime`` runs both.) ``source`` writes the pinned revision's
``backends/cuda``, ``backends/aoti`` and ``extension/cuda`` into a git-ignored
folder (``build/executorch-src``) from a git mirror (``git archive``) or a
shallow clone; ``build`` compiles the runtime's C++ sources with the C++
compiler against the installed wheel's headers, ``libexecutorch.so`` and the
CUDA runtime library (libcudart), into ``build/cuda_runtime/``:

* ``libgdn_executorch_cuda.so``: ExecuTorch's CudaBackend (registered with the
  wheel's runtime when the library is loaded) and two C entry points of ours
  that set its runtime options (``runtime/backend_options.cpp``);
* ``python/executorch/backends/{cuda,aoti}``: the same revision's lowering
  (``CudaBackend``, ``CudaPartitioner``), which ``lower_to_cuda`` uses instead of
  the wheel's. The lowering writes what the runtime reads (the delegate's
  named-data keys, the weights blob), so both must come from one revision.

Loading (``load()``) follows runtime_ops' loader: ``$GDN_CUDA_RUNTIME_LIB`` or
the build folder's library, opened with RTLD_GLOBAL before any program is
loaded, and one clear error naming the path tried and how to build it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Optional

from gdn_export.backends import RuntimeUnavailable

# ExecuTorch's main of 2026-08-22 ("Ship the CUDA Windows import library only in CUDA
# builds"). Why this one: cuda_backend/README.md, "The runtime".
PINNED_REVISION = "cff6f4dd32e630945b7188512c1f2b4f102b05ad"
EXECUTORCH_REPOSITORY = "https://github.com/pytorch/executorch.git"
SOURCE_SUBDIRS = ("backends/cuda", "backends/aoti", "extension/cuda")
# The runtime's C++ sources. Left out: shims/tensor_attribute.cpp (defines a symbol
# common_shims_slim.cpp defines too) and the .cu shims (int4/int5/int6/int8 matmuls, sort,
# rand), which only quantized programs call.
RUNTIME_SOURCES = (
    "backends/cuda/runtime/cuda_backend.cpp",
    "backends/cuda/runtime/cuda_allocator.cpp",
    "backends/cuda/runtime/cuda_mutable_state.cpp",
    "backends/cuda/runtime/shims/memory.cpp",
    "backends/cuda/runtime/shims/cuda_guard.cpp",
    "backends/cuda/runtime/platform/platform.cpp",
    "backends/aoti/common_shims_slim.cpp",
    "backends/aoti/slim/cuda/guard.cpp",
    "extension/cuda/caller_stream.cpp",
)
# The lowering's Python packages, carried into the build folder.
LOWERING_PACKAGES = ("backends/cuda", "backends/aoti")

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
OWN_SOURCES = (PACKAGE_DIR / "runtime" / "backend_options.cpp", PACKAGE_DIR / "runtime" / "cublas_mm.cpp")
DEFAULT_SOURCE_DIR = REPO_ROOT / "build" / "executorch-src"
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "cuda_runtime"
LIBRARY_NAME = "libgdn_executorch_cuda.so"
REVISION_FILE = "REVISION"
STAMP_FILE = "BUILD_STAMP"
ENV_VAR = "GDN_CUDA_RUNTIME_LIB"
BUILD_HINT = "build it with `make cuda-runtime` (or `python -m cuda_backend.executorch_runtime build`)"


class CudaRuntimeUnavailable(RuntimeUnavailable):
    """ExecuTorch's CUDA runtime (or its matching lowering) is not built or cannot be loaded."""


# ---------------------------------------------------------------------------
# The source folder
# ---------------------------------------------------------------------------


def _source_root(source_dir: Path) -> Path:
    """The folder holding ``backends/`` and ``extension/``: ``DIR/executorch`` (what ``source``
    writes) or DIR itself (an ExecuTorch checkout)."""
    for root in (source_dir / "executorch", source_dir):
        if all((root / subdir).is_dir() for subdir in SOURCE_SUBDIRS):
            return root
    raise CudaRuntimeUnavailable(
        f"--executorch-src {source_dir}: no ExecuTorch source there (needs {', '.join(SOURCE_SUBDIRS)}, "
        "under executorch/ or at the top); make it with `python -m cuda_backend.executorch_runtime source`"
    )


def source_revision(source_dir: Path) -> Optional[str]:
    """The revision a source folder was made from (its REVISION file, or git's HEAD), None if unknown."""
    marker = source_dir / REVISION_FILE
    if marker.is_file():
        return marker.read_text().strip()
    try:
        head = subprocess.run(["git", "-C", str(source_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() if head.returncode == 0 else None


def make_source(out: Path, *, mirror: Optional[Path] = None, clone: Optional[str] = None,
                revision: str = PINNED_REVISION) -> Path:
    """Write ``revision``'s SOURCE_SUBDIRS into ``out/executorch`` (replacing ``out``); returns ``out``.

    From ``mirror`` (a git directory, bare or not, that holds the revision) with
    ``git archive``, or else from a shallow fetch of ``clone`` (a repository URL).
    """
    if (mirror is None) == (clone is None):
        raise ValueError("make_source: give exactly one of mirror and clone")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        if clone is not None:
            git_dir = staging / "clone.git"
            for command in (["git", "init", "-q", "--bare", str(git_dir)],
                            ["git", "--git-dir", str(git_dir), "fetch", "-q", "--depth", "1", clone, revision]):
                subprocess.run(command, check=True)
            mirror = git_dir
        archive = staging / "source.tar"
        with open(archive, "wb") as handle:
            # A mirror may lack blobs outside these folders: git archive then complains on
            # stderr but writes every file asked for, so success is judged by the tar's content.
            result = subprocess.run(["git", "--git-dir", str(mirror), "archive", "--format=tar",
                                     "--prefix=executorch/", revision, *SOURCE_SUBDIRS],
                                    stdout=handle, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0 or archive.stat().st_size == 0:
            raise CudaRuntimeUnavailable(
                f"git archive of {revision} from {mirror} failed: {result.stderr.strip()[-500:]}"
            )
        tree = staging / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        _source_root(tree)  # every subfolder arrived
        (tree / REVISION_FILE).write_text(revision + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tree, out)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------


def _wheel_dirs() -> tuple[Path, list[Path], Path]:
    """(the executorch wheel's root, its include dirs, its lib dir) as its CMake package names them."""
    import executorch

    root = Path(next(iter(executorch.__path__)))
    include = root / "include"
    c10 = include / "executorch" / "runtime" / "core" / "portable_type" / "c10"
    lib = root / "lib"
    if not (lib / "libexecutorch.so").is_file() or not include.is_dir():
        raise CudaRuntimeUnavailable(f"the executorch package at {root} has no include/ or lib/libexecutorch.so")
    return root, [include, c10], lib


def _cuda_dirs() -> list[Path]:
    """Where CUDA's headers and libraries may be: $CUDA_HOME, nvcc's toolkit, /usr/local/cuda, and the
    nvidia-* packages torch installs."""
    candidates = [os.environ.get(name) for name in ("CUDA_HOME", "CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    candidates.append("/usr/local/cuda")
    try:
        import nvidia

        candidates += [str(Path(path) / sub) for path in nvidia.__path__ for sub in ("cu13", "cuda_runtime", "cublas")]
    except ImportError:
        pass
    return [Path(candidate) for candidate in dict.fromkeys(filter(None, candidates))]


def _find_library(header: str, names: tuple[str, ...], what: str) -> tuple[Path, Path]:
    """(include dir, library file) of the first CUDA folder holding both ``header`` and one of ``names``."""
    candidates = _cuda_dirs()
    for base in candidates:
        if not (base / "include" / header).is_file():
            continue
        for lib_dir in (base / "lib64", base / "lib", base / "targets" / "x86_64-linux" / "lib"):
            for name in names:
                if (lib_dir / name).is_file():
                    return base / "include", lib_dir / name
    raise CudaRuntimeUnavailable(
        f"no {what} found (include/{header} and {names[0]}; tried {[str(c) for c in candidates]}): set CUDA_HOME"
    )


def find_cuda() -> tuple[Path, Path]:
    """(CUDA include dir, libcudart file)."""
    return _find_library("cuda_runtime.h", ("libcudart.so", "libcudart.so.13", "libcudart.so.12"), "CUDA toolkit")


def find_cublas() -> tuple[Path, Path]:
    """(cuBLAS include dir, libcublas file), for ``runtime/cublas_mm.cpp``."""
    return _find_library("cublas_v2.h", ("libcublas.so", "libcublas.so.13", "libcublas.so.12"), "cuBLAS")


def compile_commands(source_root: Path, objects: Path, cxx: str = "g++") -> list[tuple[list[str], Path]]:
    """The compiler command of every runtime source (and ours), with its object file."""
    _, wheel_includes, _ = _wheel_dirs()
    cuda_include, _ = find_cuda()
    cublas_include, _ = find_cublas()
    flags = [
        "-std=c++17", "-O2", "-fPIC", "-DCUDA_AVAILABLE=1",
        # What the wheel's CMake package asks of its consumers (EXECUTORCH_COMPILE_DEFINITIONS):
        # the vendored c10 headers without a generated cmake_macros.h, and the same
        # event-tracer class layout as libexecutorch.so.
        "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
        f"-I{source_root.parent}",  # <executorch/backends/...> from the source folder first
        *(f"-I{path}" for path in wheel_includes),
        *(f"-I{path}" for path in dict.fromkeys((cuda_include, cublas_include))),
    ]
    sources = [source_root / path for path in RUNTIME_SOURCES] + list(OWN_SOURCES)
    commands = []
    for source in sources:
        name = str(source.relative_to(source_root if source.is_relative_to(source_root) else PACKAGE_DIR))
        target = objects / (name.replace("/", "_") + ".o")
        commands.append(([cxx, *flags, "-c", str(source), "-o", str(target)], target))
    return commands


def _build_stamp(commands: list, revision: Optional[str], source_dir: Path) -> str:
    """What a build depends on: the revision and folder of the source, each compile command (object
    folder left out), and the text of our own sources, whose edits the revision does not show."""
    digest = hashlib.sha256(f"{revision}\n{source_dir.resolve()}\n".encode())
    for command, target in commands:
        digest.update(" ".join(part for part in command if not part.startswith(str(target.parent))).encode())
    for source in OWN_SOURCES:
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()


def build(source_dir: Path, out: Path = DEFAULT_BUILD_DIR, *, cxx: Optional[str] = None,
          jobs: Optional[int] = None, allow_other_revision: bool = False, force: bool = False) -> Path:
    """Compile the runtime from ``source_dir`` into ``out``; returns the library's path.

    A build whose stamp (``_build_stamp``) matches the last one returns at once, unless ``force``:
    device scripts and ``make cuda-runtime`` call it before every use."""
    source_dir = Path(source_dir)
    root = _source_root(source_dir)
    revision = source_revision(source_dir)
    if revision not in (None, PINNED_REVISION) and not allow_other_revision:
        raise CudaRuntimeUnavailable(
            f"--executorch-src {source_dir} is revision {revision}, not the pinned {PINNED_REVISION}"
        )
    if root.name != "executorch":  # a checkout: include it as <executorch/...> through a link
        include_root = Path(tempfile.mkdtemp(prefix="gdn_et_include_"))
        (include_root / "executorch").symlink_to(root.resolve(), target_is_directory=True)
        root = include_root / "executorch"
    cxx = cxx or os.environ.get("CXX") or "g++"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    objects = Path(tempfile.mkdtemp(dir=out, prefix=".objects."))
    try:
        commands = compile_commands(root, objects, cxx)
        stamp = _build_stamp(commands, revision, source_dir)
        built = (out / LIBRARY_NAME).is_file() and (out / "python").is_dir()
        if built and not force and (out / STAMP_FILE).is_file() and (out / STAMP_FILE).read_text() == stamp:
            return out / LIBRARY_NAME
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda command: subprocess.run(command[0], capture_output=True, text=True),
                                    commands))
        failed = [(command, result) for command, result in zip(commands, results) if result.returncode != 0]
        if failed:
            (command, _), result = failed[0]
            raise CudaRuntimeUnavailable(
                f"compiling {command[-3]} failed ({len(failed)} of {len(commands)} sources):\n"
                f"{' '.join(command)}\n{result.stderr[-4000:]}"
            )
        _, _, wheel_lib = _wheel_dirs()
        _, cudart = find_cuda()
        _, cublas = find_cublas()
        staging = out / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
        link = [cxx, "-shared", "-o", str(staging), *(str(target) for _, target in commands),
                f"-L{wheel_lib}", "-lexecutorch", str(cudart), str(cublas), "-ldl",
                "-Wl,--no-undefined", f"-Wl,-rpath,{':'.join(dict.fromkeys(map(str, (wheel_lib, cudart.parent, cublas.parent))))}"]
        result = subprocess.run(link, capture_output=True, text=True)
        if result.returncode != 0:
            raise CudaRuntimeUnavailable(f"linking {LIBRARY_NAME} failed:\n{' '.join(link)}\n{result.stderr[-4000:]}")
        os.replace(staging, out / LIBRARY_NAME)
    finally:
        shutil.rmtree(objects, ignore_errors=True)
    _copy_lowering(root, out / "python")
    (out / REVISION_FILE).write_text(f"{revision or 'unknown'}\n{source_dir.resolve()}\n")
    (out / STAMP_FILE).write_text(stamp)
    return out / LIBRARY_NAME


def _copy_lowering(root: Path, python_dir: Path) -> None:
    """The source's lowering packages (Python files only) into ``python_dir/executorch/...``."""
    staging = python_dir.with_name(f".{python_dir.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for package in LOWERING_PACKAGES:
        source = root / package
        for path in source.rglob("*.py"):
            if "tests" in path.relative_to(source).parts:
                continue
            target = staging / "executorch" / package / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    shutil.rmtree(python_dir, ignore_errors=True)
    os.replace(staging, python_dir)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

_loaded: Optional[ctypes.CDLL] = None


def library_path() -> Path:
    """``$GDN_CUDA_RUNTIME_LIB`` when set, else the build folder's library."""
    override = os.environ.get(ENV_VAR)
    return Path(override) if override else DEFAULT_BUILD_DIR / LIBRARY_NAME


def _where() -> str:
    return f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the default build folder"


def load() -> ctypes.CDLL:
    """Load the runtime once (RTLD_GLOBAL: the delegates' AOTInductor libraries resolve its
    shims); registers CudaBackend with the wheel's runtime. Raises CudaRuntimeUnavailable."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = library_path()
    if not path.is_file():
        raise CudaRuntimeUnavailable(f"ExecuTorch CUDA runtime: no library at {path} (from {_where()}); {BUILD_HINT}")
    import executorch.extension.pybindings.portable_lib  # noqa: F401  (libexecutorch.so first)

    try:
        _loaded = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise CudaRuntimeUnavailable(
            f"ExecuTorch CUDA runtime: cannot load {path} (from {_where()}): {error}; {BUILD_HINT}"
        ) from error
    return _loaded


def set_option(key: str, value) -> None:
    """Set one of CudaBackend's runtime options (a bool or a string) for this process."""
    library = load()
    if isinstance(value, bool):
        code = library.gdn_cuda_set_bool_option(key.encode(), ctypes.c_int(int(value)))
    else:
        code = library.gdn_cuda_set_string_option(key.encode(), str(value).encode())
    if code != 0:
        raise CudaRuntimeUnavailable(f"CudaBackend refused option {key}={value!r} (ExecuTorch error {code:#x})")


def prepare_for_programs() -> None:
    """Load the runtime and share constants by name across a program's methods.

    ``weight_sharing_across_methods`` makes the second method loaded reuse the
    first one's GPU tensors of the same name: the weights, and the state buffers
    (caches, recurrent and conv states), so ``decode`` continues where ``prefill``
    stopped. Set before any method of a program is loaded.
    """
    set_option("weight_sharing_across_methods", True)


# ---------------------------------------------------------------------------
# The matching lowering
# ---------------------------------------------------------------------------

LOWERING_PREFIXES = tuple("executorch." + package.replace("/", ".") for package in LOWERING_PACKAGES)


class _LoweringFinder(importlib.abc.MetaPathFinder):
    """Imports ``executorch.backends.cuda`` and ``.aoti`` (and everything under them) from one folder."""

    def __init__(self, python_dir: Path):
        self.python_dir = python_dir

    def find_spec(self, fullname, path=None, target=None):
        if not any(fullname == prefix or fullname.startswith(prefix + ".") for prefix in LOWERING_PREFIXES):
            return None
        base = self.python_dir.joinpath(*fullname.split("."))
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
        if base.is_dir():  # a folder without __init__.py (backends/aoti): a namespace package
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        raise ModuleNotFoundError(f"{fullname} is not in the CUDA runtime's lowering ({self.python_dir})", name=fullname)


_finder: Optional[_LoweringFinder] = None


def lowering_dir() -> Path:
    """The Python lowering built beside the runtime library."""
    return library_path().parent / "python"


def use_matching_lowering() -> Path:
    """Make ``executorch.backends.cuda``/``.aoti`` import from the runtime's revision; returns its folder.

    Call before anything imports them. Raises CudaRuntimeUnavailable when the
    runtime is not built, or when the wheel's copies were imported already.
    """
    global _finder
    python_dir = lowering_dir()
    if _finder is not None:
        return _finder.python_dir
    if not (python_dir / "executorch" / "backends" / "cuda" / "cuda_backend.py").is_file():
        raise CudaRuntimeUnavailable(
            f"ExecuTorch CUDA runtime: no lowering at {python_dir} (beside the runtime library, from {_where()}): "
            f"the .pte must be lowered by the runtime's own revision; {BUILD_HINT}"
        )
    stale = sorted(
        name for name, module in sys.modules.items()
        if any(name.startswith(prefix + ".") for prefix in LOWERING_PREFIXES) and module is not None
        and not str(getattr(module, "__file__", "") or "").startswith(str(python_dir))
    )
    if stale:
        raise CudaRuntimeUnavailable(
            f"the executorch wheel's {stale[0]} is imported already; lowering for the CUDA runtime must "
            "import ExecuTorch's CUDA backend from the runtime's revision (start a fresh process)"
        )
    for name in LOWERING_PREFIXES:  # the bare packages, possibly imported from the wheel
        sys.modules.pop(name, None)
    _finder = _LoweringFinder(python_dir)
    sys.meta_path.insert(0, _finder)
    return python_dir


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_backend.executorch_runtime",
                                     description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    source = commands.add_parser("source", help="write the pinned revision's sources into a folder")
    origin = source.add_mutually_exclusive_group(required=True)
    origin.add_argument("--mirror", type=Path, help="a git directory (bare or not) that holds the revision")
    origin.add_argument("--clone", nargs="?", const=EXECUTORCH_REPOSITORY, metavar="URL",
                        help=f"fetch the revision over the network (default {EXECUTORCH_REPOSITORY})")
    source.add_argument("--out", type=Path, default=DEFAULT_SOURCE_DIR)
    source.add_argument("--revision", default=PINNED_REVISION, help=argparse.SUPPRESS)
    built = commands.add_parser("build", help="compile the runtime (and carry its lowering) into a folder")
    built.add_argument("--executorch-src", type=Path, default=None,
                       help=f"the source folder (default {DEFAULT_SOURCE_DIR.relative_to(REPO_ROOT)}, made from "
                            "--mirror, or cloned, when missing)")
    built.add_argument("--mirror", type=Path, default=None, help="make a missing source folder from this git mirror")
    built.add_argument("--out", type=Path, default=DEFAULT_BUILD_DIR)
    built.add_argument("--cxx", default=None, help="the C++ compiler (default $CXX or g++)")
    built.add_argument("-j", "--jobs", type=int, default=None)
    built.add_argument("--force", action="store_true", help="compile even when the last build is up to date")
    built.add_argument("--allow-other-revision", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.command == "source":
            out = make_source(args.out, mirror=args.mirror, clone=args.clone, revision=args.revision)
            print(f"ExecuTorch source {args.revision[:10]}: {out}")
            return 0
        source_dir = args.executorch_src or DEFAULT_SOURCE_DIR
        if args.executorch_src is None and source_revision(source_dir) != PINNED_REVISION:
            mirror = args.mirror or (Path(os.environ["GDN_EXECUTORCH_MIRROR"])
                                     if os.environ.get("GDN_EXECUTORCH_MIRROR") else None)
            make_source(source_dir, mirror=mirror, clone=None if mirror else EXECUTORCH_REPOSITORY)
        library = build(source_dir, args.out, cxx=args.cxx, jobs=args.jobs,
                        allow_other_revision=args.allow_other_revision, force=args.force)
        print(f"ExecuTorch CUDA runtime {PINNED_REVISION[:10]}: {library}")
        return 0
    except (CudaRuntimeUnavailable, subprocess.CalledProcessError) as error:
        print(f"cuda runtime: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
