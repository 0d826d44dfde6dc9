"""The op contract: ``gdn::gated_delta_rule`` and its ``.out`` variant.

Defined once here with ``torch.library``; every backend (the C++ CPU kernel,
the Triton kernels, the Metal kernel) registers an implementation of these
exact schemas, and the pure-PyTorch reference registered below is the default
(CompositeExplicitAutograd) implementation and the ground truth.

Shapes (the layout Qwen3.5's projections produce; no transposes needed):

    query, key     [B, T, Hk, Dk]
    value          [B, T, Hv, Dv]       Hv is a multiple of Hk
    g              [B, T, Hv]           scalar gate per head (GDA), log space
                or [B, T, Hv, Dk]       gate per key channel (KDA), log space
    beta           [B, T, Hv]
    initial_state  [B, Hv, Dk, Dv]      float32
    -> output      [B, T, Hv, Dv]       value's dtype
       final_state [B, Hv, Dk, Dv]      float32

In ``.out``, ``final_state`` may be the very tensor passed as
``initial_state``: the state is then updated in place, which is how decode
avoids copying the state every token.

``gdn::gated_delta_rule_inplace`` (+ ``.out``) is the mutating form of the
same op, in the style of ExecuTorch's ``llama::update_cache``: ``state`` is
read as the initial state and overwritten with the final state, and only the
output is returned. A model keeps its recurrent state in a buffer and calls
this form, so the exported program updates the buffer in place instead of
copying a fresh state into it every step. Its default implementation
delegates to ``gated_delta_rule.out`` with ``final_state=state``, so every
backend's ``.out`` kernel serves it in eager mode; runtime kernels register
``gated_delta_rule_inplace.out`` themselves.
"""

from __future__ import annotations

import torch

from gdn_export.ops import reference

NAMESPACE = "gdn"

_ARGS = (
    "Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, Tensor initial_state, "
    "*, float? scale=None, bool use_qk_l2norm=False"
)
FUNCTIONAL_SCHEMA = f"gated_delta_rule({_ARGS}) -> (Tensor output, Tensor final_state)"
OUT_SCHEMA = (
    f"gated_delta_rule.out({_ARGS}, Tensor(a!) output, Tensor(b!) final_state)"
    " -> (Tensor(a!), Tensor(b!))"
)
_INPLACE_ARGS = (
    "Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, Tensor(a!) state, "
    "*, float? scale=None, bool use_qk_l2norm=False"
)
INPLACE_SCHEMA = f"gated_delta_rule_inplace({_INPLACE_ARGS}) -> Tensor"
INPLACE_OUT_SCHEMA = f"gated_delta_rule_inplace.out({_INPLACE_ARGS}, Tensor(b!) output) -> Tensor(b!)"

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Sequences at least this long take the chunked form, in the reference and in the kernels
# that have both forms (below it the per-token walk does less work).
CHUNKED_MIN_LENGTH = 16


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def check_inputs(query, key, value, g, beta, initial_state, scale=None) -> None:
    """Raise a clear error naming the argument when inputs break the contract.

    Called by the reference and the fake implementation, so eager calls and
    ``torch.export`` tracing reject the same inputs before anything is written.
    """
    named = {
        "query": query,
        "key": key,
        "value": value,
        "g": g,
        "beta": beta,
        "initial_state": initial_state,
    }
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn.gated_delta_rule: {name} must be a Tensor, got {type(tensor).__name__}")
    for name in ("query", "key", "value", "g", "beta"):
        if named[name].dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"gdn.gated_delta_rule: {name} must be float32, bfloat16 or float16, "
                f"got {named[name].dtype}"
            )
    if initial_state.dtype != torch.float32:
        raise TypeError(
            f"gdn.gated_delta_rule: initial_state must be float32, got {initial_state.dtype}"
        )
    expected_rank = {"query": 4, "key": 4, "value": 4, "beta": 3, "initial_state": 4}
    for name, rank in expected_rank.items():
        if named[name].dim() != rank:
            raise ValueError(
                f"gdn.gated_delta_rule: {name} must have {rank} dims, got shape {_shape(named[name])}"
            )
    if g.dim() not in (3, 4):
        raise ValueError(
            "gdn.gated_delta_rule: g must be [B, T, Hv] (GDA) or [B, T, Hv, Dk] (KDA), "
            f"got shape {_shape(g)}"
        )
    batch, length, num_k_heads, key_dim = query.shape
    num_v_heads, value_dim = value.shape[2], value.shape[3]
    if num_k_heads == 0 or num_v_heads % num_k_heads != 0:
        raise ValueError(
            f"gdn.gated_delta_rule: value heads (Hv={num_v_heads}) must be a multiple of "
            f"query/key heads (Hk={num_k_heads})"
        )
    expected = {
        "key": [batch, length, num_k_heads, key_dim],
        "value": [batch, length, num_v_heads, value_dim],
        "g": [batch, length, num_v_heads] + ([key_dim] if g.dim() == 4 else []),
        "beta": [batch, length, num_v_heads],
        "initial_state": [batch, num_v_heads, key_dim, value_dim],
    }
    for name, shape in expected.items():
        if _shape(named[name]) != shape:
            raise ValueError(
                f"gdn.gated_delta_rule: {name} must have shape {shape} "
                f"(from query {_shape(query)} and value {_shape(value)}), got {_shape(named[name])}"
            )
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) > 1:
        raise RuntimeError(f"gdn.gated_delta_rule: all tensors must be on one device, got {devices}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"gdn.gated_delta_rule: scale must be a float or None, got {type(scale).__name__}")


def check_out_tensors(value, initial_state, output, final_state) -> None:
    """``output`` must match value's shape/dtype/device, ``final_state`` the state's."""
    for name, tensor, like in (("output", output, value), ("final_state", final_state, initial_state)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gdn.gated_delta_rule.out: {name} must be a Tensor, got {type(tensor).__name__}")
        if _shape(tensor) != _shape(like) or tensor.dtype != like.dtype:
            raise ValueError(
                f"gdn.gated_delta_rule.out: {name} must have shape {_shape(like)} and dtype "
                f"{like.dtype}, got shape {_shape(tensor)} and dtype {tensor.dtype}"
            )
        if tensor.device != like.device:
            raise RuntimeError(
                f"gdn.gated_delta_rule.out: {name} must be on {like.device}, got {tensor.device}"
            )


def reference_gated_delta_rule(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False
):
    """Validated reference: per-token for short sequences, chunked for long ones."""
    check_inputs(query, key, value, g, beta, initial_state, scale)
    form = (
        reference.chunked_gated_delta_rule
        if query.shape[1] >= CHUNKED_MIN_LENGTH
        else reference.recurrent_gated_delta_rule
    )
    output, final_state = form(
        query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm
    )
    return output, final_state.to(torch.float32)


def reference_gated_delta_rule_out(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state
):
    check_inputs(query, key, value, g, beta, initial_state, scale)
    check_out_tensors(value, initial_state, output, final_state)
    result, state = reference_gated_delta_rule(
        query, key, value, g, beta, initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm
    )
    output.copy_(result)
    final_state.copy_(state)  # safe when final_state is initial_state: state is a fresh tensor
    return output, final_state


def gated_delta_rule_inplace(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False):
    """Default of the mutating form: the backend's ``.out`` kernel with final_state=state."""
    output = torch.empty_like(value)
    torch.ops.gdn.gated_delta_rule.out(
        query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm,
        output=output, final_state=state,
    )
    return output


def gated_delta_rule_inplace_out(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output):
    torch.ops.gdn.gated_delta_rule.out(
        query, key, value, g, beta, state, scale=scale, use_qk_l2norm=use_qk_l2norm,
        output=output, final_state=state,
    )
    return output


def _fake_gated_delta_rule(query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False):
    check_inputs(query, key, value, g, beta, initial_state, scale)
    return torch.empty_like(value), torch.empty_like(initial_state)


def _fake_gated_delta_rule_out(
    query, key, value, g, beta, initial_state, *, scale=None, use_qk_l2norm=False, output, final_state
):
    check_inputs(query, key, value, g, beta, initial_state, scale)
    check_out_tensors(value, initial_state, output, final_state)
    return output, final_state


def _fake_gated_delta_rule_inplace(query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False):
    check_inputs(query, key, value, g, beta, state, scale)
    return torch.empty_like(value)


def _fake_gated_delta_rule_inplace_out(
    query, key, value, g, beta, state, *, scale=None, use_qk_l2norm=False, output
):
    check_inputs(query, key, value, g, beta, state, scale)
    check_out_tensors(value, state, output, state)
    return output


_library = torch.library.Library(NAMESPACE, "DEF")


def define_op(schema: str, default, fake) -> None:
    """Defines the ``gdn`` op (or overload) ``schema`` names, with ``default`` as its
    implementation on every device until a backend registers its own, and ``fake``
    (checks and output shapes only) for tracing."""
    name = schema[: schema.index("(")]
    _library.define(schema)
    _library.impl(name, default, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_library)


define_op(FUNCTIONAL_SCHEMA, reference_gated_delta_rule, _fake_gated_delta_rule)
define_op(OUT_SCHEMA, reference_gated_delta_rule_out, _fake_gated_delta_rule_out)
define_op(INPLACE_SCHEMA, gated_delta_rule_inplace, _fake_gated_delta_rule_inplace)
define_op(INPLACE_OUT_SCHEMA, gated_delta_rule_inplace_out, _fake_gated_delta_rule_inplace_out)
