"""Tiny random-weight Qwen3.5 checkpoints, built with transformers itself.

Tests, ``make demo`` and the export tests use these instead of downloading a
real model: the folder has the same layout as a Hugging Face checkpoint
(config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json), and its weights come from transformers' own model
classes, so loading it checks our reading of the real format.

transformers and tokenizers are test extras; they are imported inside the
functions so that ``import gdn_export.tiny`` stays light.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

# The pre-tokenizer regex of Qwen's tokenizers: contractions, letter runs with an
# optional leading symbol, single digits, punctuation runs, newlines, spaces.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The tokenizer fills the model's vocabulary, as a real checkpoint's nearly does, so
# any id a random model generates decodes to text in every runner.
MODEL_VOCAB_SIZE = 512
TOKENIZER_VOCAB_SIZE = MODEL_VOCAB_SIZE

_CORPUS = """\
Once upon a time there was a little model that wanted to run fast on every device.
It read one token at a time and kept a small state that summarized everything it had seen.
The state decayed a little with every step, and the delta rule wrote only what was new.
Every morning the engineers measured how many tokens per second it could produce.
On the phone it was quick, on the laptop it was quicker, and on the big GPU it flew.
The quick brown fox jumps over the lazy dog while the cat watches from the window.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
How much wood would a woodchuck chuck if a woodchuck could chuck wood?
Numbers like 1, 2, 3, 42, 2048 and 3.14 appear in text too, along with symbols: #, $, %, &.
Hello world! Hello again, world. Goodbye, cruel world; see you tomorrow.
User: What is the capital of France?
Assistant: The capital of France is Paris.
User: Can you write a short poem about the sea?
Assistant: The sea is wide, the sea is deep, it sings the sailors off to sleep.
"""


# ChatML, as Qwen's templates write a conversation (without their tools and reasoning parts).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _write_atomically(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def build_tokenizer():
    """A small Qwen-style byte-level BPE tokenizer trained on the built-in corpus (deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def tiny_config(
    *,
    moe: bool = False,
    tie_word_embeddings: bool = False,
    wrapper: bool = False,
    num_k_heads: int = 2,
    num_v_heads: int = 4,
    key_head_dim: int = 16,
    value_head_dim: int = 24,
    layer_types: tuple[str, ...] = ("linear_attention", "linear_attention", "full_attention"),
    hidden_size: int = 64,
    bos_token_id: int = 0,
    eos_token_id: int = 2,
):
    """The transformers config of a tiny Qwen3.5 (a ``Qwen3_5*Config`` wrapper when ``wrapper``)."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    text = dict(
        vocab_size=MODEL_VOCAB_SIZE,
        hidden_size=hidden_size,
        num_hidden_layers=len(layer_types),
        layer_types=list(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=num_k_heads,
        linear_num_value_heads=num_v_heads,
        linear_key_head_dim=key_head_dim,
        linear_value_head_dim=value_head_dim,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )
    if moe:
        text.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
        )
    else:
        text.update(intermediate_size=96)
    text_class = Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig
    if not wrapper:
        return text_class(**text)
    wrapper_class = Qwen3_5MoeConfig if moe else Qwen3_5Config
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                  patch_size=4, num_position_embeddings=16)
    return wrapper_class(
        text_config=text, vision_config=vision, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id,
    )


def tiny_hf_model(config, seed: int = 0):
    """A transformers model for ``config`` with random weights, fp32, eval mode.

    Norm weights, A_log and dt_bias are randomized too (transformers initializes
    them to constants), so the tests see every parameter's effect.
    """
    import torch
    from transformers import (
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeForConditionalGeneration,
    )

    classes = {
        "qwen3_5_text": Qwen3_5ForCausalLM,
        "qwen3_5_moe_text": Qwen3_5MoeForCausalLM,
        "qwen3_5": Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    }
    torch.manual_seed(seed)
    model = classes[config.model_type](config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("dt_bias"):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith("A_log"):
                parameter.copy_(torch.empty(parameter.shape).uniform_(-1.0, 2.0, generator=generator))
            elif parameter.dim() >= 2:
                parameter.copy_(0.08 * torch.randn(parameter.shape, generator=generator))
    return model


def make_tiny_checkpoint(
    directory,
    *,
    moe: bool = False,
    tie_word_embeddings: bool = False,
    wrapper: bool = False,
    num_k_heads: int = 2,
    num_v_heads: int = 4,
    key_head_dim: int = 16,
    value_head_dim: int = 24,
    layer_types: tuple[str, ...] = ("linear_attention", "linear_attention", "full_attention"),
    seed: int = 0,
) -> Path:
    """Write a tiny random-weight Qwen3.5 checkpoint folder and return its path.

    Deterministic for a given ``seed``. ``wrapper`` writes the vision-language
    layout real Qwen3.5 checkpoints use (``text_config``, weights under
    ``model.language_model.``, a small vision tower under ``model.visual.``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    bos_token_id = tokenizer.token_to_id("<|endoftext|>")
    eos_token_id = tokenizer.token_to_id("<|im_end|>")
    config = tiny_config(
        moe=moe, tie_word_embeddings=tie_word_embeddings, wrapper=wrapper, num_k_heads=num_k_heads,
        num_v_heads=num_v_heads, key_head_dim=key_head_dim, value_head_dim=value_head_dim,
        layer_types=layer_types, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
    )
    model = tiny_hf_model(config, seed)
    model.generation_config.bos_token_id = bos_token_id
    model.generation_config.eos_token_id = [eos_token_id, bos_token_id]
    model.save_pretrained(directory)
    _write_atomically(directory / "tokenizer.json", tokenizer.to_str())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "add_prefix_space": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_atomically(directory / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2) + "\n")
    return directory
