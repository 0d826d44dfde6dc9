"""cuda_backend.device.profile_decode's reading of Nsight Compute's CSV and its sums (the profiling needs a GPU)."""

from __future__ import annotations

import random

from cuda_backend.device.profile_decode import DURATION, family, kernel_rows, summarize


def _ncu_csv(launches: list[tuple[str, float]]) -> str:
    """Nsight Compute's ``--csv --page raw`` output for these (kernel, nanoseconds) launches: its own log lines,
    a header, a units row, and numbers with thousands separators."""
    lines = ["==PROF== Connected to process 1", '"ID","Kernel Name","' + DURATION + '"', '"","","nsecond"']
    lines += [f'"{index}","{name}","{nanoseconds:,.0f}"' for index, (name, nanoseconds) in enumerate(launches)]
    return "\n".join(lines) + "\n"


def test_prefill_profile_sums_each_kernel_family(capsys, seed):
    rng = random.Random(seed)
    names = ["triton_tem_fused_mm_3", "triton_poi_fused_permute_copy_2", "triton_red_fused_mean_1",
             "triton_per_fused_rsqrt_0", "chunk_prepare_kernel", "cached_attention_kernel"]
    launches = [(rng.choice(names), float(rng.randint(1000, 250000))) for _ in range(40)]
    rows = kernel_rows(_ncu_csv(launches))
    assert [(row["Kernel Name"], float(row[DURATION])) for row in rows] == launches, f"seed {seed}"

    summarize(rows, 1, "prefill call")
    printed = capsys.readouterr().out
    families = {"AOTInductor GEMM templates": ("triton_tem_",),
                "AOTInductor pointwise and reductions": ("triton_poi_", "triton_red_", "triton_per_"),
                "ours (cuda_backend.kernels)": ("chunk_", "cached_")}
    for label, prefixes in families.items():
        chosen = [nanoseconds for name, nanoseconds in launches if name.startswith(prefixes)]
        assert all(family(name) == label for name, _ in launches if name.startswith(prefixes))
        if chosen:
            assert f"| {label} | {len(chosen):.1f} | {sum(chosen) / 1e3:.1f} |" in printed, (seed, label, printed)
    total_us = sum(nanoseconds for _, nanoseconds in launches) / 1e3
    assert f"{len(launches)} launches profiled (1.0 prefill calls): {total_us:.0f} us" in printed, f"seed {seed}"
