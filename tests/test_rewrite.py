"""rewrite(model, backend): which recurrence each backend gets, what torch.export sees, and
that the emitted ExecuTorch program updates the recurrent state and KV caches in place.
"""

import pytest
import torch

import cuda_backend  # noqa: F401  (defines torch.ops.gdn_cuda, the CUDA rewrite's ops)
from gdn_export.loading import load_qwen35
from gdn_export.models.qwen35 import MLP, GatedAttention, GatedDeltaNet, MaskedCacheAttention, PerTokenRecurrence
from cuda_backend.attention import CudaCachedAttention
from cuda_backend.linear import DecodeLinear, GatedMLP
from cuda_backend.recurrence import CudaFusedRecurrence
from gdn_export import backends
from gdn_export.passes import CachedAttentionOp, FusedOpRecurrence, GatedAttentionOp, InplaceOpRecurrence, rewrite
from runtime_ops.loader import is_loaded as runtime_ops_available
from gdn_export.tiny import MODEL_VOCAB_SIZE

MAX_SEQ_LEN = 32
OPS = {
    # A Gated DeltaNet layer from its projections on (conv, gates, recurrence), float32 (the CPU backends).
    "portable": torch.ops.gdn.conv_gated_delta_rule.default,
    "xnnpack": torch.ops.gdn.conv_gated_delta_rule.default,
    # A Gated DeltaNet layer from its projection on (conv, gates, the chunked kernels), any T (dynamic here).
    "cuda": torch.ops.gdn_cuda.prefill_gated_delta_net.default,
}


def linear_attention_layers(model):
    return [module for module in model.modules() if isinstance(module, GatedDeltaNet)]


def full_attention_layers(model):
    return [module for module in model.modules() if isinstance(module, GatedAttention)]


def random_tokens(length, generator):
    return torch.randint(0, MODEL_VOCAB_SIZE, (1, length), generator=generator)


def export(model, length, dynamic=False):
    dynamic_shapes = ({1: torch.export.Dim("length", min=1, max=MAX_SEQ_LEN)}, None) if dynamic else None
    example = (torch.randint(0, MODEL_VOCAB_SIZE, (1, length)), torch.tensor([0]))
    return torch.export.export(model, example, dynamic_shapes=dynamic_shapes, strict=False)


def call_targets(program):
    return [node.target for node in program.graph.nodes if node.op == "call_function"]


def assert_runs_like_eager(program, checkpoint, backend, calls, seed):
    """The exported program, from zeroed state, gives the eager model's logits call after call."""
    eager = load_qwen35(checkpoint, max_seq_len=MAX_SEQ_LEN)
    if backend is not None:
        rewrite(eager, backend=backend)
    exported = program.module()
    for buffer in exported.buffers():
        buffer.zero_()
    for tokens, position in calls:
        expected = eager(tokens, torch.tensor([position]))
        actual = exported(tokens, torch.tensor([position]))
        difference = (actual - expected).abs().max().item()
        assert difference <= 1e-5, f"seed={seed} backend={backend} position={position}: max abs diff {difference}"


# ---------------------------------------------------------------- the table


def test_each_backend_gets_its_recurrence(dense_checkpoint):
    expected = {"portable": InplaceOpRecurrence, "xnnpack": InplaceOpRecurrence,
                "cuda": CudaFusedRecurrence, "metal": FusedOpRecurrence}
    for backend, recurrence_class in expected.items():
        model = load_qwen35(dense_checkpoint, max_seq_len=8)
        assert all(isinstance(layer.recurrence, PerTokenRecurrence) for layer in linear_attention_layers(model))
        assert rewrite(model, backend=backend) is model
        layers = linear_attention_layers(model)
        assert len(layers) == 2
        assert all(type(layer.recurrence) is recurrence_class for layer in layers), backend
        # The CPU backends attend through gdn::cached_attention, CUDA through its Triton kernels; Metal keeps
        # the masked form.
        attention_class = {"portable": CachedAttentionOp, "xnnpack": CachedAttentionOp,
                           "cuda": CudaCachedAttention}.get(backend, MaskedCacheAttention)
        assert all(type(layer.attend) is attention_class for layer in full_attention_layers(model)), backend
        # The CPU backends' layers take their work between the projections to gdn::gated_attention, on the
        # attention's kernel.
        cpu = backend in ("portable", "xnnpack")
        assert all((type(layer) is GatedAttentionOp) == cpu for layer in full_attention_layers(model)), backend
        # CUDA's linear layers take one token through its matrix-vector kernel, and its MLPs compute the
        # silu-product inside the down projection's.
        linear_class = DecodeLinear if backend == "cuda" else torch.nn.Linear
        mlp_class = GatedMLP if backend == "cuda" else MLP
        assert all(type(layer.mlp) is mlp_class for layer in model.layers), backend
        linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
        assert linears and all(type(module) is linear_class for module in linears), backend
        # The same weights: CUDA's merged projections hold their layers' weights stacked, the rest under their names.
        reference, rewritten = load_qwen35(dense_checkpoint, max_seq_len=8).state_dict(), model.state_dict()
        merged = set()
        for key, value in rewritten.items():
            if key in reference:
                assert torch.equal(value, reference[key]), key
                continue
            if key.endswith("input_norm.weight"):  # CUDA: a decoder layer's norm, moved into its one consumer
                layer = ".".join(key.split(".")[:2])
                parts = [f"{layer}.post_attention_layernorm.weight" if ".mlp." in key else
                         f"{layer}.input_layernorm.weight"]
            elif key.endswith("mlp.gate_up_proj.weight"):  # CUDA's GatedMLP
                owner = key.removesuffix(".gate_up_proj.weight")
                parts = [f"{owner}.gate_proj.weight", f"{owner}.up_proj.weight"]
            else:
                group, _, leaf = key.rpartition(".projection.")
                owner, _, names = group.rpartition(".")
                parts = [f"{owner}.{name}.{leaf}" for name in names.split("__")]
            assert backend == "cuda", key
            assert torch.equal(value, torch.cat([reference[part] for part in parts])), key
            merged.update(parts)
        assert set(reference) - set(rewritten) == merged
        # 2 GDN layers, 1 attention and 3 MLPs merged; 3 layers' 2 norms moved into their consumers.
        assert len(merged) == (2 * 4 + 3 + 3 * 2 + 3 * 2 if backend == "cuda" else 0)


def test_non_float32_caches_keep_the_masked_attention(dense_checkpoint):
    model = rewrite(load_qwen35(dense_checkpoint, dtype=torch.bfloat16, max_seq_len=8), backend="xnnpack")
    assert all(type(layer.attend) is MaskedCacheAttention for layer in full_attention_layers(model))


def test_unknown_backend_is_rejected_with_the_valid_names(dense_checkpoint):
    model = load_qwen35(dense_checkpoint, max_seq_len=8)
    with pytest.raises(ValueError, match=r"unknown backend 'vulkan'; expected one of xnnpack, portable, cuda, metal"):
        rewrite(model, backend="vulkan")
    assert all(isinstance(layer.recurrence, PerTokenRecurrence) for layer in linear_attention_layers(model))


class MarkedRecurrence(InplaceOpRecurrence):
    pass


class MyGpuBackend(backends.Backend):
    name = "my_gpu"

    def recurrence(self):
        return MarkedRecurrence()


MY_GPU = MyGpuBackend()


def test_a_registered_backend_is_found_by_name(dense_checkpoint, monkeypatch):
    """A new backend is one entry point: the registry imports it by name, rewrite uses it."""
    entries = {**backends._entry_points(backends.BACKENDS_GROUP), "my_gpu": f"{__name__}:MY_GPU"}
    monkeypatch.setattr(backends, "_entry_points", lambda group: entries)
    backends.get_backend.cache_clear()
    try:
        assert backends.backend_names()[-1] == "my_gpu"
        model = rewrite(load_qwen35(dense_checkpoint, max_seq_len=8), backend="my_gpu")
    finally:
        backends.get_backend.cache_clear()
    assert all(type(layer.recurrence) is MarkedRecurrence for layer in linear_attention_layers(model))
    # Its attention is the model's own (the Backend default).
    assert all(type(layer.attend) is MaskedCacheAttention for layer in full_attention_layers(model))


# ---------------------------------------------------------------- graph selection


@pytest.mark.parametrize("backend, moe", [("portable", False), ("cuda", False), ("xnnpack", True)])
def test_rewritten_model_exports_one_op_per_layer_for_any_length(dense_checkpoint, moe_checkpoint, backend, moe, seed):
    checkpoint = moe_checkpoint if moe else dense_checkpoint
    model = rewrite(load_qwen35(checkpoint, max_seq_len=MAX_SEQ_LEN), backend=backend)
    program = export(model, length=5, dynamic=True)
    targets = call_targets(program)
    assert targets.count(OPS[backend]) == len(linear_attention_layers(model))
    assert not any("gated_delta_rule" in str(t) and t != OPS[backend] for t in targets)
    if backend != "cuda":  # the conv is inside the CPU backends' op
        assert torch.ops.aten.convolution.default not in targets
    # The CPU backends' attention layers are one op each between their projections: no cache write apart.
    attention_op = torch.ops.gdn_cuda.cached_attention.default if backend == "cuda" else \
        torch.ops.gdn.gated_attention.default
    assert targets.count(attention_op) == len(full_attention_layers(model))
    assert not any("attention" in str(t) and t != attention_op for t in targets)
    if backend != "cuda":
        assert not any("index_put" in str(t) for t in targets)
    # The CPU backends' norm after each recurrence is one op too.
    norms = targets.count(torch.ops.gdn.gated_rms_norm.default)
    assert norms == (0 if backend == "cuda" else len(linear_attention_layers(model))), norms
    # No per-token loop: the graph is the same size whatever the example length.
    assert len(call_targets(export(model, length=2))) == len(call_targets(export(model, length=9)))

    # The exported program, dynamic in T, computes what the eager model does: prefill then decode.
    # (The CUDA program calls Triton kernels: tests/test_cuda_graph.py runs it under the interpreter.)
    if backend == "cuda":
        return
    generator = torch.Generator().manual_seed(seed)
    prompt, next_token = random_tokens(7, generator), random_tokens(1, generator)
    assert_runs_like_eager(program, checkpoint, backend, [(prompt, 0), (next_token, 7)], seed)


def test_unrewritten_model_exports_at_fixed_length_without_the_op(dense_checkpoint, seed):
    model = load_qwen35(dense_checkpoint, max_seq_len=MAX_SEQ_LEN)
    short, longer = export(model, length=2), export(model, length=3)
    for program in (short, longer):
        assert not any("gdn" in str(target) for target in call_targets(program))
    # The per-token loop is unrolled: one more token, more nodes.
    assert len(call_targets(longer)) > len(call_targets(short))
    tokens = random_tokens(3, torch.Generator().manual_seed(seed))
    assert_runs_like_eager(longer, dense_checkpoint, None, [(tokens, 0)], seed)


# ---------------------------------------------------------------- the emitted program


def test_emitted_program_updates_state_and_caches_in_place(dense_checkpoint, seed):
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    model = load_qwen35(dense_checkpoint, max_seq_len=MAX_SEQ_LEN)
    model.all_logits = False
    rewrite(model, backend="portable")
    edge = to_edge(export(model, length=4, dynamic=True), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    lowered = edge.to_executorch(ExecutorchBackendConfig(run_reinplace_pass=True, emit_mutable_buffer_names=True))
    plan = lowered.executorch_program.execution_plan[0]
    buffer_names = {}
    for index, value in enumerate(plan.values):
        info = getattr(value.val, "extra_tensor_info", None)
        if info is not None and info.fully_qualified_name:
            buffer_names[index] = info.fully_qualified_name
    state_values = {i: name for i, name in buffer_names.items() if name.endswith(("recurrent_state", "conv_state"))}
    cache_values = {i: name for i, name in buffer_names.items() if name.endswith(("k_cache", "v_cache"))}
    assert len(state_values) == 4 and len(cache_values) == 2, buffer_names

    # Every instruction that touches a state or cache buffer, with its op name.
    touching = {index: [] for index in (*state_values, *cache_values)}
    for instruction in plan.chains[0].instructions:
        arguments = instruction.instr_args
        if not hasattr(arguments, "op_index"):
            continue
        operator = plan.operators[arguments.op_index]
        name = f"{operator.name}.{operator.overload}" if operator.overload else operator.name
        for index in set(arguments.args) & touching.keys():
            touching[index].append((name, list(arguments.args)))

    for index, name in state_values.items():
        # The op's state arguments are the buffers themselves; no copy_ into or out of them.
        assert [op for op, _ in touching[index]] == ["gdn::conv_gated_delta_rule.out"], (name, touching[index])
        (_, arguments), = touching[index]
        expected = 8 if name.endswith("recurrent_state") else 7
        assert arguments.index(index) == expected, f"{name} must be the op's argument {expected}"
    for index, name in cache_values.items():
        # Written and read where it lies by the attention op: no copy of a cache.
        assert [op for op, _ in touching[index]] == ["gdn::gated_attention.out"], (name, touching[index])
        (_, arguments), = touching[index]
        expected = 8 if name.endswith("k_cache") else 9
        assert arguments.index(index) == expected, f"{name} must be the op's argument {expected}"

    if runtime_ops_available():
        # With the C++ kernels built, run it: logits match eager call after call, which
        # needs the state and caches carried over by those in-place updates alone.
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        program = _load_for_executorch_from_buffer(lowered.buffer)
        eager = load_qwen35(dense_checkpoint, max_seq_len=MAX_SEQ_LEN)
        eager.all_logits = False
        generator = torch.Generator().manual_seed(seed)
        for tokens, position in ((random_tokens(6, generator), 0), (random_tokens(1, generator), 6),
                                 (random_tokens(3, generator), 7)):
            expected = eager(tokens, torch.tensor([position]))
            actual = program.forward((tokens, torch.tensor([position])))[0]
            difference = (actual - expected).abs().max().item()
            assert difference <= 1e-5, f"seed={seed} position={position}: max abs diff {difference}"
