"""gdn_bench.cuda_layers: what it times is what our CUDA program runs (the benchmarks themselves need a GPU)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

pytest.importorskip("triton")  # the CUDA rewrite's ops are triton_ops

from gdn_bench.cuda_layers import main, prefill_linears, step_linears  # noqa: E402


def test_step_linears_are_the_decode_linears_of_the_rewritten_model(tmp_path, seed):
    from cuda_backend.linear import DecodeLinear
    from gdn_export import load_qwen35, rewrite
    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny", seed=seed, key_head_dim=64, value_head_dim=64)
    model = rewrite(load_qwen35(checkpoint, max_seq_len=16), "cuda")
    # The MLP's down projection takes its input silu-gated (GatedMLP); the layers that took a norm, normed.
    def kind(name, module):
        return "gated" if name.endswith("mlp.down_proj") else "normed" if module.input_norm is not None else "plain"

    ran = Counter((*module.weight.shape, kind(name, module))
                  for name, module in model.named_modules() if isinstance(module, DecodeLinear))
    config = json.loads((checkpoint / "config.json").read_text())
    assert step_linears(config.get("text_config", config)) == ran, f"seed {seed}"


def test_prefill_linears_are_the_matrix_products_of_the_rewritten_model(tmp_path, seed):
    from cuda_backend.linear import DecodeLinear
    from gdn_export import load_qwen35, rewrite
    from gdn_export.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny", seed=seed, key_head_dim=64, value_head_dim=64)
    model = rewrite(load_qwen35(checkpoint, max_seq_len=16), "cuda")
    # Every linear layer runs as a matrix product at T > 1 but the output layer, which sees the last position.
    products = Counter(tuple(module.weight.shape) for name, module in model.named_modules()
                       if isinstance(module, DecodeLinear) and name != "lm_head")
    config = json.loads((checkpoint / "config.json").read_text())
    assert prefill_linears(config.get("text_config", config)) == products, f"seed {seed}"


def test_unknown_shape_is_refused_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["linear", "--shapes", "0.8b,1b"])
    assert exit_info.value.code == 2
    assert "--shapes: unknown 1b (expected some of 0.8b, 4b)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["attention", "--cache", "4096"])
    assert "--cache 4096: the attention calls reach position 8192" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["gemm", "--tokens", "1"])
    assert "--tokens 1: a prefill chunk has at least 2 tokens" in capsys.readouterr().err
    assert not torch.cuda.is_initialized()
