"""The host dispatch's checks around a launch, as far as Linux can run them.

* ``check_pipeline_fits`` (runtime/launch.h, compiled and run here with the
  system C++ compiler): a pipeline whose ``maxTotalThreadsPerThreadgroup`` is
  below the planned threadgroup, or whose SIMD width is not 32, is refused
  with a message naming the kernel and both numbers; a pipeline with room is
  accepted. ``metal_dispatch.mm`` calls it with the pipeline's properties
  before every encode (a text check: no Metal here).
* Text checks of ``runtime/metal_dispatch.mm``, the only evidence possible off
  Apple (``make metal-check`` also compiles it with clang against ExecuTorch's
  headers): the library is compiled in safe math mode on either SDK, and no
  NSError is dereferenced unchecked when a message is built.
"""

from __future__ import annotations

import re
import subprocess

from metal_backend import emulation

DISPATCH_SOURCE = emulation.PACKAGE_DIR / "runtime" / "metal_dispatch.mm"

PIPELINE_PROGRAM = r"""
#include <cstdio>
#include "launch.h"

int main() {
  gdn_metal::DispatchPlan plan{"gated_delta_rule_float_dk128", {8, 32, 1}, {32, 4, 1}};
  const unsigned long long pipelines[][2] = {{1024, 32}, {128, 32}, {96, 32}, {1024, 16}};
  for (const auto& pipeline : pipelines) {
    try {
      gdn_metal::check_pipeline_fits(plan, pipeline[0], pipeline[1]);
      std::printf("accepted\n");
    } catch (const gdn_metal::Unsupported& error) {
      std::printf("refused: %s\n", error.what());
    }
  }
}
"""


def test_pipeline_limits_are_checked_against_the_plan(tmp_path):
    source = tmp_path / "pipeline_fits.cpp"
    source.write_text(PIPELINE_PROGRAM)
    binary = tmp_path / "pipeline_fits"
    subprocess.run(["g++", "-std=c++17", "-I", str(emulation.PACKAGE_DIR / "runtime"), str(source), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    lines = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.splitlines()
    assert lines[:2] == ["accepted", "accepted"]
    assert lines[2] == ("refused: gdn metal: gated_delta_rule_float_dk128 is planned with 128 threads per "
                        "threadgroup, but its pipeline allows at most 96")
    assert lines[3] == ("refused: gdn metal: gated_delta_rule_float_dk128 needs 32-wide SIMD groups, this GPU's "
                        "pipeline has 16")


def _function_body(source: str, signature: str) -> str:
    start = source.index(signature)
    depth, index = 0, source.index("{", start)
    for end in range(index, len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0:
            return source[index:end + 1]
    raise AssertionError(f"unbalanced braces after {signature}")


def test_dispatch_checks_each_pipeline_before_encoding():
    encode = _function_body(DISPATCH_SOURCE.read_text(), "void encode_dispatch(")
    check = encode.index("check_pipeline_fits(plan, pipeline.maxTotalThreadsPerThreadgroup, "
                         "pipeline.threadExecutionWidth)")
    assert check < encode.index("dispatch_sync_with_rethrow")


def test_library_is_compiled_in_safe_math_mode_on_either_sdk():
    compile_library = _function_body(DISPATCH_SOURCE.read_text(), "static id<MTLLibrary> compile_library(")
    newer_sdk, older_sdk = compile_library.split("#else")
    assert re.search(r"if \(@available\(macOS 15\.0, \*\)\) \{\s*options\.mathMode = MTLMathModeSafe;\s*"
                     r"options\.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;\s*"
                     r"\} else \{\s*options\.fastMathEnabled = NO;", newer_sdk)
    assert "options.fastMathEnabled = NO;" in older_sdk.split("#endif")[0]
    assert compile_library.index("#endif") < compile_library.index("newLibraryWithSource:")


def test_no_error_description_is_read_without_a_nil_check():
    source = DISPATCH_SOURCE.read_text()
    describe = _function_body(source, "std::string describe(NSError* error)")
    assert describe.index("error == nil || error.localizedDescription == nil") < describe.index(".UTF8String")
    elsewhere = source.replace(describe, "")
    assert "localizedDescription" not in elsewhere and ".UTF8String" not in elsewhere
