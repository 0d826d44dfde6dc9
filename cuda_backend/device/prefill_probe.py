"""On a GPU: which part of a CUDA program's prefill method goes wrong in ExecuTorch's CUDA runtime.

The device step ``cpp-e2e`` found the decode method right token for token and
the prefill method wrong from its first call. This exports the tiny dense
model's two-method program with the prefill method in other forms, each into
its own folder, for the C++ runner to run with ``--prefill-chunk CHUNK``:

* ``static-chunked``: T fixed at CHUNK (no dynamic dim), the chunked kernels;
* ``static-reference``: T fixed at CHUNK, the recurrence as plain tensor ops
  (``PerTokenRecurrence``), no Triton kernel of ours in the method.

Usage: ``python -m cuda_backend.device.prefill_probe CHECKPOINT OUT_DIR --chunk 4 [--variant NAME]``
(without ``--variant`` every variant is exported, each in a child process, at once).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

VARIANTS = ("static-chunked", "static-reference")


def export_variant(checkpoint: Path, out: Path, variant: str, chunk: int) -> None:
    import torch

    from gdn_export import loading
    from gdn_export.checkpoint import read_checkpoint
    from gdn_export.lowering import write_program
    from gdn_export.models.qwen35 import GatedDeltaNet, PerTokenRecurrence
    from gdn_export.passes import rewrite
    from cuda_backend.lowering import lower_to_cuda

    source = read_checkpoint(checkpoint)
    model = loading.load_model(source, dtype=torch.float32, max_seq_len=128)
    model.all_logits = False
    rewrite(model, backend="cuda")
    input_pos = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        decode = torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), input_pos), strict=False)
        if variant == "static-reference":
            for module in model.modules():
                if isinstance(module, GatedDeltaNet):
                    module.recurrence = PerTokenRecurrence()
        prefill = torch.export.export(model, (torch.zeros(1, chunk, dtype=torch.long), input_pos), strict=False)
    metadata = source.program_metadata(max_seq_len=128, prefill_chunk=chunk)
    manager = lower_to_cuda({"decode": decode, "prefill": prefill}, metadata=metadata)
    out.mkdir(parents=True, exist_ok=True)
    write_program(manager, out / "model.pte")
    print(f"{variant}: {sorted(path.name for path in out.iterdir())}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--chunk", type=int, default=4)
    parser.add_argument("--variant", choices=VARIANTS)
    arguments = parser.parse_args()
    if arguments.variant:
        export_variant(arguments.checkpoint, arguments.out / arguments.variant, arguments.variant, arguments.chunk)
        return 0
    children = [
        subprocess.Popen([sys.executable, "-m", "cuda_backend.device.prefill_probe", str(arguments.checkpoint),
                          str(arguments.out), "--chunk", str(arguments.chunk), "--variant", variant],
                         stdout=open(arguments.out / f"{variant}.log", "w"), stderr=subprocess.STDOUT)
        for variant in VARIANTS
    ]
    return max(child.wait() for child in children)


if __name__ == "__main__":
    sys.exit(main())
