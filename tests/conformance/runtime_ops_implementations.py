"""The C++ kernel inside ExecuTorch programs, as a conformance Implementation.

Eagerly the C++ kernel is what ``op-cpu`` runs once runtime_ops is loaded
(tests/test_runtime_ops.py checks the dispatch). Here every call runs a small
exported ``.pte`` through ``executorch.runtime``: one program per case shape,
with the sequence length dynamic, cached for the session.

* functional and ``.out`` with a separate final state: a program calling
  ``gdn.gated_delta_rule`` (lowered to the ``gated_delta_rule.out`` kernel);
* in-place forms: a program calling ``gdn.gated_delta_rule_inplace`` on its
  state input (the ``gated_delta_rule_inplace.out`` kernel).
"""

from __future__ import annotations

import functools

import torch

from runtime_ops.loader import is_loaded as runtime_ops_available
from gdn_export.ops.conformance import Implementation

MAX_LENGTH = 320  # above the table's longest case (T = 257)


class FunctionalProgram(torch.nn.Module):
    def __init__(self, scale, use_qk_l2norm):
        super().__init__()
        self.scale, self.use_qk_l2norm = scale, use_qk_l2norm

    def forward(self, query, key, value, g, beta, initial_state):
        return torch.ops.gdn.gated_delta_rule(
            query, key, value, g, beta, initial_state, scale=self.scale, use_qk_l2norm=self.use_qk_l2norm
        )


class InplaceProgram(FunctionalProgram):
    def forward(self, query, key, value, g, beta, state):
        return torch.ops.gdn.gated_delta_rule_inplace(
            query, key, value, g, beta, state, scale=self.scale, use_qk_l2norm=self.use_qk_l2norm
        )


class LoadedProgram:
    """A loaded program's forward method; holds the Program, which the Method reads but does not keep alive."""

    def __init__(self, program):
        self.program = program
        self.method = program.load_method("forward")

    def execute(self, inputs):
        return self.method.execute(inputs)


def export_program(module: torch.nn.Module, example_args: tuple, dynamic_length: bool = True) -> LoadedProgram:
    """``module`` through torch.export -> to_edge -> to_executorch, loaded with executorch.runtime."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.runtime import Runtime

    dynamic_shapes = None
    if dynamic_length:
        length = torch.export.Dim("length", min=1, max=MAX_LENGTH)
        dynamic_shapes = tuple({1: length} for _ in example_args[:5]) + (None,) * (len(example_args) - 5)
    exported = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes)
    # Custom ops are outside the core ATen opset the IR validity check knows.
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    return LoadedProgram(Runtime.get().load_program(program.buffer))


@functools.lru_cache(maxsize=None)
def _program(form: str, signature: tuple, scale, use_qk_l2norm: bool):
    """One loaded program per (form, shapes without length, dtypes, options)."""
    example = []
    for sizes, dtype in signature:
        sizes = list(sizes)
        if len(example) < 5:
            sizes[1] = 2  # example length; the exported length is dynamic
        example.append(torch.randn(sizes).to(dtype))
    module = (InplaceProgram if form == "inplace" else FunctionalProgram)(scale, use_qk_l2norm)
    return export_program(module, tuple(example))


def _execute(form, query, key, value, g, beta, state, scale, use_qk_l2norm):
    if not runtime_ops_available():
        raise RuntimeError("runtime_ops library not loaded: the .pte kernels are not registered")
    args = [t.contiguous() for t in (query, key, value, g, beta, state)]
    signature = tuple((tuple(t.shape[:1]) + (0,) + tuple(t.shape[2:]) if i < 5 else tuple(t.shape), t.dtype)
                      for i, t in enumerate(args))
    return _program(form, signature, scale, use_qk_l2norm).execute(args)


def pte_functional(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
    output, final_state = _execute("functional", query, key, value, g, beta, initial_state, scale, use_qk_l2norm)
    return output, final_state


def pte_out(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state):
    if final_state is initial_state:
        new_state, result = _execute("inplace", query, key, value, g, beta, initial_state, scale, use_qk_l2norm)
    else:
        result, new_state = _execute("functional", query, key, value, g, beta, initial_state, scale, use_qk_l2norm)
    output.copy_(result)
    final_state.copy_(new_state)
    return output, final_state


def pte_inplace(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output):
    new_state, result = _execute("inplace", query, key, value, g, beta, state, scale, use_qk_l2norm)
    output.copy_(result)
    state.copy_(new_state)  # the program's copy of its state input carries the update
    return output


RUNTIME_OPS_IMPLEMENTATIONS = [
    Implementation(
        name="runtime-ops-pte",
        functional=pte_functional,
        out=pte_out,
        inplace=pte_inplace,
        unsupported=lambda case: None if runtime_ops_available() else "runtime_ops library not loaded",
    ),
]
