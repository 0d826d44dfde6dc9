"""export_qwen35 and the runners, end to end, against Hugging Face transformers.

Each test checkpoint is a tiny random-weight Qwen3.5 written by transformers
itself (``gdn_export.tiny``); the ``.pte`` runs in ExecuTorch's runtime with our
C++ kernel, and every figure is compared with transformers on the same folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gdn_export.export import export_qwen35
from gdn_export.runner import ProgramRunner, load_tokenizer
from gdn_export.tiny import make_tiny_checkpoint

VARIANTS = {
    "dense": {},
    "moe": {"moe": True},
    "tied": {"tie_word_embeddings": True},
    "wrapper": {"wrapper": True, "moe": True},
}
PROMPT = "The quick brown fox jumps over"
NEW_TOKENS = 32


def hugging_face_model(checkpoint):
    import transformers

    model_type = json.loads((checkpoint / "config.json").read_text())["model_type"]
    model_class = {
        "qwen3_5_text": transformers.Qwen3_5ForCausalLM,
        "qwen3_5_moe_text": transformers.Qwen3_5MoeForCausalLM,
        "qwen3_5": transformers.Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": transformers.Qwen3_5MoeForConditionalGeneration,
    }[model_type]
    return model_class.from_pretrained(checkpoint, dtype=torch.float32).eval()


def hugging_face_step_logits(model, prompt_ids, continuation):
    """Last-position logits after the prompt and after each token of ``continuation``, with HF's cache."""
    with torch.no_grad():
        output = model(torch.tensor([prompt_ids]), use_cache=True)
        logits = [output.logits[0, -1]]
        cache = output.past_key_values
        for token in continuation:
            output = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = output.past_key_values
            logits.append(output.logits[0, -1])
    return torch.stack(logits)


def hugging_face_greedy(model, prompt_ids, new_tokens):
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False)
    return output[0, len(prompt_ids):].tolist()


def pte_step_logits(runner: ProgramRunner, prompt_ids, continuation):
    runner.reset()
    logits = [runner.feed(prompt_ids).clone()]
    logits += [runner.feed([token]).clone() for token in continuation]
    return torch.stack(logits)


class Exported:
    """Checkpoints and their exports, made once per test session (exports take seconds each)."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def checkpoint(self, variant):
        key = ("checkpoint", variant)
        if key not in self.cache:
            self.cache[key] = make_tiny_checkpoint(self.root / variant, seed=len(self.cache) + 1, **VARIANTS[variant])
        return self.cache[key]

    def program(self, variant, **export_kwargs):
        key = (variant, tuple(sorted(export_kwargs.items())))
        if key not in self.cache:
            name = "-".join([variant] + [f"{k}{v}" for k, v in sorted(export_kwargs.items())])
            output = self.root / f"{name}.pte"
            export_qwen35(self.checkpoint(variant), output, max_seq_len=128, **export_kwargs)
            self.cache[key] = output
        return self.cache[key]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return Exported(tmp_path_factory.mktemp("export"))


def fresh_prompt(length, generator, vocab=400):
    return torch.randint(3, vocab, (length,), generator=generator).tolist()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pte_logits_match_transformers(exported, variant, generator):
    checkpoint = exported.checkpoint(variant)
    runner = ProgramRunner(exported.program(variant))
    hf = hugging_face_model(checkpoint)
    prompt = fresh_prompt(11, generator)
    continuation = fresh_prompt(6, generator)
    expected = hugging_face_step_logits(hf, prompt, continuation)
    actual = pte_step_logits(runner, prompt, continuation)
    assert (actual - expected).abs().max().item() <= 1e-4


def test_portable_backend_matches_transformers(exported, generator):
    runner = ProgramRunner(exported.program("dense", backend="portable"))
    hf = hugging_face_model(exported.checkpoint("dense"))
    prompt, continuation = fresh_prompt(9, generator), fresh_prompt(4, generator)
    expected = hugging_face_step_logits(hf, prompt, continuation)
    assert (pte_step_logits(runner, prompt, continuation) - expected).abs().max().item() <= 1e-4


def test_prefill_in_chunks_equals_one_shot(exported, generator):
    runner = ProgramRunner(exported.program("dense"))
    prompt = fresh_prompt(13, generator)
    runner.reset()
    one_shot = runner.feed(prompt).clone()
    runner.reset()
    for chunk in (prompt[:5], prompt[5:12], prompt[12:]):
        chunked = runner.feed(chunk).clone()
    torch.testing.assert_close(chunked, one_shot, rtol=0, atol=1e-5)
    # A program whose calls take at most 4 tokens: the runner splits the prompt itself.
    small_chunks = ProgramRunner(exported.program("dense", prefill_chunk=4))
    assert small_chunks.max_chunk == 4
    torch.testing.assert_close(small_chunks.feed(prompt), one_shot, rtol=0, atol=1e-5)


def test_program_metadata_comes_from_the_checkpoint(exported):
    checkpoint = exported.checkpoint("dense")
    runner = ProgramRunner(exported.program("dense"))
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    config = json.loads((checkpoint / "config.json").read_text())
    assert runner.max_context == 128 and runner.max_chunk == 128
    assert runner.eos_ids == set(generation["eos_token_id"])
    assert runner.metadata["get_bos_id"] == [generation["bos_token_id"]]
    assert runner.metadata["get_vocab_size"] == [config["vocab_size"]]


def test_gdn_run_greedy_text_equals_transformers_generate(exported, capsys):
    from gdn_export.cli import run_main

    checkpoint = exported.checkpoint("dense")
    tokenizer = load_tokenizer(checkpoint / "tokenizer.json")
    expected_ids = hugging_face_greedy(hugging_face_model(checkpoint), tokenizer.encode(PROMPT).ids, NEW_TOKENS)
    status = run_main(["--model", str(exported.program("dense")), "--tokenizer", str(checkpoint / "tokenizer.json"),
                       "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)])
    captured = capsys.readouterr()
    assert status == 0
    assert captured.out.rstrip("\n") == tokenizer.decode(expected_ids, skip_special_tokens=False)
    assert "prefill:" in captured.err and "tok/s" in captured.err


def test_stock_text_llm_runner_equals_transformers_generate(exported):
    """ExecuTorch's own TextLLMRunner runs our program unchanged (it prints the text itself)."""
    checkpoint = exported.checkpoint("dense")
    tokenizer = load_tokenizer(checkpoint / "tokenizer.json")
    expected_ids = hugging_face_greedy(hugging_face_model(checkpoint), tokenizer.encode(PROMPT).ids, NEW_TOKENS)
    eos_ids = set(json.loads((checkpoint / "generation_config.json").read_text())["eos_token_id"])
    # The stock runner prints tokens up to, not including, the EOS it stops at.
    shown_ids = expected_ids[: next((i for i, t in enumerate(expected_ids) if t in eos_ids), len(expected_ids))]
    script = (
        "import gdn_export\n"
        "from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner\n"
        f"runner = TextLLMRunner({str(exported.program('dense'))!r}, {str(checkpoint / 'tokenizer.json')!r})\n"
        f"runner.generate({PROMPT!r}, GenerationConfig(max_new_tokens={NEW_TOKENS}, temperature=0.0, echo=False))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # The stock runner decodes and prints each token on its own, dropping bytes that are not
    # a whole UTF-8 character by themselves (a random model emits many) and control characters.
    def visible(text):
        return "".join(c for c in text if c != "\ufffd" and (c.isprintable() or c in " \n"))

    expected_text = "".join(visible(tokenizer.decode([token], skip_special_tokens=False)) for token in shown_ids)
    assert len(expected_text) >= 16 and expected_text in visible(result.stdout)


def eager_step_logits(model, prompt_ids, continuation):
    """The same steps through our eager model (what the program was exported from)."""
    with torch.no_grad():
        logits = [model(torch.tensor([prompt_ids]), torch.tensor([0]))[0, -1]]
        position = len(prompt_ids)
        for token in continuation:
            logits.append(model(torch.tensor([[token]]), torch.tensor([position]))[0, -1])
            position += 1
    return torch.stack(logits)


@pytest.mark.parametrize(
    "variant, quantize, backend, lowering_error, max_quantization_error",
    # lowering_error bounds max |program - eager quantized model| relative to the
    # logits' range (XNNPACK's int8 activation rounding differs slightly from
    # torchao's reference; for 8da4w, 0.017 to 0.031 over fresh prompts, so 0.06 leaves
    # the tail room). max_quantization_error bounds the program's distance to
    # unquantized transformers over 16 teacher-forced steps, relative to the spread of
    # transformers' logits; measured on tiny random models: int8wo about 0.03, 8da8w
    # about 0.03, 8da4w about 0.45 (4-bit groups of 32 on 64-wide layers; measured with a 4-bit
    # embedding, which is 8-bit since), where unrelated logits give ~1.4.
    # (Argmax agreement is no measure here: a random model's top logits are near ties.)
    # int8wo runs on XNNPACK's int8-weight kernels, and on portable as a weight widened at each call;
    # 16da8w's linears on gdn::grouped_int8_linear, its table and tied head on gdn::planes_embedding and
    # gdn::planes_logits (5 bits; an untied head as int8wo's). Program against eager model,
    # over fresh prompts: int8wo under 1e-6, 16da8w 5e-5 to 1.1e-4 (12 prompts) and 1.5e-4 (a CI seed); since
    # its table is the two-plane one, the dense 16da8w 6e-5 to 2.6e-4 (18 prompts) and 3.5e-4
    # (GDN_TEST_SEED=648166625), errors spread over every step rather than one flip, so it gets 1e-3;
    # 8da4w_avx2 (gdn::grouped_int4_linear, the reference's int8 rounding) 1.4e-7 to 2.9e-7
    # (3 seeds). Since its linears take each layer's norm and MLP gating (gdn_export.passes.layer_fusion), the
    # program computes those in C++ (another order of the squares' sum, another exp) where this eager model
    # runs torch's ops, so an int8 activation may round one level apart, and a 4-bit random model carries that
    # on: 1.1e-2 for 1 seed of 9 (the others at most 1e-4), so 8da4w_avx2 gets 8da4w's 0.06. The tied 16da8w
    # head reads int8 activations too (gdn::planes_logits), where a near-tie may round one level apart: 2.6e-3 at
    # GDN_TEST_SEED=719727965, a step whose difference is one column of the head's weights times one level (the
    # rest under 1.3e-5), so the tied 16da8w gets 0.01.
    [("dense", "int8wo", "xnnpack", 1e-4, 0.1), ("tied", "int8wo", "xnnpack", 1e-4, 0.1),
     ("tied", "int8wo", "portable", 1e-4, 0.1), ("dense", "8da4w", "xnnpack", 0.06, 0.8),
     ("tied", "8da4w", "xnnpack", 0.06, 0.8), ("tied", "8da4w_avx2", "xnnpack", 0.06, 0.8),
     ("tied", "8da8w", "xnnpack", 0.01, 0.1),
     ("dense", "16da8w", "xnnpack", 1e-3, 0.1), ("tied", "16da8w", "xnnpack", 0.01, 0.1)],
)
def test_quantized_programs_stay_close(exported, variant, quantize, backend, lowering_error, max_quantization_error,
                                       generator):
    from gdn_export import load_qwen35, rewrite
    from gdn_export.passes import keep_recurrent_states_in
    from gdn_export.quantize import quantize_model

    checkpoint = exported.checkpoint(variant)
    options = {} if backend == "xnnpack" else {"backend": backend}  # the default's programs are shared with others
    runner = ProgramRunner(exported.program(variant, quantize=quantize, **options))
    hf = hugging_face_model(checkpoint)
    prompt = fresh_prompt(8, generator)
    continuation = hugging_face_greedy(hf, prompt, 16)[:-1]
    eager = quantize_model(rewrite(load_qwen35(checkpoint, max_seq_len=128), backend="xnnpack"), quantize)
    keep_recurrent_states_in(eager, torch.float16)  # as a quantized CPU program keeps them by default
    expected = eager_step_logits(eager, prompt, continuation)
    actual = pte_step_logits(runner, prompt, continuation)
    logit_range = (expected.max() - expected.min()).item()
    assert (actual - expected).abs().max().item() <= lowering_error * logit_range
    unquantized = hugging_face_step_logits(hf, prompt, continuation)
    spread = (unquantized - unquantized.mean(-1, keepdim=True)).norm()
    assert ((actual - unquantized).norm() / spread).item() <= max_quantization_error


@pytest.mark.parametrize("options, expected", [
    ({"quantize": "8da4w_avx2"}, torch.float16),  # a quantized CPU program's default
    ({"quantize": "8da4w_avx2", "state_dtype": "float32"}, torch.float32),
    ({}, torch.float32),  # fp32's default
    ({"state_dtype": "float16"}, torch.float16),
], ids=["quantized", "quantized-float32", "fp32", "fp32-float16"])
def test_cpu_programs_keep_the_recurrent_state_in_the_chosen_dtype(exported, options, expected, generator, seed,
                                                                    tmp_path):
    """The state a program saves is in ``--state-dtype``'s dtype, and the logits and states are the eager model's
    with its states kept so (through the op's reference, which rounds a float16 state once a call)."""
    from safetensors.torch import load_file

    from gdn_export import load_qwen35, rewrite
    from gdn_export.passes import keep_recurrent_states_in
    from gdn_export.quantize import quantize_model
    from gdn_export.session import Session
    from tests.test_conv_recurrence import half_spacing

    checkpoint = exported.checkpoint("tied")
    session = Session(ProgramRunner(exported.program("tied", **options)))
    prompt, continuation = fresh_prompt(9, generator), fresh_prompt(4, generator)
    actual = [session.feed(prompt).clone()] + [session.feed([token]).clone() for token in continuation]
    session.save(tmp_path / "state")
    saved = load_file(tmp_path / "state")
    eager = rewrite(load_qwen35(checkpoint, max_seq_len=128), backend="xnnpack")
    if "quantize" in options:
        eager = quantize_model(eager, options["quantize"])
    keep_recurrent_states_in(eager, expected)
    expected_logits = eager_step_logits(eager, prompt, continuation)
    # The fp32 programs' arithmetic differs from eager's in last bits only; a quantized one may round an int8
    # activation a level apart (test_quantized_programs_stay_close's bound for 8da4w_avx2).
    bound = 0.06 if "quantize" in options else 1e-4
    logit_range = (expected_logits.max() - expected_logits.min()).item()
    error = (torch.stack(actual) - expected_logits).abs().max().item()
    assert error <= bound * logit_range, f"seed={seed}: {error} of a range of {logit_range}"
    states = {name: module.recurrent_state for name, module in eager.named_modules() if hasattr(module, "conv1d")}
    assert states
    for name, state in states.items():
        program_state = saved[f"{name}.recurrent_state"]
        assert program_state.dtype == expected == state.dtype, name
        # A float16 state may also round a near-tie one float16 step apart (GDN_TEST_SEED=148903906: 7.6e-6 where
        # the values reach 0.055, whose step is 3.1e-5).
        allowed = bound * state.abs().max().item() + (half_spacing(state.float()) if expected == torch.float16 else 0)
        assert ((program_state.float() - state.float()).abs() <= allowed).all(), name


def quantized_bytes(model, quantize):
    """Bytes of the weights of ``model``'s linears and embeddings as ``quantize`` stores them (the math of the
    format: int4 values packed two a byte with a bf16 scale per group in XNNPACK; int8 values with an int8 scale
    per group of 32 and an fp32 multiplier per channel in 16da8w's linears, else with an fp32 scale per row; a
    planes table's 8-bit codes with a byte per group of 32, and 16da8w's fifth plane, a bit a weight), and their
    float32 bytes."""
    from torch import nn

    from gdn_export.ops.grouped_int8_linear import fits
    from gdn_export.quantize import FIVE_BIT_HEAD_MODES, FOUR_BIT_MODES, GROUP_SIZES_4BIT, PLANES_MODES, module_mode

    stored = floats = 0
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        rows, width = module.weight.shape
        floats += 4 * rows * width
        if isinstance(module, nn.Embedding) and quantize in PLANES_MODES:
            stored += rows * width + rows * width // 32 + 2 * rows
            stored += rows * width // 8 if quantize in FIVE_BIT_HEAD_MODES else 0
        elif module_mode(name, quantize) in FOUR_BIT_MODES:
            groups = rows * width // next(size for size in GROUP_SIZES_4BIT if width % size == 0)
            stored += rows * width // 2 + groups * 2
        elif module_mode(name, quantize) == "16da8w" and fits(rows, width):
            stored += rows * width + rows * width // 32 + 4 * rows
        else:
            stored += rows * width + 4 * rows
    return stored, floats


@pytest.mark.parametrize("quantize", ["8da4w", "8da4w_avx2", "8da8w", "int8wo", "16da8w"])
def test_quantized_program_holds_quantized_embedding_and_head(exported, quantize):
    """The program shrinks by what quantizing every linear, the output head and the embedding saves, no less."""
    from gdn_export import load_qwen35

    model = load_qwen35(exported.checkpoint("tied"), max_seq_len=128)
    stored, floats = quantized_bytes(model, quantize)
    # The float program holds the tied table once; so do the quantized ones: their embedding reads XNNPACK's
    # copy of the head's 8-bit bytes.
    table = 4 * model.embed_tokens.weight.numel()
    rows, width = model.embed_tokens.weight.shape
    stored -= rows * width + 4 * rows
    saved = exported.program("tied").stat().st_size - exported.program("tied", quantize=quantize).stat().st_size
    expected_saving = floats - table - stored
    # Alignment padding and per-tensor headers: a few percent of the weights.
    assert saved >= expected_saving - 0.05 * floats


@pytest.mark.parametrize("quantize", ["8da8w", "int8wo"])
def test_tied_8bit_table_is_stored_once(exported, generator, quantize):
    """The tied table (int8 rows, one fp32 scale each) serves the embedding and the head from one copy.

    The table's bytes, computed from the eager quantized model, occur once in the file (twice before the
    embedding read XNNPACK's copy); the lookup runs in our GdnEmbeddingBackend delegate, which refuses a token
    outside the table instead of reading past it.
    """
    from gdn_export import load_qwen35
    from gdn_export.quantize import quantize_model
    from gdn_export.runner import executorch_runtime, program_delegate_ids

    model = quantize_model(load_qwen35(exported.checkpoint("tied"), max_seq_len=128), quantize)
    embedding, head = model.embed_tokens.weight, model.lm_head.weight
    assert embedding.qdata.dtype == torch.int8 and embedding.scale.shape == (embedding.shape[0], 1)
    assert torch.equal(embedding.qdata, head.qdata) and torch.equal(embedding.scale, head.scale)
    path = exported.program("tied", quantize=quantize)
    program = path.read_bytes()
    table, scales = (tensor.contiguous().numpy().tobytes() for tensor in (embedding.qdata, embedding.scale))
    assert (program.count(table), program.count(scales)) == (1, 1)
    assert "GdnEmbeddingBackend" in program_delegate_ids(path)
    # One token past the table.
    forward = executorch_runtime().get().load_program(str(path)).load_method("forward")
    tokens = fresh_prompt(3, generator) + [embedding.shape[0]]
    with pytest.raises(RuntimeError):
        forward.execute([torch.tensor([tokens]), torch.tensor([0])])


@pytest.mark.parametrize("quantize,op", [("8da4w_avx2", "gdn::grouped_int4_linear.out"),
                                         ("16da8w", "gdn::grouped_int8_linear.out")])
def test_grouped_linears_run_on_our_kernels(exported, quantize, op):
    """Each of the rewritten model's grouped linears of ``quantize`` (a layer's merged projections once) is one
    call of our kernel in the program's forward, outside XNNPACK's delegates."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from gdn_export import load_qwen35, rewrite
    from gdn_export.quantize import GroupedInt4Linear, GroupedInt8Linear, quantize_model

    kind = GroupedInt4Linear if quantize == "8da4w_avx2" else GroupedInt8Linear
    model = rewrite(quantize_model(load_qwen35(exported.checkpoint("tied"), max_seq_len=128), quantize), "xnnpack")
    expected = sum(type(module) is kind for module in model.modules())
    assert expected >= 8, f"the tiny model should have {quantize} linears on {op}"
    program = deserialize_pte_binary(exported.program("tied", quantize=quantize).read_bytes())
    program = getattr(program, "program", program)
    (plan,) = [plan for plan in program.execution_plan if plan.name == "forward"]
    names = [f"{operator.name}.{operator.overload}" for operator in plan.operators]
    calls = [names[instruction.instr_args.op_index] for chain in plan.chains for instruction in chain.instructions
             if hasattr(instruction.instr_args, "op_index")]
    assert calls.count(op) == expected, (calls.count(op), expected)


@pytest.mark.parametrize("quantize,op", [("8da4w_avx2", "gdn::grouped_int4_linear.out"),
                                         ("16da8w", "gdn::grouped_int8_linear.out")])
def test_layer_norms_and_residual_adds_run_in_the_grouped_linears(exported, quantize, op):
    """Each decoder layer's input and post-attention RMSNorms go into the grouped linears that read them, its MLP's
    gating into its down projection, and its two residual adds into the linears that end its mixer and its MLP
    (``gdn_export.passes.layer_fusion``): the program's calls of our kernel pass as many norm weights, gatings
    and residuals as the rewritten model asks for. That is each layer's two adds and its gating, each
    post-attention norm, and the input norms of the layers whose input projections are all ours (the tiny
    model's Gated DeltaNet gates, 4 outputs, fit no tile of 16)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from gdn_export import load_qwen35, rewrite
    from gdn_export.passes.layer_fusion import NormTakenByItsConsumer, ResidualInProducts
    from gdn_export.quantize import GroupedLinear, quantize_model

    model = rewrite(quantize_model(load_qwen35(exported.checkpoint("tied"), max_seq_len=128), quantize), "xnnpack")
    layers = len(model.layers)
    assert all(type(layer) is ResidualInProducts for layer in model.layers)
    assert all(type(layer.post_attention_layernorm) is NormTakenByItsConsumer for layer in model.layers)
    assert any(type(layer.input_layernorm) is NormTakenByItsConsumer for layer in model.layers)
    normed = sum(isinstance(module, GroupedLinear) and module.input_norm is not None for module in model.modules())
    assert normed >= layers + 1
    program = deserialize_pte_binary(exported.program("tied", quantize=quantize).read_bytes())
    program = getattr(program, "program", program)
    (plan,) = [plan for plan in program.execution_plan if plan.name == "forward"]
    names = [f"{operator.name}.{operator.overload}" for operator in plan.operators]
    calls = [instruction.instr_args.args for chain in plan.chains for instruction in chain.instructions
             if hasattr(instruction.instr_args, "op_index") and names[instruction.instr_args.op_index] == op]

    def tensors_at(position):
        return sum(type(plan.values[args[position]].val).__name__ == "Tensor" for args in calls)

    # (x, weight, scales, norm_weight, norm_eps, gated, residual, out, returned out)
    assert tensors_at(3) == normed, (tensors_at(3), normed)
    gated = sum(getattr(plan.values[args[5]].val, "bool_val", False) is True for args in calls)
    assert gated == layers, (gated, layers)  # each MLP's down projection
    assert tensors_at(6) == 2 * layers, (tensors_at(6), layers)


@pytest.mark.parametrize("quantize", ["8da4w", "16da8w"])
def test_tied_planes_program_reads_one_table(exported, generator, quantize):
    """The 8da4w and 16da8w programs' tied table is one two-plane table (gdn_export.ops.vocabulary_planes),
    with 16da8w's fifth plane (each code's bit 3) for its 5-bit head: each plane's bytes, computed from the
    eager quantized model, occur once in the file, our two ops read them (no delegate holds a copy of the
    table), and a token outside the table is refused, not read."""
    from gdn_export import load_qwen35
    from gdn_export.ops.vocabulary_planes import reference_planes_embedding
    from gdn_export.quantize import PlanesEmbedding, PlanesHead, quantize_model
    from gdn_export.runner import executorch_runtime, program_delegate_ids

    model = quantize_model(load_qwen35(exported.checkpoint("tied"), max_seq_len=128), quantize)
    assert isinstance(model.embed_tokens, PlanesEmbedding) and isinstance(model.lm_head, PlanesHead)
    vocabulary = model.embed_tokens.vocabulary
    assert model.lm_head.vocabulary is vocabulary
    planes = ("high", "low", "group_units")
    if quantize == "16da8w":
        planes += ("fifth",)
        rows, width = vocabulary.high.shape[0], 2 * vocabulary.high.shape[1]
        units = (vocabulary.row_units.float()[:, None] * vocabulary.group_units.float()).repeat_interleave(32, 1)
        lookup = reference_planes_embedding(torch.arange(rows), vocabulary.high, vocabulary.low,
                                            vocabulary.row_units, vocabulary.group_units)
        codes = torch.round(lookup / torch.where(units > 0, units, 1)).to(torch.int64)
        bits = (vocabulary.fifth[:, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1
        assert torch.equal(bits.reshape(rows, width).to(torch.int64), (codes >> 3) & 1)
    else:
        assert vocabulary.fifth is None
    path = exported.program("tied", quantize=quantize)
    program = path.read_bytes()
    for name in planes:
        assert program.count(getattr(vocabulary, name).numpy().tobytes()) == 1, name
    assert "GdnEmbeddingBackend" not in program_delegate_ids(path)
    rows = vocabulary.high.shape[0]
    forward = executorch_runtime().get().load_program(str(path)).load_method("forward")
    tokens = fresh_prompt(3, generator) + [rows]
    with pytest.raises(RuntimeError):
        forward.execute([torch.tensor([tokens]), torch.tensor([0])])


@pytest.mark.parametrize("quantize", ["none", "8da4w", "8da8w", "int8wo", "16da8w"])
def test_lookup_only_bytes_are_the_table_bytes_no_head_reads(exported, quantize):
    """``lookup_only_bytes`` (what a decode step does not stream of a tied program's file, for gdn-bench's
    memory floors) against the file: the fp32 table occurs twice (the lookup's and XNNPACK's head's), the
    8da4w and 16da8w low plane once and read by the lookup alone, and an 8-bit table once, shared with the
    head."""
    from gdn_export import load_qwen35
    from gdn_export.quantize import lookup_only_bytes, quantize_model

    model = load_qwen35(exported.checkpoint("tied"), max_seq_len=128)
    rows, width = model.embed_tokens.weight.shape
    if quantize == "none":
        program = exported.program("tied").read_bytes()
        table = model.embed_tokens.weight.detach().contiguous().numpy().tobytes()
        assert program.count(table) == 2
        expected = len(table)
    else:
        model = quantize_model(model, quantize)
        program = exported.program("tied", quantize=quantize).read_bytes()
        if quantize in ("8da4w", "16da8w"):
            low = model.embed_tokens.vocabulary.low.numpy().tobytes()
            assert program.count(low) == 1
            expected = len(low)
        else:
            table = model.embed_tokens.weight.qdata
            assert torch.equal(model.lm_head.weight.qdata, table)
            assert program.count(table.contiguous().numpy().tobytes()) == 1
            expected = 0
    assert lookup_only_bytes(quantize, rows, width, tied=True) == expected
    assert lookup_only_bytes(quantize, rows, width, tied=False) == (4 if quantize == "none" else 1) * rows * width
    with pytest.raises(ValueError, match="mode must be one of"):
        lookup_only_bytes("q4", rows, width, tied=True)


def test_freed_heap_memory_goes_back_to_the_system():
    """return_freed_memory (called at each export stage) hands back heap pages that frees left mapped.

    Interleaved small blocks (below glibc's mmap threshold, so they live in the heap) are freed every other
    one: the heap cannot shrink from its top, so the resident size stays up until the trim.
    """
    import platform

    from gdn_export.lowering import _malloc_trim, return_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.fail(f"this check is written for glibc on Linux, not {platform.system()} {platform.libc_ver()}")
    assert _malloc_trim() is not None

    def resident_bytes() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    block = 64 * 1024
    blocks = [torch.empty(block, dtype=torch.uint8).fill_(index % 251) for index in range(8192)]
    kept = blocks[::2]
    del blocks
    before = resident_bytes()
    return_freed_memory()
    after = resident_bytes()
    freed = 4096 * block  # 256 MiB, in 64 KiB holes between the kept blocks
    assert before - after >= 0.5 * freed, f"resident {before / 2**20:.0f} -> {after / 2**20:.0f} MiB"
    assert all(int(tensor[0]) == (2 * index) % 251 for index, tensor in enumerate(kept))


@pytest.mark.parametrize("quantize", ["none", "8da4w"])
def test_weights_delegates_copied_are_freed_and_the_program_is_the_same(tmp_path, seed, monkeypatch, quantize):
    """The export lets the lowering free the model's copy of each weight a delegate has serialized (each XNNPACK
    partition's as it is preprocessed, the rest before to_executorch): the program's bytes are the same as
    without it, and what is freed is at least the weights of the linears XNNPACK took."""
    import contextlib

    import gdn_export.export as export
    import gdn_export.lowering as lowering
    from gdn_export import export_qwen35, load_qwen35

    folder = make_tiny_checkpoint(tmp_path / "tied", seed=seed, tie_word_embeddings=True)
    freed = []
    free = lowering.free_storages
    monkeypatch.setattr(lowering, "free_storages", lambda storages: freed.append(free(storages)) or freed[-1])
    export_qwen35(folder, tmp_path / "freed.pte", quantize=quantize)
    monkeypatch.setattr(export, "weights_freed_when_serialized", contextlib.nullcontext)
    count = len(freed)
    export_qwen35(folder, tmp_path / "kept.pte", quantize=quantize)
    assert len(freed) == count  # nothing freed where the export does not allow it
    assert (tmp_path / "freed.pte").read_bytes() == (tmp_path / "kept.pte").read_bytes(), f"seed {seed}"
    model = load_qwen35(folder, max_seq_len=16)
    linears = sum(m.weight.numel() for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"))
    # fp32 weights 4 bytes each; 8da4w's 4-bit values one byte each until XNNPACK packs them.
    assert sum(freed) >= linears * (4 if quantize == "none" else 1) * 0.9, f"seed {seed}: freed {freed}"
