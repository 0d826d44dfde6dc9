"""The Metal kernels as conformance implementations: on MPS (macOS), and emulated on the CPU (anywhere).

* ``metal-mps`` (when MPS is available): the registered gdn ops on MPS tensors,
  i.e. the Metal kernels of ``mps_eager`` and, for head dims they do not
  cover, its documented fallback to the reference, which must still conform.
* ``metal-emulation``: ``kernels/gated_delta_rule.metal`` compiled unchanged as
  C++, each threadgroup's threads run as fibers so ``simd_sum`` synchronizes
  the 32 lanes of a SIMD group as on the GPU, launches planned by the host
  dispatch's own ``runtime/launch.h`` (see ``metal_backend/emulation.py``).
  Cases with head dims other than 64, 128 or 256 must raise
  NotImplementedError before writing.

Both run ``table_cases``: the table plus its variants at head dims 64
(``with_head_dims``: most layout, call and extreme-gate variants use 32-dim
heads), as the CUDA port does on a GPU (``metal_backend/device/conformance_rows.py``).
Left out of the emulated rows for time: the Qwen3.5-shaped prefill cases
(Hv = 32, T = 64: 8M lane exchanges, ~50 s emulated); their decode shape
(T = 1) and the T = 257 cases run the same code paths, and the CUDA port runs
them.
"""

from __future__ import annotations

from typing import Sequence

from gdn_export.ops.conformance import OpCase, registered_ops, with_head_dims
from metal_backend import emulation, mps_eager


def table_cases(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    """``cases`` (of CASES or FUSED_CASES) and their variants at head dims the kernels take."""
    return with_head_dims(cases, mps_eager.SUPPORTED_HEAD_DIMS)


def _emulated_in_time(cases: Sequence[OpCase]) -> tuple[OpCase, ...]:
    return tuple(case for case in table_cases(cases) if not (case.num_v_heads >= 32 and case.length > 1))


EMULATED = emulation.EMULATION.implementation(op_cases=_emulated_in_time)
MPS = registered_ops("metal-mps", device="mps", op_cases=table_cases)

IMPLEMENTATIONS = ([MPS] if mps_eager.register() else []) + [EMULATED]
