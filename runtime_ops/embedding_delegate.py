"""The 8-bit token embedding as a delegate that reads its table from the program's named data.

With tied embeddings the quantized table is needed twice: by the embedding
lookup and by the output head. XNNPACK keeps the head's int8 weight (one fp32
scale per row, symmetric) in the program's named data, which ExecuTorch
stores once per distinct content (``NamedDataStore``); ExecuTorch's own
``embedding_byte`` kernel reads its table from the program's constants
instead, so the table was stored twice. A program's kernels cannot read the
named data (in ExecuTorch 1.5.1 a constant outside the constant segment must
come from a ``.ptd`` file); a delegate can. So ``GdnEmbeddingPartitioner``
hands each 8-bit row-wise table lookup (torchao's ``dequantize_affine`` into
``aten.embedding``) to the ``GdnEmbeddingBackend`` delegate, whose
``preprocess`` puts the table and its scales in the named data: when they are
the head's bytes (tied embeddings, ``8da8w``) the program holds them once. Its
runtime, ``executorch_embedding_backend.cpp``, is in ``libgdn_runtime_ops.so``.

Tables quantized otherwise (4-bit groups, a block other than one row, a
non-float32 scale or output) are left to ExecuTorch's kernels. Zero points
are read only in ``preprocess``: a partitioner sees fake tensors (ExecuTorch's
``to_backend``), so it cannot tell a symmetric table from an asymmetric one,
and ``preprocess`` refuses non-zero ones (``gdn_export.quantize`` makes none;
the runtime has no zero points) instead of lowering a wrong lookup.

The runtime checks every token against the table's rows, so a bad token id
fails the call instead of reading past the table.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

BACKEND_ID = "GdnEmbeddingBackend"
PAYLOAD_TAG = "gdn-embedding-v1"  # the payload's first word; the C++ runtime checks it
# Alignment of the blobs in the named data: XNNPACK's (CONSTANT_TENSOR_ALIGNMENT), so a shared blob keeps it.
ALIGNMENT = 16


def _constant(program, node) -> Optional[torch.Tensor]:
    from executorch.backends.transforms.utils import get_param_tensor, is_param_node

    if not isinstance(node, torch.fx.Node) or node.op != "placeholder" or not is_param_node(program, node):
        return None
    return get_param_tensor(program, node)


def int8_table_lookup(program, node: torch.fx.Node) -> Optional[tuple]:
    """``(dequantize node, table [rows, width] int8, scales [rows] float32, zero points or None)`` when
    ``node`` is an ``aten.embedding`` of an int8 table with one scale per row; else None.

    Reads dtypes and shapes only, since the partitioner sees fake tensors; ``preprocess`` checks the zero points.
    """
    if node.op != "call_function" or "aten.embedding.default" not in str(node.target):
        return None
    dequantize = node.args[0]
    if (
        not isinstance(dequantize, torch.fx.Node)
        or "torchao.dequantize_affine" not in str(dequantize.target)
        or len(dequantize.users) != 1
        or node.meta["val"].dtype != torch.float32
    ):
        return None
    arguments = dict(zip(("input", "block_size", "scale", "zero_point", "input_dtype", "quant_min", "quant_max",
                          "output_dtype"), dequantize.args))
    arguments.update(dequantize.kwargs)
    table, scales = _constant(program, arguments["input"]), _constant(program, arguments["scale"])
    zero_point_node = arguments.get("zero_point")
    zero_point = None if zero_point_node is None else _constant(program, zero_point_node)
    if table is None or scales is None or table.dtype != torch.int8 or table.dim() != 2:
        return None
    if zero_point_node is not None and zero_point is None:
        return None  # zero points computed in the graph: not a constant preprocess could check
    rows, width = table.shape
    if (
        list(arguments["block_size"]) != [1, width]
        or (arguments.get("quant_min"), arguments.get("quant_max")) != (-128, 127)
        or arguments.get("output_dtype", torch.float32) != torch.float32
        or scales.dtype != torch.float32
        or scales.numel() != rows
        or any(len(placeholder.users) != 1 for placeholder in dequantize.all_input_nodes)
    ):
        return None
    return dequantize, table, scales.reshape(rows), zero_point


class GdnEmbeddingPartitioner(Partitioner):
    """Tags each 8-bit row-wise embedding lookup (``int8_table_lookup``) for ``GdnEmbeddingBackend``."""

    def __init__(self):
        super().__init__()
        self.delegation_spec = DelegationSpec(BACKEND_ID, [])

    def partition(self, exported_program) -> PartitionResult:
        from executorch.exir.backend.utils import tag_constant_data

        tags = {}
        for node in exported_program.graph.nodes:
            found = int8_table_lookup(exported_program, node)
            if found is None:
                continue
            tag = f"gdn_embedding_{len(tags)}"
            for tagged in (found[0], node):
                tagged.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


class GdnEmbeddingBackend(BackendDetails):
    """Preprocess of one tagged lookup: the table and scales into the named data, their keys into the payload."""

    @classmethod
    def copy_exported_program_for_preprocess(cls, edge_program, compile_specs):
        from gdn_export.lowering import copy_sharing_weights

        # Preprocess only reads the table: ExecuTorch's default deep copy would be a second table.
        return copy_sharing_weights(edge_program)

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        from executorch.exir._serialize._named_data_store import NamedDataStore

        lookups = [found for node in edge_program.graph.nodes
                   if (found := int8_table_lookup(edge_program, node)) is not None]
        if len(lookups) != 1:
            raise ValueError(f"{BACKEND_ID}: expected one int8 table lookup in the partition, found {len(lookups)}")
        _, table, scales, zero_point = lookups[0]
        if zero_point is not None and bool(zero_point.any()):
            # gdn_export.quantize quantizes tables symmetrically; the runtime has no zero points.
            raise ValueError(f"{BACKEND_ID}: the embedding table has non-zero zero points (expected symmetric int8)")
        rows, width = table.shape
        store = NamedDataStore()
        keys = []
        for name, tensor in (("table", table), ("scales", scales)):
            data = tensor.detach().contiguous().numpy().tobytes()
            keys.append(f"gdn_embedding_{name}_{hashlib.sha256(data).hexdigest()}")
            store.add_named_data(keys[-1], data, alignment=ALIGNMENT)
        payload = f"{PAYLOAD_TAG} {rows} {width} {keys[0]} {keys[1]}".encode()
        return PreprocessResult(processed_bytes=payload, data_store_output=store.get_named_data_store_output())
