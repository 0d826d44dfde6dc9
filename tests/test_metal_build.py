"""The build's generated kernel source: valid C++, and the very source the eager path compiles.

``metal_backend/embed_kernel_source.cmake`` (the step CMakeLists.txt runs to
bake the shader into ``gdn_metal_ops``) is run alone, its header compiled into
a program that prints the string, and the result compared with
``mps_eager.kernel_source()``. The rest of the CMake build needs macOS.
"""

from __future__ import annotations

import subprocess

from metal_backend import emulation, mps_eager
from runtime_ops.build import find_cmake

SCRIPT = emulation.PACKAGE_DIR / "embed_kernel_source.cmake"


def test_embedded_source_matches_the_eager_source(tmp_path):
    cmake = find_cmake()  # the system's, or the package index's that make install brings when it is too old
    header = tmp_path / "gdn_metal_kernels_source.h"
    subprocess.run(
        [cmake, f"-DGDN_KERNEL_DIR={emulation.PACKAGE_DIR / 'kernels'}", f"-DGDN_KERNEL_SOURCE_HEADER={header}",
         "-P", str(SCRIPT)],
        check=True, capture_output=True, text=True,
    )
    program = tmp_path / "print_source.cpp"
    program.write_text('#include <cstdio>\n#include "gdn_metal_kernels_source.h"\n'
                       "int main() { std::fputs(kGdnMetalKernelsSource, stdout); }\n")
    binary = tmp_path / "print_source"
    subprocess.run(["g++", "-std=c++17", "-I", str(tmp_path), str(program), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    assert printed == mps_eager.kernel_source()
    assert "struct FusedGatedDeltaRuleParams" in printed and "[[kernel]] void fused_gated_delta_rule(" in printed
