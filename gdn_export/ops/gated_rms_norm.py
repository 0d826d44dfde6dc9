"""``gdn::gated_rms_norm``: the norm that ends a Gated DeltaNet layer's token mixer, in one call.

    gdn::gated_rms_norm(Tensor x, Tensor gate, Tensor weight, float eps) -> Tensor
    gdn::gated_rms_norm.out(<same>, *, Tensor(a!) out) -> Tensor(a!)

    x, gate  [..., D] float32   the recurrence's output per head, and in_proj_z's output viewed alike
    weight   [D] float32        the norm's (plain, not zero-centered) weight
    -> [..., D] float32: weight * (x * rsqrt(mean(x², -1) + eps)) * silu(gate)

It is ``models.qwen35.GatedRMSNorm`` on float32 tensors. In a CPU program the
model's form was a delegate call of some nine XNNPACK ops a layer, each waking
the thread pool (about 23 us of a 0.8B decode step's ~20 ms, 18 times);
``runtime_ops`` implements it in C++ as one call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.contract import define_op

SCHEMA = "gated_rms_norm(Tensor x, Tensor gate, Tensor weight, float eps) -> Tensor"
OUT_SCHEMA = "gated_rms_norm.out(Tensor x, Tensor gate, Tensor weight, float eps, *, Tensor(a!) out) -> Tensor(a!)"


def check_norm_inputs(x, gate, weight) -> None:
    """TypeError naming the argument, for what the op cannot take (shapes and dtypes only)."""
    for name, tensor in (("x", x), ("gate", gate), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"gdn.gated_rms_norm: {name} must be a float32 tensor, got {got}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise TypeError(f"gdn.gated_rms_norm: x must be [..., D] with D >= 1, got {list(x.shape)}")
    if gate.shape != x.shape:
        raise TypeError(f"gdn.gated_rms_norm: gate must have x's shape {list(x.shape)}, got {list(gate.shape)}")
    if list(weight.shape) != [x.shape[-1]]:
        raise TypeError(f"gdn.gated_rms_norm: weight must be [{x.shape[-1]}] (D of x), got {list(weight.shape)}")


def reference_gated_rms_norm(x, gate, weight, eps):
    """The model's GatedRMSNorm ops on float32 tensors, so an eager model computes the same floats."""
    check_norm_inputs(x, gate, weight)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed * F.silu(gate)


def reference_gated_rms_norm_out(x, gate, weight, eps, *, out):
    result = reference_gated_rms_norm(x, gate, weight, eps)
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(f"gdn.gated_rms_norm.out: out must be {list(result.shape)} {result.dtype}, "
                         f"got {list(out.shape)} {out.dtype}")
    return out.copy_(result)


def _fake(x, gate, weight, eps):
    check_norm_inputs(x, gate, weight)
    return torch.empty_like(x)


def _fake_out(x, gate, weight, eps, *, out):
    check_norm_inputs(x, gate, weight)
    return out


define_op(SCHEMA, reference_gated_rms_norm, _fake)
define_op(OUT_SCHEMA, reference_gated_rms_norm_out, _fake_out)
