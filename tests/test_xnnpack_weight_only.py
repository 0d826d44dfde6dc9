"""int8wo's linears on XNNPACK's float-activation int8-weight kernels (``runtime_ops.xnnpack_weight_only``): the
delegate holds the int8 weight, computes the float product of the dequantized weight, and XNNPACK's own
linears (float, dynamically quantized) lower as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class Linears(nn.Module):
    """Two linears in a row with a float op between; the first with a bias if ``bias``."""

    def __init__(self, generator: torch.Generator, activation_quantization, bias: bool = False):
        super().__init__()
        from gdn_export.quantize import int8_rows

        self.first = nn.Linear(96, 160, bias=bias)
        self.second = nn.Linear(160, 64, bias=False)
        with torch.no_grad():
            for linear in (self.first, self.second):
                linear.weight = nn.Parameter(int8_rows(torch.randn(linear.weight.shape, generator=generator) * 0.1,
                                                       activation_quantization), requires_grad=False)
            if bias:
                self.first.bias.copy_(torch.randn(160, generator=generator))

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))

    def reference(self, x):
        """The same in float64, from the weights' int8 rows and scales (none of torchao's code)."""
        def weight(linear):
            return linear.weight.qdata.double() * linear.weight.scale.double()

        hidden = x.double() @ weight(self.first).T
        if self.first.bias is not None:
            hidden = hidden + self.first.bias.double()
        return torch.tanh(hidden) @ weight(self.second).T


def lowered_program(module: nn.Module, example: torch.Tensor, configs, tmp_path):
    """``module`` lowered by XNNPACK's partitioner with ``configs``, as a loaded method, and the ops left outside."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from gdn_export.runner import executorch_runtime

    exported = torch.export.export(module, (example,), dynamic_shapes=({0: torch.export.Dim("T", max=64)},))
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner(configs=configs)])
    outside = [str(node.target) for node in edge.exported_program().graph.nodes if node.op == "call_function"]
    path = tmp_path / "program.pte"
    path.write_bytes(edge.to_executorch().buffer)
    return executorch_runtime().get().load_program(str(path)).load_method("forward"), path, outside


def test_weight_only_linears_run_in_xnnpack_on_int8_weights(generator, seed, tmp_path):
    from runtime_ops.xnnpack_weight_only import CONFIGS

    module = Linears(generator, activation_quantization=None).eval()
    method, path, outside = lowered_program(module, torch.randn(5, 96, generator=generator), CONFIGS, tmp_path)
    # One delegate holds both linears and the tanh between; nothing widens a weight outside it.
    assert [op for op in outside if "getitem" not in op] == ["executorch_call_delegate"], outside
    # The file holds the int8 weights, not float copies: under half of the float weights' 4 * 25,600 bytes.
    assert path.stat().st_size < 2 * (96 * 160 + 160 * 64), path.stat().st_size
    for rows in (1, 7, 64):
        x = torch.randn(rows, 96, generator=generator)
        expected = module.reference(x)
        actual = method.execute([x])[0]
        error = (actual.double() - expected).abs().max().item()
        assert error <= 1e-5 * expected.abs().max().item(), f"seed {seed}, {rows} rows: error {error}"


@pytest.mark.parametrize("biases_apart", [True, False])
def test_a_weight_only_linear_with_a_bias(biases_apart, generator, seed, tmp_path):
    """XNNPACK's serializer takes a bias only beside a quantized input, so ``biases_added_after`` (the XNNPACK
    backend's rewrite) adds it after the linear, and the program computes the reference's values. Left whole,
    the linear is decomposed and the dequantize and matrix product XNNPACK takes compute wrong values
    (ExecuTorch 1.5.1): the reason for the rewrite, checked here so that a release that mends it is noticed."""
    from runtime_ops.xnnpack_weight_only import CONFIGS, biases_added_after

    module = Linears(generator, activation_quantization=None, bias=True).eval()
    expected_replaced = 1 if biases_apart else 0
    assert (biases_added_after(module) if biases_apart else 0) == expected_replaced
    method, _, outside = lowered_program(module, torch.randn(5, 96, generator=generator), CONFIGS, tmp_path)
    x = torch.randn(7, 96, generator=generator)
    expected = module.reference(x) if not biases_apart else reference_with_bias(module, x)
    error = (method.execute([x])[0].double() - expected).abs().max().item()
    if biases_apart:
        assert [op for op in outside if "getitem" not in op] == ["executorch_call_delegate"], outside
        assert error <= 1e-5 * expected.abs().max().item(), f"seed {seed}: error {error}"
    else:
        assert error > 0.1 * expected.abs().max().item(), f"seed {seed}: ExecuTorch's path now computes right"


def reference_with_bias(module: Linears, x: torch.Tensor) -> torch.Tensor:
    """``Linears.reference`` once ``biases_added_after`` moved the first linear's bias into its wrapper."""
    first = module.first.linear
    hidden = x.double() @ (first.weight.qdata.double() * first.weight.scale.double()).T + module.first.bias.double()
    second = module.second.weight
    return torch.tanh(hidden) @ (second.qdata.double() * second.scale.double()).T


@pytest.mark.parametrize("activation_quantization", ["int8_asym_per_token"])
def test_xnnpacks_own_quantized_linears_lower_as_before(activation_quantization, generator, seed, tmp_path):
    """A linear with dynamically quantized activations (8da8w's) still goes to XNNPACK's own config."""
    from runtime_ops.xnnpack_weight_only import CONFIGS

    module = Linears(generator, activation_quantization).eval()
    method, _, outside = lowered_program(module, torch.randn(5, 96, generator=generator), CONFIGS, tmp_path)
    assert [op for op in outside if "getitem" not in op] == ["executorch_call_delegate"], outside
    x = torch.randn(9, 96, generator=generator)
    expected = module.reference(x)
    # Per-token int8 activations: within a percent of the range.
    error = (method.execute([x])[0].double() - expected).abs().max().item()
    assert error <= 0.02 * expected.abs().max().item(), f"seed {seed}: error {error}"
