"""One table of ``gdn::gated_delta_rule`` cases that every implementation runs.

In the spirit of llama.cpp's test-backend-ops: a case says its parameters,
builds fresh random inputs, and states its error bound. The test suite
(``tests/conformance/``) runs every registered implementation over this table
against an fp64 run of the reference; ``gdn-bench`` reuses the same cases to
time the kernels, so correctness and speed share one definition.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from gdn_export.ops import reference
from gdn_export.ops.fused import unfuse

GATES = ("scalar", "per_channel")  # GDA: g [B, T, Hv]; KDA: g [B, T, Hv, Dk]
CALLS = ("functional", "out", "out_inplace", "inplace")  # inplace: gated_delta_rule_inplace
EXTREMES = (None, "g_min", "g_zero", "beta_zero", "beta_one")


@dataclass(frozen=True)
class OpCase:
    batch: int = 1
    length: int = 17
    num_k_heads: int = 2
    num_v_heads: int = 4
    key_dim: int = 32
    value_dim: int = 32
    gate: str = "scalar"
    use_qk_l2norm: bool = True
    scale: Optional[float] = None
    dtype: torch.dtype = torch.float32
    strided: bool = False  # every input a non-contiguous view of a transposed buffer
    call: str = "functional"
    extreme: Optional[str] = None
    split_at: Optional[int] = None  # run as two calls [0, split_at) + [split_at, T), state carried

    @property
    def name(self) -> str:
        parts = [
            f"B{self.batch}",
            f"T{self.length}",
            f"H{self.num_k_heads}x{self.num_v_heads}",
            f"D{self.key_dim}x{self.value_dim}",
            "gda" if self.gate == "scalar" else "kda",
            str(self.dtype).removeprefix("torch."),
            self.call,
        ]
        if not self.use_qk_l2norm:
            parts.append("prenorm")
        if self.scale is not None:
            parts.append(f"scale{self.scale}")
        if self.strided:
            parts.append("strided")
        if self.extreme:
            parts.append(self.extreme)
        if self.split_at is not None:
            parts.append(f"split{self.split_at}")
        return "-".join(parts)

    @property
    def tolerance(self) -> float:
        """Bound on max|actual - expected| / max|expected| against the fp64 reference."""
        return 1e-5 if self.dtype == torch.float32 else 1e-2


@dataclass
class OpInputs:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor

    def as_args(self) -> tuple:
        return (self.query, self.key, self.value, self.g, self.beta, self.initial_state)

    def to(self, device) -> "OpInputs":
        return OpInputs(*(t.to(device) for t in self.as_args()))


def _strided_view(tensor: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view: dims 1 and 2 swapped in memory."""
    if tensor.dim() < 3:
        return tensor
    buffer = tensor.transpose(1, 2).contiguous()
    view = buffer.transpose(1, 2)
    return view


def make_inputs(case: OpCase, generator: torch.Generator, device="cpu") -> OpInputs:
    """Fresh random inputs for ``case``, well conditioned as Qwen3.5 produces them.

    Without in-kernel L2 norm the keys are normalized here (as a caller must),
    since the delta rule is only contractive for |k| <= 1/sqrt(beta).
    """

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    B, T, Hk, Hv, Dk, Dv = (
        case.batch, case.length, case.num_k_heads, case.num_v_heads, case.key_dim, case.value_dim,
    )
    query = randn(B, T, Hk, Dk)
    key = randn(B, T, Hk, Dk)
    if not case.use_qk_l2norm:
        query = reference.l2_normalize(query)
        key = reference.l2_normalize(key)
    value = randn(B, T, Hv, Dv)
    gate_shape = (B, T, Hv) if case.gate == "scalar" else (B, T, Hv, Dk)
    g = F.logsigmoid(randn(*gate_shape) + 2.0)  # log decay in (-inf, 0), mostly near -0.1..-1
    beta = torch.sigmoid(randn(B, T, Hv))
    if case.extreme == "g_min":
        g = torch.full_like(g, -30.0)
    elif case.extreme == "g_zero":
        g = torch.zeros_like(g)
    elif case.extreme == "beta_zero":
        beta = torch.zeros_like(beta)
    elif case.extreme == "beta_one":
        beta = torch.ones_like(beta)
    initial_state = 0.5 * randn(B, Hv, Dk, Dv)
    tensors = [t.to(case.dtype) for t in (query, key, value, g, beta)] + [initial_state]
    tensors = [t.to(device) for t in tensors]
    if case.strided:
        tensors = [_strided_view(t) for t in tensors]
    return OpInputs(*tensors)


def expected_outputs(case: OpCase, inputs: OpInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 run of the per-token reference on the very (dtype-rounded) inputs."""
    args = [t.detach().cpu().to(torch.float64) for t in inputs.as_args()]
    return reference.recurrent_gated_delta_rule(
        *args, scale=case.scale, use_qk_l2norm=case.use_qk_l2norm
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|actual - expected| / max|expected| (NaN anywhere gives inf)."""
    actual = actual.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if not torch.isfinite(actual).all():
        return math.inf
    scale = expected.abs().max().item() if expected.numel() else 0.0
    return (actual - expected).abs().max().item() / max(scale, 1e-30) if expected.numel() else 0.0


# An implementation under test: the two entry points of the op contract.
FunctionalEntry = Callable[..., tuple]  # (q, k, v, g, beta, state, *, scale, use_qk_l2norm)
OutEntry = Callable[..., tuple]  # same, plus output=, final_state=
# gated_delta_rule_inplace.out: (q, k, v, g, beta, state, *, scale, use_qk_l2norm, output) -> output
InplaceEntry = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One implementation of the op, as the conformance suite and gdn-bench drive it."""

    name: str
    functional: FunctionalEntry
    out: OutEntry
    inplace: InplaceEntry
    device: str = "cpu"
    # gdn.fused_gated_delta_rule.out, for backends that implement the fused op.
    fused: Optional[Callable[..., torch.Tensor]] = None
    # Returns why a case is unsupported (then calling it must raise), or None.
    unsupported: Callable[[OpCase], Optional[str]] = lambda case: None


def run_case(impl: Implementation, case: OpCase, inputs: OpInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``case`` through ``impl``; out tensors are NaN-poisoned before the kernel writes them."""
    kwargs = {"scale": case.scale, "use_qk_l2norm": case.use_qk_l2norm}
    boundaries = [0, case.length] if case.split_at is None else [0, case.split_at, case.length]
    state = inputs.initial_state
    outputs = []
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        step = [t[:, start:stop] for t in (inputs.query, inputs.key, inputs.value, inputs.g, inputs.beta)]
        if case.call == "functional":
            output, state = impl.functional(*step, state, **kwargs)
        else:
            output = torch.full_like(step[2], float("nan"))
            if case.call == "inplace":
                state = state.clone() if state is inputs.initial_state else state
                impl.inplace(*step, state, **kwargs, output=output)
            elif case.call == "out_inplace":
                final_state = state.clone() if state is inputs.initial_state else state
                impl.out(*step, final_state, **kwargs, output=output, final_state=final_state)
                state = final_state
            else:
                final_state = torch.full_like(state, float("nan"))
                impl.out(*step, state, **kwargs, output=output, final_state=final_state)
                state = final_state
        outputs.append(output)
    return torch.cat(outputs, dim=1), state


@dataclass
class FusedInputs:
    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor

    def as_args(self) -> tuple:
        return (self.mixed_qkv, self.a, self.b, self.A_log, self.dt_bias, self.state)


def make_fused_inputs(case: OpCase, generator: torch.Generator, device="cpu") -> FusedInputs:
    """Inputs of ``gdn.fused_gated_delta_rule`` for ``case``'s dims, as Qwen3.5 produces them."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    B, T, Hk, Hv, Dk, Dv = (
        case.batch, case.length, case.num_k_heads, case.num_v_heads, case.key_dim, case.value_dim,
    )
    mixed_qkv = F.silu(randn(B, T, 2 * Hk * Dk + Hv * Dv))
    A_log = torch.empty(Hv).uniform_(0.0, 2.7, generator=generator)  # A in [1, 15]
    tensors = [mixed_qkv, randn(B, T, Hv), randn(B, T, Hv)]
    tensors = [t.to(case.dtype) for t in tensors] + [A_log, 0.5 * randn(Hv), 0.5 * randn(B, Hv, Dk, Dv)]
    return FusedInputs(*(t.to(device) for t in tensors))


def expected_fused_outputs(case: OpCase, inputs: FusedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64: the unfused reference recurrence after reference gating."""
    args = [t.detach().cpu().to(torch.float64) for t in inputs.as_args()]
    query, key, value, g, beta = unfuse(*args)
    return reference.recurrent_gated_delta_rule(
        query, key, value, g, beta, args[5], scale=case.scale, use_qk_l2norm=True
    )


def run_fused_case(impl: Implementation, case: OpCase, inputs: FusedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the fused op (state in place, output NaN-poisoned), in two calls when ``split_at`` is set."""
    boundaries = [0, case.length] if case.split_at is None else [0, case.split_at, case.length]
    state = inputs.state.clone()
    outputs = []
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        step = [t[:, start:stop] for t in (inputs.mixed_qkv, inputs.a, inputs.b)]
        output = torch.full(
            (case.batch, stop - start, case.num_v_heads, case.value_dim), float("nan"),
            dtype=case.dtype, device=state.device,
        )
        impl.fused(*step, inputs.A_log, inputs.dt_bias, state, scale=case.scale, output=output)
        outputs.append(output)
    return torch.cat(outputs, dim=1), state


def _cases() -> list[OpCase]:
    base = OpCase()
    cases: list[OpCase] = [base]

    def vary(**changes):
        cases.append(dataclasses.replace(base, **changes))

    for key_dim, value_dim in [
        (16, 16), (64, 64), (128, 128), (256, 256), (16, 32), (64, 128), (128, 64), (256, 128), (32, 256),
    ]:
        vary(num_k_heads=1, num_v_heads=2, key_dim=key_dim, value_dim=value_dim)
    for num_k_heads, num_v_heads in [(2, 2), (2, 6), (2, 8), (3, 9)]:
        vary(num_k_heads=num_k_heads, num_v_heads=num_v_heads)
    for length in (1, 2, 64, 257):
        vary(length=length)
    vary(batch=3)
    vary(batch=3, length=1)
    for gate in GATES:
        vary(gate=gate, use_qk_l2norm=False)
        vary(gate=gate, scale=0.3)
        vary(gate=gate, length=64, key_dim=128, value_dim=64)
        for extreme in EXTREMES[1:]:
            vary(gate=gate, extreme=extreme)
        vary(gate=gate, strided=True)
        vary(gate=gate, strided=True, length=1, call="out_inplace")
        for call in ("out", "out_inplace", "inplace"):
            for length in (1, 17, 64):
                vary(gate=gate, call=call, length=length)
        vary(gate=gate, split_at=8)
        vary(gate=gate, length=64, split_at=32, call="out_inplace")
        vary(gate=gate, length=64, split_at=32, call="inplace")
        vary(gate=gate, length=257, split_at=128, batch=3)
        for length in (1, 64):
            vary(gate=gate, dtype=torch.bfloat16, length=length)
        vary(gate=gate, dtype=torch.bfloat16, length=17, call="out_inplace", key_dim=128, value_dim=128)
    vary(gate="per_channel", length=257)
    # The shapes of Qwen3.5's larger models: decode and a prefill chunk.
    for length in (1, 64):
        for dtype in (torch.float32, torch.bfloat16):
            vary(num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, length=length, dtype=dtype,
                 call="out_inplace")
    return cases


CASES: tuple[OpCase, ...] = tuple(_cases())

# The fused op always L2-normalizes q/k and gates per head; its cases are the
# table's plain-layout GDA cases (call kind does not apply: it is always in place).
FUSED_CASES: tuple[OpCase, ...] = tuple(
    dict.fromkeys(
        dataclasses.replace(case, call="inplace")
        for case in CASES
        if case.gate == "scalar" and case.use_qk_l2norm and not case.strided and case.extreme is None
    )
)
