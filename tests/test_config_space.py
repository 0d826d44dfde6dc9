"""Every Qwen3.5 text config transformers runs exports and runs: a property-based test.

Hypothesis draws a text config (head counts and dims of both attention kinds,
the GQA and value/key head ratios, the layer pattern, partial rotary, tied
embeddings, dense or MoE, odd sizes), transformers builds the model with
random weights and saves it as a checkpoint folder, ``export_qwen35`` exports
it with the default backend (XNNPACK, fp32), and the ``.pte`` runs a prefill
and a few decode steps in ExecuTorch's runtime. Its logits must equal
transformers' within 1e-4 of their largest magnitude.

Size: CI_EXAMPLES (3) drawn configs a run plus the explicit ``@example`` cases
(every config that ever failed; 2 now), so 5 exports of 1 to 3 layers. Measured
2026-11-24 on this project's 2-core machine, shared with other jobs (load 5 to
10): 390 s wall, 145 s of CPU (user + sys) for the whole test, 10 to 70 s of
it an export's to_edge/partition step; 124 s wall (110 s CPU) at a lighter load.
Configs (and their weights and tokens) are drawn from the run's seed,
``GDN_TEST_SEED`` (tests/conftest.py: fresh when unset, printed in the session
header; also in the test's id and every failure), so its replay line reruns a
failure. No shrinking: each step would be another export.
``GDN_CONFIG_SPACE_EXAMPLES=100`` runs more configs locally; a config that
fails goes into an ``@example`` below. Configs export_qwen35 refuses are
tests/test_config_refusals.py's.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, assume, example, given, note, seed, settings
from hypothesis import strategies as st

from gdn_export.export import export_qwen35
from gdn_export.models.qwen35 import FULL_ATTENTION, LINEAR_ATTENTION
from gdn_export.runner import ProgramRunner
from gdn_export.tiny import MODEL_VOCAB_SIZE, make_tiny_checkpoint
from tests.test_export import hugging_face_model, hugging_face_step_logits, pte_step_logits

CI_EXAMPLES = 3
EXAMPLES = int(os.environ.get("GDN_CONFIG_SPACE_EXAMPLES", CI_EXAMPLES))
SEED = int(os.environ.get("GDN_TEST_SEED") or secrets.randbelow(2**32))
RELATIVE_TOLERANCE = 1e-4
MAX_SEQ_LEN = 64
DECODE_STEPS = 3


@st.composite
def text_configs(draw) -> dict:
    """``make_tiny_checkpoint`` options of a Qwen3.5 text config transformers builds and runs."""
    layer_types = draw(st.lists(st.sampled_from([LINEAR_ATTENTION, FULL_ATTENTION]), min_size=1, max_size=3))
    head_dim = draw(st.integers(1, 40))
    # transformers rotates the first int(head_dim * factor) channels of a head in two halves.
    partial_rotary_factor = draw(
        st.sampled_from([0.25, 0.5, 0.75, 1.0])
        | st.integers(0, head_dim // 2).map(lambda half: 2 * half / head_dim)
    )
    assume(int(head_dim * partial_rotary_factor) % 2 == 0)
    num_key_value_heads = draw(st.integers(1, 3))
    linear_num_key_heads = draw(st.integers(1, 3))
    config = dict(
        layer_types=tuple(layer_types),
        tie_word_embeddings=draw(st.booleans()),
        hidden_size=draw(st.integers(4, 72)),
        num_key_value_heads=num_key_value_heads,
        # transformers repeats each KV head for a whole group of query heads.
        num_attention_heads=num_key_value_heads * draw(st.integers(1, 3)),
        head_dim=head_dim,
        partial_rotary_factor=partial_rotary_factor,
        attention_bias=draw(st.booleans()),
        linear_num_key_heads=linear_num_key_heads,
        # ... and each linear-attention key head for a whole group of value heads.
        linear_num_value_heads=linear_num_key_heads * draw(st.integers(1, 3)),
        linear_key_head_dim=draw(st.integers(1, 40)),
        linear_value_head_dim=draw(st.integers(1, 40)),
        linear_conv_kernel_dim=draw(st.integers(1, 5)),
    )
    if draw(st.booleans()):
        num_experts = draw(st.integers(1, 6))
        config.update(
            moe=True,
            num_experts=num_experts,
            num_experts_per_tok=draw(st.integers(1, num_experts)),
            moe_intermediate_size=draw(st.integers(1, 40)),
            shared_expert_intermediate_size=draw(st.integers(1, 40)),
        )
    else:
        config.update(intermediate_size=draw(st.integers(1, 96)))
    return config


@st.composite
def cases(draw) -> dict:
    """A config, the seeds of its weights and tokens, and the lengths of the calls."""
    return dict(
        config=draw(text_configs()),
        weights_seed=draw(st.integers(0, 2**31 - 1)),
        tokens_seed=draw(st.integers(0, 2**31 - 1)),
        # Below and above 16 tokens: the recurrence kernel's token-by-token and chunked forms.
        prompt_length=draw(st.integers(1, 40)),
        # A sequence run before the compared one, from position 0 again: the program must
        # forget its caches and states (runners start a new sequence without clearing them).
        poison_length=draw(st.integers(1, 8)),
    )


def program_and_reference_logits(case: dict, folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(the .pte's logits, transformers') after the prompt and after each decode step of ``case``."""
    checkpoint = make_tiny_checkpoint(folder / "checkpoint", seed=case["weights_seed"], **case["config"])
    program = folder / "model.pte"
    export_qwen35(checkpoint, program, max_seq_len=MAX_SEQ_LEN)
    tokens = torch.randint(
        0, MODEL_VOCAB_SIZE, (case["poison_length"] + case["prompt_length"] + DECODE_STEPS,),
        generator=torch.Generator().manual_seed(case["tokens_seed"]),
    ).tolist()
    poison, prompt = tokens[:case["poison_length"]], tokens[case["poison_length"]:-DECODE_STEPS]
    continuation = tokens[-DECODE_STEPS:]
    runner = ProgramRunner(program)
    runner.feed(poison)
    actual = pte_step_logits(runner, prompt, continuation)  # restarts at position 0
    reference = hugging_face_model(checkpoint)
    if case["config"].get("moe"):
        # transformers' default experts kernel (torch grouped_mm) needs 16-byte aligned rows on CPU,
        # so it fails for odd sizes; its eager experts compute the same sums for every size.
        reference.set_experts_implementation("eager")
    if FULL_ATTENTION in case["config"]["layer_types"]:
        expected = hugging_face_step_logits(reference, prompt, continuation)
    else:
        # transformers' cache asks the attention layers for the sequence length and fails
        # without one; without the cache, one call over the whole sequence gives every step.
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + continuation]), use_cache=False).logits[0]
        expected = logits[len(prompt) - 1:]
    return actual, expected


def check_case(case: dict) -> None:
    """Asserts that ``case``'s program matches transformers (the property)."""
    with tempfile.TemporaryDirectory(prefix="config-space-") as folder:
        actual, expected = program_and_reference_logits(case, Path(folder))
    error = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert error <= RELATIVE_TOLERANCE, (
        f"GDN_TEST_SEED={SEED}: program logits differ from transformers' by {error:.3g} of their largest "
        f"magnitude (tolerance {RELATIVE_TOLERANCE}) for {case}"
    )


# The smallest model of one full-attention layer and one KV head, which the examples below start from.
ONE_ATTENTION_LAYER = dict(
    layer_types=(FULL_ATTENTION,), tie_word_embeddings=False, hidden_size=16, num_key_value_heads=1,
    num_attention_heads=2, head_dim=8, partial_rotary_factor=0.5, attention_bias=False,
    linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, intermediate_size=16,
)


@pytest.mark.parametrize("run_seed", [SEED], ids=[f"GDN_TEST_SEED={SEED}"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # No shrinking: each step would be another export of 10 to 40 s; a failure's drawn
    # config is reported as it is, and goes into an @example below.
    phases=[Phase.explicit, Phase.generate],
)
@seed(SEED)
@given(case=cases())
# One KV head: Python indexing (`cache[:, :, positions] = key`) dropped the value's size-1 head
# dim, and ExecuTorch's in-place index_put kernel failed the call (error 0x12) on the lower rank.
@example(case=dict(config=ONE_ATTENTION_LAYER, weights_seed=1, tokens_seed=2, prompt_length=5, poison_length=2))
# No rotation (partial_rotary_factor 0, GDN_TEST_SEED=148903906): gdn::gated_attention refused its empty cos and
# sin ([T, 0]) at export.
@example(case=dict(config=dict(ONE_ATTENTION_LAYER, partial_rotary_factor=0.0, attention_bias=True),
                   weights_seed=3, tokens_seed=4, prompt_length=5, poison_length=2))
def test_exported_program_matches_transformers(run_seed, case):
    note(f"GDN_TEST_SEED={run_seed}")  # with the drawn case in every failure, errors of the run included
    check_case(case)
