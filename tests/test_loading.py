"""load_qwen35: checkpoint layouts, dtypes, clear errors; and the tiny checkpoints themselves."""

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from gdn_export.loading import CheckpointError, load_qwen35
from gdn_export.passes import rewrite
from gdn_export.tiny import MODEL_VOCAB_SIZE, SPECIAL_TOKENS, make_tiny_checkpoint, tiny_config, tiny_hf_model


def copy_checkpoint(source, destination):
    shutil.copytree(source, destination)
    return destination


def assert_same_parameters(actual, expected, seed):
    actual_parameters = dict(actual.named_parameters())
    expected_parameters = dict(expected.named_parameters())
    assert actual_parameters.keys() == expected_parameters.keys()
    for name, parameter in expected_parameters.items():
        assert torch.equal(actual_parameters[name], parameter), f"seed={seed}: {name} differs"


def random_tokens(length, seed):
    return torch.randint(0, MODEL_VOCAB_SIZE, (1, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- layouts


def test_sharded_checkpoint_loads_the_same_weights(dense_checkpoint, tmp_path, module_seed):
    # The same weights as dense_checkpoint (built from the module's seed), saved in shards.
    sharded = tmp_path / "sharded"
    tiny_hf_model(tiny_config(), module_seed).save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert_same_parameters(load_qwen35(sharded), load_qwen35(dense_checkpoint), module_seed)


def test_stacked_expert_tensors_load_like_per_expert_ones(moe_checkpoint, tmp_path, seed):
    # save_pretrained writes experts.N.{gate,up,down}_proj.weight; checkpoints may
    # also store transformers' stacked form: experts.gate_up_proj / experts.down_proj.
    stacked = copy_checkpoint(moe_checkpoint, tmp_path / "stacked")
    tensors = load_file(stacked / "model.safetensors")
    config = json.loads((stacked / "config.json").read_text())["text_config"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.language_model.layers.{layer}.mlp.experts"
        experts = range(config["num_experts"])
        gate_up = [
            torch.cat([tensors.pop(f"{prefix}.{e}.gate_proj.weight"), tensors.pop(f"{prefix}.{e}.up_proj.weight")])
            for e in experts
        ]
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{prefix}.down_proj"] = torch.stack([tensors.pop(f"{prefix}.{e}.down_proj.weight") for e in experts])
    save_file(tensors, stacked / "model.safetensors", metadata={"format": "pt"})
    assert_same_parameters(load_qwen35(stacked), load_qwen35(moe_checkpoint), seed)


def test_vision_and_mtp_weights_are_skipped_with_a_note(moe_checkpoint, tmp_path, caplog):
    # Released checkpoints also carry a multi-token-prediction head under mtp.
    folder = copy_checkpoint(moe_checkpoint, tmp_path / "with_mtp")
    rewrite_weights(folder, lambda t: t.update({"mtp.fc.weight": torch.randn(64, 128)}))
    with caplog.at_level(logging.INFO, logger="gdn_export.loading"):
        model = load_qwen35(folder)
    assert "vision tower" in caplog.text and "multi-token prediction" in caplog.text
    assert not any("visual" in name or "mtp" in name for name, _ in model.named_parameters())
    assert_same_parameters(model, load_qwen35(moe_checkpoint), seed=None)


@torch.no_grad()
@pytest.mark.parametrize("backend", [None, "portable"])
def test_bfloat16_weights_with_float32_state(dense_checkpoint, seed, backend):
    reference = load_qwen35(dense_checkpoint, max_seq_len=16)
    model = load_qwen35(dense_checkpoint, dtype=torch.bfloat16, max_seq_len=16)
    if backend is not None:
        rewrite(model, backend=backend)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for name, buffer in model.named_buffers():
        expected_dtype = torch.float32 if name.endswith("recurrent_state") else torch.bfloat16
        assert buffer.dtype == expected_dtype, name
    tokens = random_tokens(11, seed)
    expected = reference(tokens, torch.tensor([0]))
    actual = model(tokens, torch.tensor([0]))
    assert actual.dtype == torch.bfloat16
    # bf16 rounding of weights and activations through 3 layers, as a norm-wise relative
    # error: at most 0.033 over 60 seeds. The largest single logit's error scatters
    # more (up to 0.06, and 0.101 for seed 1601885338, whose norm-wise error is 0.043).
    error = ((actual.float() - expected).norm() / expected.norm()).item()
    assert error < 0.1, f"seed={seed}: relative error {error}"


def test_loaded_model_is_an_inference_model(dense_checkpoint):
    model = load_qwen35(dense_checkpoint, max_seq_len=8)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.max_seq_len == 8 and model.config.vocab_size == MODEL_VOCAB_SIZE


# ---------------------------------------------------------------- errors


def rewrite_weights(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def rewrite_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_qwen35(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="missing config.json"):
        load_qwen35(tmp_path)


def test_config_that_is_not_json(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: cannot read it as JSON"):
        load_qwen35(folder)


def test_unsupported_model_type_and_architecture(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    rewrite_config(folder, lambda c: c.update(model_type="llama", architectures=None))
    with pytest.raises(CheckpointError, match=r"config\.json.*unsupported model_type 'llama'"):
        load_qwen35(folder)
    rewrite_config(folder, lambda c: c.update(model_type="qwen3_5_text", architectures=["LlamaForCausalLM"]))
    with pytest.raises(CheckpointError, match=r"config\.json: unsupported architecture 'LlamaForCausalLM'"):
        load_qwen35(folder)


def test_missing_weights(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_qwen35(folder)


def test_index_naming_a_missing_shard(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors: missing weight file.*model\.norm"):
        load_qwen35(folder)


def test_missing_tensor(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'layers\.1\.linear_attn\.A_log'"):
        load_qwen35(folder)


def test_missing_expert(moe_checkpoint, tmp_path):
    folder = copy_checkpoint(moe_checkpoint, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.pop("model.language_model.layers.2.mlp.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.2\.mlp\.experts\.3\.up_proj\.weight"):
        load_qwen35(folder)


def test_shape_mismatch(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.linear_attn.in_proj_z.weight": torch.randn(8, 64)}))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor 'model\.layers\.0\.linear_attn\.in_proj_z\.weight' has shape \[8, 64\], "
        r"expected \[96, 64\]",
    ):
        load_qwen35(folder)


def test_unexpected_tensor(dense_checkpoint, tmp_path):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.linear_attn.extra.weight": torch.randn(4)}))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.0\.linear_attn\.extra\.weight' is not a"):
        load_qwen35(folder)


@pytest.mark.parametrize("damage", ["truncated", "garbage_header"])
def test_corrupt_safetensors_file(dense_checkpoint, tmp_path, damage):
    folder = copy_checkpoint(dense_checkpoint, tmp_path / "c")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x10\x00" + data[2:])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt or unreadable safetensors file"):
        load_qwen35(folder)


def test_bad_arguments(dense_checkpoint):
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        load_qwen35(dense_checkpoint, dtype=torch.int8)
    with pytest.raises(ValueError, match="max_seq_len must be a positive int"):
        load_qwen35(dense_checkpoint, max_seq_len=0)


# ---------------------------------------------------------------- tiny checkpoints


def test_tiny_checkpoint_is_deterministic(tmp_path, seed):
    first = make_tiny_checkpoint(tmp_path / "a", seed=seed)
    second = make_tiny_checkpoint(tmp_path / "b", seed=seed)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), f"seed={seed}: {name} differs"


def test_tiny_tokenizer_round_trips_text(dense_checkpoint):
    tokenizer = Tokenizer.from_file(str(dense_checkpoint / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == MODEL_VOCAB_SIZE
    special_ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    assert None not in special_ids
    text = "Hello world! The café sells 3.14 cups of tea,\n  then the quick fox rests."
    encoding = tokenizer.encode(text)
    assert len(encoding.ids) < len(text.encode())  # merges were learned
    assert tokenizer.decode(encoding.ids) == text
    config = json.loads((dense_checkpoint / "config.json").read_text())
    generation = json.loads((dense_checkpoint / "generation_config.json").read_text())
    assert config["vocab_size"] == MODEL_VOCAB_SIZE
    assert set(generation["eos_token_id"]) <= set(special_ids)


def test_tiny_tokenizer_loads_in_executorch_tokenizer(dense_checkpoint):
    # ExecuTorch's TextLLMRunner reads tokenizer.json with this C++ tokenizer.
    from pytorch_tokenizers import CppHFTokenizer

    reference = Tokenizer.from_file(str(dense_checkpoint / "tokenizer.json"))
    tokenizer = CppHFTokenizer()
    tokenizer.load(str(dense_checkpoint / "tokenizer.json"))
    text = "Once upon a time, 42 engineers measured 2048 tokens per second!"
    assert tokenizer.encode(text, 0, 0) == reference.encode(text).ids
    assert tokenizer.vocab_size() == reference.get_vocab_size()


def test_layers_are_transformed_as_they_are_read(tmp_path, seed):
    """With a transform (the export's quantizer), no two layers' float weights are ever held at once."""
    from torch import nn

    from gdn_export.checkpoint import read_checkpoint
    from gdn_export.loading import load_model
    from gdn_export.ops.vocabulary_planes import head_weights, reference_planes_embedding
    from gdn_export.quantize import EIGHT_BIT_MODULES, PlanesEmbedding, PlanesHead, Quantizer

    checkpoint = make_tiny_checkpoint(tmp_path / "tied", seed=seed, tie_word_embeddings=True)
    seen = []
    quantizer = Quantizer("8da4w")

    def transform(name, module):
        # Every weight layer already handed over must have been quantized: none is float any more.
        still_float = [m for m in seen if type(m.weight) is nn.Parameter and type(m.weight.data) is torch.Tensor]
        assert not still_float, f"{len(still_float)} earlier layers still hold float weights"
        quantized = quantizer(name, module)
        if isinstance(quantized, (nn.Linear, nn.Embedding)):
            seen.append(quantized)
        return quantized

    model = load_model(read_checkpoint(checkpoint), dtype=torch.float32, max_seq_len=16, transform=transform)
    reference = dict(load_qwen35(checkpoint, max_seq_len=16).named_modules())
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    assert len(seen) == len(layers)
    assert {id(m) for m in seen} == {id(m) for m in layers.values()}
    # The tied table became one two-plane table that the head reads too.
    assert isinstance(model.embed_tokens, PlanesEmbedding) and isinstance(model.lm_head, PlanesHead)
    vocabulary = model.embed_tokens.vocabulary
    assert model.lm_head.vocabulary is vocabulary
    table = reference["embed_tokens"].weight
    planes = (vocabulary.high, vocabulary.low, vocabulary.row_units, vocabulary.group_units)
    lookup = reference_planes_embedding(torch.arange(table.shape[0]), *planes)
    # 8 bits a weight, a unit per group of 32 no larger than the group's max / 127.5 plus the row's grid step.
    group_max = table.abs().reshape(table.shape[0], -1, 32).amax(-1)
    unit = (group_max / 127.5 + group_max.amax(-1, keepdim=True) / 127.5 / 255 * 1.01).repeat_interleave(32, dim=1)
    assert ((lookup - table).abs() <= unit / 2 * 1.001 + 1e-7).all(), f"seed {seed}"
    # The head's 4-bit weights: the middle of 16 codes, so within 8 units (and the rounding's half) of the weight.
    assert ((head_weights(vocabulary.high, vocabulary.row_units, vocabulary.group_units) - table).abs()
            <= 8.5 * unit * 1.001 + 1e-7).all(), f"seed {seed}"
    fitted = plain = 0.0
    for name, quantized in layers.items():
        expected = reference[name].weight
        error = quantized.weight.dequantize() - expected
        if name.rpartition(".")[2] in EIGHT_BIT_MODULES:
            # 8 bits, one scale a row: within half a step (row max / 127) of the float weight.
            half_step = expected.abs().amax(dim=1, keepdim=True) / 254
            assert (error.abs() <= half_step * 1.001 + 1e-7).all(), name
            continue
        # 4 bits in groups of 32 with least-squares scales, against the group's max-abs scale (max / 7.5,
        # values clamped to -8..7), computed here: the fit starts from that scale among others and never
        # moves to a worse one, so no layer is worse, and the model as a whole clearly better.
        groups = expected.reshape(-1, 32)
        scale = groups.abs().amax(dim=1, keepdim=True) / 7.5
        rounded = (torch.clamp(torch.round(groups / scale), -8, 7) * scale).reshape(expected.shape)
        layer_fitted, layer_plain = error.square().sum().item(), (rounded - expected).square().sum().item()
        assert layer_fitted <= 1.0001 * layer_plain, f"seed {seed}: {name}"
        fitted, plain = fitted + layer_fitted, plain + layer_plain
    assert fitted < 0.9 * plain, f"seed {seed}: {fitted / plain:.3f} of max-abs rounding's squared error"


def test_reading_a_checkpoint_keeps_only_the_current_tensor_resident(tmp_path, seed):
    """The file's pages leave the resident set once each tensor is read, so loading a checkpoint larger than
    memory (the 4B shape's 8 GB on a laptop) never holds the whole file: here 256 MB of tensors, read one
    at a time, while the resident file-backed memory stays under a quarter of that."""
    from gdn_export.loading import _read_tensors

    def resident_file_mib() -> int:
        line = next(line for line in open("/proc/self/status") if line.startswith("RssFile:"))
        return int(line.split()[1]) // 1024

    generator = torch.Generator().manual_seed(seed)
    tensors = {f"model.layers.{index}.mlp.up_proj.weight": torch.randn(1024, 1024, generator=generator)
               for index in range(64)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    baseline = resident_file_mib()
    peak = 0
    for name, tensor, origin in _read_tensors({name: path for name in tensors}, torch.float32):
        assert torch.equal(tensor, tensors[f"model.{name}"]), origin
        peak = max(peak, resident_file_mib() - baseline)
        del tensor
    assert peak < 64, f"up to {peak} MiB of the 256 MiB file stayed resident"


def rounding_error(groups: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Each group's squared error after symmetric int4 rounding with its scale (``groups`` [..., group])."""
    return ((groups - torch.round(groups / scale[..., None]).clamp(-8, 7) * scale[..., None]) ** 2).sum(-1)


@pytest.mark.parametrize("signed", [False, True])
def test_int4_scales_are_near_the_best_scale_of_a_dense_search(signed, seed):
    """The fitted scales against a brute-force search over 4000 scales between max / 10 and max / 5 (and as
    many between -max / 5 and -max / 10 if ``signed``): the squared error summed over the groups within 0.5%
    of the searched optimum's (at most 0.21% over 200 seeds; single groups may stop at a local optimum, up to
    1.3x), and no group worse than max / 7.5 rounding. Signed, no group worse than its positive scale's, and
    the sum at least 5% under it (Gaussian groups: about 11%)."""
    from gdn_export.quantize import fit_int4_scales

    generator = torch.Generator().manual_seed(seed)
    # Gaussian rows, some groups with an outlier, one group all zero.
    weight = torch.randn(48, 96, generator=generator) * 0.02
    weight[::7, 5] *= 6
    weight[3, 32:64] = 0
    scales = fit_int4_scales(weight, 32, signed)
    assert scales.shape == (48, 3) and (scales != 0).all() and (signed or (scales > 0).all()), f"seed {seed}"
    groups = weight.reshape(48, 3, 32)

    largest = groups.abs().amax(-1).clamp_min(1e-30)
    divisors = torch.linspace(5.0, 10.0, 4000)
    divisors = torch.cat([divisors, -divisors]) if signed else divisors
    searched = torch.stack([rounding_error(groups, largest / divisor) for divisor in divisors])
    best = searched.min(dim=0).values
    ours = rounding_error(groups, scales)
    assert ours.sum() <= 1.005 * best.sum(), f"seed {seed}: {ours.sum() / best.sum():.4f}x the searched optimum"
    plain = rounding_error(groups, largest / 7.5)
    assert (ours <= plain * (1 + 1e-5) + 1e-12).all(), f"seed {seed}: a group worse than max / 7.5 rounding"
    assert ours[3, 1] == 0  # the zero group is exact
    if signed:
        positive = rounding_error(groups, fit_int4_scales(weight, 32))
        assert (ours <= positive * (1 + 1e-5) + 1e-12).all(), f"seed {seed}: a group worse than its positive scale's"
        assert ours.sum() <= 0.95 * positive.sum(), f"seed {seed}: {ours.sum() / positive.sum():.4f}x positive's"


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("kernel", ["reference", "runtime_ops"])
def test_int4_scales_of_a_matrix_are_those_of_each_row_alone(kernel, signed, seed, monkeypatch):
    """The reference works on blocks of rows, the C++ kernel on a vector's width of groups side by side (16, 8
    or 4: 74 groups here leave a last batch of 10, 2 or 2); a group's scale must not depend on the rows or
    groups beside it."""
    import gdn_export.ops.int4_scales as int4_scales
    from gdn_export.quantize import INT4_SCALE_DIVISORS, INT4_SIGNED_SCALE_DIVISORS

    fit = int4_scales.reference_fit_int4_scales if kernel == "reference" else torch.ops.gdn.fit_int4_scales
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(37, 64, generator=generator) * 0.02
    weight[::5, 7] *= 8
    monkeypatch.setattr(int4_scales, "FIT_BLOCK_ELEMENTS", 5 * 64)  # the reference's blocks: 5 rows, the last 2
    divisors = list(INT4_SIGNED_SCALE_DIVISORS if signed else INT4_SCALE_DIVISORS)
    scales = fit(weight, 32, divisors)
    alone = torch.cat([fit(weight[row:row + 1], 32, divisors) for row in range(37)])
    assert torch.equal(scales, alone), f"seed {seed}: rows {sorted(set((scales != alone).nonzero()[:, 0].tolist()))}"


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_scales_kernel_is_the_reference(group, signed, seed):
    """runtime_ops' C++ fit against the op's PyTorch reference. The kernel sums each group in order, the
    reference in torch's vectorized order, so a last bit can move a refinement's rounding and the search then
    ends at another local optimum, a little better or worse: no group's squared error above the reference's
    by more than 1% (relative), the summed error the reference's within 1e-4, 98% of the scales within 1e-5.
    (Over 1500 seeds a size and sign: per-group ratios 0.9987 to 1.0021, the worst at groups of 128, sums
    within 1.5e-5, 98.9% of the scales or more.)"""
    from gdn_export.ops.int4_scales import reference_fit_int4_scales
    from gdn_export.quantize import INT4_SCALE_DIVISORS, INT4_SIGNED_SCALE_DIVISORS

    assert torch._C._dispatch_has_kernel_for_dispatch_key("gdn::fit_int4_scales", "CPU"), "C++ kernel not loaded"
    generator = torch.Generator().manual_seed(seed)
    rows, columns = 45, 4 * group  # 180 groups: the kernel's last batch of 16 or 8 lanes holds 4
    weight = torch.randn(rows, columns, generator=generator) * 0.02
    weight[::7, 5] *= 6  # outliers
    weight[3, :group] = 0  # an all-zero group
    weight[4, group:2 * group] = torch.randint(-8, 8, (group,), generator=generator) * 0.01  # an exact rounding
    divisors = list(INT4_SIGNED_SCALE_DIVISORS if signed else INT4_SCALE_DIVISORS)
    expected = reference_fit_int4_scales(weight, group, divisors)
    scales = torch.ops.gdn.fit_int4_scales(weight, group, divisors)
    assert scales.shape == expected.shape, f"seed {seed}"
    # Positive divisors give positive scales; with both signs, both win somewhere.
    assert ((scales < 0).any() and (scales > 0).any()) if signed else (scales > 0).all(), f"seed {seed}"
    groups = weight.reshape(rows, 4, group)

    ours, theirs = rounding_error(groups, scales), rounding_error(groups, expected)
    assert (ours <= theirs * (1 + 1e-2) + 1e-12).all(), \
        f"seed {seed}: worst error ratio {(ours / theirs.clamp_min(1e-30)).max().item():.7f}"
    assert abs(ours.sum() / theirs.sum() - 1) <= 1e-4, f"seed {seed}: summed error {ours.sum() / theirs.sum():.7f}x"
    assert ours[3, 0] == 0 and ours[4, 1] <= 1e-12, f"seed {seed}: the zero and exact groups"
    close = ((scales - expected).abs() <= 1e-5 * expected.abs()).float().mean().item()
    assert close >= 0.98, f"seed {seed}: {close:.3f} of the scales within 1e-5"


@pytest.mark.parametrize("divisors", [[], [8.0, 0.0], [8.0, float("nan")], [-8.0, float("inf")]])
@pytest.mark.parametrize("kernel", ["reference", "runtime_ops"])
def test_int4_scales_refuse_divisors_they_cannot_start_from(kernel, divisors):
    import gdn_export.ops.int4_scales as int4_scales

    fit = int4_scales.reference_fit_int4_scales if kernel == "reference" else torch.ops.gdn.fit_int4_scales
    with pytest.raises((ValueError, RuntimeError), match="divisors must be one or more finite nonzero numbers"):
        fit(torch.randn(4, 64), 32, divisors)


def test_int4_linear_holds_bfloat16_scales_and_one_zero_byte(seed):
    """A 4-bit linear holds its scales as the bfloat16 values XNNPACK stores and its zero points as one byte
    (a quarter of the float scales' bytes, none of the zero points'); its codes are those of the float scales,
    and it computes each weight as code times the bfloat16 scale."""
    from gdn_export.quantize import fit_int4_scales, quantize_module

    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(32, 96, generator=generator) * 0.02
    linear = torch.nn.Linear(96, 32, bias=False)
    with torch.no_grad():
        linear.weight.copy_(dense)
    weight = quantize_module(linear, "8da4w", "layers.0.mlp.up_proj").weight
    fitted = fit_int4_scales(dense, 32)
    assert weight.scale.dtype == torch.bfloat16 and torch.equal(weight.scale.reshape(32, 3), fitted.to(torch.bfloat16))
    assert weight.zero_point.untyped_storage().nbytes() == 1 and (weight.zero_point == 0).all()
    codes = torch.round(dense.reshape(32, 3, 32) / fitted[..., None]).clamp(-8, 7)
    assert torch.equal(weight.qdata.reshape(32, 3, 32).float(), codes), f"seed {seed}"
    expected = (codes * fitted.to(torch.bfloat16).float()[..., None]).reshape(32, 96)
    assert torch.equal(weight.dequantize(), expected), f"seed {seed}"


def test_avx2_linear_rounds_its_weights_with_signed_scales(seed):
    """An 8da4w_avx2 linear's weights are its codes times fit_int4_scales(signed=True)'s scales, of both signs,
    in the op's int8 form (an integer a group times a multiplier a channel), and round the float weight closer
    than 8da4w's positive scales do (11% less squared error on Gaussian weights; at least 5% asserted)."""
    from gdn_export.ops.grouped_int4_linear import float_weight, small_scales
    from gdn_export.quantize import GroupedInt4Linear, fit_int4_scales, quantize_module

    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(64, 256, generator=generator) * 0.02

    def linear():
        layer = torch.nn.Linear(256, 64, bias=False)
        with torch.no_grad():
            layer.weight.copy_(dense)
        return layer

    ours = quantize_module(linear(), "8da4w_avx2", "layers.0.mlp.up_proj")
    assert isinstance(ours, GroupedInt4Linear)
    integers, multipliers = small_scales(fit_int4_scales(dense, 32, signed=True))
    fitted = integers.float() * multipliers[:, None]
    assert (fitted < 0).any() and (fitted > 0).any(), f"seed {seed}"
    codes = torch.round(dense.reshape(64, 8, 32) / fitted[..., None]).clamp(-8, 7)
    ours_weight = float_weight(ours.weight, ours.scales)
    assert torch.equal(ours_weight, (codes * fitted[..., None]).reshape(64, 256)), f"seed {seed}"
    positive = quantize_module(linear(), "8da4w", "layers.0.mlp.up_proj").weight.dequantize()
    ours_error, positive_error = ((ours_weight - dense) ** 2).sum(), ((positive - dense) ** 2).sum()
    assert ours_error <= 0.95 * positive_error, f"seed {seed}: {ours_error / positive_error:.4f}x 8da4w's error"


@pytest.mark.parametrize("kind", ["embedding", "linear"])
def test_int8_rows_in_blocks_are_torchaos_quantization(kind, seed, monkeypatch):
    """int8_rows quantizes blocks of rows; against torchao's own config applied to the whole weight."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    import gdn_export.quantize as quantize

    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(45, 24, generator=generator) * 0.05
    weight[::4, 3] *= 10  # rows of very different ranges
    if kind == "embedding":
        module, activations = torch.nn.Embedding(45, 24), None
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    else:
        module, activations = torch.nn.Linear(24, 45, bias=False), "int8_asym_per_token"
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    with torch.no_grad():
        module.weight.copy_(weight)
        quantize_(module, config, filter_fn=lambda candidate, _name: candidate is module)
    expected = module.weight
    monkeypatch.setattr(quantize, "INT8_ROWS_BLOCK_ELEMENTS", 7 * 24)  # blocks of 7 rows, the last of 3
    actual = quantize.int8_rows(weight, activations)
    assert type(actual) is type(expected), type(actual)
    for name in ("qdata", "scale", "zero_point"):
        assert torch.equal(getattr(actual, name), getattr(expected, name)), f"seed {seed}: {kind} {name} differs"
    for name in ("target_dtype", "block_size", "dtype", "activation_quantization"):
        assert getattr(actual, name) == getattr(expected, name), f"{kind} {name}"


def test_tied_vocabulary_is_held_once_and_exports_the_same_program(tmp_path, seed, monkeypatch):
    """A tied 8da8w model's head rebuilt on the table's int8 tensors: the same logits, the same .pte bytes.
    (8da4w's tied table is one two-plane table from the start: tests/test_vocabulary_planes.py.)"""
    import gdn_export.export as export
    from gdn_export import export_qwen35
    from gdn_export.checkpoint import read_checkpoint
    from gdn_export.loading import load_model
    from gdn_export.quantize import quantize_module, share_tied_vocabulary

    folder = make_tiny_checkpoint(tmp_path / "tied", seed=seed, tie_word_embeddings=True)
    model = load_model(read_checkpoint(folder), dtype=torch.float32, max_seq_len=64,
                       transform=lambda name, module: quantize_module(module, "8da8w", name))
    table, head = model.embed_tokens.weight, model.lm_head.weight
    assert head.qdata.data_ptr() != table.qdata.data_ptr()
    tokens = random_tokens(9, seed)
    model.all_logits = True
    before = model(tokens, torch.tensor([0]))
    model.reset()
    assert share_tied_vocabulary(model)
    shared = model.lm_head.weight
    for part in ("qdata", "scale", "zero_point"):
        assert getattr(shared, part).data_ptr() == getattr(table, part).data_ptr(), part
    assert shared.activation_quantization == head.activation_quantization
    assert torch.equal(model(tokens, torch.tensor([0])), before), f"seed {seed}"

    export_qwen35(folder, tmp_path / "shared.pte", quantize="8da8w")
    monkeypatch.setattr(export, "share_tied_vocabulary", lambda model: False)
    export_qwen35(folder, tmp_path / "apart.pte", quantize="8da8w")
    assert (tmp_path / "shared.pte").read_bytes() == (tmp_path / "apart.pte").read_bytes(), f"seed {seed}"
