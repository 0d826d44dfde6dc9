"""The device step's conformance driver (metal_backend/device/conformance_rows.py), run here on the emulation.

On the GPU it drives the CUDA port; the same driver over the CPU emulation
(same C API, same Implementation shape) checks here that its rows print the
table's one check (``check_case``): a pass within tolerance, a refusal of
uncovered head dims, a failure as FAIL; and that its selections cover the
table: every case and every one raised to covered dims, the Qwen3.5 prefill
shape the emulation leaves out, and only covered dims in the sanitizer's list.
"""

from __future__ import annotations

import dataclasses

from gdn_export.ops.conformance import CASES, FUSED_CASES, OpCase
from metal_backend import emulation
from metal_backend.conformance import EMULATED
from metal_backend.device import conformance_rows


def test_rows_run_and_pass_through_the_emulation(capsys, seed):
    case = OpCase(num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=64, length=3, call="out_inplace")
    uncovered = OpCase(num_k_heads=1, num_v_heads=2, length=2)
    fused = dataclasses.replace(case, call="inplace")
    rows = [(case, False), (fused, True), (uncovered, False)]
    failed, refused = conformance_rows.run_rows(emulation.EMULATION.implementation(), rows, seed)
    lines = capsys.readouterr().out.splitlines()
    assert (failed, refused) == (0, 1), lines
    assert [line.split()[:2] for line in lines] == [
        ["PASS", case.name], ["PASS", f"fused-{fused.name}"], ["PASS", uncovered.name],
    ]
    assert "refused (Dk=32, Dv=32: the Metal kernels take 64, 128 or 256): NotImplementedError" in lines[-1]


def test_a_wrong_result_is_a_failed_row(capsys, seed):
    case = OpCase(num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=64, length=3)
    implementation = emulation.EMULATION.implementation()
    wrong = dataclasses.replace(implementation, functional=lambda *args, **kwargs: tuple(
        result + 1e-3 for result in implementation.functional(*args, **kwargs)))
    failed, _ = conformance_rows.run_rows(wrong, [(case, False)], seed)
    line = capsys.readouterr().out.strip()
    assert failed == 1 and line.startswith(f"FAIL  {case.name}") and "> tolerance" in line, line


def test_selections_cover_the_table():
    rows = conformance_rows.selection("all")
    plain = [case for case, fused in rows if not fused]
    fused = [case for case, fused in rows if fused]
    assert len(set(plain)) == len(plain) and len(set(fused)) == len(fused)
    assert set(CASES) <= set(plain) and set(FUSED_CASES) <= set(fused)
    covered = [case for case in plain if EMULATED.unsupported(case) is None]
    # Each case with 32-dim heads runs again at 64.
    assert {dataclasses.replace(c, key_dim=64, value_dim=64) for c in CASES if (c.key_dim, c.value_dim) == (32, 32)
            } <= set(covered)
    qwen_prefill = [c for c in covered if c.num_v_heads == 32 and c.key_dim == 128 and c.length == 64]
    assert qwen_prefill and any(c.call == "out_inplace" for c in qwen_prefill)
    sanitizer = conformance_rows.selection("sanitizer")
    assert any(c.call == "inplace" and c.num_v_heads == 32 for c, fused in sanitizer if not fused)
    assert all(EMULATED.unsupported(case) is None for case, _ in sanitizer)
