"""ExecuTorch's XNNPACK lowering without the steps that cannot change our programs.

Most of a quantized export's time is ExecuTorch re-tracing the program with fake tensors over the
symbolic token count T (docs/benchmarks.md, "Where the export time goes"). Many of those re-tracings
do nothing for our programs, and this module skips them. The program is byte for byte the one that
the whole lowering writes (tests/test_xnnpack_lowering.py checks it for every quantization the
backend offers):

* ``quantization_ops_by_shape`` (also around the program's trace). Torchao's quantization ops, in every
  quantized linear, run their Python code on each fake call, the most of any op: the views, reductions and
  roundings on symbolic sizes were about a third of the 0.8B 8da4w export. A fake call now makes its outputs
  from the inputs' shapes; real tensors still run torchao's code.
* ``OneDecompositionXnnpackPartitioner``. For a partitioner whose ops kept whole (linears and
  torchao's quantization ops, for XNNPACK) come with a check on each node, ``to_edge_transform_and_lower``
  decomposes the program twice, marking the checked nodes in between. When every such node passes
  the check, marking changes nothing, so the partitioner drops its check and the program is
  decomposed once.
* ``decomposed_once`` with ``functional_programs_kept``. ``to_edge_transform_and_lower`` first re-traces
  each method with no decomposition at all, only to make it functional, and then decomposes it: two
  passes over the program where ``to_edge`` takes one. Each method with a partitioner is decomposed
  here, functional at once, and ExecuTorch's two re-traces leave it as it is when they have nothing to do.
* ``edge_passes_where_applicable``. ExecuTorch's conversion to its edge dialect runs a dozen passes over each
  method, each re-tracing it. Five of them rewrite only what our programs no longer hold once decomposed
  (``EDGE_PASS_REWRITES``: a node of ``aten.t``, a view op, a symbolic value or a number where a tensor is
  expected, an arithmetic op whose operands' dtypes differ), and are skipped for a program without it.
* ``views_and_numbers_in_one_trace``. The first of those passes, each view op to its copying op, also makes
  tensors of the numbers that ops take as tensors, the work of a later pass with a re-trace of its own.
* ``edge_ops_and_dim_order_in_one_trace``. The last two of those passes, to edge ops and to dim-order ops,
  each rewrite one node at a time; they run as one re-trace.
* ``portable_dim_order_legalized_where_needed``. ``to_executorch`` re-traces each method to copy the input of a
  pooling, expand, mean or sum outside the delegates into the default dim order; ours are all in it already.
* ``specs_from_values_held``. ``to_executorch`` re-traces each method again before it gives each node its tensor
  spec, to bring the nodes' values up to date; forward's values already are, so its specs come from them.
* ``only_applicable_passes``. XNNPACK's ``preprocess`` runs its whole pass list (17 passes in
  ExecuTorch 1.5.1) over each of our 100 or more partitions, and most passes re-trace the
  partition, though they rewrite ops that our programs never give XNNPACK (batch norm,
  upsampling, PReLU, max pooling...). ``REWRITTEN_OPS`` names such a pass beside the edge ops it
  rewrites, read off its source; a partition holding none of them skips it, and ``PASS_APPLIES`` gives two
  more passes a check of what they work on. A pass named in neither always runs, so one that a newer
  ExecuTorch adds is never skipped silently.
* ``merges_checked_on_sets``. XNNPACK's partitioner asks, for each pair of partitions it might merge,
  whether a node outside both leads back into them, one node of a downstream set at a time; asked as an
  intersection, the same answer costs a fraction. It also builds every node's downstream set, and its
  upstream set, as Python sets (twice, the first for torch's base class, which it never asks): 1.45 GiB
  at once for the 4B program, its export's peak. Each node's downstream nodes are kept as the bits of
  one integer instead (``DownstreamBits``, 1/64 of a set's memory or less), and nothing else is built.
* ``unchanged_submodules_not_recompiled``. ExecuTorch cuts each partition out of the method as a submodule
  and re-sorts the method's graph, which recompiles the method's Python code and, with it, every submodule cut
  out before: the k-th partition recompiles the method and k - 1 submodules that did not change, a quadratic
  cost over our 117 partitions. The method is recompiled once when its partitions are made, and a submodule
  whose graph is as it was at its last compile keeps its code.

And two that cost memory. ``weights_freed_once_serialized``: while the export lets the lowering free
weights (``gdn_export.lowering.weights_freed_when_serialized``), a weight that only one partition uses is
freed as soon as XNNPACK has serialized its own copy of it, so the model's weights and XNNPACK's copies are
never all resident together (the 4B 8da4w export peaked there). And ``preprocess_sharing_weights``. ExecuTorch deep-copies every
partition before preprocessing, in case a backend changes it, and holds all the copies until the last
partition is done: a second copy of every weight (0.77 GiB of the 0.8B 8da4w export's 3.7 GiB peak).
XNNPACK's preprocessing makes new tensors and writes into none, so the copies keep their own graphs
and share the weights, as ExecuTorch's CUDA backend does in its low-memory mode.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from gdn_export.lowering import replaced_attribute

_BATCH_NORMS = ("aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default")

# pass (its class name) -> the edge ops it rewrites; it has nothing to do in a partition without them.
REWRITTEN_OPS: dict[str, tuple[str, ...]] = {
    "ConvertToUpsampleBilinear2d": ("aten.upsample_bilinear2d.vec",),
    # It turns a decomposed linear's matrix products back into a linear; ours reach XNNPACK whole.
    "ConvertToLinearPass": ("aten.mm.default", "aten.addmm.default", "aten.bmm.default"),
    # Its patterns are decomposed attention, which always holds a softmax.
    "ConvertToSDPAPass": ("aten._softmax.default",),
    "FuseBatchNormPass": _BATCH_NORMS,
    "DecomposeBatchNorm": _BATCH_NORMS,
    # It folds a relu or hardtanh into the op before it.
    "FuseActivationPass": ("aten.relu.default", "aten.hardtanh.default"),
    "DecomposeConcatenate": ("aten.cat.default",),
    "RemoveGetItemPass": ("aten.max_pool2d_with_indices.default", "aten.max.dim"),
    "Conv1dUnsqueezePass": ("aten.convolution.default",),
    "PReLUReshapePass": ("aten._prelu_kernel.default",),
    "RemoveRedundantCopyPass": ("aten._to_copy.default",),
    # It turns ExecuTorch's dim-order ops back into the memory-format ops XNNPACK reads (its source's map).
    "DimOrderOpsRevertPass": ("dim_order_ops._to_dim_order_copy.default", "dim_order_ops._empty_dim_order.default",
                              "dim_order_ops._clone_dim_order.default"),
}


class OneDecompositionXnnpackPartitioner(XnnpackPartitioner):
    """XNNPACK's partitioner; when XNNPACK takes every node of the ops it keeps whole, it says so by
    giving no per-node check, and ``to_edge_transform_and_lower`` decomposes the program once instead of twice."""

    def ops_to_not_decompose(self, exported_program):
        ops, takes = super().ops_to_not_decompose(exported_program)
        kept = [node for node in exported_program.graph.nodes if node.op == "call_function" and node.target in ops]
        if takes is not None and all(takes(node) for node in kept):
            return ops, None
        return ops, takes


def decomposed_once(programs: dict, partitioners) -> dict:
    """``programs`` ({method: ExportedProgram}), each method with one partitioner decomposed by ExecuTorch's default
    table without the ops that partitioner keeps whole, in one re-trace that also makes it functional; each method
    without one (the state methods) by the whole table, in one re-trace where ExecuTorch makes two; the others as
    they are.

    What ``to_edge_transform_and_lower`` then does with such a method: its functionalizing re-trace is skipped
    (``functional_programs_kept``); if the partitioner checks no node, the table has nothing left to decompose, and
    the method is decomposed once where it was twice; if it does check nodes (a node it refuses, such as a
    float64 linear), ExecuTorch's two decompositions follow as before, on a program they leave as they would have made it.
    The partitioner's check is not asked here: on the program as ``torch.export`` traced it, before
    functionalization, XNNPACK refuses every linear that it takes afterwards."""
    from executorch.exir.program._program import _default_decomposition_table

    decomposed = {}
    for name, program in programs.items():
        found = partitioners(name)
        if len(found) > 1:
            decomposed[name] = program
            continue
        kept = found[0].ops_to_not_decompose(program)[0] if found else ()
        table = _default_decomposition_table()
        for op in kept:
            table.pop(op, None)
        decomposed[name] = program.run_decompositions(table)
    return decomposed


# Ops of the default decomposition table that tracing a program with symbolic sizes always writes again: a graph
# holding no other op of a table is left as it is by decomposing it with that table.
RETRACED_ANYWAY = ("aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default")


def nothing_to_decompose(program, table: dict) -> bool:
    """Whether ``program`` calls no op of ``table`` but those in ``RETRACED_ANYWAY``."""
    return not any(
        node.op == "call_function" and node.target in table and str(node.target) not in RETRACED_ANYWAY
        for node in program.graph.nodes
    )


@contextlib.contextmanager
def functional_programs_kept(programs) -> Iterator[None]:
    """While open, ``run_decompositions`` returns each of ``programs`` (functional and decomposed already,
    ``decomposed_once``) as it is when it has nothing to do: ``run_decompositions({})``, a re-trace that only makes a
    program functional, and a table of which the program holds only symbolic-size ops (ExecuTorch decomposes
    again whenever a program holds any op of its table, and a program with a dynamic dim always holds
    ``aten.sym_size.int``)."""
    from torch.export import ExportedProgram

    kept = {id(program) for program in programs}
    retrace = ExportedProgram.run_decompositions

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        if id(self) in kept and decomp_table is not None and not args and not kwargs \
                and nothing_to_decompose(self, decomp_table):
            return self
        return retrace(self, decomp_table, *args, **kwargs)

    with replaced_attribute(ExportedProgram, "run_decompositions", run_decompositions):
        yield


def _holds_a_transpose(graph_module) -> bool:
    return any(node.target is torch.ops.aten.t.default for node in graph_module.graph.nodes)


def _holds_a_view_op(graph_module) -> bool:
    return any(isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
               for node in graph_module.graph.nodes if node.op == "call_function")


def _tensor_arguments(graph_module) -> Iterator:
    """The value of each argument of an op of ``graph_module`` that its schema types as a Tensor."""
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for index, argument in enumerate(node.target._schema.arguments):
            if not isinstance(argument.type, torch.TensorType):
                continue
            value = node.kwargs.get(argument.name) if argument.kwarg_only or argument.name in node.kwargs \
                else (node.args[index] if index < len(node.args) else None)
            yield value


def _passes_a_symbol_as_a_tensor(graph_module) -> bool:
    """Whether an op gets a SymInt/SymFloat/SymBool where its schema takes a Tensor (what SymToTensorPass wraps in
    ``aten.scalar_tensor``)."""
    symbols = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return any(isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), symbols)
               for value in _tensor_arguments(graph_module))


def _passes_a_number_as_a_tensor(graph_module) -> bool:
    """Whether an op gets a Python number where its schema takes a Tensor (what ScalarToTensorPass makes a tensor
    constant of)."""
    return any(isinstance(value, (float, int, bool)) for value in _tensor_arguments(graph_module))


def _promotion_kinds() -> dict:
    """The ops RemoveMixedTypeOperators casts the operands of, each with its type promotion (from its source)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND

    aten = torch.ops.aten
    return {aten.add.Tensor: KIND.DEFAULT, aten.mul.Tensor: KIND.DEFAULT, aten.sub.Tensor: KIND.DEFAULT,
            aten.div.Tensor: KIND.INT_TO_FLOAT, aten.div.Tensor_mode: KIND.DEFAULT, aten.minimum.default: KIND.DEFAULT}


def _operand(graph_module, argument) -> Optional[torch.Tensor]:
    """What the pass sees of an operand: a node's (fake) tensor, or the constant tensor a ``get_attr`` names;
    None for anything else (a symbol, a Python number), which the check leaves to the pass."""
    if not isinstance(argument, torch.fx.Node):
        return None
    if argument.op == "get_attr":
        owner = graph_module
        for name in argument.target.split("."):
            owner = getattr(owner, name, None)
        return owner if isinstance(owner, torch.Tensor) else None
    value = argument.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def _mixes_dtypes(graph_module) -> bool:
    """What RemoveMixedTypeOperators rewrites: an add, sub, mul, div or minimum with an operand whose dtype is not
    the one the operands promote to (the pass casts it). An operand the check cannot read counts as mixed."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    kinds = _promotion_kinds()
    for node in graph_module.graph.nodes:
        kind = kinds.get(node.target) if node.op == "call_function" else None
        if kind is None or len(node.args) <= 1:
            continue
        if node.target is torch.ops.aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            kind = ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
        operands = [_operand(graph_module, argument) for argument in node.args]
        if any(operand is None for operand in operands):
            return True
        promoted = elementwise_dtypes(*operands, type_promotion_kind=kind)[1]
        if any(operand.dtype != promoted for operand in operands):
            return True
    return False


# An edge-dialect pass (its class name) -> whether a graph holds what it rewrites, read off its source: it changes
# nothing in a graph without it.
EDGE_PASS_REWRITES = {
    "NormalizeTransposePass": _holds_a_transpose,  # aten.t -> aten.t_copy
    "ReplaceBrokenOpsWithFunctionalOpsPass": _holds_a_view_op,  # each view op -> its _copy op
    "SymToTensorPass": _passes_a_symbol_as_a_tensor,
    # Its numbers are made tensors in the first re-trace already (views_and_numbers_in_one_trace).
    "ScalarToTensorPass": _passes_a_number_as_a_tensor,
    "RemoveMixedTypeOperators": _mixes_dtypes,
}


@contextlib.contextmanager
def edge_passes_where_applicable() -> Iterator[None]:
    """While open, the passes of ``EDGE_PASS_REWRITES`` among ExecuTorch's edge-dialect passes run only on graphs
    holding what they rewrite."""
    from torch.fx.passes.infra.pass_base import PassResult

    import executorch.exir.program._program as program_module

    edge_passes = program_module._get_aten_to_edge_passes

    def where_applicable(each):
        # ExecuTorch's pass manager hands most passes over wrapped in a function named after the pass's class.
        applies = EDGE_PASS_REWRITES.get(getattr(each, "__name__", type(each).__name__))
        if applies is None:
            return each
        return lambda graph_module: each(graph_module) if applies(graph_module) else PassResult(graph_module, False)

    def applicable_edge_passes(config):
        before, after = edge_passes(config)
        return [where_applicable(each) for each in before], after

    with replaced_attribute(program_module, "_get_aten_to_edge_passes", applicable_edge_passes):
        yield


def needs_default_dim_order(graph_module) -> bool:
    """What ExecuTorch's LegalizePortableDimOrderPass (in ``to_executorch``) rewrites: an op of its list (pooling,
    expand, mean, sum), outside the delegates, whose input is not in the default dim order; it copies the input
    to that order first. A graph with submodules of its own (control flow), which the pass enters, counts as
    holding one, as does such an op whose input the check cannot read."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    if any(isinstance(child, torch.fx.GraphModule) for child in graph_module.children()):
        return True
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in LegalizePortableDimOrderPass._target_ops:
            continue
        value = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or [int(d) for d in value.dim_order()] != list(range(value.dim())):
            return True
    return False


@contextlib.contextmanager
def portable_dim_order_legalized_where_needed() -> Iterator[None]:
    """While open, ExecuTorch's LegalizePortableDimOrderPass re-traces only a program that
    ``needs_default_dim_order``: ours keep every tensor in the default order."""
    import executorch.exir.program._program as program_module
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from torch.fx.passes.infra.pass_base import PassResult

    class WhereNeeded(LegalizePortableDimOrderPass):
        def call(self, graph_module):
            if not needs_default_dim_order(graph_module):
                return PassResult(graph_module, False)
            return super().call(graph_module)

    with replaced_attribute(program_module, "LegalizePortableDimOrderPass", WhereNeeded):
        yield


def holds_every_value(graph_module) -> bool:
    """Whether every placeholder and op of ``graph_module`` holds its value (``meta["val"]``) as fake tensors and
    numbers alone: what SpecPropPass re-traces a method to make sure of. The write-backs that ``to_executorch``
    adds for buffers a method mutates in the graph (the state methods') hold none."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree as pytree

    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "call_function"):
            if "val" not in node.meta:
                return False
            leaves = pytree.tree_leaves(node.meta["val"])
            if any(isinstance(leaf, torch.Tensor) and not isinstance(leaf, FakeTensor) for leaf in leaves):
                return False
    return True


class _NameMapsReadOnce:
    """A graph signature whose two maps of placeholder names, to parameters and to buffers, are made once: the
    signature's own properties build a new map on each read."""

    def __init__(self, signature):
        self._signature = signature
        self.inputs_to_parameters = signature.inputs_to_parameters
        self.inputs_to_buffers = signature.inputs_to_buffers

    def __getattr__(self, name):
        return getattr(self._signature, name)


@contextlib.contextmanager
def metadata_restored_in_one_read() -> Iterator[None]:
    """While open, ``run_decompositions`` puts the parameters' and buffers' metadata back on the graph it traced
    with the new signature's name maps made once, where torch reads both properties for each placeholder and so
    builds them anew each time: quadratic in the placeholders (the 0.8B forward's 400-odd made it 6 s of a
    profiled export, docs/benchmarks.md run 51). The same torch function writes the same metadata."""
    import torch.export.exported_program as exported_program

    restore = getattr(exported_program, "_populate_param_buffer_metadata_to_new_gm", None)
    if restore is None:  # another torch: nothing to change
        yield
        return

    def restore_reading_once(params_buffers_to_node_meta, gm, new_sig):
        return restore(params_buffers_to_node_meta, gm, _NameMapsReadOnce(new_sig))

    with replaced_attribute(exported_program, "_populate_param_buffer_metadata_to_new_gm", restore_reading_once):
        yield


@contextlib.contextmanager
def specs_from_values_held() -> Iterator[None]:
    """While open, SpecPropPass (``to_executorch`` runs it on each method) takes each node's spec from the value it
    holds, on a copy of the method's graph, when ``holds_every_value``, instead of re-tracing the method to bring
    the values up to date first; a method with a node without one is re-traced as before. The copy's nodes get
    what the re-trace would give them besides: no tensor metadata for a fake value (``ExportPass``'s
    ``make_tensor_meta``), and the output node the values it returns. After our lowering, forward's values are
    what the re-trace makes them (tests/test_xnnpack_lowering.py: the same program, byte for byte); its re-trace
    took some 11 s of the 0.8B 8da4w export on a 2-core host (docs/benchmarks.md, run 48)."""
    import copy

    from executorch.exir.passes import spec_prop_pass
    from torch.fx.passes.infra.pass_base import PassResult
    from torch.utils import _pytree as pytree

    whole = spec_prop_pass.SpecPropPass.__call__

    class Copied:
        """Stands for the ``ExportPass()`` that SpecPropPass re-traces with: a new module on a copy of the graph
        (``to_executorch`` then moves the pass's module into the program's, so it must not be the same one)."""

        def __call__(self, graph_module):
            copied = torch.fx.GraphModule(graph_module, copy.deepcopy(graph_module.graph))
            copied.meta = graph_module.meta.copy()  # as ExportPass keeps it
            for node in copied.graph.nodes:
                if node.op == "output":
                    node.meta["val"] = pytree.tree_map_only(torch.fx.Node, lambda each: each.meta.get("val"),
                                                            node.args[0])
                if node.op in ("placeholder", "call_function", "output"):
                    node.meta["tensor_meta"] = pytree.tree_map(lambda _: None, node.meta["val"])
            return PassResult(copied, False)

    def call(self, graph_module):
        if not holds_every_value(graph_module):
            return whole(self, graph_module)
        with replaced_attribute(spec_prop_pass, "ExportPass", Copied):
            return whole(self, graph_module)

    with replaced_attribute(spec_prop_pass.SpecPropPass, "__call__", call):
        yield


@contextlib.contextmanager
def views_and_numbers_in_one_trace() -> Iterator[None]:
    """While open, the first re-trace of ExecuTorch's conversion to its edge dialect, torch's
    ``ReplaceViewOpsWithViewCopyOpsPass`` (each view op to its copying op), also does what ``ScalarToTensorPass``
    does a few passes later in a re-trace of its own (a Python number where an op takes a Tensor to a tensor
    constant). Both rewrite one node at a time from the op it calls, and none of the passes between them
    (``ReplaceSymSizeOpPass``, ``NormalizeTransposePass``, ``ReplaceBrokenOpsWithFunctionalOpsPass``) reads a
    number, so numbers made tensors earlier give the same graph; ``ScalarToTensorPass`` then finds none and is
    skipped (``edge_passes_where_applicable``; tests/test_xnnpack_lowering.py compares the bytes)."""
    import executorch.exir.program._program as program_module
    from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass
    from torch._export.passes.replace_view_ops_with_view_copy_ops_pass import (
        _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS,
        get_view_copy_of_view_op,
    )

    class ViewCopiesAndNumberTensors(ScalarToTensorPass):
        def call_operator(self, op, args, kwargs, meta):
            if op in _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS:
                op = _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS[op]
            elif isinstance(op, torch._ops.OpOverload):
                op = get_view_copy_of_view_op(op._schema) or op
            return super().call_operator(op, args, kwargs, meta)

    with replaced_attribute(program_module, "ReplaceViewOpsWithViewCopyOpsPass", ViewCopiesAndNumberTensors):
        yield


@contextlib.contextmanager
def edge_ops_and_dim_order_in_one_trace() -> Iterator[None]:
    """While open, ExecuTorch's last two steps into its edge dialect, ``OpReplacePass`` (each ATen op to its edge
    op) and ``MemoryFormatOpsPass`` (the edge ops that take a memory format to those that take a dim order), run
    as one re-trace where they were two: each rewrites one node at a time from what the node calls and reads,
    so rewriting each node by both in turn gives the graph the two passes give (tests/test_xnnpack_lowering.py
    compares the bytes). Where ExecuTorch asks for the second after the first has run, it gets the second."""
    import executorch.exir.program._program as program_module
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge, should_lower_to_edge
    from torch.fx.passes.infra.pass_base import PassResult

    class EdgeOpsWithDimOrder(MemoryFormatOpsPass):
        def __init__(self) -> None:
            super().__init__()
            self.dim_order = False  # set when ExecuTorch asks for MemoryFormatOpsPass before this has run
            self.ran = False

        def call_operator(self, op, args, kwargs, meta):
            if should_lower_to_edge(op):
                op = aten_to_edge(op)
            if self.dim_order:
                return super().call_operator(op, args, kwargs, meta)
            return ExportPass.call_operator(self, op, args, kwargs, meta)

        def call(self, graph_module):
            self.ran = True
            return super().call(graph_module)

    made: list = []

    def op_replace_pass():
        made.append(EdgeOpsWithDimOrder())
        return made[-1]

    def memory_format_ops_pass():
        if made and not made[-1].ran and not made[-1].dim_order:
            made[-1].dim_order = True
            return lambda graph_module: PassResult(graph_module, False)
        return MemoryFormatOpsPass()

    with replaced_attribute(program_module, "OpReplacePass", op_replace_pass), \
            replaced_attribute(program_module, "MemoryFormatOpsPass", memory_format_ops_pass):
        yield


def torchao_quantization_ops() -> dict:
    """{op: torchao's Python body} of the quantization ops our XNNPACK programs hold: a dynamically quantized
    linear's activations, and the 8-bit weights of the table and linears."""
    import torchao.quantization.quant_primitives  # noqa: F401 (defines the ops)
    from torch._inductor.decomposition import decompositions  # where torchao registers each op's body

    ops = torch.ops.torchao
    wanted = (ops.choose_qparams_affine.default, ops.quantize_affine.default, ops.dequantize_affine.default)
    return {op: decompositions[op] for op in wanted if op in decompositions}


_QUANTIZED_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAPPINGS = ("SYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR", "ASYMMETRIC")


def quantization_outputs_by_shape(op, body, mode, args, kwargs):
    """What torchao's ``body`` of ``op`` returns for fake inputs, made by ``mode`` from their shapes alone (each
    output contiguous, as torchao's code leaves it); None for a form this does not cover, which torchao's code
    then runs for."""
    import inspect

    from torchao.quantization.quant_primitives import _get_reduction_params

    try:
        bound = inspect.signature(body).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    given = bound.arguments
    x = given["input"]
    if not isinstance(x, torch.Tensor):
        return None
    name = op.name()
    if name == "torchao::quantize_affine":
        if x.dtype not in _FLOAT_DTYPES or given["output_dtype"] not in _QUANTIZED_DTYPES:
            return None
        shapes, dtypes = [x.shape], [given["output_dtype"]]
    elif name == "torchao::dequantize_affine":
        if x.dtype != given["input_dtype"] or given["output_dtype"] not in _FLOAT_DTYPES:
            return None
        shapes, dtypes = [x.shape], [given["output_dtype"]]
    else:  # choose_qparams_affine: min and max over each block, so one value a block
        block = list(given["block_size"])
        if x.dtype not in _FLOAT_DTYPES or given["mapping_type"] not in _MAPPINGS or len(block) != x.dim():
            return None
        if given["keepdim"]:
            shape = [size // step for size, step in zip(x.shape, block)]
        else:
            reduced, dims = _get_reduction_params(block, x.size())
            shape = [size for dim, size in enumerate(reduced) if dim not in dims]
        # The zero point is made in the input's dtype (int32 for an asymmetric mapping) unless one is given.
        zero_dtype = given["zero_point_dtype"] or (torch.int32 if given["mapping_type"] == "ASYMMETRIC" else x.dtype)
        shapes, dtypes = [shape, shape], [given["scale_dtype"] or x.dtype, zero_dtype]
    with mode:
        made = tuple(torch.empty(shape, dtype=dtype, device=x.device) for shape, dtype in zip(shapes, dtypes))
    return made if len(made) > 1 else made[0]


@contextlib.contextmanager
def quantization_ops_by_shape() -> Iterator[None]:
    """While open, torchao's quantization ops called on fake tensors make their outputs from the inputs' shapes
    (``quantization_outputs_by_shape``); real tensors run torchao's code as before.

    Torchao registers each op's Python body as its CompositeImplicitAutograd kernel, and that body is what a fake
    call ran: a dozen views, reductions and roundings on symbolic sizes, in the program's trace, its
    decomposition and each of ExecuTorch's passes that re-trace it, for each of a 0.8B program's 300 or so such
    nodes. Those calls were about a third of the 0.8B 8da4w export's time (docs/benchmarks.md, run 49). A call
    reaches the fake tensors' mode where torch.export has put its own kernel before torchao's (tracing and
    decomposing), and runs the autograd kernel for the CPU first where nothing has (ExecuTorch's passes): both
    lead here. The outputs' shapes, dtypes and strides are torchao's own for every form our programs hold
    (tests/test_xnnpack_lowering.py compares them, and the programs' bytes)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    bodies = torchao_quantization_ops()
    dispatch = FakeTensorMode._dispatch_impl

    def dispatch_by_shape(mode, func, types, args, kwargs):
        if func in bodies:
            made = quantization_outputs_by_shape(func, bodies[func], mode, args, kwargs)
            if made is not None:
                return made
        return dispatch(mode, func, types, args, kwargs)

    def autograd_kernel(op, body):
        def kernel(*args, **kwargs):
            x = args[0] if args else kwargs.get("input")
            if isinstance(x, FakeTensor):
                made = quantization_outputs_by_shape(op, body, x.fake_mode, args, kwargs)
                if made is not None:
                    return made
            return body(*args, **kwargs)

        return kernel

    def forget_resolved_kernels():
        # The Python dispatcher (torch.export's) keeps the kernel it found for each key: one found before the
        # autograd kernel was registered, or after it was removed, would outlive the change.
        for op in bodies:
            op._dispatch_cache.clear()

    library = torch.library.Library("torchao", "IMPL")
    try:
        for op, body in bodies.items():
            library.impl(op.name().split("::")[1], autograd_kernel(op, body), "AutogradCPU")
        forget_resolved_kernels()
        with replaced_attribute(FakeTensorMode, "_dispatch_impl", dispatch_by_shape):
            yield
    finally:
        library._destroy()
        forget_resolved_kernels()


def _graph_state(graph) -> tuple:
    """What a GraphModule's generated code follows: each node in order, with its op, target and arguments."""
    return tuple((node, node.op, node.target, node.args, node.kwargs) for node in graph.nodes)


@contextlib.contextmanager
def unchanged_submodules_not_recompiled() -> Iterator[None]:
    """While ExecuTorch creates a method's partitions, the method's GraphModule is recompiled once, at the end,
    where ExecuTorch recompiled it after each partition; and a recompile recompiles only the submodules whose
    graph changed since their own last compile (``_graph_state``)."""
    from torch.fx import GraphModule

    import executorch.exir.backend.backend_api as backend_api

    recompile = GraphModule.recompile
    create_partitions = backend_api._create_partitions_in_graph_module
    compiled: dict[int, tuple] = {}  # id(submodule) -> (submodule, its graph's state at its last compile)

    def changed_submodules(self):
        results = []
        for name, child in self.named_children():
            if not isinstance(child, GraphModule):
                continue
            state = _graph_state(child.graph)
            last = compiled.get(id(child))
            if last is not None and last[0] is child and last[1] == state:
                continue
            results.append((name, recompile(child)))
            compiled[id(child)] = (child, state)
        return results

    def creating_partitions(method, *args, **kwargs):
        deferred = []

        def later_for_the_method(self):
            if self is method:
                deferred.append(self)
                return None
            return recompile(self)

        with replaced_attribute(GraphModule, "_recompile_submodules", changed_submodules):
            try:
                with replaced_attribute(GraphModule, "recompile", later_for_the_method):
                    return create_partitions(method, *args, **kwargs)
            finally:
                if deferred:
                    method.recompile()
                compiled.clear()

    with replaced_attribute(backend_api, "_create_partitions_in_graph_module", creating_partitions):
        yield


class DownstreamBits:
    """Which nodes of a graph lead from each node, what ``_DependencyViewer`` of ExecuTorch's group
    partitioner holds as sets, held as the bits of one integer a node (bit i: the graph's i-th node). A set
    costs 30 to 60 bytes a member, and most nodes of a program lead to most of the nodes after them; the
    bits cost one bit. Only ``merges_checked_on_sets``'s merge check asks it, on the bits: the partitioner
    asks nothing else of its viewer."""

    def __init__(self, graph_module) -> None:
        self.nodes = list(graph_module.graph.nodes)
        self.position = {node: index for index, node in enumerate(self.nodes)}
        self.bits: dict = {}
        for node in reversed(self.nodes):  # a graph's nodes are in topological order: users come later
            downstream = 0
            for user in node.users:
                downstream |= self.bits.get(user, 0) | (1 << self.position[user])
            self.bits[node] = downstream

    def mask(self, nodes) -> int:
        """The bits of ``nodes`` (nodes added to the graph after this was built have none), set in a byte array:
        or-ing each node's bit into an integer would copy the integer each time."""
        bits = bytearray(len(self.nodes) // 8 + 1)
        for node in nodes:
            index = self.position.get(node)
            if index is not None:
                bits[index >> 3] |= 1 << (index & 7)
        return int.from_bytes(bits, "little")


class _NotBuilt:
    """Stands for the dependency viewer torch's partitioner builds for a group partitioner, which replaces it
    with its own before asking it anything."""

    def __init__(self, graph_module) -> None:
        pass


@contextlib.contextmanager
def merges_checked_on_sets() -> Iterator[None]:
    """While open, ExecuTorch's group partitioner (XNNPACK's) keeps each node's downstream nodes as bits
    (``DownstreamBits``), and asks whether two partitions may merge by intersecting bits.

    A merge is refused when a node outside both partitions, fed by one of them, leads back into either.
    ExecuTorch tests that by walking each such node's downstream set (often most of the graph) one node at a
    time: 196 million membership tests for the 0.8B program. The same question, asked as whether that
    node's bits and the merged partition's intersect, is one operation on integers; the answer, and so every
    partition, is the same. The final cycle check on the graph's edges (torch's ``validate_partition``) stays."""
    import torch.fx.passes.infra.partitioner as torch_partitioner
    from executorch.exir.backend.canonical_partitioners import group_partitioner
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import validate_partition

    built = GroupBasedPartitioner.__init__

    def init(self, *args, **kwargs) -> None:
        with replaced_attribute(torch_partitioner, "_DependencyViewer", _NotBuilt):
            built(self, *args, **kwargs)

    def can_merge(self, first, second, partitions_by_id) -> bool:
        merged = set(partitions_by_id[first].nodes) | set(partitions_by_id[second].nodes)
        viewer = self.dependency_viewer
        mask = viewer.mask(merged)
        if any(viewer.bits.get(user, 0) & mask for node in merged for user in node.users if user not in merged):
            return False
        return validate_partition(list(merged))

    with replaced_attribute(group_partitioner, "_DependencyViewer", DownstreamBits), \
            replaced_attribute(GroupBasedPartitioner, "__init__", init), \
            replaced_attribute(GroupBasedPartitioner, "_can_merge_partitions", can_merge):
        yield


def op_names(exported_program) -> set[str]:
    """The names (``aten.cat.default``) of the ops a partition calls."""
    return {
        getattr(node.target, "__name__", str(node.target))
        for node in exported_program.graph.nodes
        if node.op == "call_function"
    }


def _sets_custom_meta(graph_module) -> bool:
    """What PropagateCustomMetaPass does: a quantize or dequantize node whose input node has ``meta["custom"]``,
    which the pass copies onto it."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    return any(
        (is_quant(node) or is_dequant(node)) and node.args and isinstance(node.args[0], torch.fx.Node)
        and "custom" in node.args[0].meta
        for node in graph_module.graph.nodes
    )


def _computes_from_constants_alone(graph_module) -> bool:
    """What ConstPropPass folds: an op none of whose inputs is a value of the graph (only literals and get_attr
    tensors). It re-traces the partition to find them; our partitions hold none."""
    return any(
        node.op == "call_function" and all(each.op == "get_attr" for each in node.all_input_nodes)
        for node in graph_module.graph.nodes
    )


# pass (its class name) -> whether a partition holds what it works on, for passes that a table of ops cannot say.
PASS_APPLIES = {
    "PropagateCustomMetaPass": _sets_custom_meta,
    "ConstPropPass": _computes_from_constants_alone,
}


def applicable_passes(passes: list, names: set[str], graph_module=None) -> list:
    """``passes`` without those whose rewritten ops (``REWRITTEN_OPS``) are all absent from ``names``, and (given the
    partition's ``graph_module``) those of ``PASS_APPLIES`` that find nothing there."""
    return [
        each for each in passes
        if (each.__name__ not in REWRITTEN_OPS or names.intersection(REWRITTEN_OPS[each.__name__]))
        and (graph_module is None or each.__name__ not in PASS_APPLIES or PASS_APPLIES[each.__name__](graph_module))
    ]


@contextlib.contextmanager
def only_applicable_passes() -> Iterator[None]:
    """While open, XNNPACK's ``preprocess`` runs ``applicable_passes`` of its default list on each partition."""
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    whole_list_manager = preprocess.XNNPACKPassManager

    class ApplicablePassManager(whole_list_manager):
        def __init__(self, exported_program, passes=None):
            super().__init__(exported_program, passes)
            if not passes:  # an explicit list (a compile spec's) is the caller's choice: keep it
                self.passes = applicable_passes(self.passes, op_names(exported_program), exported_program.graph_module)

    with replaced_attribute(preprocess, "XNNPACKPassManager", ApplicablePassManager):
        yield


@contextlib.contextmanager
def preprocess_sharing_weights() -> Iterator[None]:
    """While open, XNNPACK's ``preprocess`` gets each partition as ``copy_sharing_weights`` makes it."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from gdn_export.lowering import copy_sharing_weights

    sharing = classmethod(lambda cls, edge_program, compile_specs: copy_sharing_weights(edge_program))
    with replaced_attribute(XnnpackBackend, "copy_exported_program_for_preprocess", sharing):
        yield


def exclusive_storages(tagged_program, storage_of: dict) -> Optional[set]:
    """The data pointers of the parameter storages that nodes of one partition alone use in ``tagged_program``
    (a partitioner's result: fake tensors, nodes tagged with ``delegation_tag``), found through
    ``storage_of`` ({parameter FQN: data pointer}, read from the real program before partitioning); None when a
    parameter of ``tagged_program`` is not in ``storage_of`` (one the partitioner made, such as ExecuTorch's copy
    of a weight that two partitions share), whose storage cannot be told apart from the others'. Buffers and
    lifted constants (small, and some made by decomposing) are never freed."""
    tags: dict = {}
    parameters = tagged_program.graph_signature.inputs_to_parameters
    for node in tagged_program.graph.nodes:
        fqn = parameters.get(node.name) if node.op == "placeholder" else None
        if fqn is None:
            continue
        if fqn not in storage_of:
            return None
        # The placeholder's own tag and its users': XNNPACK tags a linear's weight with the linear's partition
        # even when an op outside also reads it (a tied table), and ExecuTorch then gives that op a copy.
        found = tags.setdefault(storage_of[fqn], set())
        found.update(holder.meta.get("delegation_tag") for holder in (node, *node.users))
    return {pointer for pointer, found in tags.items() if len(found) == 1 and None not in found}


@contextlib.contextmanager
def weights_freed_once_serialized() -> Iterator[None]:
    """While open, and while ``gdn_export.lowering.freeing_weights()``, the weights that one XNNPACK partition
    alone uses are freed once its ``preprocess`` has serialized them.

    A partition's program holds the model's tensors, and XNNPACK copies each into its payload (``bytes``), so the
    model's copy is freed with them: a 4B 8da4w export held the model's unpacked 4-bit weights (one byte each)
    beside XNNPACK's packed ones until its end. Which weights one partition alone uses is read off the
    partitioner's tags (``exclusive_storages``); the partitioner sees fake tensors, so the storages behind the
    parameters' names are read from the real program that ``ops_to_not_decompose`` is given first. A program
    whose parameters cannot all be traced to a storage frees nothing."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from gdn_export.lowering import free_storages, freeing_weights, return_freed_memory, weight_storages

    storage_of: dict = {}
    exclusive: set = set()
    ops_to_not_decompose = OneDecompositionXnnpackPartitioner.ops_to_not_decompose
    partition = OneDecompositionXnnpackPartitioner.partition
    preprocess = XnnpackBackend.preprocess

    def ops_recording(self, exported_program):
        if freeing_weights():
            for fqn in exported_program.graph_signature.parameters:
                for storage in weight_storages([exported_program.state_dict.get(fqn)]):
                    storage_of.setdefault(fqn, storage.data_ptr())
        return ops_to_not_decompose(self, exported_program)

    def partition_recording(self, exported_program):
        result = partition(self, exported_program)
        if freeing_weights():
            found = exclusive_storages(result.tagged_exported_program, storage_of)
            exclusive.update(found or ())
        return result

    def preprocess_freeing(edge_program, compile_specs):
        result = preprocess(edge_program, compile_specs)
        if freeing_weights():
            owned = [edge_program.state_dict.get(fqn) for fqn in edge_program.graph_signature.parameters]
            if free_storages(storage for storage in weight_storages(owned) if storage.data_ptr() in exclusive):
                return_freed_memory()
        return result

    with replaced_attribute(OneDecompositionXnnpackPartitioner, "ops_to_not_decompose", ops_recording), \
            replaced_attribute(OneDecompositionXnnpackPartitioner, "partition", partition_recording), \
            replaced_attribute(XnnpackBackend, "preprocess", staticmethod(preprocess_freeing)):
        yield
