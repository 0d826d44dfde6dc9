"""On a GPU: the decode linear kernel against cuBLAS on every linear shape of a Qwen3.5 decode step.

For each distinct (out, in) shape of the 0.8B and 4B configs (gdn_bench.e2e.SHAPES): the
time of ``cuda_backend.decode_linear`` and of ``F.linear`` (cuBLAS) at one bf16 token, each
checked against the other, as GB/s of weights read; then a whole step's linear layers
(each shape times its count) against the copy bandwidth measured here.

Each is timed replayed from a CUDA graph, as the program's decode runs with ``--cuda-graph``:
launched one by one from Python, a small layer's time is the launch's (a first run of this
probe put our kernel at 23 to 68 us on the 0.8B's small shapes, whose weights need 1 to 2 us).

Usage: ``python -m cuda_backend.device.decode_linear_probe [--shapes 0.8b,4b]``
"""

from __future__ import annotations

import argparse
from collections import Counter


def step_linears(config: dict) -> Counter:
    """{(out_features, in_features): count} of one decode step's linear layers (dense config)."""
    hidden, kinds = config["hidden_size"], config["layer_types"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = Counter()
    for kind in kinds:
        if kind == "linear_attention":
            shapes.update({(2 * key_dim + value_dim, hidden): 1, (value_dim, hidden): 1,
                           (config["linear_num_value_heads"], hidden): 2, (hidden, value_dim): 1})
        else:
            shapes.update({(2 * heads * head_dim, hidden): 1, (kv_heads * head_dim, hidden): 2,
                           (hidden, heads * head_dim): 1})
        shapes.update({(config["intermediate_size"], hidden): 2, (hidden, config["intermediate_size"]): 1})
    shapes[(config["vocab_size"], hidden)] += 1
    return shapes


def main() -> int:
    import torch
    import triton.testing
    import torch.nn.functional as F

    import cuda_backend
    from gdn_bench.e2e import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="0.8b,4b")
    args = parser.parse_args()
    source = torch.empty(2**29, dtype=torch.uint8, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: source.clone(), rep=200)
    bandwidth = 2 * source.numel() / copy_ms / 1e6  # GB/s, read + written
    print(f"copy bandwidth {bandwidth:.0f} GB/s (read + written); a weight read streams at most that")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for name in args.shapes.split(","):
        config = SHAPES[name]
        total = {"ours": 0.0, "cublas": 0.0}
        weight_bytes = 0
        print(f"\n{name}: shape (out, in) x count | ours us, GB/s | cuBLAS us, GB/s | max rel diff")
        for (out_features, in_features), count in sorted(step_linears(config).items()):
            weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16, generator=generator)
            x = torch.randn(1, 1, in_features, device="cuda", dtype=torch.bfloat16, generator=generator)
            ours, theirs = cuda_backend.decode_linear(x, weight), F.linear(x, weight)
            difference = ((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max()).item()
            times = {"ours": triton.testing.do_bench_cudagraph(lambda: cuda_backend.decode_linear(x, weight), rep=100),
                     "cublas": triton.testing.do_bench_cudagraph(lambda: F.linear(x, weight), rep=100)}
            size = weight.numel() * weight.element_size()
            weight_bytes += size * count
            for system in total:
                total[system] += times[system] * count
            print(f"  ({out_features}, {in_features}) x {count} | {times['ours'] * 1e3:.1f}, "
                  f"{size / times['ours'] / 1e6:.0f} | {times['cublas'] * 1e3:.1f}, "
                  f"{size / times['cublas'] / 1e6:.0f} | {difference:.1e}")
            if difference > 2e-2:
                print(f"  MISMATCH: ours and cuBLAS differ by {difference:.1e} (relative)")
                return 1
        floor_ms = weight_bytes / bandwidth / 1e6  # as gdn-bench's roofline: reads at the copy's bytes moved
        print(f"{name}: a step's linears read {weight_bytes / 1e9:.2f} GB: ours {total['ours']:.3f} ms, "
              f"cuBLAS {total['cublas']:.3f} ms, the copy-bandwidth floor {floor_ms:.3f} ms "
              f"(ours at {floor_ms / total['ours']:.2f} of it, cuBLAS at {floor_ms / total['cublas']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
