"""``gdn-bench e2e --hide-avx512``: our programs timed as an AVX2-only x86 machine runs them, on one with AVX-512.

Issue 20's floors hold on AVX2-only and on AVX-512 machines alike, and every machine here has AVX-512. What an
AVX2-only machine changes is which kernels run. Memory, caches and clock stay this machine's own, so a run with
AVX-512 hidden measures this machine's cores and memory with an AVX2-only instruction set, not another machine.

Each library picks its kernels its own way, so each is told on its own:

- **XNNPACK** (inside ExecuTorch's wheel) picks once, when it starts, from cpuinfo's table of the CPU's features.
  That table is ``cpuinfo_isa``, a struct of one-byte flags in ``libexecutorch_threadpool.so``, and XNNPACK's
  library reads it. ``hide_avx512`` fills the table (``cpuinfo_initialize``), checks that it has the layout
  below, and clears its AVX-512 flags (AVX-VNNI's, AVX10's and AMX's too) before any program loads.
- **Our kernels** pick when they are compiled, so the runtime_ops library must be one built for x86-64-v3
  (``python -m runtime_ops.build --march x86-64-v3 --build-dir DIR --no-install``, then
  ``GDN_RUNTIME_OPS_LIB=DIR/libgdn_runtime_ops.so``). ``check_runtime_ops_library`` refuses one with AVX-512
  loops.
- **PyTorch**, which in a program's process only picks each next token, is told by ``ATEN_CPU_CAPABILITY=avx2``.
- **llama.cpp** needs a build made with ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF``, given to
  ``--llama-cpp`` (gdn_bench/README.md).
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

ENV_VAR = "GDN_BENCH_HIDE_AVX512"  # set by the bench's parent process; its spawned children hide AVX-512 too

# cpuinfo.h's struct cpuinfo_x86_isa as compiled for x86-64: one bool per field, in this order (the fields
# under CPUINFO_ARCH_X86 alone are absent). The ExecuTorch 1.5.1 wheel's table is these 85 bytes.
FIELDS = (
    "rdtscp rdpid sysenter msr clzero clflush clflushopt mwait mwaitx fxsave xsave three_d_now three_d_now_plus "
    "prefetch prefetchw prefetchwt1 sse3 ssse3 sse4_1 sse4_2 sse4a misaligned_sse avx avxvnni fma3 fma4 xop f16c "
    "avx2 avx512f avx512pf avx512er avx512cd avx512dq avx512bw avx512vl avx512ifma avx512vbmi avx512vbmi2 "
    "avx512bitalg avx512vpopcntdq avx512vnni avx512bf16 avx512fp16 avx512vp2intersect avx512_4vnniw "
    "avx512_4fmaps avx10_1 avx10_2 amx_bf16 amx_tile amx_int8 amx_fp16 avx_vnni_int8 avx_vnni_int16 "
    "avx_ne_convert hle rtm xtest mpx cmpxchg16b clwb movbe lahf_sahf fs_gs_base lzcnt popcnt tbm bmi bmi2 adx "
    "aes vaes pclmulqdq vpclmulqdq gfni rdrand rdseed sha rng ace ace2 phe pmm lwp"
).split()

# Fields whose value must equal the kernel's flag of this name in /proc/cpuinfo: the check that the table
# has the layout above before anything is written into it.
CHECKED = {
    "sse3": "pni", "ssse3": "ssse3", "sse4_1": "sse4_1", "sse4_2": "sse4_2", "avx": "avx", "avxvnni": "avx_vnni",
    "fma3": "fma", "f16c": "f16c", "avx2": "avx2", "avx512f": "avx512f", "avx512cd": "avx512cd",
    "avx512dq": "avx512dq", "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "cmpxchg16b": "cx16", "movbe": "movbe", "popcnt": "popcnt", "bmi": "bmi1",
    "bmi2": "bmi2", "adx": "adx", "aes": "aes", "pclmulqdq": "pclmulqdq", "sha": "sha_ni",
}

# What an AVX2-only CPU lacks: every field from avx512f up to the end of AMX's, and AVX-VNNI (an AVX2-era
# extension that Zen 3 and Haswell-to-Comet-Lake Intel parts, the AVX2-only x86 most people run, do not have).
HIDDEN = ("avxvnni", *FIELDS[FIELDS.index("avx512f"):FIELDS.index("amx_fp16") + 1])


class IsaError(RuntimeError):
    """AVX-512 cannot be hidden here, or not faithfully; the message says why."""


def _first_processor(key: str):
    """The value of ``key`` for the first processor in /proc/cpuinfo (None where there is no such file or key)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


def cpu_flags() -> set:
    """The kernel's flags of the first processor in /proc/cpuinfo (empty where there is no such file)."""
    return set((_first_processor("flags") or "").split())


def cpu_name() -> str:
    """The processor's model name, as /proc/cpuinfo gives it."""
    return _first_processor("model name") or platform.processor() or "unknown CPU"


def _threadpool_library() -> Path:
    import executorch

    return Path(next(iter(executorch.__path__))) / "lib" / "libexecutorch_threadpool.so"


def cpuinfo_table():
    """cpuinfo's feature table as XNNPACK reads it, filled: a ctypes array of ``len(FIELDS)`` bytes."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise IsaError(f"--hide-avx512: only on x86-64 Linux, this is {platform.system()} {platform.machine()}")
    library_path = _threadpool_library()
    # Loaded by its path before any program: ExecuTorch's own libraries then find this one by its name.
    library = ctypes.CDLL(str(library_path), mode=ctypes.RTLD_GLOBAL)
    library.cpuinfo_initialize.restype = ctypes.c_bool
    if not library.cpuinfo_initialize():
        raise IsaError(f"--hide-avx512: cpuinfo_initialize failed in {library_path}")
    return (ctypes.c_uint8 * len(FIELDS)).in_dll(library, "cpuinfo_isa")


def check_layout(table, flags: set) -> None:
    """IsaError unless every ``CHECKED`` field of ``table`` says what ``flags`` (/proc/cpuinfo's) say."""
    wrong = [f"{field} = {table[FIELDS.index(field)]} where /proc/cpuinfo {'has' if flag in flags else 'lacks'} "
             f"{flag}" for field, flag in CHECKED.items() if bool(table[FIELDS.index(field)]) != (flag in flags)]
    if wrong:
        raise IsaError("--hide-avx512: ExecuTorch's cpuinfo table is not laid out as cpuinfo.h's struct "
                       f"cpuinfo_x86_isa that this bench knows ({'; '.join(wrong[:3])}), so nothing was hidden")


def hide_avx512(flags: set | None = None) -> list:
    """Clear the ``HIDDEN`` flags of cpuinfo's table in this process; the names of those that were set.

    Must run before the first program loads (XNNPACK reads the table once). ``flags``: /proc/cpuinfo's, for
    the layout check."""
    table = cpuinfo_table()
    check_layout(table, cpu_flags() if flags is None else flags)
    cleared = [name for name in HIDDEN if table[FIELDS.index(name)]]
    for name in HIDDEN:
        table[FIELDS.index(name)] = 0
    return cleared


def apply_requested() -> None:
    """``hide_avx512`` in a process the bench spawned, when its parent asked (``ENV_VAR``)."""
    if os.environ.get(ENV_VAR) == "1":
        hide_avx512()


def runtime_ops_extensions(library: Path) -> list:
    """The vector extensions a runtime_ops library's kernels were compiled for (its own report), read in a
    child process: loading a second runtime_ops library beside one already loaded stops the process (ExecuTorch
    refuses the second registration of each kernel)."""
    read = ("import ctypes, sys; report = ctypes.CDLL(sys.argv[1]).gdn_runtime_ops_vector_extensions; "
            "report.restype = ctypes.c_char_p; print(report().decode())")
    child = subprocess.run([sys.executable, "-c", read, str(library)], capture_output=True, text=True, timeout=300)
    if child.returncode != 0:
        reason = (child.stderr.strip().splitlines() or ["no message"])[-1]
        raise IsaError(f"--hide-avx512: could not read the vector extensions of {library} ({reason})")
    return child.stdout.split()


def check_runtime_ops_library(library: Path) -> list:
    """The library's extensions; IsaError if it has AVX-512 (or AVX-VNNI) loops, naming how to build one without."""
    if not library.is_file():
        raise IsaError(f"--hide-avx512: no runtime_ops library at {library}")
    extensions = runtime_ops_extensions(library)
    wide = [name for name in extensions if name.startswith("avx512") or name == "avx_vnni"]
    if wide:
        raise IsaError(
            f"--hide-avx512: the runtime_ops library {library} was compiled with {', '.join(wide)} loops; build one "
            "for an AVX2-only CPU (python -m runtime_ops.build --march x86-64-v3 --build-dir DIR --no-install) and "
            "set GDN_RUNTIME_OPS_LIB=DIR/libgdn_runtime_ops.so")
    return extensions


def machine_line(hidden: bool) -> str:
    """The CPU and the vector extensions its kernels could use in this run, for the report."""
    flags = cpu_flags()
    wide = sorted(flag for flag in flags if flag.startswith("avx512") or flag in ("avx2", "avx_vnni"))
    # AMX's tile units: a native llama.cpp build on such a CPU compiles ggml's AMX kernels for Q4_0 and Q8_0 weights.
    matrix = sorted(flag for flag in flags if flag.startswith("amx"))
    line = f"{cpu_name()}, {os.cpu_count()} cores; AVX extensions: {' '.join(wide) or 'none'}"
    if matrix:
        line += f"; AMX: {' '.join(matrix)}"
    if hidden:
        line += ("; AVX-512 and AVX-VNNI hidden from XNNPACK, our kernels built for x86-64-v3, PyTorch at "
                 "ATEN_CPU_CAPABILITY=avx2 (--hide-avx512): this machine's cores and memory with AVX2 alone")
    return line
