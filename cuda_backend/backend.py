"""The ``cuda`` backend: Triton kernels compiled into the program by ExecuTorch's CudaBackend."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cuda_backend.kernels import SUPPORTED_HEAD_DIMS
from gdn_export.backends import Backend


class CudaTritonBackend(Backend):
    name = "cuda"
    summary = "NVIDIA GPU: Triton kernels inside ExecuTorch's CudaBackend (AOTInductor); weights in a .ptd"
    head_dims = SUPPORTED_HEAD_DIMS
    writes_data_files = True
    default_dtype = "bf16"  # the recurrent state stays fp32 (gdn_export.loading)
    delegate_ids = ("CudaBackend",)

    def unavailable_reason(self) -> Optional[str]:
        from cuda_backend.lowering import CudaLoweringError, check_lowering_prerequisites

        try:
            check_lowering_prerequisites()
        except CudaLoweringError as error:
            return str(error)
        return None

    def recurrence(self) -> nn.Module:
        from cuda_backend.recurrence import CudaFusedRecurrence

        return CudaFusedRecurrence()

    def attention(self, layer) -> Optional[nn.Module]:
        from cuda_backend.attention import CudaCachedAttention

        return CudaCachedAttention()

    def merged_linears(self, layer: nn.Module) -> list[tuple[str, ...]]:
        """The projections each layer makes of one input, as one product: at one token each is a launch of its
        own, and a decode step's small kernels cost launches more than bytes."""
        from cuda_backend.attention import ATTENTION_PROJECTIONS
        from cuda_backend.recurrence import INPUT_PROJECTIONS
        from gdn_export.models.qwen35 import GatedAttention, GatedDeltaNet

        # The MLP's gate/up are merged by its own module (``mlp``).
        siblings = {GatedDeltaNet: INPUT_PROJECTIONS, GatedAttention: ATTENTION_PROJECTIONS}
        return [siblings[type(layer)]] if type(layer) in siblings else []

    def mlp(self, layer: nn.Module) -> Optional[nn.Module]:
        from cuda_backend.linear import GatedMLP

        return GatedMLP(layer)

    def linear(self, layer: nn.Linear) -> Optional[nn.Module]:
        from cuda_backend.linear import DecodeLinear

        return DecodeLinear.sharing(layer)

    def finish_rewrite(self, model: nn.Module) -> None:
        """Each decoder layer's RMSNorms into the one product that reads each: the mixer's merged projections
        (Gated DeltaNet's and attention's read their normed input nowhere else) and a ``GatedMLP``'s gate/up;
        at one token the product's kernel normalizes its input, one launch fewer a norm. A sparse MoE's norm,
        read by its router and experts, stays. And each layer's residual adds go into the products that end its
        mixer and its MLP (``ResidualInProducts``). Gated DeltaNet layers take their one-token calls through
        ``gdn_cuda::decode_gated_delta_net`` (``DecodeGatedDeltaNet``), full-attention layers theirs through
        ``gdn_cuda::decode_attention_inputs`` (``DecodeGatedAttention``)."""
        from cuda_backend.attention import DecodeGatedAttention
        from cuda_backend.linear import DecodeLinear, GatedMLP
        from cuda_backend.recurrence import DecodeGatedDeltaNet
        from gdn_export.models.qwen35 import DecoderLayer, GatedAttention, GatedDeltaNet
        from gdn_export.passes.layer_fusion import ResidualInProducts, output_projection, take_input_norm
        from gdn_export.passes.linear_groups import LinearGroup

        for layer in model.modules():
            if not isinstance(layer, DecoderLayer):
                continue
            mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
            groups = [child for child in mixer.children() if isinstance(child, LinearGroup)]
            if len(groups) == 1:
                take_input_norm(layer, "input_layernorm", [groups[0].projection])
            if isinstance(layer.mlp, GatedMLP):
                take_input_norm(layer, "post_attention_layernorm", [layer.mlp.gate_up_proj])
            if isinstance(output_projection(mixer), DecodeLinear):
                layer.__class__ = ResidualInProducts
            # rewrite merged each mixer's projections, made its output projection a DecodeLinear and (attention)
            # gave it CudaCachedAttention.
            if type(mixer) is GatedDeltaNet:
                mixer.__class__ = DecodeGatedDeltaNet
            elif type(mixer) is GatedAttention:
                DecodeGatedAttention.taking(mixer, model.config)

    def export_methods(self, model, prefill_chunk: int) -> dict[str, torch.export.ExportedProgram]:
        """``decode`` and ``prefill``, as ExecuTorch's own Qwen3.5 CUDA export has them.

        * ``decode(tokens [1, 1], input_pos [1])``: T is static, so each Gated
          DeltaNet layer holds ``gdn_cuda::decode_gated_delta_net`` (its conv and
          gates, then the per-token kernel).
        * ``prefill(tokens [1, T], input_pos [1])`` with T dynamic from 2 to
          ``prefill_chunk``: ``gdn_cuda::prefill_gated_delta_net`` (its conv and
          gates, then the chunked kernels). Traced at T = ``prefill_chunk``. Left
          out when ``prefill_chunk`` is 1.

        Both update the model's state buffers (KV caches, conv and recurrent
        states) in place; the runtime shares them between the methods by name
        (``cuda_backend.executorch_runtime.prepare_for_programs``).
        """
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        input_pos = torch.zeros(1, dtype=torch.long)
        methods = {}
        with torch.no_grad():
            methods["decode"] = torch.export.export(
                model, (torch.zeros(1, 1, dtype=torch.long), input_pos), strict=False
            )
            if prefill_chunk >= 2:
                tokens = torch.zeros(1, prefill_chunk, dtype=torch.long)
                # A range of one length is that length, static (torch.export refuses min == max).
                shapes = ({1: torch.export.Dim("prefill_tokens", min=2, max=prefill_chunk)}, None) \
                    if prefill_chunk > 2 else None
                methods["prefill"] = torch.export.export(
                    model, (tokens, input_pos), dynamic_shapes=shapes, strict=False
                )
        return methods

    def lower(self, programs: dict, metadata: dict):
        from cuda_backend.lowering import lower_to_cuda

        return lower_to_cuda(programs, metadata=metadata)

    def load_runtime(self) -> None:
        """ExecuTorch's CUDA runtime (built by ``make cuda-runtime``), its methods sharing their states."""
        from cuda_backend.executorch_runtime import prepare_for_programs

        prepare_for_programs()

    def conformance_implementations(self) -> list:
        from cuda_backend.conformance import IMPLEMENTATIONS

        return IMPLEMENTATIONS


CUDA = CudaTritonBackend()
