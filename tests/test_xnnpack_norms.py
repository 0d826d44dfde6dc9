"""XNNPACK's form of the model's RMSNorms (``runtime_ops.norms``): the same values, and every norm's mean
inside the XNNPACK delegate of a program exported with a dynamic T."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gdn_export.models.qwen35 import GatedRMSNorm, RMSNorm
from runtime_ops.norms import PooledGatedRMSNorm, PooledRMSNorm, pool_norm_means, pooled_mean_of_squares


@pytest.mark.parametrize("shape", [(1, 7, 48), (1, 5, 3, 16), (6, 2, 16), (3, 16)], ids=str)
def test_pooled_mean_is_the_mean_of_squares(shape, generator, seed):
    x = 3 * torch.randn(*shape, generator=generator)
    expected = (x.double() ** 2).mean(-1, keepdim=True)
    actual = pooled_mean_of_squares(x)
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    error = ((actual.double() - expected).abs() / expected).max().item()
    assert error <= 1e-6, f"seed={seed} shape={shape}: relative error {error}"


class Norms(nn.Module):
    """A decoder layer's norm ([1, T, hidden]) and the recurrence output's gated norm ([1, T, heads, dim])."""

    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(48, 1e-6)
        self.gated = GatedRMSNorm(16, 1e-6)

    def forward(self, x, y, z):
        return self.norm(x) * 2.0, self.gated(y, z) + 1.0


def test_norms_keep_their_values_and_their_means_go_to_xnnpack(generator, seed):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    model = Norms()
    with torch.no_grad():
        model.norm.weight.copy_(0.5 * torch.randn(48, generator=generator))
        model.gated.weight.copy_(1 + 0.5 * torch.randn(16, generator=generator))
    inputs = (torch.randn(1, 5, 48, generator=generator), torch.randn(1, 5, 3, 16, generator=generator),
              torch.randn(1, 5, 3, 16, generator=generator))
    expected = model(*inputs)
    pool_norm_means(model)
    assert (type(model.norm), type(model.gated)) == (PooledRMSNorm, PooledGatedRMSNorm)
    assert [name for name, _ in model.named_parameters()] == ["norm.weight", "gated.weight"]
    for before, after in zip(expected, model(*inputs)):
        torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-6, msg=lambda m: f"seed={seed}: {m}")

    length = torch.export.Dim("length", min=1, max=64)
    exported = torch.export.export(model, inputs, dynamic_shapes=({1: length}, {1: length}, {1: length}))
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    targets = [str(node.target) for node in edge.exported_program().graph.nodes if node.op == "call_function"]
    assert not any("mean" in target for target in targets), targets
    assert sum("executorch_call_delegate" in target for target in targets) >= 1, targets
