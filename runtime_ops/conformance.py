"""The C++ kernels inside ExecuTorch programs, as a conformance implementation.

Eagerly the C++ kernels are what the core's ``op-cpu`` row runs once
runtime_ops is loaded (tests/test_runtime_ops.py checks the dispatch). Here,
``runtime-ops-pte``: every call runs a small exported ``.pte`` through
``executorch.runtime`` (one program per case shape, the sequence length
dynamic, cached for the session): functional and ``.out`` with a separate
final state call ``gdn.gated_delta_rule`` (lowered to the
``gated_delta_rule.out`` kernel), the in-place forms
``gdn.gated_delta_rule_inplace`` on the state input
(``gated_delta_rule_inplace.out``), attention ``gdn.cached_attention``
(``cached_attention.out``, float32) with the caches as inputs. Without the
library every case is reported unsupported (``op-cpu`` then runs the reference).

Both CPU backends (portable, xnnpack) run these kernels and list this row.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from gdn_export.ops.conformance import AttentionCase, Implementation
from runtime_ops.loader import RuntimeOpsUnavailable
from runtime_ops.loader import is_loaded as runtime_ops_available

MAX_LENGTH = 320  # above the table's longest case (T = 257)
NOT_LOADED = "runtime_ops library not loaded: the C++ kernels are not registered"


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


class AttentionProgram(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, query, k_cache, v_cache, input_pos):
        return torch.ops.gdn.cached_attention(query, k_cache, v_cache, input_pos, scale=self.scale)


class LoadedProgram:
    """A loaded program's forward method; holds the Program, which the Method reads but does not keep alive."""

    def __init__(self, program):
        self.program = program
        self.method = program.load_method("forward")

    def execute(self, inputs):
        return self.method.execute(inputs)


def export_program(
    module: torch.nn.Module, example_args: tuple, dynamic_length_args: int = 0, max_length: int = MAX_LENGTH
) -> LoadedProgram:
    """``module`` through torch.export -> to_edge -> to_executorch, loaded with executorch.runtime.

    The first ``dynamic_length_args`` arguments have a dynamic length (dim 1, 1..max_length).
    """
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.runtime import Runtime

    length = torch.export.Dim("length", min=1, max=max_length)
    dynamic_shapes = tuple({1: length} if i < dynamic_length_args else None for i in range(len(example_args)))
    exported = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes if dynamic_length_args else None)
    # Custom ops are outside the core ATen opset the IR validity check knows.
    program = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    return LoadedProgram(Runtime.get().load_program(program.buffer))


def _signature(args: list, dynamic_length_args: int) -> tuple:
    """(sizes, dtype) of each argument, the dynamic lengths as 0: one program serves every length."""
    return tuple(
        (tuple(t.shape[:1]) + (0,) + tuple(t.shape[2:]) if i < dynamic_length_args else tuple(t.shape), t.dtype)
        for i, t in enumerate(args)
    )


def _example(signature: tuple) -> tuple:
    # Length 2 as the example: torch.export specializes a dim of size 1.
    return tuple(torch.ones([2 if size == 0 else size for size in sizes]).to(dtype) for sizes, dtype in signature)


@functools.lru_cache(maxsize=None)
def _program(form: str, signature: tuple, scale, use_qk_l2norm: bool) -> LoadedProgram:
    """One loaded program per (form, shapes without length, dtypes, options)."""
    module = (InplaceProgram if form == "inplace" else FunctionalProgram)(scale, use_qk_l2norm)
    return export_program(module, _example(signature), dynamic_length_args=5)


@functools.lru_cache(maxsize=None)
def _attention_program(signature: tuple, scale) -> LoadedProgram:
    max_len = signature[1][0][2]  # k_cache [Hkv, D, S]: at most S new tokens
    example = _example(signature)[:3] + (torch.tensor([0]),)
    return export_program(AttentionProgram(scale), example, dynamic_length_args=1, max_length=max_len)


def _execute(form, query, key, value, g, beta, state, scale, use_qk_l2norm):
    args = [t.contiguous() for t in (query, key, value, g, beta, state)]
    return _program(form, _signature(args, 5), scale, use_qk_l2norm).execute(args)


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


def pte_cached_attention(query, k_cache, v_cache, input_pos, *, scale=None, output):
    args = [t.contiguous() for t in (query, k_cache, v_cache)]
    (result,) = _attention_program(_signature(args, 1), scale).execute([*args, input_pos])
    return output.copy_(result)


def _loaded(entry):
    """``entry``, refusing to run without the C++ kernels with a message saying so."""

    def call(*args, **kwargs):
        if not runtime_ops_available():
            raise RuntimeOpsUnavailable(NOT_LOADED)
        return entry(*args, **kwargs)

    return call


def _unsupported(case) -> Optional[str]:
    if not runtime_ops_available():
        return NOT_LOADED
    if isinstance(case, AttentionCase) and case.dtype != torch.float32:
        return f"{case.dtype}: the C++ attention kernel reads float32 (other caches keep the masked form)"
    return None


IMPLEMENTATIONS = [
    Implementation(
        name="runtime-ops-pte",
        functional=_loaded(pte_functional),
        out=_loaded(pte_out),
        inplace=_loaded(pte_inplace),
        cached_attention=_loaded(pte_cached_attention),
        unsupported=_unsupported,
    ),
]
