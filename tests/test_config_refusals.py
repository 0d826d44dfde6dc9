"""The edge of the config space: what export_qwen35 refuses, in one line naming the field, before writing.

Hypothesis takes a tiny checkpoint's config.json and changes one field to a
value transformers' config class takes but no Qwen3.5 model can run (a size
of zero, head counts that do not group, more experts a token than there are)
or that transformers runs and our model does not implement (another
activation, a scaled rotary embedding). ``export_qwen35`` must raise a
one-line ``CheckpointError`` that names the changed field, and the output
folder must stay empty. For the first kind, transformers itself must fail to
build or run the model from the same config, so a refusal is never stricter
than transformers. No export happens (each refusal comes before loading): the
test takes a few seconds.
"""

from __future__ import annotations

import json
import shutil
from typing import Optional

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from gdn_export.checkpoint import CheckpointError
from gdn_export.export import export_qwen35
from gdn_export.tiny import make_tiny_checkpoint
from tests.test_config_space import SEED

# Fields whose value must be a positive integer, in both models and in the MoE model only.
POSITIVE = ("hidden_size", "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_key_head_dim",
            "linear_conv_kernel_dim", "vocab_size")
POSITIVE_MOE = ("num_experts", "moe_intermediate_size")
EXAMPLES = 40


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, module_seed):
    """{"dense": folder, "moe": folder}: text-only tiny checkpoints whose config.json the tests rewrite
    (in copies); conftest's MoE checkpoint nests its config under the wrapper's text_config."""
    root = tmp_path_factory.mktemp("refusals")
    return {kind: make_tiny_checkpoint(root / kind, moe=kind == "moe", seed=module_seed) for kind in ("dense", "moe")}


@st.composite
def changes(draw) -> tuple[str, str, dict, Optional[bool]]:
    """(checkpoint kind, the field to be named, {field: new value}, whether transformers' model runs it).

    The last is None where it is not the point (a negative size: transformers may or may not check it).
    """
    kind = draw(st.sampled_from(["dense", "moe"]))
    choice = draw(st.sampled_from(
        ["positive", "gqa", "linear_groups", "mlp_width", "hidden_act", "rope_type", "rotary_factor"]
        + (["positive_moe", "top_k"] if kind == "moe" else [])
    ))
    if choice in ("positive", "positive_moe"):
        field = draw(st.sampled_from(POSITIVE if choice == "positive" else POSITIVE_MOE))
        return kind, field, {field: draw(st.integers(-3, 0))}, None
    if choice == "gqa":  # the tiny config has 2 KV heads
        heads = draw(st.integers(1, 9).filter(lambda n: n % 2))
        return kind, "num_attention_heads", {"num_attention_heads": heads}, False
    if choice == "linear_groups":  # ... and 2 linear-attention key heads
        heads = draw(st.integers(1, 9).filter(lambda n: n % 2))
        return kind, "linear_num_value_heads", {"linear_num_value_heads": heads}, False
    if choice == "top_k":  # ... and 4 experts
        return kind, "num_experts_per_tok", {"num_experts_per_tok": draw(st.integers(5, 8))}, False
    if choice == "mlp_width":  # transformers runs a zero-width MLP; the exported program computes it wrong
        field = "shared_expert_intermediate_size" if kind == "moe" else "intermediate_size"
        return kind, field, {field: 0}, True
    if choice == "hidden_act":  # transformers runs these; our model implements SiLU only
        return kind, "hidden_act", {"hidden_act": draw(st.sampled_from(["gelu", "relu", "gelu_pytorch_tanh"]))}, True
    if choice == "rope_type":  # ... and unscaled rotary embeddings only
        rope_type = draw(st.sampled_from(["linear", "dynamic"]))
        return kind, "rope_type", {"rope_parameters": {"rope_type": rope_type, "factor": 2.0}}, True
    factor = draw(st.floats(1.01, 4.0) | st.floats(-4.0, -0.01))
    return kind, "partial_rotary_factor", {"rope_parameters": {"partial_rotary_factor": factor}}, None


def changed_config(config: dict, change: dict) -> dict:
    config = dict(config)
    for name, value in change.items():
        config[name] = {**config[name], **value} if name == "rope_parameters" else value
    return config


def transformers_runs(config: dict) -> bool:
    """Whether transformers builds the model of ``config`` and runs it on a few tokens."""
    import transformers

    config_class = {"qwen3_5_text": transformers.Qwen3_5TextConfig,
                    "qwen3_5_moe_text": transformers.Qwen3_5MoeTextConfig}[config["model_type"]]
    model_class = {"qwen3_5_text": transformers.Qwen3_5ForCausalLM,
                   "qwen3_5_moe_text": transformers.Qwen3_5MoeForCausalLM}[config["model_type"]]
    try:
        model = model_class(config_class(**{k: v for k, v in config.items() if k != "architectures"})).eval()
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    except Exception:  # whatever transformers raises: it does not run this config
        return False
    return True


@pytest.mark.parametrize("run_seed", [SEED], ids=[f"GDN_TEST_SEED={SEED}"])
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@seed(SEED)
@given(drawn=changes())
def test_a_config_the_model_cannot_run_is_refused_naming_the_field(run_seed, drawn, checkpoints, tmp_path_factory):
    kind, field, change, transformers_should_run = drawn
    config = changed_config(json.loads((checkpoints[kind] / "config.json").read_text()), change)
    folder = tmp_path_factory.mktemp("changed")
    checkpoint = shutil.copytree(checkpoints[kind], folder / "checkpoint")
    (checkpoint / "config.json").write_text(json.dumps(config))
    output = folder / "out"
    output.mkdir()
    with pytest.raises(CheckpointError) as refused:
        export_qwen35(checkpoint, output / "model.pte", max_seq_len=16)
    message = str(refused.value)
    assert "\n" not in message and field in message, (run_seed, change, message)
    assert list(output.iterdir()) == []
    if transformers_should_run is not None:
        assert transformers_runs(config) == transformers_should_run, (run_seed, change)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("field", ["head_dim", "linear_conv_kernel_dim", "rms_norm_eps", "attention_bias",
                                   "tie_word_embeddings", "partial_rotary_factor", "rope_theta"])
def test_an_absent_field_takes_transformers_default(checkpoints, kind, field):
    import transformers

    from gdn_export.models.qwen35 import Qwen35Config

    config = json.loads((checkpoints[kind] / "config.json").read_text())
    config.pop(field, None)
    if field in ("partial_rotary_factor", "rope_theta"):
        config["rope_parameters"] = {k: v for k, v in config["rope_parameters"].items() if k != field}
    config_class = {"dense": transformers.Qwen3_5TextConfig, "moe": transformers.Qwen3_5MoeTextConfig}[kind]
    theirs = config_class(**{k: v for k, v in config.items() if k != "architectures"})
    expected = theirs.rope_parameters[field] if field in ("partial_rotary_factor", "rope_theta") else getattr(theirs, field)
    assert getattr(Qwen35Config.from_hf(config), field) == expected
