"""On a GPU: the CUDA-rewritten tiny Qwen3.5, compiled with AOTInductor and lowered with CudaBackend.

ExecuTorch's CUDA runtime is not on the package index, so the lowered code
path is proven by compiling the same exported programs with
``torch._inductor.aoti_compile_and_package`` (what CudaBackend runs inside),
loading them and matching the eager reference model's logits and greedy tokens:

* ``prefill``: T dynamic, holds ``gdn_cuda::fused_chunked_gated_delta_rule``;
  the prompt and then every decode step go through it;
* ``decode``: T = 1, holds ``gdn_cuda::fused_recurrent_gated_delta_rule``; the
  prompt goes in one token at a time, then greedy decoding.

Both ops are also lowered with ``cuda_backend.lowering.lower_to_cuda`` to a
``.pte`` and its ``.ptd`` (methods ``decode``, T = 1, and ``prefill``, T = 8). Usage: ``python -m cuda_backend.device.aoti_check OUT_DIR``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT_LENGTH, NEW_TOKENS, MAX_PREFILL, PREFILL_CHUNK = 12, 8, 64, 8


def _exported(model, length: int, dynamic: bool):
    tokens = torch.zeros(1, length, dtype=torch.long, device="cuda")
    input_pos = torch.zeros(1, dtype=torch.long, device="cuda")
    if not dynamic:
        with torch.no_grad():
            return torch.export.export(model, (tokens, input_pos), strict=False)
    try:
        shapes = ({1: torch.export.Dim("token_dim", min=1, max=MAX_PREFILL)}, None)
        with torch.no_grad():
            return torch.export.export(model, (tokens, input_pos), dynamic_shapes=shapes, strict=False)
    except torch._dynamo.exc.UserError as error:
        # torch 2.11 cannot prove a stride guard of the attention layer over the named range
        # (torch 2.13 can); Dim.DYNAMIC keeps T dynamic and records the guard instead.
        print(f"named Dim refused ({str(error).splitlines()[1].strip()[:160]}); using Dim.DYNAMIC", flush=True)
        with torch.no_grad():
            return torch.export.export(
                model, (tokens, input_pos), dynamic_shapes=({1: torch.export.Dim.DYNAMIC}, None), strict=False
            )


def _gdn_ops(program) -> list[str]:
    return sorted({str(node.target) for node in program.graph.nodes if "gdn" in str(node.target)})


def _generate(step, prompt: torch.Tensor, one_token_at_a_time: bool):
    """Greedy decoding; returns (logits of every call [N, vocab], generated tokens)."""
    logits, tokens = [], []
    with torch.no_grad():
        if one_token_at_a_time:
            for position in range(prompt.shape[1]):
                last = step(prompt[:, position:position + 1], torch.tensor([position], device="cuda"))
        else:
            last = step(prompt, torch.tensor([0], device="cuda"))
        logits.append(last[0, -1])
        position = prompt.shape[1]
        for _ in range(NEW_TOKENS):
            token = last[0, -1].argmax().view(1, 1)
            tokens.append(token.item())
            last = step(token, torch.tensor([position], device="cuda"))
            logits.append(last[0, -1])
            position += 1
    return torch.stack(logits).float(), tokens


def main(out_dir: str) -> int:
    from gdn_export.loading import load_qwen35
    from gdn_export.passes import register_recurrence, rewrite
    from gdn_export.passes.cuda import CudaFusedRecurrence
    from gdn_export.tiny import make_tiny_checkpoint

    from cuda_backend.lowering import lower_to_cuda

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = make_tiny_checkpoint(Path(tempfile.mkdtemp()) / "tiny", key_head_dim=64, value_head_dim=64)
    reference = load_qwen35(checkpoint, max_seq_len=128).cuda().eval()
    register_recurrence("cuda", CudaFusedRecurrence)
    model = rewrite(load_qwen35(checkpoint, max_seq_len=128), "cuda").cuda().eval()
    prompt = torch.randint(3, 300, (1, PROMPT_LENGTH), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    failures = 0

    programs = {"decode": _exported(model, 1, dynamic=False), "prefill": _exported(model, 4, dynamic=True)}
    for name, program in programs.items():
        print(f"{name}: gdn ops in the exported graph: {_gdn_ops(program)}", flush=True)
    # ExecuTorch plans memory from T's upper bound, which Dim.DYNAMIC leaves unset: the
    # lowered prefill method takes a fixed chunk of PREFILL_CHUNK tokens instead.
    lowered = {"decode": _exported(model, 1, dynamic=False), "prefill": _exported(model, PREFILL_CHUNK, dynamic=False)}

    for name, program in programs.items():
        started = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(out / f"{name}.pt2"))
        print(f"{name}: AOTInductor compile {time.perf_counter() - started:.1f} s", flush=True)
        compiled = torch._inductor.aoti_load_package(package)
        print(f"{name}: loaded", flush=True)
        one_at_a_time = name == "decode"
        reference.reset()
        expected_logits, expected_tokens = _generate(reference, prompt, one_at_a_time)
        logits, tokens = _generate(lambda t, p: compiled(t, p), prompt, one_at_a_time)
        error = ((logits - expected_logits).abs().max() / expected_logits.abs().max()).item()
        same = tokens == expected_tokens
        print(f"{name}: AOTI vs eager reference: max rel logits error {error:.2e}, greedy tokens "
              f"{'match' if same else 'DIFFER'}: {tokens} vs {expected_tokens}", flush=True)
        failures += (error > 1e-3) + (not same)
        (out / f"{name}.pt2").unlink(missing_ok=True)  # only the .pte/.ptd come back

    started = time.perf_counter()
    metadata = {"get_max_seq_len": 128, "enable_dynamic_shape": True, "use_kv_cache": True}
    pte = out / "tiny_qwen35_cuda.pte"
    manager, data_files = lower_to_cuda(lowered, metadata=metadata, output=pte)
    with open(pte, "wb") as file:
        manager.write_to_file(file)
    for method in lowered:
        graph = manager.exported_program(method).graph
        delegates = [str(node.target) for node in graph.nodes if "delegate" in str(node.target)]
        print(f"lowered {method}: {len(delegates)} delegate call(s)", flush=True)
    sizes = ", ".join(f"{path.name} {path.stat().st_size / 2**20:.2f} MiB" for path in [pte, *data_files])
    print(f"CudaBackend lowering {time.perf_counter() - started:.1f} s: {sizes}", flush=True)
    failures += not data_files

    print("AOTI CHECK", "PASSED" if failures == 0 else f"FAILED ({failures})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/cuda_device"))
