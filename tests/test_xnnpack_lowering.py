"""ExecuTorch's XNNPACK lowering without the steps that change nothing (``runtime_ops.xnnpack_lowering``):
the programs are byte for byte those of ExecuTorch's whole lowering, and a skipped step is one that
had nothing to do."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from runtime_ops.xnnpack_lowering import (
    EDGE_PASS_REWRITES,
    REWRITTEN_OPS,
    OneDecompositionXnnpackPartitioner,
    applicable_passes,
    only_applicable_passes,
    preprocess_sharing_weights,
)


def whole_pass_list() -> list:
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    return XNNPACKPassManager(None).passes


def test_only_passes_named_with_absent_ops_are_skipped():
    passes = [type(name, (), {}) for name in ("Unnamed", "DecomposeConcatenate", "FuseActivationPass", "PReLUReshapePass")]
    kept = applicable_passes(passes, {"aten.cat.default", "aten.linear.default"})
    assert [each.__name__ for each in kept] == ["Unnamed", "DecomposeConcatenate"]
    assert [each.__name__ for each in applicable_passes(passes, set())] == ["Unnamed"]


def test_every_named_pass_is_in_xnnpacks_list():
    names = [each.__name__ for each in whole_pass_list()]
    assert set(REWRITTEN_OPS) <= set(names), sorted(set(REWRITTEN_OPS) - set(names))


def test_every_edge_pass_named_is_among_executorchs():
    import executorch.exir.program._program as program_module
    from executorch.exir import EdgeCompileConfig

    before, _ = program_module._get_aten_to_edge_passes(EdgeCompileConfig())
    names = [getattr(each, "__name__", type(each).__name__) for each in before]
    assert set(EDGE_PASS_REWRITES) <= set(names), sorted(set(EDGE_PASS_REWRITES) - set(names))


def test_partition_pass_checks_refuse_only_where_the_pass_does_nothing(dense_checkpoint, tmp_path):
    """PASS_APPLIES: in each XNNPACK partition of the tiny model's export that a check refused, its pass, run
    anyway, leaves the graph's ops (in order, with what each reads), their custom metadata and the constants as
    they were (the passes re-trace, which renames nodes)."""
    import copy

    from executorch.backends.xnnpack._passes.propagate_custom_meta_pass import PropagateCustomMetaPass
    from executorch.exir.passes.const_prop_pass import ConstPropPass

    from gdn_export import export_qwen35
    from runtime_ops.xnnpack_lowering import PASS_APPLIES

    refused = []
    checks = dict(PASS_APPLIES)
    try:
        for name, check in checks.items():
            def recording(graph_module, check=check, name=name):
                applies = check(graph_module)
                if not applies:
                    refused.append((name, copy.deepcopy(graph_module)))
                return applies
            PASS_APPLIES[name] = recording
        export_qwen35(dense_checkpoint, tmp_path / "model.pte", backend="xnnpack", quantize="8da4w")
    finally:
        PASS_APPLIES.update(checks)
    assert {name for name, _ in refused} == set(checks), [name for name, _ in refused]
    passes = {"PropagateCustomMetaPass": lambda: PropagateCustomMetaPass(None), "ConstPropPass": ConstPropPass}

    def state(graph_module):
        nodes = list(graph_module.graph.nodes)
        where = {node: index for index, node in enumerate(nodes)}
        return ([(node.op, str(node.target), [where[each] for each in node.all_input_nodes]) for node in nodes],
                [node.meta.get("custom") for node in nodes], sorted(name for name, _ in graph_module.named_buffers()))

    for name, graph_module in refused:
        before = state(graph_module)
        assert state(passes[name]()(graph_module).graph_module) == before, name

    # And each check says yes where its pass has work: a quantize node below a node with custom metadata, an op
    # of literals alone.
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (the quantized_decomposed ops)

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["custom"] = {"origin": "test"}
    quantized = graph.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default,
                                    (x, 0.1, 0, -128, 127, torch.int8))
    filled = graph.call_function(torch.ops.aten.full.default, ([2], 1.0))
    graph.output((quantized, filled))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert all(check(graph_module) for check in checks.values())
    quantized.args = (filled, *quantized.args[1:])
    filled.meta.pop("custom", None)
    assert not checks["PropagateCustomMetaPass"](graph_module)


class TransposesAndViews(nn.Module):
    def forward(self, x):
        return x.t() * 2, x.view(-1) + 1


class MixedTypes(nn.Module):
    def forward(self, x, counts):
        return x * counts  # float32 times int64: the int64 operand is cast


def test_edge_pass_checks_see_what_their_pass_rewrites(dense_checkpoint, generator, tmp_path):
    """Where a check says no, its pass leaves the graph as it was: the graphs of the tiny model's export (what the
    checks see inside ``edge_passes_where_applicable``) each go through the pass itself. Where the pass rewrites
    (a transpose and a reshape, traced as ``aten.t`` and ``aten.view``; a tensor times a number; a float times an
    int64 tensor), its check says yes."""
    import copy

    import executorch.exir.program._program as program_module
    from executorch.exir import EdgeCompileConfig

    from gdn_export import export_qwen35

    seen = []
    checks = dict(EDGE_PASS_REWRITES)
    try:
        for name, check in checks.items():
            EDGE_PASS_REWRITES[name] = lambda graph_module, check=check, name=name: (
                seen.append((name, copy.deepcopy(graph_module), check(graph_module))) or seen[-1][2])
        export_qwen35(dense_checkpoint, tmp_path / "model.pte", backend="xnnpack", quantize="8da4w")
    finally:
        EDGE_PASS_REWRITES.update(checks)
    before, _ = program_module._get_aten_to_edge_passes(EdgeCompileConfig())
    passes = {getattr(each, "__name__", type(each).__name__): each for each in before}
    assert {name for name, _, _ in seen} == set(checks)
    for name, graph_module, applies in seen:
        code = graph_module.code
        if not applies:
            assert passes[name](graph_module).graph_module.code == code, name

    program = torch.export.export(TransposesAndViews(), (torch.randn(3, 5, generator=generator),), strict=False)
    graph_module = program.run_decompositions({}).graph_module  # functional, nothing decomposed: aten.t, aten.view
    for name in ("NormalizeTransposePass", "ReplaceBrokenOpsWithFunctionalOpsPass", "ScalarToTensorPass"):
        assert checks[name](graph_module), name
        assert passes[name](copy.deepcopy(graph_module)).graph_module.code != graph_module.code, name

    counts = torch.randint(1, 9, (3, 5), generator=generator)
    program = torch.export.export(MixedTypes(), (torch.randn(3, 5, generator=generator), counts), strict=False)
    graph_module = program.run_decompositions({}).graph_module
    assert checks["RemoveMixedTypeOperators"](graph_module)
    rewritten = passes["RemoveMixedTypeOperators"](copy.deepcopy(graph_module)).graph_module
    assert "_to_copy" in rewritten.code and "_to_copy" not in graph_module.code


def test_default_dim_order_check_sees_what_its_pass_rewrites(generator):
    """needs_default_dim_order says yes for a mean over a channels-last tensor, which LegalizePortableDimOrderPass
    rewrites (it copies the input to the default order first), and no for the same mean over a contiguous one,
    which the pass leaves as it was."""
    import copy

    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime_ops.xnnpack_lowering import needs_default_dim_order

    def mean_over(memory_format):
        with FakeTensorMode() as mode:
            x = mode.from_tensor(torch.randn(2, 3, 4, 5, generator=generator).contiguous(memory_format=memory_format))
        graph = torch.fx.Graph()
        node = graph.placeholder("x")
        node.meta["val"] = x
        mean = graph.call_function(exir_ops.edge.aten.mean.dim, (node, [1], True))
        with mode:
            mean.meta["val"] = x.mean(dim=[1], keepdim=True)
        graph.output(mean)
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    channels_last, contiguous = mean_over(torch.channels_last), mean_over(torch.contiguous_format)
    assert needs_default_dim_order(channels_last) and not needs_default_dim_order(contiguous)
    rewritten = LegalizePortableDimOrderPass()(copy.deepcopy(channels_last)).graph_module
    assert "_to_dim_order_copy" in rewritten.code
    kept = LegalizePortableDimOrderPass()(copy.deepcopy(contiguous)).graph_module
    assert "_to_dim_order_copy" not in kept.code


def weights_of(edge_program) -> list:
    return [tensor for values in (edge_program.state_dict, edge_program.constants)
            for tensor in values.values() if isinstance(tensor, torch.Tensor)]


def checksums(tensors: list) -> list:
    return [(tensor.dtype, tuple(tensor.shape), tensor.double().sum().item(), (tensor.double() ** 2).sum().item())
            for tensor in tensors]


class Recorder:
    """While open, records the passes each XNNPACK partition ran, whether a partitioner gave up its check and the
    size (nodes) of each program that a decomposition re-traced, and asserts that preprocessing a partition leaves
    its weights as they were (they are shared with the program being lowered: ``preprocess_sharing_weights``)."""

    def __enter__(self):
        import executorch.backends.xnnpack.xnnpack_preprocess as preprocess
        import torch.export.exported_program as exported_program

        self.module, self.passes_run, self.checks_dropped, self.retraced = preprocess, [], [], []
        self.exported_program_module = exported_program
        self.decompose = exported_program._decompose_exported_program
        self.manager = preprocess.XNNPACKPassManager
        self.ops_to_not_decompose = OneDecompositionXnnpackPartitioner.ops_to_not_decompose
        self.preprocess = preprocess.XnnpackBackend.__dict__["preprocess"]
        recorder = self

        def checking(edge_program, compile_specs):
            # The tensors themselves: a pass may put a new tensor in the partition's state dict, not change one.
            weights = weights_of(edge_program)
            before = checksums(weights)
            result = recorder.preprocess.__func__(edge_program, compile_specs)
            assert checksums(weights) == before, "XNNPACK's preprocess wrote into a partition's weights"
            return result

        class RecordingManager(self.manager):
            def transform(self):
                recorder.passes_run.append([each.__name__ for each in self.passes])
                return super().transform()

        def recording(partitioner, exported_program):
            ops, takes = recorder.ops_to_not_decompose(partitioner, exported_program)
            recorder.checks_dropped.append(takes is None)
            return ops, takes

        def decomposing(program, *args, **kwargs):
            recorder.retraced.append(len(program.graph.nodes))
            return recorder.decompose(program, *args, **kwargs)

        preprocess.XNNPACKPassManager = RecordingManager
        preprocess.XnnpackBackend.preprocess = staticmethod(checking)
        OneDecompositionXnnpackPartitioner.ops_to_not_decompose = recording
        exported_program._decompose_exported_program = decomposing
        return self

    def forward_retraces(self) -> int:
        """Re-traces of ``forward``, the largest of the methods (the state methods are a few dozen nodes)."""
        return sum(size > max(self.retraced) // 2 for size in self.retraced)

    def __exit__(self, *exc):
        self.exported_program_module._decompose_exported_program = self.decompose
        self.module.XNNPACKPassManager = self.manager
        self.module.XnnpackBackend.preprocess = self.preprocess
        OneDecompositionXnnpackPartitioner.ops_to_not_decompose = self.ops_to_not_decompose


def quantization_bodies_counted(monkeypatch) -> list:
    """A list that grows by one each time torchao's quantize or dequantize code runs for a fake tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    import torchao.quantization.quant_primitives as primitives

    counted = []
    for name in ("_quantize_affine_no_dtype_cast", "_dequantize_affine_no_dtype_check"):
        def body(x, *args, original=getattr(primitives, name), **kwargs):
            if isinstance(x, FakeTensor):
                counted.append(1)
            return original(x, *args, **kwargs)

        monkeypatch.setattr(primitives, name, body)
    return counted


# 8da8w lowers as 8da4w does (8da4w holds 8-bit layers too).
@pytest.mark.parametrize("quantize", ["none", "8da4w", "int8wo"])
def test_export_writes_the_program_of_the_whole_lowering(quantize, dense_checkpoint, tmp_path, module_seed,
                                                         monkeypatch):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torch._subclasses.fake_tensor import FakeTensorMode

    import runtime_ops.xnnpack_lowering as lowering
    from gdn_export import export_qwen35

    ours = tmp_path / "ours.pte"
    held = []  # (nodes, whether they all held their values) of each method SpecPropPass came to
    whether_held = lowering.holds_every_value

    def recording_held(graph_module):
        held.append((len(graph_module.graph.nodes), whether_held(graph_module)))
        return held[-1][1]

    monkeypatch.setattr(lowering, "holds_every_value", recording_held)
    fake_bodies = quantization_bodies_counted(monkeypatch)
    with Recorder() as recorder:
        export_qwen35(dense_checkpoint, ours, backend="xnnpack", quantize=quantize)
    # torchao's quantization code ran for no fake tensor.
    assert fake_bodies == [], len(fake_bodies)
    # forward (the largest method) is not re-traced for its specs; set_state, whose buffer write-backs
    # to_executorch adds without values, is.
    assert len(held) == 3 and max(held)[1] and not all(whether for _, whether in held), held
    # The shortcuts were taken where they apply: forward re-traced once to be decomposed (ExecuTorch alone: once to
    # make it functional, once to decompose it), passes skipped in every partition. XNNPACK takes every linear
    # (int8wo's through runtime_ops.xnnpack_weight_only), so its check is dropped for forward.
    # [0]: decomposed_once's question, on the program as traced; [1]: ExecuTorch's, on that decomposition.
    assert recorder.checks_dropped[1], recorder.checks_dropped
    assert recorder.forward_retraces() == 1, recorder.retraced
    # Each state method is re-traced once too (ExecuTorch alone: twice).
    assert len(recorder.retraced) == 3, recorder.retraced
    whole = len(whole_pass_list())
    assert recorder.passes_run and all(len(passes) < whole for passes in recorder.passes_run), recorder.passes_run

    monkeypatch.setattr(lowering, "only_applicable_passes", contextlib.nullcontext)
    monkeypatch.setattr(lowering, "preprocess_sharing_weights", contextlib.nullcontext)
    monkeypatch.setattr(lowering, "OneDecompositionXnnpackPartitioner", XnnpackPartitioner)
    monkeypatch.setattr(lowering, "decomposed_once", lambda programs, partitioners: programs)
    monkeypatch.setattr(lowering, "functional_programs_kept", lambda programs: contextlib.nullcontext())
    for shortcut in ("edge_passes_where_applicable", "views_and_numbers_in_one_trace",
                     "edge_ops_and_dim_order_in_one_trace",
                     "portable_dim_order_legalized_where_needed", "unchanged_submodules_not_recompiled",
                     "merges_checked_on_sets", "weights_freed_once_serialized", "specs_from_values_held",
                     "quantization_ops_by_shape", "metadata_restored_in_one_read"):
        monkeypatch.setattr(lowering, shortcut, contextlib.nullcontext)
    theirs = tmp_path / "theirs.pte"
    FakeTensorMode.cache_clear()  # outputs of fake calls that the export above made, which a call could reuse
    with Recorder() as recorder:
        export_qwen35(dense_checkpoint, theirs, backend="xnnpack", quantize=quantize)
    # The quantized programs' linears hold torchao's ops; the float program holds none.
    assert bool(fake_bodies) == (quantize != "none"), len(fake_bodies)
    assert recorder.passes_run and all(len(passes) == whole for passes in recorder.passes_run)
    assert recorder.forward_retraces() == 3, recorder.retraced
    assert len(recorder.retraced) - recorder.forward_retraces() >= 2 * 2, recorder.retraced
    assert ours.read_bytes() == theirs.read_bytes(), (
        f"seed={module_seed} quantize={quantize}: the program differs from the whole lowering's "
        f"({ours.stat().st_size} against {theirs.stat().st_size} bytes)")


def test_decomposition_restores_the_same_metadata_reading_the_name_maps_once(generator, seed, monkeypatch):
    """``metadata_restored_in_one_read``: a decomposition puts the same metadata back on each placeholder of
    parameters and buffers, and builds the signature's maps a few times instead of once per placeholder."""
    from torch.export.graph_signature import ExportGraphSignature

    from runtime_ops.xnnpack_lowering import metadata_restored_in_one_read

    # Parameters and buffers (the norm's running statistics), a dozen placeholders.
    module = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 4), nn.BatchNorm1d(4)).eval()
    program = torch.export.export(module, (torch.randn(5, 8, generator=generator),))
    reads = []
    for name in ("inputs_to_parameters", "inputs_to_buffers"):
        built = getattr(ExportGraphSignature, name)

        def counted(signature, built=built):
            reads.append(1)
            return built.fget(signature)

        monkeypatch.setattr(ExportGraphSignature, name, property(counted))

    def restored(decomposed):
        placeholders = [node for node in decomposed.graph.nodes if node.op == "placeholder"]
        return [(node.name, sorted(node.meta), str(node.meta.get("nn_module_stack")),
                 node.meta.get("val").shape) for node in placeholders]

    theirs = restored(program.run_decompositions({}))
    their_reads = len(reads)
    reads.clear()
    with metadata_restored_in_one_read():
        ours = restored(program.run_decompositions({}))
    assert ours == theirs, f"seed {seed}"
    placeholders = sum(1 for node in program.graph.nodes if node.op == "placeholder")
    assert placeholders >= 12 and their_reads >= 2 * placeholders > len(reads), (their_reads, len(reads))


class Rewritten(nn.Module):
    """What two skippable passes rewrite (a relu after a linear, a six-way concatenation), and a float64
    linear, which XNNPACK does not take."""

    def __init__(self, float64: bool):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.wide = nn.Linear(16, 4).double() if float64 else None

    def forward(self, x):
        y = torch.relu(self.linear(x))
        out = torch.cat([y, x, y * 2, x + 1, y - x, x * 3], dim=-1)
        return (out, self.wide(x.double())) if self.wide is not None else out


def lowered(module: nn.Module, inputs: tuple, partitioner) -> tuple[list, list]:
    """The delegates' bytes and the ops outside them, ``module`` lowered by ``partitioner``."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    edge = to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[partitioner],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    graph_module = edge.exported_program().graph_module
    payloads = [each.processed_bytes for each in graph_module.modules() if isinstance(each, LoweredBackendModule)]
    outside = [str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"]
    return payloads, outside


@pytest.mark.parametrize("float64", [False, True], ids=["float32", "with-float64-linear"])
def test_small_module_lowers_as_in_the_whole_lowering(float64, generator, seed):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    module = Rewritten(float64).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    inputs = (torch.randn(3, 16, generator=generator),)
    with Recorder() as recorder, only_applicable_passes(), preprocess_sharing_weights():
        ours = lowered(module, inputs, OneDecompositionXnnpackPartitioner())
    theirs = lowered(module, inputs, XnnpackPartitioner())
    assert ours == theirs, f"seed={seed}"
    # XNNPACK's check is dropped only when it takes every linear (asked first before decomposing).
    assert recorder.checks_dropped[0] == (not float64), recorder.checks_dropped
    # The relu and the concatenation went into the delegate: their passes ran where they were.
    ran = set().union(*map(set, recorder.passes_run))
    assert {"FuseActivationPass", "DecomposeConcatenate"} <= ran and "PReLUReshapePass" not in ran, ran
    assert not any("cat" in target or "relu" in target for target in ours[1]), ours[1]


def test_a_copy_sharing_weights_has_its_own_graph_and_the_same_tensors(generator):
    from gdn_export.lowering import copy_sharing_weights

    module = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    program = torch.export.export(module, (torch.randn(2, 8, generator=generator),))
    copied = copy_sharing_weights(program)
    assert copied.graph_module is not program.graph_module
    assert copied.state_dict is not program.state_dict
    assert all(copied.state_dict[name] is tensor for name, tensor in program.state_dict.items())
    next(iter(copied.graph.nodes)).name = "renamed"  # a change to the copy's graph stays in the copy
    assert next(iter(program.graph.nodes)).name != "renamed"


def test_xnnpack_copies_partitions_sharing_weights_only_while_open():
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir.backend.backend_details import BackendDetails

    assert XnnpackBackend.copy_exported_program_for_preprocess.__func__ is \
        BackendDetails.copy_exported_program_for_preprocess.__func__
    with preprocess_sharing_weights():
        assert XnnpackBackend.copy_exported_program_for_preprocess.__func__ is not \
            BackendDetails.copy_exported_program_for_preprocess.__func__
    assert "copy_exported_program_for_preprocess" not in XnnpackBackend.__dict__


def random_graph_module(generator: torch.Generator, size: int = 120) -> torch.fx.GraphModule:
    """A graph of ``size`` additions, each of two earlier nodes picked at random (some nodes feed nothing)."""
    import operator

    graph = torch.fx.Graph()
    nodes = [graph.placeholder(f"x{index}") for index in range(4)]
    for _ in range(size):
        first, second = torch.randint(0, len(nodes), (2,), generator=generator).tolist()
        nodes.append(graph.call_function(operator.add, (nodes[first], nodes[second])))
    graph.output(nodes[-1])
    return torch.fx.GraphModule(nn.Module(), graph)


def test_downstream_bits_answer_as_executorchs_dependency_sets(generator, seed):
    from executorch.exir.backend.canonical_partitioners.group_partitioner import _DependencyViewer

    from runtime_ops.xnnpack_lowering import DownstreamBits

    module = random_graph_module(generator)
    theirs, ours = _DependencyViewer(module), DownstreamBits(module)
    for node in module.graph.nodes:
        assert ours.bits[node] == ours.mask(theirs.downstreams_of(node)), f"seed={seed} node={node}"
    assert any(ours.bits[node] for node in module.graph.nodes), f"seed={seed}: no node leads anywhere"


def test_merges_are_answered_as_executorchs_group_partitioner_answers_them(generator, seed):
    """Random pairs of runs of nodes as partitions: the bits refuse and allow the merges ExecuTorch's sets do,
    and the partitioner built while open holds the bits and no torch viewer of its own."""
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.operator_support import OperatorSupportBase

    from runtime_ops.xnnpack_lowering import DownstreamBits, merges_checked_on_sets

    class Everything(OperatorSupportBase):
        def is_node_supported(self, submodules, node) -> bool:
            return node.op == "call_function"

    module = random_graph_module(generator)
    additions = [node for node in module.graph.nodes if node.op == "call_function"]
    pairs = []
    for _ in range(200):  # two runs of the topological order with a gap between (none: always mergeable)
        start, first, gap, second = torch.randint(0, 12, (4,), generator=generator).tolist()
        start, gap = start * 8, gap % 3 * gap
        pairs.append({0: Partition(0, additions[start:start + first + 1]),
                      1: Partition(1, additions[start + first + 1 + gap:start + first + gap + second + 2])})
    theirs = GroupBasedPartitioner(module, Everything())
    expected = [theirs._can_merge_partitions(0, 1, pair) for pair in pairs]
    with merges_checked_on_sets():
        ours = GroupBasedPartitioner(module, Everything())
        assert isinstance(ours.dependency_viewer, DownstreamBits)
        answers = [ours._can_merge_partitions(0, 1, pair) for pair in pairs]
    assert answers == expected, f"seed={seed}"
    assert 0 < sum(expected) < len(expected), f"seed={seed}: every random pair answered alike ({sum(expected)})"


def test_values_are_held_where_every_node_holds_fake_values_alone(generator):
    """holds_every_value: SpecPropPass's re-trace is skipped only where each placeholder and op holds a value of
    fake tensors and numbers; a node without one, or with a real tensor, asks for the re-trace."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime_ops.xnnpack_lowering import holds_every_value

    x = torch.randn(3, 5, generator=generator)
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    added = graph.call_function(torch.ops.aten.add.Tensor, (a, 1))
    size = graph.call_function(torch.ops.aten.sym_size.int, (added, 0))
    graph.output((added, size))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    with FakeTensorMode() as mode:
        a.meta["val"] = mode.from_tensor(x)
        added.meta["val"] = a.meta["val"] + 1
    size.meta["val"] = 3
    assert holds_every_value(graph_module)
    added.meta["val"] = x + 1
    assert not holds_every_value(graph_module)
    del added.meta["val"]
    assert not holds_every_value(graph_module)


def _fake_with_dynamic_tokens(mode, tensor: torch.Tensor, dynamic: int | None):
    """``tensor`` as a fake tensor of ``mode``, its dim ``dynamic`` (if any) a symbolic size, as T is in forward."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    sizes = [DimDynamic.DYNAMIC if dim == dynamic else DimDynamic.STATIC for dim in range(tensor.dim())]
    return mode.from_tensor(tensor, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))


def _quantization_cases(generator) -> list:
    """(id, op, args, dim of the tensors made symbolic): the forms our programs hold (a linear's activations per
    token, asymmetric int8; 4-bit and 8-bit weights in groups; the table's rows) and a few more."""
    ops = torch.ops.torchao
    tokens = torch.randn(1, 5, 64, generator=generator) * 3
    weights = torch.randn(48, 64, generator=generator)
    per_token = ([1, 1, 64], torch.int8, -128, 127)
    token_scale, token_zero = ops.choose_qparams_affine(tokens, "ASYMMETRIC", *per_token, None, None, torch.int8)
    token_codes = ops.quantize_affine(tokens, [1, 1, 64], token_scale, token_zero, torch.int8, -128, 127)
    group_scale, group_zero = ops.choose_qparams_affine(weights, "SYMMETRIC", [1, 32], torch.int8, -8, 7)
    group_codes = ops.quantize_affine(weights, [1, 32], group_scale, group_zero, torch.int8, -8, 7)
    return [
        ("choose-per-token", ops.choose_qparams_affine.default,
         (tokens, "ASYMMETRIC", *per_token, None, None, torch.int8), 1),
        ("choose-groups", ops.choose_qparams_affine.default,
         (weights, "SYMMETRIC", [1, 32], torch.int8, -8, 7, None, torch.float32), None),
        ("choose-kept-dims", ops.choose_qparams_affine.default,
         (tokens, "SYMMETRIC_NO_CLIPPING_ERR", [1, 1, 32], torch.int8, -128, 127, 1e-6, None, None, True), 1),
        ("choose-rows-bfloat16", ops.choose_qparams_affine.default,
         (weights.to(torch.bfloat16), "SYMMETRIC", [1, 64], torch.int8, -127, 127), None),
        ("quantize-per-token", ops.quantize_affine.default,
         (tokens, [1, 1, 64], token_scale, token_zero, torch.int8, -128, 127), 1),
        ("quantize-groups", ops.quantize_affine.default,
         (weights, [1, 32], group_scale, group_zero, torch.int8, -8, 7), None),
        ("dequantize-per-token", ops.dequantize_affine.default,
         (token_codes, [1, 1, 64], token_scale, token_zero, torch.int8, -128, 127), 1),
        ("dequantize-groups-bfloat16", ops.dequantize_affine.default,
         (group_codes, [1, 32], group_scale, group_zero, torch.int8, -8, 7, torch.bfloat16), None),
    ]


def _described(outputs) -> list:
    return [(str(list(each.shape)), str(list(each.stride())), each.dtype, each.device)
            for each in (outputs if isinstance(outputs, tuple) else (outputs,))]


@pytest.mark.parametrize("below_autograd", [False, True], ids=["called", "below-autograd"])
def test_quantization_ops_by_shape_give_torchaos_outputs(below_autograd, generator, seed, monkeypatch):
    """quantization_ops_by_shape: torchao's three ops called on fake tensors, with T symbolic, give the shapes
    (the same expressions in T), strides, dtypes and devices of torchao's own code without running it, both where
    the autograd kernel runs first (ExecuTorch's passes) and where the fake mode does (torch.export puts its own
    kernel first); after it, torchao's code runs again."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    import torchao.quantization.quant_primitives as primitives

    from runtime_ops.xnnpack_lowering import quantization_ops_by_shape

    bodies_run = []
    checked = primitives._get_and_check_qmin_qmax  # the first call of each op's body
    monkeypatch.setattr(primitives, "_get_and_check_qmin_qmax", lambda *args: bodies_run.append(1) or checked(*args))
    below = torch._C._AutoDispatchBelowAutograd if below_autograd else contextlib.nullcontext
    for name, op, args, dynamic in _quantization_cases(generator):
        mode = FakeTensorMode(shape_env=ShapeEnv())
        fakes = tuple(_fake_with_dynamic_tokens(mode, each, dynamic) if isinstance(each, torch.Tensor) else each
                      for each in args)
        bodies_run.clear()
        with mode, below():
            expected = op(*fakes)
        assert bodies_run, f"{name}: torchao's code did not run outside the context"
        bodies_run.clear()
        with quantization_ops_by_shape(), mode, below():
            made = op(*fakes)
        assert not bodies_run, f"{name}: torchao's code ran for fake tensors inside the context"
        assert _described(made) == _described(expected), f"seed={seed} {name}"
        assert "s" in _described(expected)[0][0] or dynamic is None, f"{name}: T is not symbolic"
        bodies_run.clear()
        with mode, below():
            op(*fakes)
        assert bodies_run, f"{name}: torchao's code did not run after the context"


def test_quantization_ops_by_shape_leave_real_tensors_to_torchao(generator, seed):
    """Inside quantization_ops_by_shape, real tensors still get torchao's values: per-token asymmetric int8
    against the formula, and every case as torchao gives it outside."""
    from runtime_ops.xnnpack_lowering import quantization_ops_by_shape

    cases = _quantization_cases(generator)
    expected = [op(*args) for _, op, args, _ in cases]
    with quantization_ops_by_shape():
        made = [op(*args) for _, op, args, _ in cases]
        tokens = cases[0][2][0]
        scale, zero = made[0]
        codes = torch.ops.torchao.quantize_affine(tokens, [1, 1, 64], scale, zero, torch.int8, -128, 127)
    for (name, *_), want, got in zip(cases, expected, made):
        for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
            assert w.dtype == g.dtype and torch.equal(w, g), f"seed={seed} {name}"
    low, high = tokens.amin(-1, keepdim=True).clamp(max=0), tokens.amax(-1, keepdim=True).clamp(min=0)
    formula_scale = (high - low) / 255
    formula_zero = torch.clamp(-128 - torch.round(low / formula_scale), -128, 127)
    torch.testing.assert_close(scale, formula_scale.squeeze(-1), msg=f"seed={seed}")
    assert torch.equal(zero.to(torch.float32), formula_zero.squeeze(-1)), f"seed={seed}"
    formula_codes = torch.clamp(torch.round(tokens / formula_scale) + formula_zero, -128, 127).to(torch.int8)
    assert (codes.to(torch.int32) - formula_codes.to(torch.int32)).abs().max() <= 1, f"seed={seed}"
