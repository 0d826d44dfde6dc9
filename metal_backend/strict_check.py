"""Stricter compilers over the Metal sources, off Apple: part of ``make metal-check``.

* ``kernel_bindings()`` (pure Python, also a test): every ``[[buffer(n)]]`` of
  each kernel in ``kernels/gated_delta_rule.metal`` is numbered in parameter
  order and matches, argument for argument, the order every host binds
  (``runtime/c_shims.mm`` through ``encode_dispatch``, ``mps_eager.py``,
  ``emulation.py``, and the kernel calls of the emulation and the CUDA port);
  only outputs are writable; the constant buffer holds the
  params struct ``launch.h`` plans; every attribute is one Metal defines, on a
  type Metal allows; the work-split constants agree.
* ``main_file_cxx14()`` (g++): the source Metal is given (params header
  inlined, ``mps_eager.kernel_source()``) compiles as a main file in C++14,
  the dialect MSL is based on, with every warning an error.
* ``address_spaces()`` (clang): the kernel source compiled with ``device``,
  ``constant``, ``threadgroup`` and ``thread`` as distinct clang address spaces
  (``strict/address_spaces/metal_stdlib``), so a pointer passed or assigned
  across them is an error as in Metal; a planted mix-up must be rejected.
* ``cuda_port_compile()`` (nvcc, where the CUDA toolkit is): the same source
  built as CUDA through ``device/include/metal_stdlib`` (``metal_backend/device/``).
* ``objective_cxx_host()`` (clang): ``runtime/*.mm`` through
  ``clang -x objective-c++ -fobjc-arc -fsyntax-only`` against ExecuTorch's Metal
  runtime headers (at ``EXECUTORCH_COMMIT``) and the stand-in SDK headers of
  ``strict/apple_sdk/`` (declarations only), once as a macOS 14 SDK and once as
  a macOS 15 one.

ExecuTorch's headers come from a checkout (``EXECUTORCH_SOURCE_DIR``) or a git
directory holding ``EXECUTORCH_COMMIT`` (``EXECUTORCH_GIT_DIR``); only the
headers the two host files include are copied, into ``build/`` (git-ignored).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPOSITORY = PACKAGE_DIR.parent
KERNEL_SOURCE = PACKAGE_DIR / "kernels" / "gated_delta_rule.metal"
STRICT_DIR = PACKAGE_DIR / "strict"
BUILD_DIR = REPOSITORY / "build" / "metal_strict"
HOST_SOURCES = (PACKAGE_DIR / "runtime" / "metal_dispatch.mm", PACKAGE_DIR / "runtime" / "c_shims.mm")

# The ExecuTorch sources the Objective-C++ check reads (main, 2026-08-22; the
# executorch 1.5.1 wheel's own commit is not public).
EXECUTORCH_COMMIT = "cff6f4dd32e630945b7188512c1f2b4f102b05ad"
EXECUTORCH_ENTRY_HEADERS = (
    "backends/apple/metal/runtime/ops/common.h",
    "backends/apple/metal/runtime/shims/types.h",
)
# ExecuTorch's build puts its vendored c10 on the include path.
EXECUTORCH_C10_DIR = "runtime/core/portable_type/c10"

CLANG_HINT = (
    "clang not found: the address-space and Objective-C++ checks of make metal-check need clang "
    "(Debian/Ubuntu: apt-get install -y clang; macOS: xcode-select --install), or set CLANG=/path/to/clang++"
)


class CheckError(RuntimeError):
    """A strict check failed or cannot run; the message says which and why."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    summary: str


def clang() -> str:
    found = os.environ.get("CLANG") or shutil.which("clang++") or shutil.which("clang")
    if found is None:
        raise CheckError(CLANG_HINT)
    return found


def _executorch_reader():
    """(label, read(path) -> text or None) over ExecuTorch's sources, from the environment."""
    source_dir = os.environ.get("EXECUTORCH_SOURCE_DIR")
    if source_dir:
        root = Path(source_dir)
        if not (root / EXECUTORCH_ENTRY_HEADERS[0]).is_file():
            raise CheckError(f"EXECUTORCH_SOURCE_DIR={source_dir} is not an ExecuTorch checkout "
                             f"(no {EXECUTORCH_ENTRY_HEADERS[0]})")

        def read_checkout(path: str):
            file = root / path
            return file.read_text() if file.is_file() else None

        return f"checkout {root}", read_checkout
    git_dir = os.environ.get("EXECUTORCH_GIT_DIR")
    if git_dir:
        def read_commit(path: str):
            result = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{EXECUTORCH_COMMIT}:{path}"],
                                    capture_output=True, text=True)
            return result.stdout if result.returncode == 0 else None

        if read_commit(EXECUTORCH_ENTRY_HEADERS[0]) is None:
            raise CheckError(f"EXECUTORCH_GIT_DIR={git_dir} does not hold ExecuTorch commit {EXECUTORCH_COMMIT}")
        return f"commit {EXECUTORCH_COMMIT[:12]}", read_commit
    raise CheckError(
        "the Objective-C++ check needs ExecuTorch's Metal runtime headers: set EXECUTORCH_SOURCE_DIR to an "
        "ExecuTorch checkout (git clone https://github.com/pytorch/executorch), or EXECUTORCH_GIT_DIR to a git "
        f"directory holding commit {EXECUTORCH_COMMIT}"
    )


def executorch_headers() -> tuple[str, Path]:
    """(where from, include root) of the ExecuTorch headers the host files include, transitively.

    Copied into build/ once per commit; a checkout (EXECUTORCH_SOURCE_DIR) is copied afresh each run.
    """
    cached = BUILD_DIR / f"executorch-{EXECUTORCH_COMMIT[:12]}"
    if not os.environ.get("EXECUTORCH_SOURCE_DIR") and (cached / ".complete").exists():
        return f"commit {EXECUTORCH_COMMIT[:12]} (cached)", cached
    label, read = _executorch_reader()
    root = BUILD_DIR / ("executorch-checkout" if label.startswith("checkout") else cached.name)
    shutil.rmtree(root, ignore_errors=True)
    pending, copied = list(EXECUTORCH_ENTRY_HEADERS), set()
    while pending:
        path = pending.pop()
        if path in copied:
            continue
        text = read(path)
        if text is None:  # an include behind a configuration this build does not use (ATen mode)
            continue
        copied.add(path)
        target = root / "executorch" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        for included in re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, re.M):
            if included.startswith("executorch/"):
                pending.append(included.removeprefix("executorch/"))
            elif included.startswith(("c10/", "torch/headeronly/")):
                pending.append(f"{EXECUTORCH_C10_DIR}/{included}")
    (root / ".complete").write_text(f"{label}: {len(copied)} headers\n")
    return label, root


# Metal's attributes for compute-kernel arguments, with the types Metal allows
# each (Metal Shading Language Specification, "Attributes for kernel function
# input arguments"); buffer(n) takes device or constant pointers/references.
_GRID_TYPES = {"uint", "uint2", "uint3", "ushort", "ushort2", "ushort3"}
_SCALAR_TYPES = {"uint", "ushort"}
METAL_KERNEL_ATTRIBUTES = {
    **dict.fromkeys(
        ("thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
         "threads_per_grid", "threads_per_threadgroup", "threadgroups_per_grid", "grid_origin", "grid_size",
         "dispatch_threads_per_threadgroup"),
        _GRID_TYPES,
    ),
    **dict.fromkeys(
        ("thread_index_in_threadgroup", "thread_index_in_simdgroup", "thread_index_in_quadgroup",
         "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup", "threads_per_simdgroup",
         "thread_execution_width", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup"),
        _SCALAR_TYPES,
    ),
    "buffer": None,
}
# Buffers a kernel may write: the op's output and its (final or in-place) state.
WRITTEN_BUFFERS = {"output", "final_state", "state"}

SOURCE_FILES = {
    "kernel": KERNEL_SOURCE,
    "launch": PACKAGE_DIR / "runtime" / "launch.h",
    "c_shims": PACKAGE_DIR / "runtime" / "c_shims.mm",
    "mps_eager": PACKAGE_DIR / "mps_eager.py",
    "emulation": PACKAGE_DIR / "emulation.py",
    "emulated_kernels": PACKAGE_DIR / "emulation" / "emulated_kernels.cpp",
    "cuda_port": PACKAGE_DIR / "device" / "cuda_port.cu",
}


@dataclass(frozen=True)
class KernelArgument:
    name: str
    type_words: tuple
    attribute: str
    index: int | None  # buffer(n)

    @property
    def address_space(self) -> str | None:
        return next((w for w in self.type_words if w in ("device", "constant", "threadgroup", "thread")), None)

    @property
    def base_type(self) -> str:
        return next(w for w in self.type_words if w not in ("const", "device", "constant", "threadgroup", "thread"))


def _split_top_level(text: str) -> list[str]:
    """Splits on commas outside parentheses and brackets."""
    parts, depth, current = [], 0, ""
    for character in text:
        depth += character in "([<"
        depth -= character in ")]>"
        if character == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    return parts + [current] if current.strip() else parts


def kernel_signatures(source: str) -> dict[str, list[KernelArgument]]:
    """Each [[kernel]] function's arguments, in order, from the .metal text."""
    source = re.sub(r"//[^\n]*", "", source)
    kernels = {}
    for name, parameters in re.findall(r"\[\[kernel\]\]\s+void\s+(\w+)\s*\((.*?)\)\s*\{", source, re.S):
        arguments = []
        for parameter in _split_top_level(parameters):
            attribute = re.search(r"\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]", parameter)
            if attribute is None:
                raise CheckError(f"{name}: argument without a Metal attribute: {' '.join(parameter.split())}")
            declaration = parameter[: attribute.start()].replace("*", " * ").replace("&", " & ").split()
            arguments.append(KernelArgument(
                name=declaration[-1], type_words=tuple(declaration[:-1]), attribute=attribute.group(1),
                index=int(attribute.group(2)) if attribute.group(2) else None,
            ))
        kernels[name] = arguments
    return kernels


def _same_role(host_name: str, kernel_name: str) -> bool:
    """A host's tensor name binds a kernel argument of that role (one state tensor serves both state slots)."""
    return host_name == kernel_name or (host_name == "state" and kernel_name in ("initial_state", "final_state"))


def _host_bindings(texts: dict) -> list[tuple[str, str, list, int | None]]:
    """(binder, kernel, tensor names in binding order, index of the params bytes) of every host binder."""
    bindings = []
    shims = re.sub(r"//[^\n]*", "", texts["c_shims"])
    for body in re.split(r"\nAOTITorchError aoti_torch_mps_", shims)[1:]:
        kernel = re.search(r"plan_(\w+?)(?:_inplace)?\(", body).group(1)
        listed = re.search(r"const EtTensor\* tensors\[(\d+)\] = \{(.*?)\};", body, re.S)
        names = [re.search(r'"(\w+)"', entry).group(1) if "tensor_of" in entry else entry.strip()
                 for entry in _split_top_level(listed.group(2))]
        for index, assigned in re.findall(r"tensors\[(\d+)\] = reinterpret_cast<const EtTensor\*>\((\w+)\)", body):
            names[int(index)] = assigned
        # encode_dispatch's contract (metal_dispatch.h): tensors at 0..count-1, the params at count.
        count = re.search(r"\btensors, (\d+),", body)
        bindings.append(("runtime/c_shims.mm", kernel, names, int(count.group(1)) if count else None))
    eager = texts["mps_eager"]
    if "kernel(*tensors, words," not in eager:
        raise CheckError("mps_eager._dispatch no longer passes the tensors then the parameter words")
    for function in re.split(r"\ndef ", eager)[1:]:
        dispatched = re.search(r"_dispatch\(launch, ([\w, ]+)\)", function)
        planned = re.search(r"launch = plan_(\w+)\(", function)
        if dispatched and planned:
            names = [n.strip() for n in dispatched.group(1).split(",")]
            bindings.append(("mps_eager.py", planned.group(1), names, len(names)))
    for function in re.split(r"\n    def ", texts["emulation"])[1:]:
        named = re.search(r"named = \{(.*?)\}", function, re.S)
        launched = re.search(r'self\.call\("gdn_(\w+)"', function)
        if named and launched:
            names = re.findall(r'"(\w+)":', named.group(1))
            bindings.append(("emulation.py", launched.group(1), names, len(names)))
    return bindings


def _harness_calls(binder: str, text: str) -> list[tuple[str, str, list, list]]:
    """(binder, kernel, data indices, position names) of each kernel call in a harness source."""
    calls = []
    for kernel, arguments in re.findall(r"\b(\w*gated_delta_rule)<[\w, ]+>\(\s*(static_cast.*?)\);", text, re.S):
        data = [int(i) for i in re.findall(r"data\[(\d+)\]", arguments)]
        positions = re.findall(r"\bat\.(\w+)", arguments)
        calls.append((binder, kernel, data, positions))
    return calls


def kernel_bindings(texts: dict | None = None) -> CheckResult:
    """The kernels' [[buffer(n)]] and position attributes against every host binder (see the module doc).

    ``texts`` overrides sources by key of SOURCE_FILES (the tests plant mistakes that way).
    """
    texts = {key: path.read_text() for key, path in SOURCE_FILES.items() if path.exists()} | (texts or {})
    kernels = kernel_signatures(texts["kernel"])
    launch = texts["launch"]
    problems = []
    counts = {"buffers": 0, "positions": 0}
    for kernel, arguments in kernels.items():
        buffers = [a for a in arguments if a.attribute == "buffer"]
        positions = [a for a in arguments if a.attribute != "buffer"]
        counts["buffers"] += len(buffers)
        counts["positions"] += len(positions)
        if [a.index for a in buffers] != list(range(len(buffers))) or arguments[: len(buffers)] != buffers:
            problems.append(f"{kernel}: buffer indices {[a.index for a in buffers]} are not 0..n-1 in argument order")
        for argument in arguments:
            allowed = METAL_KERNEL_ATTRIBUTES.get(argument.attribute, ())
            if argument.attribute not in METAL_KERNEL_ATTRIBUTES:
                problems.append(f"{kernel}.{argument.name}: [[{argument.attribute}]] is not a Metal kernel attribute")
            elif allowed is not None and argument.base_type not in allowed:
                problems.append(f"{kernel}.{argument.name}: [[{argument.attribute}]] on {argument.base_type}, "
                                f"Metal allows {sorted(allowed)}")
        params = buffers[-1]
        launch_type = re.search(rf"inline (\w+) plan_{kernel}\(", launch)
        params_type = launch_type and re.search(rf"struct {launch_type.group(1)} \{{\s*(\w+) params;", launch)
        if params.address_space != "constant" or "&" not in params.type_words:
            problems.append(f"{kernel}: the last buffer ({params.name}) must be a constant reference to the params")
        elif params_type is None or params.base_type != params_type.group(1):
            problems.append(f"{kernel}: params are {params.base_type}, launch.h plans "
                            f"{params_type.group(1) if params_type else 'nothing'} for plan_{kernel}")
        for argument in buffers[:-1]:
            writable = "const" not in argument.type_words
            if argument.address_space != "device" or "*" not in argument.type_words:
                problems.append(f"{kernel}.{argument.name}: tensors bind as device pointers")
            if writable != (argument.name in WRITTEN_BUFFERS):
                problems.append(f"{kernel}.{argument.name}: {'writable' if writable else 'const'}, expected the "
                                "opposite (only outputs and the state are written)")
    binders = set()
    host_bindings = _host_bindings(texts)
    for binder in ("runtime/c_shims.mm", "mps_eager.py", "emulation.py"):
        bound = {kernel for name, kernel, _, _ in host_bindings if name == binder}
        if bound != set(kernels):
            problems.append(f"{binder}: found bindings of {sorted(bound)}, expected {sorted(kernels)} "
                            "(has the binding code changed shape?)")
    for binder, kernel, names, params_index in host_bindings:
        binders.add(binder)
        expected = [a.name for a in kernels.get(kernel, []) if a.attribute == "buffer"]
        if not expected:
            problems.append(f"{binder}: binds kernel {kernel}, which the .metal file does not define")
            continue
        tensors = expected[:-1]
        if len(names) != len(tensors) or not all(map(_same_role, names, tensors)):
            problems.append(f"{binder}: binds {kernel}'s buffers as {names}, the kernel reads {tensors}")
        if params_index != len(tensors):
            problems.append(f"{binder}: binds {kernel}'s params at index {params_index}, the kernel reads "
                            f"[[buffer({len(tensors)})]]")
    for binder in ("emulated_kernels", "cuda_port"):
        if binder not in texts:
            continue
        binders.add(SOURCE_FILES[binder].name)
        calls = _harness_calls(binder, texts[binder])
        if {kernel for _, kernel, _, _ in calls} != set(kernels):
            problems.append(f"{binder}: found calls of {sorted(k for _, k, _, _ in calls)}, expected {sorted(kernels)}")
        for _, kernel, data, positions in calls:
            arguments = kernels.get(kernel, [])
            tensors = [a for a in arguments if a.attribute == "buffer"][:-1]
            if data != list(range(len(tensors))):
                problems.append(f"{binder}: passes {kernel} data{data}, the kernel takes {len(tensors)} buffers")
            expected_positions = [a.attribute for a in arguments if a.attribute != "buffer"]
            if positions != expected_positions:
                problems.append(f"{binder}: passes {kernel} positions {positions}, its attributes are "
                                f"{expected_positions}")
    constants = {name: int(value) for name, value in re.findall(r"\b(k\w+) = (\d+),", texts["kernel"])}
    for name, value in constants.items():
        planned = re.search(rf"constexpr int {name} = (\d+);", launch)
        if planned is None or int(planned.group(1)) != value:
            problems.append(f"{name} is {value} in the .metal file, "
                            f"{planned.group(1) if planned else 'absent'} in launch.h")
    if problems:
        raise CheckError("kernel bindings:\n  " + "\n  ".join(problems))
    return CheckResult(
        "kernel bindings",
        f"{len(kernels)} kernels, {counts['buffers']} buffer and {counts['positions']} position arguments, "
        f"{len(constants)} work-split constants, against {len(binders)} binders ({', '.join(sorted(binders))})",
    )


def _gxx() -> str:
    found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise CheckError("no C++ compiler found (g++, or set CXX)")
    return found


def _run(command: list, what: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if result.returncode != 0:
        raise CheckError(f"{what} failed:\n{' '.join(map(str, command))}\n{result.stderr[-4000:]}")
    return result


def main_file_cxx14(source: str | None = None) -> CheckResult:
    """What Metal compiles (mps_eager.kernel_source(), or ``source``) as a C++14 main file, warnings as errors."""
    from metal_backend import mps_eager

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    path = BUILD_DIR / "kernel_source_main.metal"
    path.write_text(mps_eager.kernel_source() if source is None else source)
    compiler = _gxx()
    _run([compiler, "-std=c++14", "-fsyntax-only", "-x", "c++", "-Wall", "-Wextra", "-Werror", "-Wno-attributes",
          "-I", PACKAGE_DIR / "emulation" / "include", path], "compiling the Metal source as a C++14 main file")
    return CheckResult("C++14 main file", f"the source Metal compiles (params header inlined), "
                                          f"{Path(compiler).name} -std=c++14 -Wall -Wextra -Werror: clean")


_INSTANTIATION_ATTRIBUTES = re.compile(r'template\s*\[\[host_name\(((?:\s*"[^"]*")+)\s*\)\]\]\s*\[\[\s*\]\]')


def address_spaces(source: str | None = None) -> CheckResult:
    """The kernel source with Metal's address spaces as clang's (see the module doc), and a planted mix-up.

    clang has no attributes on explicit instantiations, so the instantiations'
    [[host_name]] [[kernel]] are dropped after preprocessing (kernel_bindings
    checks attributes); every instantiation is still compiled.
    """
    source = KERNEL_SOURCE.read_text() if source is None else source
    planted = source.replace("inline void load_state(thread float4* state, const device float* base",
                             "inline void load_state(thread float4* state, const thread float* base", 1)
    if planted == source:
        raise CheckError("address spaces: the planted mix-up no longer applies (load_state's signature changed)")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    compiler = clang()

    def compile_source(text: str, name: str) -> tuple[subprocess.CompletedProcess, int]:
        path = BUILD_DIR / f"{name}.metal"
        path.write_text(text)
        preprocessed = _run([compiler, "-E", "-P", "-x", "c++", "-std=c++14", "-I", KERNEL_SOURCE.parent,
                             "-I", STRICT_DIR / "address_spaces", path], "preprocessing the kernel source").stdout
        preprocessed, instantiations = _INSTANTIATION_ATTRIBUTES.subn("template", preprocessed)
        (BUILD_DIR / f"{name}.cpp").write_text(preprocessed)
        result = subprocess.run([compiler, "-fsyntax-only", "-x", "c++", "-std=c++14", "-Wall", "-Wextra", "-Werror",
                                 "-Wno-unknown-attributes", str(BUILD_DIR / f"{name}.cpp")],
                                capture_output=True, text=True)
        return result, instantiations

    result, instantiations = compile_source(source, "address_spaces")
    if result.returncode != 0:
        raise CheckError(f"address spaces: the kernel source does not compile with Metal's address spaces:\n"
                         f"{result.stderr[-4000:]}")
    rejected, _ = compile_source(planted, "address_spaces_planted")
    if rejected.returncode == 0 or "address_space" not in rejected.stderr:
        raise CheckError("address spaces: a device pointer passed as a thread pointer compiled: "
                         "the check does not see address spaces")
    return CheckResult("address spaces", f"{instantiations} kernel instantiations compile clean with device/constant/"
                                         f"threadgroup/thread distinct ({Path(compiler).name}); "
                                         "1 planted mix-up rejected")


def _kernel_source_header() -> Path:
    """gdn_metal_kernels_source.h as the CMake build generates it (embed_kernel_source.cmake)."""
    from runtime_ops.build import find_cmake

    generated = BUILD_DIR / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    _run([find_cmake(), f"-DGDN_KERNEL_DIR={PACKAGE_DIR / 'kernels'}",
          f"-DGDN_KERNEL_SOURCE_HEADER={generated / 'gdn_metal_kernels_source.h'}",
          "-P", PACKAGE_DIR / "embed_kernel_source.cmake"], "generating gdn_metal_kernels_source.h")
    return generated


# The SDKs the host files must compile against: macOS 14 (Metal 3.1, the
# minimum) and 15 (mathMode replaces fastMathEnabled).
SDK_VERSIONS = {"macOS 14 SDK": 140000, "macOS 15 SDK": 150000}


def objective_cxx_host(sources: dict | None = None) -> CheckResult:
    """runtime/*.mm (or ``sources``: {name: text}) through clang's Objective-C++ front end with ARC."""
    label, executorch_root = executorch_headers()
    compiler = clang()
    generated = _kernel_source_header()
    if sources is None:
        sources = {path.name: path.read_text() for path in HOST_SOURCES}
    compiled = 0
    for name, text in sources.items():
        path = BUILD_DIR / "host" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for sdk, version in SDK_VERSIONS.items():
            _run([compiler, "-x", "objective-c++", "-std=c++17", "-fobjc-arc", "-fblocks",
                  "-fobjc-runtime=macosx-14.0", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                  "-DC10_USING_CUSTOM_GENERATED_MACROS", f"-D__MAC_OS_X_VERSION_MAX_ALLOWED={version}",
                  "-isystem", STRICT_DIR / "apple_sdk", "-isystem", executorch_root,
                  "-isystem", executorch_root / "executorch" / EXECUTORCH_C10_DIR,
                  "-I", PACKAGE_DIR / "runtime", "-I", generated, path],
                 f"Objective-C++ syntax check of {name} ({sdk})")
            compiled += 1
    return CheckResult("Objective-C++ host", f"{len(sources)} files x {len(SDK_VERSIONS)} SDKs = {compiled} "
                                             f"compiles clean ({Path(compiler).name} -fobjc-arc, ExecuTorch {label})")


def cuda_port_compile() -> CheckResult:
    """The unchanged .metal source built as CUDA by nvcc (metal_backend/device/), when the toolkit is here.

    Without nvcc this says so and passes: the device step builds it there.
    """
    from metal_backend import emulation
    from metal_backend.device import cuda_port

    try:
        names = cuda_port.CUDA_PORT.kernel_names()
    except RuntimeError as error:
        if "needs nvcc" in str(error):
            return CheckResult("CUDA port", "not built here (no nvcc); metal_backend/device/run_on_device.sh "
                                            "builds and runs it on a GPU")
        raise CheckError(f"CUDA port: {error}") from None
    if names != emulation.kernel_names():
        raise CheckError(f"CUDA port: holds {sorted(names ^ emulation.kernel_names())} unlike the emulation")
    return CheckResult("CUDA port", f"{len(names)} kernels built by nvcc for {cuda_port.ARCHITECTURE} "
                                    "from the unchanged .metal source (they run on the device step)")


def run_all() -> list[tuple[str, str | None, str | None]]:
    """(check name, summary or None, error or None) of every strict check, in order."""
    outcomes = []
    for name, check in (("kernel bindings", kernel_bindings), ("C++14 main file", main_file_cxx14),
                        ("address spaces", address_spaces), ("Objective-C++ host", objective_cxx_host),
                        ("CUDA port", cuda_port_compile)):
        try:
            outcomes.append((name, check().summary, None))
        except CheckError as error:
            outcomes.append((name, None, str(error)))
    return outcomes
