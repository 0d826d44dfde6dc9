"""The CUDA rewrite's graph: which gdn_cuda op a tiny Qwen3.5 exports with, and the lowering helpers.

Runs on the CPU: torch.export traces the triton_ops through their fake
implementations, so no GPU (and no Triton interpreter) is needed. The program
``export_qwen35 --backend cuda`` exports (decode and prefill methods) is checked
in tests/test_cuda_methods.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")  # the CUDA rewrite's ops are triton_ops

from tests.triton_interpreter import INTERPRETED, rerun_module  # noqa: E402

# torch.export cannot trace the interpreter's kernels (it would run them on fake
# tensors): under TRITON_INTERPRET=1 this module reruns itself without it.
if INTERPRETED:

    def test_graph_tests_without_the_interpreter():
        rerun_module(__file__, interpret=False)


directly = pytest.mark.skipif(INTERPRETED, reason="rerun without TRITON_INTERPRET by the test above")

from cuda_backend.lowering import CudaLoweringError, depthwise_conv1d_as_products, lower_to_cuda  # noqa: E402
from gdn_export.passes import rewrite  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, module_seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), key_head_dim=64, value_head_dim=64, seed=module_seed)


@pytest.fixture(scope="module")
def cuda_model(checkpoint):
    from gdn_export.loading import load_qwen35

    return rewrite(load_qwen35(checkpoint, max_seq_len=64), "cuda")


def _gdn_ops(model, length: int) -> list[str]:
    tokens = torch.randint(0, 300, (1, length))
    with torch.no_grad():
        program = torch.export.export(model, (tokens, torch.zeros(1, dtype=torch.long)), strict=False)
    # The linear layers' decode kernels aside (tests/test_cuda_methods.py counts them).
    return [str(node.target) for node in program.graph.nodes
            if "gdn" in str(node.target) and "linear" not in str(node.target)]


@directly
def test_decode_export_holds_the_fused_decode_op(cuda_model):
    ops = _gdn_ops(cuda_model, 1)
    # One per linear-attention layer, then the full-attention layer's.
    assert ops == ["gdn_cuda.fused_recurrent_gated_delta_rule.default"] * 2 + ["gdn_cuda.cached_attention.default"], ops


@directly
def test_prefill_export_holds_the_chunked_op(cuda_model):
    ops = _gdn_ops(cuda_model, 5)
    assert ops == ["gdn_cuda.fused_chunked_gated_delta_rule.default"] * 2 + ["gdn_cuda.cached_attention.default"], ops


@directly
def test_rewrite_for_cuda_gives_the_triton_recurrence(cuda_model):
    from cuda_backend.recurrence import CudaFusedRecurrence

    layers = [m for m in cuda_model.modules() if hasattr(m, "recurrence")]
    assert layers and all(type(m.recurrence) is CudaFusedRecurrence for m in layers)


@directly
def test_depthwise_conv1d_decomposition_matches_conv1d(generator):
    channels = 12
    x = torch.randn(2, channels, 9, generator=generator)
    weight = torch.randn(channels, 1, 4, generator=generator)
    bias = torch.randn(channels, generator=generator)
    expected = F.conv1d(x, weight, bias, groups=channels)
    actual = depthwise_conv1d_as_products(x, weight, bias, [1], [0], [1], False, [0], channels)
    assert torch.allclose(actual, expected, atol=1e-5)
    # Any other convolution is left to the default lowering.
    assert depthwise_conv1d_as_products(x, weight.repeat(1, 2, 1)[:6], None, [1], [0], [1], False, [0], 6) \
        is NotImplemented


@directly
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised on machines without CUDA")
def test_lowering_without_cuda_raises_a_clear_error():
    with pytest.raises(CudaLoweringError, match="no CUDA device"):
        lower_to_cuda(None)
