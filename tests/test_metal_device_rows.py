"""The device step's conformance driver (metal_backend/device/conformance_rows.py), run here on the emulation.

On the GPU it drives the CUDA port; the same driver over the CPU emulation
(same C API, same Implementation shape) checks here that its rows compare with
the fp64 reference, raise the uncovered cases' refusals, and that its
selections cover the table: every covered case and every uncovered one raised
to covered dims, the Qwen3.5 prefill shape the emulation tests leave out, and
no head dims the kernels cannot run.
"""

from __future__ import annotations

import dataclasses

import torch

from gdn_export.ops.conformance import CASES, FUSED_CASES, OpCase
from metal_backend import emulation
from metal_backend.device import conformance_rows


def test_rows_run_and_pass_through_the_emulation(capsys):
    case = OpCase(num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=64, length=3, call="out_inplace")
    uncovered = OpCase(num_k_heads=1, num_v_heads=2, length=2)
    fused = dataclasses.replace(case, call="inplace")
    seed = torch.seed() % (1 << 31)
    failed = conformance_rows.run_rows(emulation.EMULATION.implementation(), (case,), (fused,), (uncovered,), seed)
    lines = capsys.readouterr().out.splitlines()
    assert failed == 0, f"seed {seed}: {lines}"
    assert [line.split()[:2] for line in lines] == [
        ["PASS", case.name], ["PASS", f"fused-{fused.name}"], ["PASS", uncovered.name],
    ]
    assert lines[-1].endswith("refused (head dims not covered)")


def test_selections_cover_the_table_with_runnable_dims():
    plain, fused, refused = conformance_rows.selection("all")
    assert all(map(conformance_rows.covered, plain + fused))
    assert len(set(plain)) == len(plain) and len(set(fused)) == len(fused)
    assert {c for c in CASES if conformance_rows.covered(c)} <= set(plain)
    assert {c for c in FUSED_CASES if conformance_rows.covered(c)} <= set(fused)
    assert set(refused) == {c for c in CASES if not conformance_rows.covered(c)}
    qwen_prefill = [c for c in plain if c.num_v_heads == 32 and c.key_dim == 128 and c.length == 64]
    assert qwen_prefill and any(c.call == "out_inplace" for c in qwen_prefill)
    sanitizer_plain, sanitizer_fused, _ = conformance_rows.selection("sanitizer")
    assert any(c.call == "inplace" and c.num_v_heads == 32 for c in sanitizer_plain)
    assert all(map(conformance_rows.covered, sanitizer_plain + sanitizer_fused))
