"""The Metal C shims: Python mapping, C++ declarations and definitions, op schemas agree.

AOTInductor emits the declarations of ``metal_backend.shims.C_SHIMS`` and calls
them with the op's schema arguments in order; ``runtime/c_shims.h`` and
``runtime/c_shims.mm`` must declare and define exactly those functions. The
expected parameter list is derived from each schema with Inductor's own C-type
mapping (``CppWrapperCpu.c_type_for_prim_type``) and shim naming.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

from metal_backend import emulation, shims

RUNTIME_DIR = Path(shims.__file__).resolve().parent / "runtime"
KERNEL_SOURCE = Path(shims.__file__).resolve().parent / "kernels" / "gated_delta_rule.metal"

# ExecuTorch's runtime spells the same opaque handle type differently.
_SAME_TYPES = {"AOTITensorHandle": "AtenTensorHandle", "AOTITensorHandle*": "AtenTensorHandle*"}

_SIGNATURE = re.compile(r"AOTITorchError\s+(aoti_torch_mps_\w+)\s*\(([^)]*)\)\s*([;{])", re.S)


def _parameters(text: str) -> list[tuple[str, str]]:
    """'T name, U* other' -> [('T', 'name'), ('U*', 'other')] with pointer stars on the type."""
    parameters = []
    for parameter in text.split(","):
        parameter = " ".join(parameter.split()).replace(" *", "*")
        type_, name = parameter.rsplit(" ", 1)
        type_ = type_.replace("const ", "")
        parameters.append((_SAME_TYPES.get(type_, type_), name))
    return parameters


def _signatures(text: str, terminator: str) -> dict[str, list[tuple[str, str]]]:
    return {
        name: _parameters(parameters)
        for name, parameters, end in _SIGNATURE.findall(text)
        if end == terminator
    }


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


class _InductorTypes:
    c_type_for_prim_type = CppWrapperCpu.c_type_for_prim_type


def _expected_signature(op) -> tuple[str, list[tuple[str, str]]]:
    """What AOTInductor passes for ``op``: schema arguments in order, then one out-pointer per return."""
    types = _InductorTypes()
    parameters = [(types.c_type_for_prim_type(None, arg.type), arg.name) for arg in op._schema.arguments]
    parameters += [("AtenTensorHandle*", f"ret{i}") for i, _ in enumerate(op._schema.returns)]
    return CppWrapperCpu.get_c_shim_func_name(op._schema.name, "mps"), parameters


def test_python_mapping_matches_the_schemas():
    assert shims.C_SHIMS, "no shims"
    for op, declarations in shims.C_SHIMS.items():
        assert len(declarations) == 1
        declared = _signatures(declarations[0] + ";", ";")
        name, parameters = _expected_signature(op)
        assert declared == {name: parameters}, f"{op}: {declared} != {name}{parameters}"
        assert shims.shim_function_name(op) == name


def test_mutated_state_and_returned_output_positions():
    for op in shims.C_SHIMS:
        schema = op._schema
        mutated = [arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]
        assert mutated == ["state"], f"{op}: mutates {mutated}"
        _, parameters = _expected_signature(op)
        state_index = [arg.name for arg in schema.arguments].index("state")
        assert parameters[state_index] == ("AtenTensorHandle", "state")  # in place: a handle, not an out-pointer
        assert len(schema.returns) == 1 and parameters[-1] == ("AtenTensorHandle*", "ret0")


def test_cpp_declarations_and_definitions_match_the_mapping():
    header = _signatures(_strip_comments((RUNTIME_DIR / "c_shims.h").read_text()), ";")
    definitions = _signatures(_strip_comments((RUNTIME_DIR / "c_shims.mm").read_text()), "{")
    mapping = {}
    for declarations in shims.C_SHIMS.values():
        mapping.update(_signatures(declarations[0] + ";", ";"))
    assert header == mapping
    assert definitions == mapping


def test_no_shim_collides_with_executorchs_own():
    from executorch.backends.apple.metal.metal_backend import MetalBackend

    theirs = set(MetalBackend.get_supported_fallback_kernels())
    ours = {shims.shim_function_name(op) for op in shims.C_SHIMS}
    assert not ours & theirs, f"shim names already taken by ExecuTorch: {ours & theirs}"
    assert shims.fallback_kernel_names() == ours | {op._schema.name for op in shims.C_SHIMS}


def test_kernel_host_names_match_the_emulated_library():
    """The .metal file's [[host_name]]s (after preprocessing) are exactly the kernels the harness runs."""
    preprocessed = subprocess.run(
        ["g++", "-E", "-P", "-x", "c++", "-std=c++17", "-I", str(emulation.PACKAGE_DIR / "emulation" / "include"),
         str(KERNEL_SOURCE)],
        capture_output=True, text=True, check=True,
    ).stdout
    host_names = {
        "".join(re.findall(r'"([^"]*)"', pieces))
        for pieces in re.findall(r"host_name\(((?:\s*\"[^\"]*\")+)\s*\)", preprocessed)
    }
    assert len(host_names) == 36
    assert host_names == emulation.kernel_names()
    assert {"gated_delta_rule_bfloat_dk128", "fused_gated_delta_rule_bfloat_float_dk128"} <= host_names


def test_bool_and_optional_float_are_what_inductor_passes():
    """Guards the mapping above: a bool is int32_t and a float? is double* in Inductor's C ABI."""
    types = _InductorTypes()
    schema = torch.ops.gdn.gated_delta_rule_inplace.default._schema
    by_name = {arg.name: types.c_type_for_prim_type(None, arg.type) for arg in schema.arguments}
    assert by_name["scale"] == "double*" and by_name["use_qk_l2norm"] == "int32_t"
