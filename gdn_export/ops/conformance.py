"""One table of cases of the ``gdn`` ops that every implementation runs.

In the spirit of llama.cpp's test-backend-ops: a case says its parameters,
builds fresh random inputs, and states its error bound. ``CASES`` and
``FUSED_CASES`` hold ``gdn::gated_delta_rule`` (its call forms) and
``gdn.fused_gated_delta_rule``, ``ATTENTION_CASES`` ``gdn::cached_attention``.
An ``Implementation`` is one way to run the ops (the registered op, the
reference, a backend's kernels); the core's are ``REFERENCE_IMPLEMENTATIONS``
and each backend lists its own (``Backend.conformance_implementations``). The
test suite (``tests/conformance/``) runs every one of them over this table
against fp64 references; ``gdn-bench`` reuses the same cases to time the
kernels, so correctness and speed share one definition.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from gdn_export.ops import reference
from gdn_export.ops.attention import reference_cached_attention_out
from gdn_export.ops.contract import (
    gated_delta_rule_inplace_out,
    reference_gated_delta_rule,
    reference_gated_delta_rule_out,
)
from gdn_export.ops.fused import unfuse

GATES = ("scalar", "per_channel")  # GDA: g [B, T, Hv]; KDA: g [B, T, Hv, Dk]
CALLS = ("functional", "out", "out_inplace", "inplace")  # inplace: gated_delta_rule_inplace
EXTREMES = (None, "g_min", "g_zero", "beta_zero", "beta_one")


@dataclass(frozen=True)
class OpCase:
    """``gdn::gated_delta_rule`` (or, in FUSED_CASES, the fused op) on one shape, gate kind, dtype and call form."""

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
        return tolerance_of(self.dtype)


def tolerance_of(dtype: torch.dtype) -> float:
    """A case's error bound (max|actual - expected| / max|expected|) for inputs and outputs of ``dtype``."""
    return 1e-5 if dtype == torch.float32 else 1e-2


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


# An implementation under test: the entry points of the op contract.
FunctionalEntry = Callable[..., tuple]  # (q, k, v, g, beta, state, *, scale, use_qk_l2norm)
OutEntry = Callable[..., tuple]  # same, plus output=, final_state=
# gated_delta_rule_inplace.out: (q, k, v, g, beta, state, *, scale, use_qk_l2norm, output) -> output
InplaceEntry = Callable[..., torch.Tensor]
# cached_attention.out: (query, k_cache, v_cache, input_pos, *, scale, output) -> output
AttentionEntry = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One implementation of the ops, as the conformance suite and gdn-bench drive it."""

    name: str
    functional: FunctionalEntry
    out: OutEntry
    inplace: InplaceEntry
    device: str = "cpu"
    # gdn.fused_gated_delta_rule.out, for backends that implement the fused op.
    fused: Optional[Callable[..., torch.Tensor]] = None
    # Returns why a case is unsupported (then calling it must raise), or None.
    unsupported: Callable[[Union["OpCase", "AttentionCase"]], Optional[str]] = lambda case: None
    # gdn.cached_attention.out, for implementations of the attention op.
    cached_attention: Optional[AttentionEntry] = None
    # The cases it runs from CASES or FUSED_CASES: all of them, unless it says otherwise (and why).
    op_cases: Callable[[Sequence["OpCase"]], Sequence["OpCase"]] = lambda cases: cases
    # Environment variables a process must have had from its start to run it (Triton's interpreter, say):
    # the suite runs such an implementation in a child process that has them.
    environment: tuple[tuple[str, str], ...] = ()


def unsupported_head_dims(head_dims: Sequence[int], kernels: str) -> Callable[[OpCase], Optional[str]]:
    """``Implementation.unsupported`` of kernels written for ``head_dims`` (Dk and Dv each)."""
    taken = ", ".join(map(str, head_dims[:-1])) + f" or {head_dims[-1]}"

    def unsupported(case: OpCase) -> Optional[str]:
        if case.key_dim in head_dims and case.value_dim in head_dims:
            return None
        return f"Dk={case.key_dim}, Dv={case.value_dim}: {kernels} take {taken}"

    return unsupported


def with_head_dims(cases: Sequence[OpCase], head_dims: Sequence[int]) -> tuple[OpCase, ...]:
    """``cases``, then each one with head dims outside ``head_dims`` again with them raised to the smallest taken.

    Most of the table's layout, call and extreme-gate variants use 32-dim heads;
    for kernels that take only ``head_dims``, these copies run the variants
    through the kernels, while the originals check that they are refused.
    """

    def raised(dim: int) -> int:
        return dim if dim in head_dims else min(head_dims)

    variants = [dataclasses.replace(case, key_dim=raised(case.key_dim), value_dim=raised(case.value_dim))
                for case in cases]
    return tuple(dict.fromkeys([*cases, *variants]))


def _watched(tensor: torch.Tensor, watched: Optional[list]) -> torch.Tensor:
    """``tensor``, an out tensor about to be passed to a call; noted with a copy of what it holds in ``watched``."""
    if watched is not None:
        watched.append((tensor, tensor.clone()))
    return tensor


def run_case(
    impl: Implementation, case: OpCase, inputs: OpInputs, *, watched: Optional[list] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``case`` through ``impl``; out tensors are NaN-poisoned before the kernel writes them.

    Each out tensor (and in-place state) is noted in ``watched`` with its
    contents before the call, so a refused call can be checked to write nothing.
    """
    kwargs = {"scale": case.scale, "use_qk_l2norm": case.use_qk_l2norm}
    boundaries = [0, case.length] if case.split_at is None else [0, case.split_at, case.length]
    state = inputs.initial_state
    outputs = []
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        step = [t[:, start:stop] for t in (inputs.query, inputs.key, inputs.value, inputs.g, inputs.beta)]
        if case.call == "functional":
            output, state = impl.functional(*step, state, **kwargs)
        else:
            output = _watched(torch.full_like(step[2], float("nan")), watched)
            if case.call == "inplace":
                state = _watched(state.clone() if state is inputs.initial_state else state, watched)
                impl.inplace(*step, state, **kwargs, output=output)
            elif case.call == "out_inplace":
                final_state = _watched(state.clone() if state is inputs.initial_state else state, watched)
                impl.out(*step, final_state, **kwargs, output=output, final_state=final_state)
                state = final_state
            else:
                final_state = _watched(torch.full_like(state, float("nan")), watched)
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


def run_fused_case(
    impl: Implementation, case: OpCase, inputs: FusedInputs, *, watched: Optional[list] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the fused op (state in place, output NaN-poisoned), in two calls when ``split_at`` is set.

    ``watched`` as for ``run_case``.
    """
    boundaries = [0, case.length] if case.split_at is None else [0, case.split_at, case.length]
    state = _watched(inputs.state.clone(), watched)
    outputs = []
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        step = [t[:, start:stop] for t in (inputs.mixed_qkv, inputs.a, inputs.b)]
        output = _watched(torch.full(
            (case.batch, stop - start, case.num_v_heads, case.value_dim), float("nan"),
            dtype=case.dtype, device=state.device,
        ), watched)
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


@dataclass(frozen=True)
class AttentionCase:
    """``gdn::cached_attention``: T new tokens' queries at position ``start`` over caches of ``max_len`` positions."""

    # The layer: query heads over KV heads, and caches of max_len positions.
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_len: int = 64
    dtype: torch.dtype = torch.float32
    # The call: T new tokens from position start.
    length: int = 7
    start: int = 0
    scale: Optional[float] = None

    @property
    def tolerance(self) -> float:
        """Bound on max|actual - expected| / max|expected| against the fp64 per-row attention."""
        return tolerance_of(self.dtype)

    @property
    def name(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        scale = "" if self.scale is None else f"-scale{self.scale}"
        return (f"attention-H{self.num_heads}x{self.num_kv_heads}-T{self.length}-pos{self.start}-D{self.head_dim}"
                f"-S{self.max_len}-{dtype}{scale}")


@dataclass
class AttentionInputs:
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    input_pos: torch.Tensor

    def as_args(self) -> tuple:
        return (self.query, self.k_cache, self.v_cache, self.input_pos)


def make_attention_inputs(case: AttentionCase, generator: torch.Generator, device="cpu") -> AttentionInputs:
    """Random queries and caches (the positions past the new tokens too, which the op must not see)."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(case.dtype)

    return AttentionInputs(
        query=randn(case.num_heads, case.length, case.head_dim).to(device),
        k_cache=randn(case.num_kv_heads, case.head_dim, case.max_len).to(device),
        v_cache=randn(case.num_kv_heads, case.max_len, case.head_dim).to(device),
        input_pos=torch.tensor([case.start], device=device),
    )


def expected_attention_output(case: AttentionCase, inputs: AttentionInputs) -> torch.Tensor:
    """Row by row in fp64: row t of head h attends to positions 0..start+t of KV head h // (Hq / Hkv)."""
    query, k_cache, v_cache = (t.detach().cpu().to(torch.float64) for t in inputs.as_args()[:3])
    group = case.num_heads // case.num_kv_heads
    scale = case.head_dim**-0.5 if case.scale is None else case.scale
    output = torch.empty(case.num_heads, case.length, case.head_dim, dtype=torch.float64)
    for head in range(case.num_heads):
        keys, values = k_cache[head // group], v_cache[head // group]
        for token in range(case.length):
            visible = case.start + token + 1
            weights = torch.softmax(scale * (query[head, token] @ keys[:, :visible]), dim=-1)
            output[head, token] = weights @ values[:visible]
    return output


def run_attention_case(
    impl: Implementation, case: AttentionCase, inputs: AttentionInputs, *, watched: Optional[list] = None
) -> torch.Tensor:
    """Run ``case`` through ``impl.cached_attention`` into a NaN-poisoned output (``watched`` as for ``run_case``)."""
    output = _watched(torch.full_like(inputs.query, float("nan")), watched)
    impl.cached_attention(*inputs.as_args(), scale=case.scale, output=output)
    return output


def _attention_cases() -> list[AttentionCase]:
    cases = []
    # Each query head grouping (one KV head per query head, 4 and 6 per KV head), decode and prefill,
    # from the caches' start and further in.
    for num_heads, num_kv_heads in [(4, 4), (8, 2), (6, 1)]:
        for length, start in [(1, 0), (1, 37), (7, 0), (9, 20)]:
            cases.append(AttentionCase(num_heads=num_heads, num_kv_heads=num_kv_heads, length=length, start=start))
    base = AttentionCase(num_heads=8, num_kv_heads=2, length=7, start=20)
    cases.append(dataclasses.replace(base, scale=0.3))
    cases += [dataclasses.replace(base, dtype=dtype) for dtype in (torch.bfloat16, torch.float16)]
    # D = 48: up to the caches' last position, T up to 16.
    for length, start in [(1, 63), (16, 0), (5, 30), (16, 48)]:
        cases.append(dataclasses.replace(base, length=length, start=start, head_dim=48))
    # D = 18, a decode step at position 41: kernels that take the cache 4 dims or positions a pass end both
    # part-full.
    cases.append(dataclasses.replace(base, length=1, start=41, head_dim=18))
    # D = 20 over 100 positions, 6 query heads on 1 KV head: the C++ kernel's row blocks (48 rows),
    # row tiles (6) and column panels (16) all end part-full.
    for length, start in [(40, 0), (33, 67), (1, 99), (17, 5)]:
        cases.append(AttentionCase(num_heads=6, num_kv_heads=1, length=length, start=start, head_dim=20, max_len=100))
    # Qwen3.5's full attention: 8 query heads over 2 KV heads of 256 dims; decode deep in the cache, a prefill chunk.
    qwen = AttentionCase(num_heads=8, num_kv_heads=2, head_dim=256, max_len=512)
    cases += [dataclasses.replace(qwen, length=1, start=300), dataclasses.replace(qwen, length=64, start=0)]
    # Three tokens whose positions (126..128) straddle position 128: kernels that split the cache into spans
    # of 64 or 128 positions see a span that only the last row reaches.
    cases.append(dataclasses.replace(qwen, length=3, start=126))
    # A bf16 prefill chunk deep in the cache: kernels that skip the causal mask on the tiles every row sees
    # walk most of it that way, and the last row block is part-full.
    cases.append(dataclasses.replace(qwen, length=72, start=200, dtype=torch.bfloat16))
    return cases


ATTENTION_CASES: tuple[AttentionCase, ...] = tuple(_attention_cases())

def registered_ops(name: str, device: str = "cpu", **options) -> Implementation:
    """The registered ``torch.ops.gdn`` ops on ``device``'s tensors, i.e. whatever kernels dispatch there."""
    return Implementation(
        name=name,
        functional=torch.ops.gdn.gated_delta_rule,
        out=torch.ops.gdn.gated_delta_rule.out,
        inplace=torch.ops.gdn.gated_delta_rule_inplace.out,
        device=device,
        fused=torch.ops.gdn.fused_gated_delta_rule.out,
        **options,
    )


# The core's implementations: what the ops' callers get, and the spec itself.
REFERENCE_IMPLEMENTATIONS = (
    # The registered ops on CPU: the reference until a kernel registers for the CPU key (runtime_ops does).
    registered_ops("op-cpu", cached_attention=torch.ops.gdn.cached_attention.out),
    # The pure-PyTorch reference itself (per-token for short T, chunked for long T).
    Implementation(
        name="reference",
        functional=reference_gated_delta_rule,
        out=reference_gated_delta_rule_out,
        inplace=gated_delta_rule_inplace_out,
        cached_attention=reference_cached_attention_out,
    ),
)


# The one check of a result and of a refusal, which every driver of the table uses (the test suite's, the GPU
# device scripts', kernel-specific tests).
UNSUPPORTED_ERRORS = (NotImplementedError, ValueError, RuntimeError)


class ConformanceError(AssertionError):
    """An implementation broke the op contract on a case: a result off the reference, or a refusal that wrote."""


def check_results(case, output, expected_output, final_state=None, expected_state=None) -> dict[str, float]:
    """The relative errors of ``output`` (and ``final_state``) against the fp64 expectations, by name.

    Raises ConformanceError unless the dtypes are the contract's (the output's
    that of ``case``, the state float32) and each error is within ``case.tolerance``.
    """
    results = {"output": (output, expected_output, case.dtype)}
    if final_state is not None:
        results["final_state"] = (final_state, expected_state, torch.float32)
    errors = {}
    for name, (actual, expected, dtype) in results.items():
        if actual.dtype != dtype:
            raise ConformanceError(f"{name} is {actual.dtype}, expected {dtype}")
        errors[name] = relative_error(actual, expected)
    failed = [f"{name} error {error:.3g}" for name, error in errors.items() if not error <= case.tolerance]
    if failed:
        raise ConformanceError(f"{', '.join(failed)} > tolerance {case.tolerance:g}")
    return errors


def _unchanged(tensors: Sequence[torch.Tensor], before: Sequence[torch.Tensor]) -> bool:
    """Whether each tensor still holds what its copy in ``before`` does (NaN where it was NaN)."""
    return all(
        torch.equal(tensor.isnan(), old.isnan()) and torch.equal(tensor.nan_to_num(), old.nan_to_num())
        for tensor, old in zip(tensors, before)
    )


@dataclass(frozen=True)
class Outcome:
    """A case an implementation passed: its errors by result name, or, if it refused the case, why."""

    errors: dict
    refused: Optional[str] = None
    raised: Optional[str] = None  # the refusal's error, "Type: first line"

    def __str__(self) -> str:
        if self.refused is not None:
            return f"refused ({self.refused}): {self.raised}"
        return "  ".join(f"{name} {error:9.2e}" for name, error in self.errors.items())


def check_case(impl: Implementation, case: Union[OpCase, "AttentionCase"], generator: torch.Generator, *,
               fused: bool = False) -> Outcome:
    """Run ``case`` (of ``FUSED_CASES`` if ``fused``) through ``impl`` on inputs drawn from ``generator``.

    A case ``impl.unsupported`` names must raise one of UNSUPPORTED_ERRORS
    having written nothing; any other must match the fp64 reference within the
    case's tolerance (``check_results``) and leave its inputs as they were.
    Raises ConformanceError otherwise.
    """
    if isinstance(case, AttentionCase):
        make, expect, run = make_attention_inputs, expected_attention_output, run_attention_case
    elif fused:
        make, expect, run = make_fused_inputs, expected_fused_outputs, run_fused_case
    else:
        make, expect, run = make_inputs, expected_outputs, run_case
    inputs = make(case, generator, device=impl.device)
    untouched = [t.clone() for t in inputs.as_args()]
    reason = impl.unsupported(case)
    if reason is not None:
        watched = []
        try:
            run(impl, case, inputs, watched=watched)
        except UNSUPPORTED_ERRORS as error:
            raised = f"{type(error).__name__}: {(str(error).strip() or 'no message').splitlines()[0]}"
        else:
            raise ConformanceError(f"unsupported ({reason}) but ran without an error")
        if not _unchanged([t for t, _ in watched] + list(inputs.as_args()), [b for _, b in watched] + untouched):
            raise ConformanceError(f"refused ({raised}) after writing an output or input")
        return Outcome(errors={}, refused=reason, raised=raised)
    expected = expect(case, inputs)
    results = run(impl, case, inputs)
    if isinstance(results, torch.Tensor):  # cached_attention: the output only
        errors = check_results(case, results, expected)
    else:
        errors = check_results(case, results[0], expected[0], results[1], expected[1])
    if not _unchanged(inputs.as_args(), untouched):
        raise ConformanceError("an input was modified")
    return Outcome(errors=errors)
