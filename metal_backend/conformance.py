"""The Metal kernels as conformance implementations: on MPS (macOS), and emulated on the CPU (anywhere).

* ``metal-mps`` (when MPS is available): the registered gdn ops on MPS tensors,
  i.e. the Metal kernels of ``mps_eager`` and, for head dims they do not
  cover, its documented fallback to the reference, which must still conform.
* ``metal-emulated``: ``kernels/gated_delta_rule.metal`` compiled unchanged as
  C++, each threadgroup's threads run as fibers so ``simd_sum`` synchronizes
  the 32 lanes of a SIMD group as on the GPU, launches planned by the host
  dispatch's own ``runtime/launch.h`` (see ``metal_backend/emulation.py``).
  Cases with head dims other than 64, 128 or 256 must raise
  NotImplementedError.

Both run the table plus its variants at head dims 64 (``with_head_dims``: most
layout, call and extreme-gate variants use 32-dim heads). Left out of the
emulated rows for time: the Qwen3.5-shaped prefill cases (Hv = 32, T = 64: 8M
lane exchanges, ~50 s emulated); their decode shape (T = 1) and the T = 257
cases run the same code paths.
"""

from __future__ import annotations

from typing import Sequence

import torch

from gdn_export.ops.conformance import Implementation, OpCase, unsupported_head_dims, with_head_dims
from metal_backend import emulation, mps_eager
from metal_backend.backend import SUPPORTED_HEAD_DIMS


def _all_with_head_dims(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    return with_head_dims(cases, SUPPORTED_HEAD_DIMS)


def _emulated_in_time(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    return tuple(case for case in _all_with_head_dims(cases) if not (case.num_v_heads >= 32 and case.length > 1))


EMULATED = Implementation(
    name="metal-emulated",
    functional=emulation.gated_delta_rule,
    out=emulation.gated_delta_rule_out,
    inplace=emulation.gated_delta_rule_inplace_out,
    fused=emulation.fused_gated_delta_rule_out,
    unsupported=unsupported_head_dims(SUPPORTED_HEAD_DIMS, "the Metal kernels"),
    op_cases=_emulated_in_time,
)

MPS = Implementation(
    name="metal-mps",
    functional=torch.ops.gdn.gated_delta_rule,
    out=torch.ops.gdn.gated_delta_rule.out,
    inplace=torch.ops.gdn.gated_delta_rule_inplace.out,
    device="mps",
    fused=torch.ops.gdn.fused_gated_delta_rule.out,
    op_cases=_all_with_head_dims,
)

IMPLEMENTATIONS = ([MPS] if mps_eager.register() else []) + [EMULATED]
