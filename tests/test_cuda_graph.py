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

from cuda_backend.lowering import (  # noqa: E402
    CudaLoweringError,
    depthwise_conv1d_as_products,
    kernel_objects_per_name,
    known_inductor_settings,
    lower_to_cuda,
)
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
    # One per linear-attention layer (its conv, gates and recurrence), then the full-attention layer's two (its
    # norms, rotary embedding and cache writes; its attention).
    assert ops == ["gdn_cuda.decode_gated_delta_net.default"] * 2 + [
        "gdn_cuda.decode_attention_inputs.default", "gdn_cuda.cached_attention.default"], ops


@directly
def test_prefill_export_holds_the_chunked_op(cuda_model):
    ops = _gdn_ops(cuda_model, 5)
    # One per linear-attention layer: its conv and gates (one prologue kernel), then the chunked kernels.
    assert ops == ["gdn_cuda.prefill_gated_delta_net.default"] * 2 + ["gdn_cuda.cached_attention.default"], ops


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


@directly
def test_kernels_sharing_one_binary_get_object_files_of_their_own(tmp_path, seed):
    """Two kernel names with one binary: each object holds the binary's bytes under its own kernel's symbols.

    Without kernel_objects_per_name the second conversion overwrites the first's
    object, and AOTInductor's link lists one file twice (torch 2.11).
    """
    import subprocess

    import torch._inductor.codecache as codecache

    binary = tmp_path / "kernel.fatbin"
    payload = bytes(torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    binary.write_bytes(payload)
    convert = codecache.convert_cubin_to_obj
    names = ("decode_linear_kernel_3", "decode_linear_kernel_7")
    with kernel_objects_per_name():
        objects = [codecache.convert_cubin_to_obj(str(binary), name, "ld", "objcopy") for name in names]
    assert codecache.convert_cubin_to_obj is convert  # restored
    assert len(set(objects)) == 2, objects
    for name, obj in zip(names, objects):
        symbols = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        assert f"__{name}_start" in symbols and f"__{name}_end" in symbols, symbols
        data = tmp_path / f"{name}.bin"
        subprocess.run(["objcopy", "-O", "binary", "-j", ".rodata", obj, str(data)], check=True)
        assert data.read_bytes() == payload, f"seed {seed}"
    # Linked together, the two objects define each symbol once.
    subprocess.run(["ld", "-r", "-o", str(tmp_path / "both.o"), *objects], check=True)


@directly
def test_inductor_settings_this_torch_lacks_are_dropped():
    import torch._inductor.config as inductor_config

    settings = {"max_autotune_gemm": True, "triton.enable_persistent_tma_matmul": False,
                "triton.no_such_setting": 1, "no_such_group.max_autotune": 2}
    # The two real ones exist in every torch this project supports; the others in none.
    assert hasattr(inductor_config, "max_autotune_gemm") and hasattr(inductor_config.triton,
                                                                     "enable_persistent_tma_matmul")
    assert known_inductor_settings(settings) == {"max_autotune_gemm": True,
                                                 "triton.enable_persistent_tma_matmul": False}
