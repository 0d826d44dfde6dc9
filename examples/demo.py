"""``make demo`` (``python examples/demo.py`` from the repository root): the whole job
end to end on a built-in tiny Qwen3.5.

1. build a tiny random-weight Hugging Face checkpoint with a byte-level BPE
   tokenizer (what ``save_pretrained`` writes, as a real one looks);
2. generate eagerly with transformers and with our model, rewritten so the
   recurrence is the fused ``gdn`` op, and compare the tokens;
3. ``export_qwen35`` it to a ``.pte`` (XNNPACK + our C++ kernel);
4. generate from the ``.pte`` with ``gdn-run``, with ExecuTorch's stock
   ``TextLLMRunner`` and with our C++ example runner.

Random weights make gibberish text; what matters is that every runner writes
the same gibberish as transformers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

PROMPT = "The quick brown fox"
NEW_TOKENS = 24
WORKDIR = Path("build/demo")


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


def transformers_greedy(checkpoint: Path, prompt_ids: list) -> list:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )
    return output[0, len(prompt_ids):].tolist()


def eager_greedy(checkpoint: Path, prompt_ids: list) -> list:
    from gdn_export import load_qwen35, rewrite

    model = rewrite(load_qwen35(checkpoint, max_seq_len=128), backend="xnnpack")
    tokens, position, ids = [], 0, prompt_ids
    with torch.no_grad():
        while len(tokens) < NEW_TOKENS:
            logits = model(torch.tensor([ids]), torch.tensor([position]))
            position += len(ids)
            ids = [int(logits[0, -1].argmax())]
            tokens += ids
    return tokens


def run_stock_runner(model: Path, tokenizer: Path) -> None:
    """ExecuTorch's TextLLMRunner prints the text itself; a child process keeps its output apart."""
    script = (
        "import gdn_export\n"
        "from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner\n"
        f"runner = TextLLMRunner({str(model)!r}, {str(tokenizer)!r})\n"
        f"runner.generate({PROMPT!r}, GenerationConfig(max_new_tokens={NEW_TOKENS}, temperature=0.0, echo=False))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def run_cpp_runner(model: Path, tokenizer: Path) -> None:
    # Run as a script, so this folder is on sys.path and its sibling imports by name.
    from cpp_runner import build as cpp_runner

    try:
        binary = cpp_runner.build()
    except cpp_runner.BuildError as error:
        print(f"(the C++ runner could not be built here: {error})")
        return
    subprocess.run(
        [str(binary), "--model", str(model), "--tokenizer", str(tokenizer), "--prompt", PROMPT,
         "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0"],
        check=True,
    )


def main() -> int:
    from gdn_export import export_qwen35
    from gdn_export.cli import run_main
    from gdn_export.runner import load_tokenizer
    from gdn_export.tiny import make_tiny_checkpoint

    banner("1. a tiny Qwen3.5 checkpoint (random weights) with a byte-level BPE tokenizer")
    checkpoint = make_tiny_checkpoint(WORKDIR / "checkpoint", seed=0)
    tokenizer_path = checkpoint / "tokenizer.json"
    print(f"{checkpoint}: {', '.join(sorted(p.name for p in checkpoint.iterdir()))}")
    tokenizer = load_tokenizer(tokenizer_path)
    prompt_ids = tokenizer.encode(PROMPT).ids

    banner("2. eager greedy decoding: transformers vs gdn_export with the fused gdn op")
    expected = transformers_greedy(checkpoint, prompt_ids)
    ours = eager_greedy(checkpoint, prompt_ids)
    print(f"transformers: {tokenizer.decode(expected)!r}")
    print(f"gdn_export:   {tokenizer.decode(ours)!r}")
    print("same tokens:", "yes" if ours == expected else "NO")

    banner("3. export_qwen35 --checkpoint ... --output model.pte")
    model_path = WORKDIR / "model.pte"
    summary = export_qwen35(checkpoint, model_path, max_seq_len=256, progress=print)
    print(summary.describe())

    banner("4. gdn-run (ExecuTorch Python runtime, our kernels)")
    run_main(["--model", str(model_path), "--tokenizer", str(tokenizer_path), "--prompt", PROMPT,
              "--max-new-tokens", str(NEW_TOKENS)])

    banner("5. ExecuTorch's stock TextLLMRunner on the same .pte")
    run_stock_runner(model_path, tokenizer_path)

    banner("6. our C++ example runner (examples/cpp_runner)")
    run_cpp_runner(model_path, tokenizer_path)
    print(f"\nexpected text (transformers): {tokenizer.decode(expected)!r}")
    return 0 if ours == expected else 1


if __name__ == "__main__":
    sys.exit(main())
