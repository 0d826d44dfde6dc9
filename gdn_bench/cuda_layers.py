"""On a GPU: our CUDA program's own layer kernels at the Qwen3.5 shapes, against PyTorch's.

Two benchmarks, each at the 0.8B and 4B configs (``gdn_bench.e2e.SHAPES``), bf16, every
kernel replayed from a CUDA graph as the program's decode runs with ``--cuda-graph``
(launched one by one from Python, a small kernel's time is its launch's: a first run
that way put our decode linear kernel at 23 to 68 us on the 0.8B's small layers,
whose weights need 1 to 2 us):

* ``linear``: ``cuda_backend.decode_linear``'s kernel, at the launcher's launch and
  each of ``LINEAR_SWEEP``, against ``F.linear`` (cuBLAS) at one token, on every
  distinct (out, in) shape of a decode step as our program runs it (sibling
  projections merged and normalizing their input, the MLP's down projection
  silu-gating its own), each checked against the other, as GB/s of weights; then
  a step's linear layers (each shape times its count) against the copy bandwidth
  measured in the same run. Each is timed over copies of its weight larger
  together than the L2 cache, as a decode step meets them (timed on one weight, a
  first run read the small layers from L2 at up to 0.93 of the copy bandwidth,
  where the program's profile showed about half of it).
* ``attention``: the cached-attention kernels, at the launcher's shape and each of
  ``ATTENTION_SWEEP``, against ``scaled_dot_product_attention`` (flash attention,
  bottom-right causal, KV heads shared by their query heads) on the same keys: a
  2048-token prefill chunk at positions 0, 2048, 4096 and 6144 (a prompt of 8192 in
  the e2e bench's chunks) and one decode token at 512, 4096 and 8000. Each shape is
  checked against flash attention's output, then timed: microseconds and causal
  TFLOP/s (prefill), GB/s of cache read (decode); the fastest correct shape of each
  case shows what the launcher should choose.

* ``gemm``: the prefill method's matrix products at a chunk of ``--tokens`` (the
  e2e bench's 2048), one distinct (out, in) shape at a time: cuBLAS (what
  transformers runs) against AOTInductor's Triton GEMM templates as our lowering
  tunes them (CudaBackend allows Triton templates only: its runtime links no
  cuBLAS) and under each of ``GEMM_VARIANTS``' Inductor settings; TFLOP/s each,
  and a chunk's products (each shape times its count) in total.

Usage: ``python -m gdn_bench.cuda_layers linear|attention|gemm [--shapes 0.8b,4b] [--cache 8320] [--tokens 2048]``
(the device step: ``run_on_device.sh cuda-layers``).
"""

from __future__ import annotations

import argparse
from collections import Counter

from gdn_bench.e2e import SHAPES

# Launch shapes tried besides the launcher's own (``run_cached_attention``'s ``launch_shape``).
ATTENTION_SWEEP = {
    "prefill": (
        dict(block_m=64, block_n=32, num_warps=4), dict(block_m=64, block_n=64, num_warps=4),
        dict(block_m=64, block_n=64, num_stages=3), dict(block_m=128, block_n=32, num_warps=8, num_stages=2),
        dict(block_m=128, block_n=64, num_warps=8, num_stages=1),
        dict(block_m=128, block_n=32, num_warps=8, num_stages=3), dict(block_m=32, block_n=64, num_warps=4),
    ),
    "decode": (dict(block_n=32), dict(block_n=128, num_warps=8), dict(split=False), dict(num_warps=8)),
}
# Decode linear launches tried besides the launcher's own (``_decode_linear_launch``): tiles of 2048 to 16384
# elements in 1 to 32 rows, 4 or 8 warps.
LINEAR_SWEEP = tuple(
    dict(rows=rows, width=tile // rows, num_warps=warps, num_stages=stages)
    for rows in (1, 2, 4, 8, 16, 32) for tile in (2048, 4096, 8192, 16384) if tile // rows >= 64
    for warps in (4, 8) for stages in (2,)
)
# Inductor settings tried on the prefill GEMMs besides the lowering's own (``gemm``): its persistent
# kernel that loads tiles through the Hopper TMA unit (on the H100, 2026-11-26: 2.1 ms faster a 4B chunk than
# the templates, 2.1 ms slower than cuBLAS, but AOTInductor in torch 2.11 cannot run it: docs/benchmarks.md),
# and the exhaustive search over the templates' tile shapes (every one compiled: minutes a shape).
GEMM_VARIANTS = {
    "persistent TMA": {"triton.enable_persistent_tma_matmul": True},
    "exhaustive search": {"max_autotune_gemm_search_space": "EXHAUSTIVE"},
}
# Each linear is timed over copies of its weight adding up to this many bytes, more than an H100's or H200's L2.
COLD_BYTES = 256 << 20
PREFILL_CALLS = [(2048, position) for position in (0, 2048, 4096, 6144)]  # (T, position)
DECODE_CALLS = [(1, position) for position in (512, 4096, 8000)]


def step_linears(config: dict) -> Counter:
    """{(out_features, in_features, input): count} of one decode step's linear layers (dense config) as our
    CUDA program runs them: the projections a layer makes of one input merged into one
    (``CudaTritonBackend.merged_linears``, the MLP's gate/up) and normalizing that input themselves
    (input "normed"), the MLP's down projection taking silu(gate) * up inside its kernel ("gated"), the
    rest "plain"."""
    hidden, kinds = config["hidden_size"], config["layer_types"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = Counter()
    for kind in kinds:
        if kind == "linear_attention":  # in_proj qkv, z, b, a; out_proj
            shapes.update({(2 * key_dim + 2 * value_dim + 2 * config["linear_num_value_heads"], hidden, "normed"): 1,
                           (hidden, value_dim, "plain"): 1})
        else:  # q (with its gate), k, v; o_proj
            shapes.update({(2 * heads * head_dim + 2 * kv_heads * head_dim, hidden, "normed"): 1,
                           (hidden, heads * head_dim, "plain"): 1})
        shapes.update({(2 * config["intermediate_size"], hidden, "normed"): 1,
                       (hidden, config["intermediate_size"], "gated"): 1})
    shapes[(config["vocab_size"], hidden, "plain")] += 1
    return shapes


def relative_error(actual, expected) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def bench_linears(shapes: list[str]) -> int:
    import torch
    import torch.nn.functional as F
    import triton.testing

    from cuda_backend.triton_ops import _decode_linear_launch, run_decode_linear
    from gdn_export.models.qwen35 import RMSNorm

    source = torch.empty(2**29, dtype=torch.uint8, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: source.clone(), rep=200)
    bandwidth = 2 * source.numel() / copy_ms / 1e6  # GB/s, read + written
    del source
    print(f"copy bandwidth {bandwidth:.0f} GB/s (read + written); a weight read streams at most that")
    print(f"each product is timed over copies of its weight ({COLD_BYTES >> 20} MiB or more of them, replayed "
          "from one CUDA graph): in a decode step every weight comes from memory, not from the L2 cache")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for name in shapes:
        total = {"ours": 0.0, "fastest": 0.0, "cublas": 0.0}
        weight_bytes = 0
        print(f"\n{name}: shape (out, in) x count | ours us, GB/s | fastest of LINEAR_SWEEP | cuBLAS us, GB/s | "
              "max rel diff (gated, normed: ours computes the input in its kernel, PyTorch's silu-product or "
              "RMSNorm is kernels of their own)")
        for (out_features, in_features, kind), count in sorted(step_linears(SHAPES[name]).items()):
            size = out_features * in_features * 2
            copies = max(1, -(-COLD_BYTES // size))
            weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16,
                                   generator=generator) for _ in range(copies)]
            x = torch.randn(1, 1, in_features * (2 if kind == "gated" else 1), device="cuda", dtype=torch.bfloat16,
                            generator=generator)
            norm = RMSNorm(in_features, eps=1e-6).to("cuda", torch.bfloat16)
            output = torch.empty(1, 1, out_features, device="cuda", dtype=torch.bfloat16)

            def ours(launch_shape=None, weight_index=0):
                run_decode_linear(x, weights[weight_index], None, output, gated=kind == "gated",
                                  norm_weight=norm.weight if kind == "normed" else None, eps=norm.eps,
                                  launch_shape=launch_shape)
                return output

            def cublas(weight_index=0):
                if kind == "gated":
                    gate, up = x.chunk(2, dim=-1)
                    return F.linear(F.silu(gate) * up, weights[weight_index])
                return F.linear(norm(x) if kind == "normed" else x, weights[weight_index])

            def cold_us(run) -> float:
                return triton.testing.do_bench_cudagraph(
                    lambda: [run(weight_index=index) for index in range(copies)]) * 1e3 / copies

            expected = cublas().clone()
            default = _decode_linear_launch(out_features, in_features)
            times, best = {}, None
            for launch_shape in (default,) + LINEAR_SWEEP:
                launch = _decode_linear_launch(out_features, in_features, launch_shape)
                if launch["width"] > triton.next_power_of_2(in_features) or launch["rows"] > out_features:
                    continue
                output.fill_(float("nan"))
                try:
                    difference = relative_error(ours(launch), expected)
                except Exception as error:  # noqa: BLE001  (a launch that does not compile is a result)
                    print(f"  ({out_features}, {in_features}) {launch}: failed: {type(error).__name__}")
                    continue
                if not difference <= 2e-2:
                    print(f"  ({out_features}, {in_features}) {launch}: MISMATCH, ours and cuBLAS differ by "
                          f"{difference:.1e}")
                    return 1
                us = cold_us(lambda weight_index: ours(launch, weight_index))
                times.setdefault("ours", us)
                if best is None or us < best[0]:
                    best = (us, launch)
            times["fastest"] = best[0]
            times["cublas"] = cold_us(cublas)
            weight_bytes += size * count
            for system in total:
                total[system] += times[system] * count
            print(f"  ({out_features}, {in_features}{'' if kind == 'plain' else ', ' + kind}) x {count} | "
                  f"{times['ours']:.1f}, {size / times['ours'] / 1e3:.0f} | {best[0]:.1f}, "
                  f"{size / best[0] / 1e3:.0f}: {best[1]} | {times['cublas']:.1f}, "
                  f"{size / times['cublas'] / 1e3:.0f} | {difference:.1e}")
            del weights
        floor_us = weight_bytes / bandwidth / 1e3  # as the e2e bench's roofline: reads at the copy's bytes moved
        print(f"{name}: a step's linears read {weight_bytes / 1e9:.2f} GB: ours {total['ours']:.0f} us, the fastest "
              f"launches {total['fastest']:.0f} us, cuBLAS {total['cublas']:.0f} us, the copy-bandwidth floor "
              f"{floor_us:.0f} us (ours at {floor_us / total['ours']:.2f} of it, the fastest at "
              f"{floor_us / total['fastest']:.2f}, cuBLAS at {floor_us / total['cublas']:.2f})")
    return 0


def prefill_linears(config: dict) -> Counter:
    """{(out_features, in_features): count} of the products a prefill chunk makes as matrix products: a
    decode step's linears (``step_linears``) but the output layer, which prefill runs on the last token only."""
    shapes = Counter()
    for (out_features, in_features, _), count in step_linears(config).items():
        shapes[(out_features, in_features)] += count
    shapes[(config["vocab_size"], config["hidden_size"])] -= 1
    return +shapes


def gemm_settings(extra: dict) -> dict:
    """The Inductor settings our lowering compiles the prefill GEMMs under (CudaBackend's TRITON-only GEMM
    backends, ``cuda_backend.lowering.FAST_INDUCTOR_CONFIG``), updated with ``extra``; those this torch lacks are
    dropped."""
    from cuda_backend.lowering import FAST_INDUCTOR_CONFIG, known_inductor_settings

    return known_inductor_settings({**FAST_INDUCTOR_CONFIG, "max_autotune_gemm_backends": "TRITON", **extra})


def bench_gemms(shapes: list[str], tokens: int) -> int:
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.nn.functional as F
    import triton.testing

    def time_ms(run) -> float:
        try:
            return triton.testing.do_bench_cudagraph(run)
        except Exception:  # noqa: BLE001  (a kernel that cannot be captured is timed launched one by one)
            return triton.testing.do_bench(run)

    generator = torch.Generator(device="cuda").manual_seed(0)
    systems = ["cuBLAS", "templates (ours)", *GEMM_VARIANTS]
    failed = False
    for name in shapes:
        total = dict.fromkeys(systems, 0.0)
        flops_total = 0
        print(f"\n{name}: a prefill chunk of {tokens} tokens; shape (out, in) x count | "
              + " | ".join(f"{system} us, TFLOP/s" for system in systems))
        for (out_features, in_features), count in sorted(prefill_linears(SHAPES[name]).items()):
            x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, generator=generator)
            weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16,
                                 generator=generator) / in_features**0.5
            expected = F.linear(x, weight)
            flops = 2 * tokens * out_features * in_features
            times = {"cuBLAS": time_ms(lambda: F.linear(x, weight))}
            for system, extra in (("templates (ours)", {}), *GEMM_VARIANTS.items()):
                torch._dynamo.reset()
                with inductor_config.patch(gemm_settings(extra)):
                    compiled = torch.compile(lambda a, b: F.linear(a, b), dynamic=False, fullgraph=True)
                    try:
                        actual = compiled(x, weight)
                    except Exception as error:  # noqa: BLE001  (a setting that does not compile is a result)
                        print(f"  ({out_features}, {in_features}) {system}: failed: {type(error).__name__}: "
                              f"{str(error)[:160]}")
                        times[system] = float("nan")
                        continue
                    difference = relative_error(actual, expected)
                    if not difference <= 2e-2:
                        print(f"  ({out_features}, {in_features}) {system}: MISMATCH with cuBLAS, {difference:.1e}")
                        failed = True
                    times[system] = time_ms(lambda: compiled(x, weight))
            flops_total += flops * count
            for system in systems:
                total[system] += times[system] * count
            print(f"  ({out_features}, {in_features}) x {count} | " + " | ".join(
                f"{times[system] * 1e3:.0f}, {flops / times[system] / 1e9:.0f}" for system in systems))
        print(f"{name}: a chunk's products, {flops_total / 1e12:.1f} TFLOP: " + ", ".join(
            f"{system} {total[system]:.2f} ms ({flops_total / total[system] / 1e9:.0f} TFLOP/s)" for system in systems))
    return 1 if failed else 0


def bench_attention(shapes: list[str], cache: int) -> int:
    import torch
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from cuda_backend.triton_ops import run_cached_attention

    generator = torch.Generator(device="cuda").manual_seed(0)
    failed = False
    for name in shapes:
        config = SHAPES[name]
        heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        group = heads // kv_heads

        def randn(*size):
            return torch.randn(*size, device="cuda", dtype=torch.bfloat16, generator=generator)

        k_cache, v_cache = randn(kv_heads, head_dim, cache), randn(kv_heads, cache, head_dim)
        print(f"\n{name}: {heads} query heads over {kv_heads} KV heads, D {head_dim}, cache {cache}")
        for kind, calls in (("prefill", PREFILL_CALLS), ("decode", DECODE_CALLS)):
            for length, position in calls:
                query = randn(heads, length, head_dim)
                visible = position + length
                keys = k_cache[:, :, :visible].transpose(1, 2).repeat_interleave(group, 0).contiguous()[None]
                values = v_cache[:, :visible].repeat_interleave(group, 0).contiguous()[None]
                mask = causal_lower_right(length, visible)

                def flash():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(query[None], keys, values, attn_mask=mask)

                expected = flash()[0]
                flash_ms = triton.testing.do_bench_cudagraph(flash)
                pairs = length * position + length * (length + 1) // 2  # (query, key) pairs per query head
                flops, cache_bytes = 4 * heads * head_dim * pairs, 2 * kv_heads * visible * head_dim * 2

                def rate(ms):
                    return (f"{flops / ms / 1e9:.0f} TFLOP/s" if kind == "prefill"
                            else f"{cache_bytes / ms / 1e6:.0f} GB/s of cache")

                print(f"  {kind} T={length} at {position}: flash attention {flash_ms * 1e3:.1f} us ({rate(flash_ms)})")
                position_tensor = torch.tensor([position], device="cuda")
                best = None
                for launch_shape in ({},) + ATTENTION_SWEEP[kind]:
                    label = launch_shape or "the launcher's"
                    output = torch.full_like(query, float("nan"))

                    def ours():
                        run_cached_attention(query, k_cache, v_cache, position_tensor, output,
                                             launch_shape=launch_shape)

                    try:
                        ours()
                        torch.cuda.synchronize()
                    except Exception as error:  # noqa: BLE001  (a shape that does not compile is a result)
                        print(f"    {label}: failed: {type(error).__name__}: {str(error)[:120]}")
                        continue
                    error = relative_error(output, expected)
                    if not error <= 2e-2:
                        print(f"    {label}: WRONG, max relative error {error:.1e}")
                        failed = True
                        continue
                    ms = triton.testing.do_bench_cudagraph(ours)
                    if best is None or ms < best[0]:
                        best = (ms, label)
                    print(f"    {label}: {ms * 1e3:.1f} us ({rate(ms)}), {flash_ms / ms:.2f}x flash attention's "
                          f"speed, error {error:.1e}")
                if best is not None:
                    print(f"    fastest: {best[1]} at {best[0] * 1e3:.1f} us")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", choices=("linear", "attention", "gemm"))
    parser.add_argument("--shapes", default="0.8b,4b", help="comma-separated, of " + ", ".join(SHAPES))
    parser.add_argument("--cache", type=int, default=8320, help="attention: cache positions (the e2e bench's "
                                                                "8192 + 128)")
    parser.add_argument("--tokens", type=int, default=2048, help="gemm: the prefill chunk's tokens (rows)")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)} (expected some of {', '.join(SHAPES)})")
    reach = max(position + length for length, position in PREFILL_CALLS + DECODE_CALLS)
    if args.cache < reach:
        parser.error(f"--cache {args.cache}: the attention calls reach position {reach}")
    if args.tokens < 2:
        parser.error(f"--tokens {args.tokens}: a prefill chunk has at least 2 tokens")
    if args.bench == "gemm":
        return bench_gemms(shapes, args.tokens)
    return bench_linears(shapes) if args.bench == "linear" else bench_attention(shapes, args.cache)


if __name__ == "__main__":
    raise SystemExit(main())
