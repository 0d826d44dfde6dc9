"""The Triton kernels of ``cuda_backend`` as conformance implementations.

* On a machine with CUDA, ``op-cuda``: the registered ``gdn`` ops on CUDA
  tensors, over the whole table plus its variants at the head dims the kernels
  take (``with_head_dims``).
* Elsewhere, ``cuda-triton-interpreter``: the same kernels' launchers on CPU
  tensors under Triton's interpreter, which must be on before Triton is
  imported (so the suite runs these rows in a child process that starts with
  ``TRITON_INTERPRET=1``). The interpreter takes seconds per case, so these
  rows are a subset: ``INTERPRETED_CASES``, one case of each path the kernels
  branch on, plus every case the kernels refuse (refused before any launch).

Cases with head dims other than 64, 128 or 256 must raise NotImplementedError.
``gdn::cached_attention`` takes any head dim, so both run every ``ATTENTION_CASES`` row.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

import cuda_backend
from cuda_backend.kernels import SUPPORTED_HEAD_DIMS
from gdn_export.ops.conformance import (
    CASES,
    FUSED_CASES,
    Implementation,
    OpCase,
    registered_ops,
    unsupported_head_dims,
    with_head_dims,
)

# Named as OpCase.name; each a case of with_head_dims(CASES) or of with_head_dims(FUSED_CASES).
INTERPRETED_CASES = frozenset({
    # decode (per-token kernel): state in place, the in-place op (KDA), batch 3, strided inputs, bf16
    "B1-T1-H2x4-D64x64-gda-float32-out_inplace",
    "B1-T1-H2x4-D64x64-kda-float32-inplace",
    "B3-T1-H2x4-D64x64-gda-float32-functional",
    "B1-T1-H2x4-D64x64-kda-float32-out_inplace-strided",
    "B1-T1-H2x4-D64x64-gda-bfloat16-functional",
    # prefill (chunked kernels): a partial last chunk with Dk < Dv and Dk > Dv, strided inputs, the extreme
    # gate, q/k normalized by the caller, an explicit scale, full chunks, two calls carrying the state, bf16
    "B1-T17-H1x2-D64x128-gda-float32-functional",
    "B1-T17-H1x2-D128x64-gda-float32-functional",
    "B1-T17-H2x4-D64x64-gda-float32-functional-strided",
    "B1-T17-H2x4-D64x64-kda-float32-functional-g_min",
    "B1-T17-H2x4-D64x64-kda-float32-functional-prenorm",
    "B1-T17-H2x4-D64x64-gda-float32-functional-scale0.3",
    "B1-T64-H2x4-D64x64-gda-float32-out",
    "B1-T64-H2x4-D64x64-gda-float32-inplace-split32",  # the fused op's too
    "B1-T64-H2x4-D64x64-gda-bfloat16-functional",
    # the fused op's decode, float32 and bf16 (and the in-place op's GDA decode)
    "B1-T1-H2x4-D64x64-gda-float32-inplace",
    "B1-T1-H2x4-D64x64-gda-bfloat16-inplace",
})
_missing = INTERPRETED_CASES - {case.name for table in (CASES, FUSED_CASES)
                                for case in with_head_dims(table, SUPPORTED_HEAD_DIMS)}
if _missing:
    raise ValueError(f"INTERPRETED_CASES names cases the conformance table lacks: {sorted(_missing)}")

_unsupported_head_dims = unsupported_head_dims(SUPPORTED_HEAD_DIMS, "the Triton kernels")


def _unsupported(case: OpCase) -> Optional[str]:
    if not cuda_backend.TRITON_AVAILABLE:
        return "Triton is not installed"
    return _unsupported_head_dims(case)


def _all_with_head_dims(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    return with_head_dims(cases, SUPPORTED_HEAD_DIMS)


def _interpreted(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    return tuple(case for case in _all_with_head_dims(cases) if case.name in INTERPRETED_CASES or _unsupported(case))


def _out(*args, output, final_state, **kwargs):
    return cuda_backend.gated_delta_rule(*args, output=output, final_state=final_state, **kwargs)


def _inplace(query, key, value, g, beta, state, *, output, **kwargs):
    return cuda_backend.gated_delta_rule(query, key, value, g, beta, state, output=output, final_state=state, **kwargs)[0]


def _attention_unsupported(case) -> Optional[str]:
    return None if cuda_backend.TRITON_AVAILABLE else "Triton is not installed"


def _unsupported_case(case) -> Optional[str]:
    return _unsupported(case) if isinstance(case, OpCase) else _attention_unsupported(case)


def _implementations() -> list[Implementation]:
    if torch.cuda.is_available():
        return [registered_ops("op-cuda", device="cuda", unsupported=_unsupported_case, op_cases=_all_with_head_dims,
                               cached_attention=torch.ops.gdn.cached_attention.out)]
    return [
        Implementation(
            name="cuda-triton-interpreter",
            functional=cuda_backend.gated_delta_rule,
            out=_out,
            inplace=_inplace,
            fused=cuda_backend.fused_gated_delta_rule,
            cached_attention=cuda_backend.cached_attention,
            unsupported=_unsupported_case,
            op_cases=_interpreted,
            environment=(("TRITON_INTERPRET", "1"),),
        )
    ]


IMPLEMENTATIONS = _implementations()
