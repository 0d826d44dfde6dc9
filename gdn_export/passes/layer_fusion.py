"""A decoder layer's norms and residual adds moved into the products around them.

Each decoder layer normalizes its input before the token mixer and before the
MLP, and adds each one's output back to the residual stream. Where a backend's
products can do that work themselves (CUDA's decode kernel; the CPU grouped
linears' ``norm_weight`` and ``residual`` arguments), each norm and each add
otherwise costs a call of its own a layer: a kernel launch on a GPU, a few
XNNPACK ops in a delegate call of their own in a CPU program.

* ``take_input_norm`` moves a layer's RMSNorm into the products that read its
  output (a product takes it as ``input_norm``, a registered submodule slot),
  leaving ``NormTakenByItsConsumer`` in its place;
* ``ResidualInProducts`` is a decoder layer whose residual adds happen in the
  products that end its mixer and its MLP (a product takes it as ``residual``,
  set for the length of one call by ``adding``);
* ``GatedInputMLP`` is an MLP whose down projection reads the merged gate and
  up projection's output whole and computes silu(gate) * up itself (a product
  takes it as ``gated_input``).

``fuse_norms_and_residuals`` does all three where the products can (the CPU
programs' grouped linears); CUDA's backend applies the first two to its own.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch
from torch import nn

from gdn_export.models.qwen35 import LINEAR_ATTENTION, DecoderLayer
from gdn_export.passes.linear_groups import LinearGroupMember


class NormTakenByItsConsumer(nn.Module):
    """Where a decoder layer's RMSNorm stood once ``take_input_norm`` moved it into the products that read its
    output: the input passes through, and those products normalize it."""

    def forward(self, x):
        return x


def takes_input_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a product that normalizes its input with the norm put in its ``input_norm`` slot."""
    return "input_norm" in getattr(module, "_modules", {})


def takes_residual(module: Optional[nn.Module]) -> bool:
    """Whether ``module`` is a product that adds its ``residual`` (see ``adding``) to its output."""
    return module is not None and hasattr(type(module), "residual")


def take_input_norm(owner: nn.Module, norm_name: str, consumers: Sequence[nn.Module]) -> None:
    """Move ``owner``'s RMSNorm ``norm_name`` into ``consumers``, the products that read its output (each
    normalizes its own input: the norm of a vector is cheap beside a product).

    The caller vouches that every use of the norm's output is one of ``consumers``' inputs (a merged group's
    projection, which its members slice)."""
    for consumer in consumers:
        if consumer.input_norm is not None:
            raise ValueError(f"take_input_norm: the layer already normalizes its input ({consumer.input_norm})")
    norm = getattr(owner, norm_name)
    for consumer in consumers:
        consumer.input_norm = norm
    setattr(owner, norm_name, NormTakenByItsConsumer())


def input_products(module: nn.Module) -> Optional[list]:
    """The products that compute ``module``'s projections of its input (``INPUT_PROJECTIONS``: a merged group's
    projection, or the linear itself), each once; None when one of them cannot take a norm."""
    products = []
    for name in getattr(module, "INPUT_PROJECTIONS", ()):
        child = getattr(module, name)
        product = child.group.projection if isinstance(child, LinearGroupMember) else child
        if not takes_input_norm(product):
            return None
        if all(product is not seen for seen in products):
            products.append(product)
    return products or None


@contextlib.contextmanager
def adding(projection: nn.Module, residual: torch.Tensor):
    """``projection`` adds ``residual`` to its output for the calls made inside."""
    projection.residual = residual
    try:
        yield
    finally:
        del projection.residual  # back to the class's None


def output_projection(mixer: nn.Module) -> nn.Module:
    """The product that ends a token mixer: Gated DeltaNet's ``out_proj``, attention's ``o_proj``."""
    return mixer.out_proj if hasattr(mixer, "out_proj") else mixer.o_proj


class ResidualInProducts(DecoderLayer):
    """A decoder layer whose residual adds happen in the products that end its mixer and its MLP, where those
    take a ``residual`` (``takes_residual``); an add the product cannot take (a sparse MoE's sum of experts)
    stays."""

    def forward(self, x, positions, cos, sin, mask):
        linear = self.layer_type == LINEAR_ATTENTION
        mixer = self.linear_attn if linear else self.self_attn
        normed = self.input_layernorm(x)
        x = plus_residual(output_projection(mixer), x,
                          lambda: mixer(normed, positions) if linear else mixer(normed, positions, cos, sin, mask))
        return plus_residual(getattr(self.mlp, "down_proj", None), x,
                             lambda: self.mlp(self.post_attention_layernorm(x)))


def plus_residual(product: Optional[nn.Module], residual: torch.Tensor, compute) -> torch.Tensor:
    """``residual + compute()``, the add made inside ``product`` where it takes one (``takes_residual``)."""
    if not takes_residual(product):
        return residual + compute()
    with adding(product, residual):
        return compute()


class GatedInputMLP(nn.Module):
    """Qwen3.5's MLP, down(silu(gate(x)) * up(x)), with gate and up as one product (``gate_up_proj``) whose output
    the down projection reads whole, computing silu(gate) * up as it reads its input: no split of the product
    and no elementwise ops of their own."""

    INPUT_PROJECTIONS = ("gate_up_proj",)

    def __init__(self, gate_up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj
        down_proj.gated_input = True

    def forward(self, x):
        return self.down_proj(self.gate_up_proj(x))


def gated_input_mlp(mlp: nn.Module) -> Optional[GatedInputMLP]:
    """``mlp`` as a ``GatedInputMLP`` where its gate and up projections are one merged product, gate first, and its
    down projection takes a gated input; else None."""
    from gdn_export.models.qwen35 import MLP

    if type(mlp) is not MLP or not hasattr(type(mlp.down_proj), "gated_input"):
        return None
    gate, up = mlp.gate_proj, mlp.up_proj
    if not (isinstance(gate, LinearGroupMember) and isinstance(up, LinearGroupMember) and gate.group is up.group
            and (gate.index, up.index) == (0, 1) and gate.group.sizes == [gate.out_features, up.out_features]
            and gate.out_features == up.out_features):
        return None
    return GatedInputMLP(gate.group.projection, mlp.down_proj)


def fuse_norms_and_residuals(model: nn.Module) -> None:
    """Each decoder layer's MLP as a ``GatedInputMLP`` where it can be one, its norms into the products that read
    them where all of those can take one (``input_products``), and its residual adds into the products that end
    its mixer and MLP, where those can (``ResidualInProducts``)."""
    for layer in model.modules():
        if type(layer) is not DecoderLayer:
            continue
        mixer = layer.linear_attn if layer.layer_type == LINEAR_ATTENTION else layer.self_attn
        layer.mlp = gated_input_mlp(layer.mlp) or layer.mlp
        for norm_name, reader in (("input_layernorm", mixer), ("post_attention_layernorm", layer.mlp)):
            products = input_products(reader)
            if products is not None:
                take_input_norm(layer, norm_name, products)
        if takes_residual(output_projection(mixer)) or takes_residual(getattr(layer.mlp, "down_proj", None)):
            layer.__class__ = ResidualInProducts
