"""On a GPU: the cached-attention kernels at Qwen3.5's full-attention shapes, against PyTorch's flash attention.

For the 0.8B (8 query heads over 2 KV heads) and 4B (16 over 4) layers, 256-dim
heads, bf16, caches of ``--cache`` positions: a 2048-token prefill chunk at
positions 0, 2048, 4096 and 6144 (a prompt of 8192 in the bench's chunks), and
one decode token at positions 512, 4096 and 8000. Each launch shape of
``ATTENTION_SWEEP`` (``cuda_backend.triton_ops.run_cached_attention``'s
``launch_shape``) is checked against ``scaled_dot_product_attention`` on the
same keys (flash attention, bottom-right causal, the KV heads shared by their
query heads), and timed replayed from a CUDA graph: microseconds and causal
TFLOP/s (prefill), GB/s of cache read (decode). The fastest correct shape of
each case shows what the launcher should choose.

Usage: ``python -m cuda_backend.device.attention_probe [--shapes 0.8b,4b] [--cache 8320]``
"""

from __future__ import annotations

import argparse

# Launch shapes tried besides the launcher's own: rows and positions per tile, warps, stages.
ATTENTION_SWEEP = {
    "prefill": (
        dict(block_m=64, block_n=32, num_warps=4), dict(block_m=64, block_n=64, num_warps=4),
        dict(block_m=64, block_n=64, num_stages=3), dict(block_m=128, block_n=32, num_warps=8, num_stages=2),
        dict(block_m=128, block_n=64, num_warps=8, num_stages=1), dict(block_m=128, block_n=32, num_warps=8,
                                                                       num_stages=3),
        dict(block_m=32, block_n=64, num_warps=4),
    ),
    "decode": (dict(block_n=32), dict(block_n=128, num_warps=8), dict(split=False), dict(num_warps=8)),
}
SHAPES = {"0.8b": (8, 2), "4b": (16, 4)}
HEAD_DIM = 256
PREFILL = [(2048, position) for position in (0, 2048, 4096, 6144)]
DECODE = [(1, position) for position in (512, 4096, 8000)]


def main() -> int:
    import torch
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from cuda_backend.triton_ops import run_cached_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="0.8b,4b")
    parser.add_argument("--cache", type=int, default=8320, help="cache positions (the bench's 8192 + 128)")
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    failed = False
    for shape in args.shapes.split(","):
        num_heads, num_kv_heads = SHAPES[shape]
        group = num_heads // num_kv_heads

        def randn(*size):
            return torch.randn(*size, device="cuda", dtype=torch.bfloat16, generator=generator)

        k_cache, v_cache = randn(num_kv_heads, HEAD_DIM, args.cache), randn(num_kv_heads, args.cache, HEAD_DIM)
        print(f"\n{shape}: {num_heads} query heads over {num_kv_heads} KV heads, D {HEAD_DIM}, cache {args.cache}")
        for kind, cases in (("prefill", PREFILL), ("decode", DECODE)):
            for length, position in cases:
                query = randn(num_heads, length, HEAD_DIM)
                visible = position + length
                keys = k_cache[:, :, :visible].transpose(1, 2).repeat_interleave(group, 0).contiguous()
                values = v_cache[:, :visible].repeat_interleave(group, 0).contiguous()
                mask = causal_lower_right(length, visible)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    expected = F.scaled_dot_product_attention(query[None], keys[None], values[None], attn_mask=mask)[0]

                    def flash():
                        return F.scaled_dot_product_attention(query[None], keys[None], values[None], attn_mask=mask)

                    flash_ms = triton.testing.do_bench_cudagraph(flash, rep=50)
                pos = torch.tensor([position], device="cuda")
                rows = sum(position + t + 1 for t in range(length))  # (query, key) pairs per query head
                flops = 4 * num_heads * HEAD_DIM * rows
                cache_bytes = 2 * num_kv_heads * visible * HEAD_DIM * 2

                def rate(ms):
                    return (f"{flops / ms / 1e9:.0f} TFLOP/s" if kind == "prefill"
                            else f"{cache_bytes / ms / 1e6:.0f} GB/s of cache")

                print(f"  {kind} T={length} at {position}: flash attention {flash_ms * 1e3:.1f} us ({rate(flash_ms)})")
                best = None
                for launch_shape in ({},) + ATTENTION_SWEEP[kind]:
                    output = torch.full_like(query, float("nan"))
                    try:
                        run_cached_attention(query, k_cache, v_cache, pos, output, launch_shape=launch_shape)
                        torch.cuda.synchronize()
                    except Exception as error:  # noqa: BLE001  (a shape that does not compile is a result)
                        print(f"    {launch_shape or 'default'}: failed: {type(error).__name__}: {str(error)[:120]}")
                        continue
                    error = ((output.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
                    if not error <= 2e-2:
                        print(f"    {launch_shape or 'default'}: WRONG, max relative error {error:.1e}")
                        failed = True
                        continue
                    ms = triton.testing.do_bench_cudagraph(
                        lambda: run_cached_attention(query, k_cache, v_cache, pos, output, launch_shape=launch_shape),
                        rep=50)
                    best = min(best or (ms, launch_shape), (ms, launch_shape), key=lambda item: item[0])
                    print(f"    {launch_shape or 'default'}: {ms * 1e3:.1f} us ({rate(ms)}), "
                          f"{flash_ms / ms:.2f}x flash attention's speed, error {error:.1e}")
                if best is not None:
                    print(f"    fastest: {best[1] or 'default'} at {best[0] * 1e3:.1f} us")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
