"""metal_backend.strict_check's checks that need no clang: kernel bindings and the C++14 main file.

* Every ``[[buffer(n)]]`` and position attribute of the kernels agrees with
  every host binder and with Metal's attribute list; planted mistakes (two
  buffers swapped in the kernel or in a host binder, a misspelled or mistyped
  attribute, an input made writable, the params at the wrong index, a
  work-split constant changed on one side) are each reported by name.
* The source Metal compiles (params header inlined) compiles as a C++14 main
  file with g++ and every warning an error; the params header's
  ``#pragma once``, left in, would fail it.

The clang checks (address spaces, Objective-C++ host) run in ``make metal-check``.
"""

from __future__ import annotations

import pytest

from metal_backend import mps_eager, strict_check

SOURCES = {key: path.read_text() for key, path in strict_check.SOURCE_FILES.items() if path.exists()}


def test_kernel_bindings_agree_with_every_host():
    result = strict_check.kernel_bindings()
    assert result.summary.startswith("2 kernels, 17 buffer and 8 position arguments, 2 work-split constants")
    assert {"runtime/c_shims.mm", "mps_eager.py", "emulation.py", "emulated_kernels.cpp"} <= set(
        result.summary.split("(")[-1].rstrip(")").split(", ")
    )


def _planted(key: str, old: str, new: str) -> dict:
    assert SOURCES[key].count(old) >= 1, f"{old!r} not in {key}"
    return {key: SOURCES[key].replace(old, new, 1)}


PLANTED = [
    ("kernel buffers swapped",
     _planted("kernel", "const device T* query [[buffer(0)]],\n    const device T* key [[buffer(1)]],",
              "const device T* key [[buffer(0)]],\n    const device T* query [[buffer(1)]],"),
     r"c_shims.mm: binds gated_delta_rule's buffers as \['query', 'key'"),
    ("host buffers swapped",
     _planted("c_shims", '&tensor_of(a, "a"), &tensor_of(b, "b")', '&tensor_of(b, "b"), &tensor_of(a, "a")'),
     r"c_shims.mm: binds fused_gated_delta_rule's buffers as \['mixed_qkv', 'b', 'a'"),
    ("misspelled attribute",
     _planted("kernel", "[[thread_index_in_simdgroup]]", "[[thread_index_in_simd_group]]"),
     r"\[\[thread_index_in_simd_group\]\] is not a Metal kernel attribute"),
    ("mistyped attribute",
     _planted("kernel", "uint simdgroup [[simdgroup_index_in_threadgroup]]",
              "int simdgroup [[simdgroup_index_in_threadgroup]]"),
     r"\[\[simdgroup_index_in_threadgroup\]\] on int"),
    ("writable input",
     _planted("kernel", "const device T* beta [[buffer(4)]]", "device T* beta [[buffer(4)]]"),
     r"gated_delta_rule.beta: writable"),
    ("params index",
     _planted("c_shims", "tensors, 7,", "tensors, 6,"),
     r"binds fused_gated_delta_rule's params at index 6, the kernel reads \[\[buffer\(7\)\]\]"),
    ("work-split constant",
     _planted("kernel", "kColumnsPerSimdgroup = 4,", "kColumnsPerSimdgroup = 8,"),
     r"kColumnsPerSimdgroup is 8 in the .metal file, 4 in launch.h"),
    ("harness positions",
     _planted("emulated_kernels", "at.simdgroup_index_in_threadgroup,\n          at.simdgroups_per_threadgroup,",
              "at.simdgroups_per_threadgroup,\n          at.simdgroup_index_in_threadgroup,"),
     r"emulated_kernels: passes gated_delta_rule positions \[.threadgroup_position_in_grid., .simdgroups_per"),
]


@pytest.mark.parametrize("what, texts, message", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_binding_mistakes_are_reported(what, texts, message):
    with pytest.raises(strict_check.CheckError, match=message):
        strict_check.kernel_bindings(texts)


def test_metal_source_compiles_as_a_cxx14_main_file():
    assert "clean" in strict_check.main_file_cxx14().summary


def test_an_inlined_pragma_once_fails_the_main_file_compile():
    params = (mps_eager.KERNELS_DIR / "gated_delta_rule_params.h").read_text()
    assert "#pragma once" in params and "#pragma once" not in mps_eager.kernel_source()
    unstripped = (mps_eager.KERNELS_DIR / "gated_delta_rule.metal").read_text().replace(
        '#include "gated_delta_rule_params.h"', params
    )
    with pytest.raises(strict_check.CheckError, match="pragma once"):
        strict_check.main_file_cxx14(unstripped)
