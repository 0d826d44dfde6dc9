"""The CPU backends, ``portable`` and ``xnnpack``: our C++ kernels beside ExecuTorch's.

Both give each float32 Gated DeltaNet layer ``gdn::conv_gated_delta_rule`` (its
conv, gates and recurrence; others ``gdn::gated_delta_rule_inplace``) and
``gdn::gated_rms_norm`` (the norm after them), and each
float32 full-attention layer ``gdn::gated_attention`` (its norms, rotations,
cache writes, attention and gate, on ``gdn::cached_attention``'s kernel), whose kernels this
package builds and ``import gdn_export`` loads (the ``gdn_export.kernels``
entry point). XNNPACK also takes the linear layers (float, 8da4w, 8da8w and
int8wo) into its delegate, but 16da8w's and 8da4w_avx2's, which run on our
``gdn::grouped_int8_linear`` (XNNPACK has no kernel for int8 weights in groups)
and ``gdn::grouped_int4_linear`` (its 4-bit kernels widen to 16 bits on x86
without VNNI); portable leaves every op to ExecuTorch's portable kernels.
Quantized embeddings run on ExecuTorch's ``quantized_decomposed`` kernels in both.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from gdn_export.backends import Backend
from gdn_export.passes import (CachedAttentionOp, InplaceOpRecurrence, give_attention_layers_the_op,
                               give_gated_norms_the_op, give_layers_the_conv_op)
from gdn_export.state_methods import STATE_METHODS, export_state_methods


class CpuBackend(Backend):
    state_dtypes = ("float32", "float16")  # gdn::conv_gated_delta_rule keeps either

    def recurrence(self) -> nn.Module:
        return InplaceOpRecurrence()

    def attention(self, layer) -> Optional[nn.Module]:
        # The C++ attention kernel reads float32 caches; caches of other dtypes keep the masked form.
        return CachedAttentionOp() if layer.k_cache.dtype == torch.float32 else None

    def finish_rewrite(self, model: nn.Module) -> None:
        """Each Gated DeltaNet layer's conv, gates and recurrence as one C++ op (``ConvOpGatedDeltaNet``), and the
        norm after them as another (``GatedRMSNormOp``); each float32 full-attention layer's work between its
        projections as one (``GatedAttentionOp``)."""
        give_layers_the_conv_op(model)
        give_gated_norms_the_op(model)
        give_attention_layers_the_op(model)

    def partitioners(self, method: str) -> list:
        return []

    def edge_partitioners(self, method: str) -> list:
        return []

    def export_methods(self, model, prefill_chunk: int) -> dict:
        # forward, and the methods that read and write its state (snapshots, prompt cache, chat).
        return {**super().export_methods(model, prefill_chunk), **export_state_methods(model)}

    def lower(self, programs: dict, metadata: dict):
        from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

        from gdn_export.lowering import lower_programs

        return lower_programs(
            programs, metadata=metadata, partitioners=self.partitioners, edge_partitioners=self.edge_partitioners,
            # Bounds from the dynamic T's constraint size the memory plan; the in-place ops stay in place.
            sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(), run_reinplace_pass=True,
            # XNNPACK's serializer and our embedding delegate copy their weights' bytes when they preprocess.
            share_mutable_buffers=True, free_delegated=True,
        )

    def conformance_implementations(self) -> list:
        from runtime_ops.conformance import IMPLEMENTATIONS

        return IMPLEMENTATIONS


class XnnpackBackend(CpuBackend):
    name = "xnnpack"
    summary = "CPU: XNNPACK runs the linear layers (float, 8da4w, 8da8w, int8), our C++ kernels the rest"
    quantizations = ("none", "8da4w", "8da4w_avx2", "8da8w", "int8wo", "16da8w")
    # runtime_ops/embedding_delegate.py: its runtime is in our kernel library.
    delegate_ids = ("GdnEmbeddingBackend",)

    def load_runtime(self) -> None:
        from gdn_export.backends import RuntimeUnavailable
        from runtime_ops.loader import RuntimeOpsUnavailable, load

        try:
            load()
        except RuntimeOpsUnavailable as error:
            raise RuntimeUnavailable(str(error)) from None

    def merged_linears(self, layer: nn.Module) -> list[tuple[str, ...]]:
        """A layer's projections of its input as one product per kind of our grouped linears (``16da8w``'s int8,
        ``8da4w_avx2``'s 4-bit and 8-bit gates) and group, which run outside XNNPACK: each call rounds its input and
        passes the threadpool once, so a 0.8B 16da8w step makes 96 calls instead of 186 (about 4% of a decode
        step, docs/benchmarks.md). XNNPACK's own linears stay apart: the merged output's split, at a dynamic T,
        would end their partitions."""
        from gdn_export.models.qwen35 import MLP, GatedAttention, GatedDeltaNet
        from gdn_export.quantize import GroupedLinear

        if type(layer) not in (GatedDeltaNet, GatedAttention, MLP):
            return []
        kinds: dict = {}  # (class, group) -> names, in the layer's order
        for name in layer.INPUT_PROJECTIONS:
            linear = getattr(layer, name)
            if isinstance(linear, GroupedLinear):
                kinds.setdefault((type(linear), linear.group), []).append(name)
        return [tuple(names) for names in kinds.values() if len(names) > 1]

    def finish_rewrite(self, model: nn.Module) -> None:
        """Each decoder layer's norms and residual adds into its grouped linears where those read and end its
        mixer and MLP (``16da8w``, ``8da4w_avx2``; ``gdn_export.passes.layer_fusion``): each was a delegate call
        of a few XNNPACK ops. The other norms' means in the form XNNPACK delegates (``runtime_ops.norms``):
        fewer, larger partitions; int8wo's biases added after their linears, which XNNPACK then takes
        (``runtime_ops.xnnpack_weight_only``)."""
        from gdn_export.passes.layer_fusion import fuse_norms_and_residuals
        from runtime_ops.norms import pool_norm_means
        from runtime_ops.xnnpack_weight_only import biases_added_after

        super().finish_rewrite(model)
        fuse_norms_and_residuals(model)
        pool_norm_means(model)
        biases_added_after(model)

    def export_methods(self, model, prefill_chunk: int) -> dict:
        from runtime_ops.xnnpack_lowering import quantization_ops_by_shape

        # torchao's quantization ops are traced from their shapes (their code runs on the weights alone).
        with quantization_ops_by_shape():
            return super().export_methods(model, prefill_chunk)

    def lower(self, programs: dict, metadata: dict):
        from runtime_ops.xnnpack_lowering import (
            decomposed_once,
            edge_ops_and_dim_order_in_one_trace,
            edge_passes_where_applicable,
            functional_programs_kept,
            merges_checked_on_sets,
            metadata_restored_in_one_read,
            only_applicable_passes,
            portable_dim_order_legalized_where_needed,
            preprocess_sharing_weights,
            quantization_ops_by_shape,
            specs_from_values_held,
            unchanged_submodules_not_recompiled,
            views_and_numbers_in_one_trace,
            weights_freed_once_serialized,
        )

        # Each skips work that changes nothing in our programs (runtime_ops/xnnpack_lowering.py): torchao's
        # quantization code run on fake tensors, XNNPACK's passes for ops our partitions never hold, a copy of every
        # weight for them, a re-trace only to make a method functional (forward's, and the second of each state
        # method's two), edge and to_executorch passes with nothing to rewrite (and two pairs that each run as
        # one), forward's re-trace before its specs, the method's code regenerated after each of its partitions,
        # merge checks walked node by node, and a signature's name maps made for each placeholder that a
        # decomposition restores. With the export's collector thresholds (gdn_export.export) they took the 0.8B
        # 8da4w export from 272 s to about 100 s on one host, same bytes (docs/benchmarks.md).
        with quantization_ops_by_shape(), metadata_restored_in_one_read():
            decomposed = decomposed_once(programs, self.partitioners)
            ready = [program for name, program in decomposed.items() if program is not programs[name]]
            with only_applicable_passes(), preprocess_sharing_weights(), functional_programs_kept(ready), \
                    edge_passes_where_applicable(), views_and_numbers_in_one_trace(), \
                    edge_ops_and_dim_order_in_one_trace(), portable_dim_order_legalized_where_needed(), \
                    unchanged_submodules_not_recompiled(), merges_checked_on_sets(), weights_freed_once_serialized(), \
                    specs_from_values_held():
                return super().lower(decomposed, metadata)

    def partitioners(self, method: str) -> list:
        from runtime_ops.xnnpack_lowering import OneDecompositionXnnpackPartitioner
        from runtime_ops.xnnpack_weight_only import CONFIGS

        # The state methods only copy buffers: ExecuTorch's portable kernels do that. XNNPACK's configs take
        # int8wo's linears too (runtime_ops/xnnpack_weight_only.py).
        return [] if method in STATE_METHODS else [OneDecompositionXnnpackPartitioner(configs=CONFIGS)]

    def edge_partitioners(self, method: str) -> list:
        from runtime_ops.embedding_delegate import GdnEmbeddingPartitioner

        # An 8-bit embedding table goes to our delegate, which shares the tied output head's bytes with XNNPACK.
        return [] if method in STATE_METHODS else [GdnEmbeddingPartitioner()]


class PortableBackend(CpuBackend):
    name = "portable"
    summary = "CPU: ExecuTorch's portable kernels and ours, no delegate"
    quantizations = ("none", "int8wo")

    def finish_rewrite(self, model: nn.Module) -> None:
        """int8wo's linears in the form the portable kernels run: the weight widened at each call."""
        from gdn_export.quantize import widen_weight_only_linears

        super().finish_rewrite(model)
        widen_weight_only_linears(model)


XNNPACK = XnnpackBackend()
PORTABLE = PortableBackend()
