"""``gdn_export.lowering``'s guard around AOTInductor's C++ wrapper (CudaBackend and MetalBackend compile with it).

The wrapper's size/stride arrays are declared in the code buffer that first
asks for them and cached by that buffer's id; a buffer freed and replaced by
one at the same address then used an undeclared array, and the 0.8B CUDA
program failed to compile on the H100. These tests drive the wrapper's real
``codegen_int_array_var`` with short-lived buffers, as its reinterpret-view
and reuse lines do.
"""

from __future__ import annotations

import itertools
import random
import re

import torch
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.utils import IndentedBuffer

from gdn_export import lowering


def _wrapper() -> CppWrapperCpu:
    # The state codegen_int_array_var reads, without a graph to build the whole wrapper from.
    wrapper = CppWrapperCpu.__new__(CppWrapperCpu)
    wrapper.int_array_id = itertools.count()
    wrapper.declared_int_array_vars = set()
    wrapper.codegen_int_array_var_cache = {}
    return wrapper


def _undeclared_uses(arrays: list) -> list:
    """Each array asked for from a fresh one-line buffer, as the wrapper's reuse lines do; the names
    a buffer was handed but does not declare, with the values it should have held."""
    wrapper, missing = _wrapper(), []
    for values in arrays:
        buffer = IndentedBuffer()
        name = wrapper.codegen_int_array_var(values, buffer.writeline, known_statically=True)
        declared = re.search(rf"\b{name}\[\] = (\{{.*?\}});", buffer.getvalue())
        if declared is None or declared.group(1) != values:
            missing.append((name, values))
        del buffer  # freed, so the next buffer may take its address, as in the failing compile
    return missing


def test_every_buffer_declares_the_arrays_it_uses():
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    # Repeated shapes, as a model's layers repeat them: the cache's hits are what went wrong.
    shapes = [f"{{{', '.join(str(rng.randrange(1, 4096)) for _ in range(rng.randrange(1, 5)))}}}" for _ in range(6)]
    arrays = [rng.choice(shapes) for _ in range(200)]
    with lowering.aoti_int_arrays_declared_at_each_use():
        missing = _undeclared_uses(arrays)
    assert missing == [], f"seed {seed}: arrays used but not declared in their buffer: {missing[:5]}"
    # Restored afterwards: torch's own method again.
    assert CppWrapperCpu.codegen_int_array_var is CppWrapperCpu.__dict__["codegen_int_array_var"]
    assert CppWrapperCpu.codegen_int_array_var.__qualname__.startswith("CppWrapperCpu.")


def test_lower_programs_compiles_under_the_guard(monkeypatch):
    seen = []

    def partitioners(name):
        # Called inside lower_programs while the delegates are compiled.
        seen.append(CppWrapperCpu.codegen_int_array_var.__name__)
        return []

    model = torch.nn.Linear(8, 4).eval()
    program = torch.export.export(model, (torch.randn(2, 8),), strict=False)
    manager = lowering.lower_programs({"forward": program}, partitioners=partitioners)
    assert seen == ["declared_at_each_use"]
    assert CppWrapperCpu.codegen_int_array_var.__name__ == "codegen_int_array_var"
    assert manager.buffer[4:8] == b"ET12"  # an ExecuTorch program came out
