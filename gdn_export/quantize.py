"""Quantization of the model's linear layers and token embedding before export.

* ``8da4w``: int8 dynamic activations, int4 weights in groups of 32 (torchao's
  ``IntxUnpackedToInt8Tensor``, as ExecuTorch's llama export makes them with
  ``Int8DynamicActivationIntxWeightConfig``, with the group of llama.cpp's
  Q4_0), each group's scale the one of least squared error
  (``fit_int4_scales``) rather than taken from the group's largest weight;
  XNNPACK runs these linears with its own quantized kernels. The Gated
  DeltaNet's gate projections keep 8 bits, as in ``8da8w`` (see below); the
  token table is a two-plane table (``PlanesVocabulary``, below), which a tied
  output head reads as 4-bit weights.
* ``8da4w_avx2``: the same table, head and groups of 32, the linears on our
  own kernel (``gdn::grouped_int4_linear``, ``GroupedInt4Linear``; int8
  activations with one scale a row, no zero point) and the gate projections on
  ``16da8w``'s. Made for x86 CPUs with AVX2 and no AVX-512 VNNI: there
  XNNPACK's 4-bit kernels widen both sides to 16 bits, and the 0.8B prefill
  ran at 1.1x llama.cpp's; ours multiplies bytes (``vpmaddubsw``). Our kernel
  also takes 4-bit scales of either sign, so a group may put its largest
  weight on the -8 side (``fit_int4_scales(signed=True)``): the lower KL of
  the two 4-bit programs (docs/benchmarks.md, run 36). With AVX-512 VNNI the
  two programs run level (run 33). On ARM, where XNNPACK has dot-product
  kernels, ``8da4w`` is the program: ours has x86 loops only, and plain C++
  elsewhere. A linear whose outputs the kernel's tiles do not fit stays on
  XNNPACK. Its 4-bit scales are stored in the op's int8 form (an integer a
  group, a float32 multiplier a channel): 4.28 bits a weight instead of 4.5.
* ``8da8w``: the same with int8 weights, one scale per output channel: the
  8-bit program, on XNNPACK's int8 kernels.
* ``int8wo``: int8 weights with one scale per output channel, activations in
  float (torchao's ``IntxWeightOnlyConfig`` per row, the table's format). On
  XNNPACK these linears run on its float-activation int8-weight kernels
  (``runtime_ops.xnnpack_weight_only``): the program reads int8 weights and
  loses none of the activations' precision (KL 1.32x llama.cpp Q8_0's; a scale
  per row costs it, see ``16da8w``). Elsewhere (``portable``) the program widens each weight to float at
  each call (``Int8WeightOnlyLinear``).
* ``16da8w``: int8 weights with a scale per group of 32 (llama.cpp's Q8_0
  block; stored in the op's int8 form, an integer a group and a float32
  multiplier a channel: 8.28 bits a weight instead of 8.5), each token's
  activations in int16 (one scale, a relative error of 2^-16): the 8-bit
  program of the least KL, on our own kernel
  (``gdn::grouped_int8_linear``, ``GroupedInt8Linear``): XNNPACK has no
  kernel for int8 weights in groups. On the 0.8B shape a scale per output
  channel costs most of ``int8wo``'s KL: with the table and head the same,
  groups of 32 took the mean KL from 0.00342 to 0.00218, under Q8_0's 0.0026
  (groups of 64: 0.00241, 128: 0.00269). The token table is the 4-bit
  programs' two-plane table (below), which a tied head reads as 5-bit weights
  (the high plane and a ``fifth`` plane, one bit a weight): the head is a
  decode step's largest read, 254 MB in 8 bits, 167 MB so. With the table's
  unit per group the KL fell too, from 0.00226 to 0.00202 eagerly (a 4-bit
  head: 0.00322, over Q8_0's; a 6-bit one 0.00173) and to 0.0020 in the
  program (docs/benchmarks.md, run 41). An untied head keeps ``int8wo``'s rows.

The other modes quantize the token embedding, weight-only, in 8 bits, one
scale a row (torchao's ``IntxWeightOnlyConfig``): on XNNPACK the lookup goes to
our ``GdnEmbeddingBackend`` delegate (``runtime_ops.embedding_delegate``;
ExecuTorch's ``embedding_byte`` elsewhere). A tied output head is a linear like
the others, quantized to the same bytes as the table; the export holds it on
the table's tensors (``share_tied_vocabulary``) and the program stores them
once (XNNPACK's copy in the named data serves both).

Why the table keeps 8 bits in ``8da4w``: its rounding enters every position's
residual stream undamped. On the random-weight 0.8B shape (mean KL of the
next-token distribution from fp32, 512 tokens, at llama.cpp's scored
positions) 4-bit groups of 32 everywhere gave 0.227, the same with an 8-bit
table and head 0.184, with torchao's HQQ scales 0.1725, with least-squares
scales 0.1648, and with the gate projections in 8 bits too 0.1643
(llama.cpp's Q4_0 file, whose tied table is Q6_K: 0.1652). The gate
projections (``in_proj_a``, ``in_proj_b``: one output per value head) are 0.1%
of the weights; their outputs set each head's decay and write strength, so an
error in one moves that head's whole state.

Why the table is a two-plane table in ``8da4w``
(``gdn_export.ops.vocabulary_planes``): the output head is the largest read of
a decode step, and it needs fewer bits than the lookup. The table's 8-bit codes
(a unit per group of 32) are stored as two 4-bit planes; the lookup reads both,
a tied head only the high one, as 4-bit weights, on our own kernels. The head
then streams 127 MB a token instead of 254, the file holds the table once, and
the program's KL fell from 0.1643 to 0.1635 (the lookup's unit per group gains
more than the head's 4 bits lose; the same planes with groups of 64 scored
0.1650 eagerly). An untied head keeps its own 8-bit rows.

``quantize_module`` quantizes one module, so the loader can quantize each
layer as soon as its weights are read (``gdn_export.loading``, through a
``Quantizer``) and the float weights never all sit in memory at once;
``quantize_model`` does a whole model.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("none", "8da4w", "8da4w_avx2", "8da8w", "int8wo", "16da8w")
# The 4-bit modes: the same table, head and 4-bit groups; 8da4w_avx2's linears on our own kernel.
FOUR_BIT_MODES = ("8da4w", "8da4w_avx2")
# Modes whose token table is a PlanesVocabulary, and those whose tied head reads its fifth plane too.
PLANES_MODES = FOUR_BIT_MODES + ("16da8w",)
FIVE_BIT_HEAD_MODES = ("16da8w",)
# Group sizes of 4-bit weights, the preferred first: 32 is llama.cpp's Q4_0 block (ExecuTorch's llama
# export defaults to 128, which measured 0.258 against 0.226 mean KL with everything else equal).
GROUP_SIZES_4BIT = (32, 64, 128)
# The modules of the vocabulary (``Qwen35ForCausalLM``'s names): 8 bits in every mode (in 8da4w, a tied
# head reads the high 4 bits of the table's codes: ``PlanesHead``).
VOCABULARY_MODULES = ("embed_tokens", "lm_head")
# Modules that keep 8 bits in 8da4w besides the vocabulary's: the Gated DeltaNet's per-head gate projections.
EIGHT_BIT_MODULES = VOCABULARY_MODULES + ("in_proj_a", "in_proj_b")
# fit_int4_scales' candidates: the group's largest magnitude over each of these is a starting scale.
INT4_SCALE_DIVISORS = tuple(6.0 + 0.25 * step for step in range(13))  # 6.0 to 9.0
# With signed scales (our kernel's; XNNPACK takes positive ones only), the same candidates of either sign.
INT4_SIGNED_SCALE_DIVISORS = INT4_SCALE_DIVISORS + tuple(-divisor for divisor in INT4_SCALE_DIVISORS)
# int8_rows works on blocks of rows of about this many weights (64 MiB in fp32).
INT8_ROWS_BLOCK_ELEMENTS = 1 << 24


class PlanesVocabulary(nn.Module):
    """A token table as two 4-bit planes of 8-bit codes (``gdn_export.ops.vocabulary_planes``), the buffers
    that ``PlanesEmbedding`` and a tied ``PlanesHead`` share; ``fifth`` (None until ``add_fifth_plane``) the
    plane a 5-bit head reads besides the high one; ``dtype`` the float table's, which the lookup returns."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        from gdn_export.ops.vocabulary_planes import to_vocabulary_planes

        for name, tensor in zip(("high", "low", "row_units", "group_units"), to_vocabulary_planes(weight.detach())):
            self.register_buffer(name, tensor)
        self.register_buffer("fifth", None)
        self.dtype = weight.dtype

    def add_fifth_plane(self) -> None:
        from gdn_export.ops.vocabulary_planes import fifth_plane

        self.fifth = fifth_plane(self.low)


def _planes_fit(weight: torch.Tensor) -> bool:
    """Whether a table's width suits the planes' layout (runs of 64 weights)."""
    return weight.dim() == 2 and weight.shape[1] % 64 == 0


class PlanesEmbedding(nn.Module):
    """The token lookup of a ``PlanesVocabulary`` (8 bits)."""

    def __init__(self, vocabulary: PlanesVocabulary):
        super().__init__()
        self.vocabulary = vocabulary

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        v = self.vocabulary
        return torch.ops.gdn.planes_embedding(tokens, v.high, v.low, v.row_units, v.group_units).to(v.dtype)


class PlanesHead(nn.Module):
    """The output head on a tied ``PlanesEmbedding``'s table, reading its high plane (4 bits), and its fifth
    plane (5 bits) where the table has one.

    The head refers to the table without registering it as a submodule: the model's buffers then name each
    plane once (as ``embed_tokens.vocabulary.*``) and ``torch.export`` lifts one constant of each, which
    both ops read."""

    def __init__(self, vocabulary: PlanesVocabulary):
        super().__init__()
        object.__setattr__(self, "vocabulary", vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.vocabulary
        return torch.ops.gdn.planes_logits(x.float(), v.high, v.row_units, v.group_units, v.fifth).to(x.dtype)


class Quantizer:
    """``quantize_module`` for each module of one model, called in the loader's order
    (``gdn_export.loading.load_model``'s ``transform``): in ``PLANES_MODES`` the head of a tied table, which
    comes right after the table with the same float weight, reads the table's planes (adding the fifth in
    ``FIVE_BIT_HEAD_MODES``) instead of weights of its own."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._planes = None  # (a weak reference to the float table, its PlanesVocabulary)

    def __call__(self, name: str, module: nn.Module) -> nn.Module:
        if (self.mode in PLANES_MODES and isinstance(module, nn.Linear) and name.rpartition(".")[2] == "lm_head"
                and self._planes is not None and self._planes[0]() is module.weight):
            if self.mode in FIVE_BIT_HEAD_MODES:
                self._planes[1].add_fifth_plane()
            return PlanesHead(self._planes[1])
        table = getattr(module, "weight", None)
        replacement = quantize_module(module, self.mode, name)
        if isinstance(replacement, PlanesEmbedding):
            self._planes = (weakref.ref(table), replacement.vocabulary)
        return replacement


class GroupedLinear(nn.Module):
    """A linear on one of our grouped-weight ops (``FORMAT``, a module of ``gdn_export.ops`` and the op it
    defines): the weight's codes and scales in the op's tiles, one group size.

    Like CUDA's decode linear it can take a decoder layer's work around it (``gdn_export.passes.layer_fusion``):
    ``input_norm`` (None, or the RMSNorm that reads its input, moved here), ``gated_input`` (its input is an
    MLP's gate and up side by side, of which it reads silu(gate) * up) and ``residual`` (None, or a tensor set
    for the length of one call), which the op computes through its ``norm_weight``, ``gated`` and ``residual``
    arguments on float32 inputs. On others (a bfloat16 model in eager mode) they run as the model runs them,
    rounding where it rounds."""

    FORMAT = ""
    residual = None
    gated_input = False

    @classmethod
    def _format(cls):
        return importlib.import_module(f"gdn_export.ops.{cls.FORMAT}")

    def _hold(self, weight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        self.out_features, self.in_features, self.group = self._format().check_weight(weight, scales)
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.bias = bias
        self.register_module("input_norm", None)

    @classmethod
    def stacked(cls, linears: list, bias: Optional[torch.Tensor]) -> "GroupedLinear":
        """One layer whose output is the outputs of ``linears`` (this class, one input size and group) side by
        side, plus ``bias``: their tiles of 16 outputs in order, each output's codes and scales as they were."""
        stacked = cls.__new__(cls)
        nn.Module.__init__(stacked)
        stacked._hold(torch.cat([linear.weight for linear in linears]),
                      torch.cat([linear.scales for linear in linears]), bias)
        return stacked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, residual = self.input_norm, self.residual
        fused = {}
        if norm is not None:
            if x.dtype == torch.float32:
                fused.update(norm_weight=norm.weight.float(), norm_eps=norm.eps)
            else:
                x = norm(x)
        if self.gated_input:
            if x.dtype == torch.float32:
                fused["gated"] = True
            else:
                gate, up = x.chunk(2, dim=-1)
                x = F.silu(gate) * up
        # The bias first, then the residual, as the model adds them.
        if residual is not None and self.bias is None and x.dtype == residual.dtype == torch.float32:
            fused["residual"], residual = residual, None
        output = getattr(torch.ops.gdn, self.FORMAT)(x.float(), self.weight, self.scales, **fused).to(x.dtype)
        output = output if self.bias is None else output + self.bias
        return output if residual is None else output + residual


class GroupedInt8Linear(GroupedLinear):
    """A ``16da8w`` linear: int8 weights with a scale per group of 32 (in the op's int8 form: 8.28 bits a weight),
    on ``gdn::grouped_int8_linear``."""

    FORMAT = "grouped_int8_linear"

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scales = self._format().to_grouped_int8(linear.weight.detach(), small=True)
        self._hold(weight, scales, linear.bias)


class GroupedInt4Linear(GroupedLinear):
    """An ``8da4w_avx2`` linear: 4-bit weights with a scale per group (``fit_int4_scales``', of either sign
    unless ``signed`` is False, stored in the op's int8 form: 4.28 bits a weight), on ``gdn::grouped_int4_linear``."""

    FORMAT = "grouped_int4_linear"

    def __init__(self, linear: nn.Linear, group: int, signed: bool = True):
        super().__init__()
        scales = fit_int4_scales(linear.weight, group, signed)
        weight, scales = self._format().to_grouped_int4(linear.weight.detach(), scales, small=True)
        self._hold(weight, scales, linear.bias)


class Int8WeightOnlyLinear(nn.Module):
    """``y = (x @ q^T) * scale``: an ``int8wo`` linear's int8 rows ``q`` and scales, in the form a program
    without a weight-only kernel runs (the weight widened to float at each call)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return output if self.bias is None else output + self.bias


def is_weight_only(module: nn.Module) -> bool:
    """Whether ``module`` is a linear with ``int8wo``'s weight (int8 rows, activations left in float)."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    weight = getattr(module, "weight", None)
    return (isinstance(module, nn.Linear) and type(weight) is IntxUnpackedToInt8Tensor
            and weight.activation_quantization is None and weight.target_dtype == torch.int8)


def widen_weight_only_linears(model: nn.Module) -> int:
    """Replace each ``int8wo`` linear of ``model`` by an ``Int8WeightOnlyLinear`` on the same int8 rows and
    scales (symmetric: ``int8_rows`` makes no zero points); returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if is_weight_only(child):
                weight = child.weight
                scale = weight.scale.reshape(-1).to(weight.dtype)
                setattr(parent, name, Int8WeightOnlyLinear(weight.qdata, scale, child.bias))
                replaced += 1
    return replaced


def _granularity(features: int):
    """The first of ``GROUP_SIZES_4BIT`` that tiles ``features`` (None: none), as a torchao granularity."""
    from torchao.quantization.granularity import PerGroup

    return next((PerGroup(size) for size in GROUP_SIZES_4BIT if features % size == 0), None)


def module_mode(name: str, mode: str) -> str:
    """The mode the module called ``name`` in the model is quantized with when the program's is ``mode``."""
    if mode in FOUR_BIT_MODES and name.rpartition(".")[2] in EIGHT_BIT_MODULES:
        # The gate projections of 8da4w_avx2 on our int8 kernel too, beside its 4-bit ones.
        return "16da8w" if mode == "8da4w_avx2" and name.rpartition(".")[2] not in VOCABULARY_MODULES else "8da8w"
    if mode == "16da8w" and name.rpartition(".")[2] in VOCABULARY_MODULES:
        return "int8wo"
    return mode


def fit_int4_scales(weight: torch.Tensor, group_size: int, signed: bool = False) -> torch.Tensor:
    """Per group of ``group_size`` weights along each row, the scale ``s`` whose int4 rounding
    ``clamp(round(w / s), -8, 7) * s`` has the least squared error among those tried
    (``gdn::fit_int4_scales``, C++ where ``runtime_ops`` is loaded): positive, or of either sign if ``signed``.

    Each candidate starts from the group's largest magnitude over one of
    ``INT4_SCALE_DIVISORS`` and is refined twice by least squares for its
    rounding (the scale that best fits ``w`` by ``q * s`` given ``q``). Against
    torchao's HQQ (the same refinement from one start, max / 8) this has about
    6% less squared error on Gaussian weights: HQQ stops at the first
    rounding's optimum, and a group whose largest weight is positive wants a
    scale near max / 7, one whose largest is negative max / 8.

    XNNPACK takes positive scales only. Our kernel (``8da4w_avx2``) takes
    either sign, and then the search also tries each candidate with the sign
    that puts the group's largest weight on the -8 side, llama.cpp's Q4_0 trick
    (``INT4_SIGNED_SCALE_DIVISORS``): 11% less squared error than positive
    scales on the 0.8B shape's weights, and the program's mean KL from 0.1654 to
    0.1545, under Q4_0's 0.1652 (docs/benchmarks.md, run 36).
    Returns ``[rows, columns / group_size]`` float32 scales.
    """
    import gdn_export.ops  # noqa: F401  (defines the op)

    divisors = INT4_SIGNED_SCALE_DIVISORS if signed else INT4_SCALE_DIVISORS
    return torch.ops.gdn.fit_int4_scales(weight.detach().float().contiguous(), group_size, list(divisors))


def quantize_module(module: nn.Module, mode: str, name: str = "") -> nn.Module:
    """``module`` (an ``nn.Linear`` or ``nn.Embedding``; others are returned as they are), called ``name`` in
    the model, quantized for a program of ``mode``.

    Linears and embeddings are quantized in place (their weight becomes a torchao
    quantized tensor), but for the embedding of ``PLANES_MODES``, which is replaced by a
    ``PlanesEmbedding`` (a tied head's ``PlanesHead`` comes from ``Quantizer``,
    which sees the tie), and ``16da8w``'s linears, replaced by ``GroupedInt8Linear``
    (one whose shape its tiles do not fit gets ``int8wo``'s rows). A 4-bit layer
    whose width no group size tiles stays in float. The vocabulary's modules (``VOCABULARY_MODULES``) are found by ``name``.
    """
    if mode not in MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode in PLANES_MODES and isinstance(module, nn.Embedding) and _planes_fit(module.weight):
        return PlanesEmbedding(PlanesVocabulary(module.weight))
    mode = module_mode(name, mode)
    if mode == "none" or not isinstance(module, (nn.Linear, nn.Embedding)):
        return module
    if mode == "16da8w":
        from gdn_export.ops.grouped_int8_linear import fits

        if isinstance(module, nn.Linear) and fits(module.out_features, module.in_features):
            return GroupedInt8Linear(module)
        mode = "int8wo"  # a shape the tiles do not fit
    from torchao.quantization import IntxUnpackedToInt8Tensor

    if mode in FOUR_BIT_MODES and isinstance(module, nn.Linear):
        granularity = _granularity(module.in_features)
        if granularity is None:
            return module
        from gdn_export.ops.grouped_int4_linear import fits

        if mode == "8da4w_avx2" and fits(module.out_features, module.in_features, granularity.group_size):
            return GroupedInt4Linear(module, granularity.group_size)
        # 8da4w, or a shape the tiles do not fit (outputs not a multiple of 16): XNNPACK's 4-bit kernels.
        # The tensor Int8DynamicActivationIntxWeightConfig makes, with our scales (its config takes none).
        with torch.no_grad():
            scale = fit_int4_scales(module.weight, granularity.group_size).to(module.weight.dtype)
            weight = IntxUnpackedToInt8Tensor.from_hp(
                module.weight.detach(), (1, granularity.group_size), torch.int4,
                activation_quantization="int8_asym_per_token", intx_choose_qparams_algorithm=None,
                custom_scale=scale, custom_zero_point=torch.zeros_like(scale, dtype=torch.int8),
            )
            # XNNPACK stores these scales in bfloat16 (its blockwise kernels take no other), so they are held
            # so: the program is the same, the model 1/16 byte a weight smaller (0.21 GiB on the 4B shape),
            # and the eager model scales by what the program does. The zero points, all zero, are one byte
            # seen through an expanded view rather than a byte a group (0.10 GiB more).
            weight.scale = weight.scale.to(torch.bfloat16)
            weight.zero_point = torch.zeros((), dtype=torch.int8).expand(weight.zero_point.shape)
            module.weight = nn.Parameter(weight, requires_grad=False)
        return module
    # The tied head's bytes must equal the table's (stored once): both take the plain max-abs scale.
    activations = None if isinstance(module, nn.Embedding) or mode == "int8wo" else "int8_asym_per_token"
    with torch.no_grad():
        module.weight = nn.Parameter(int8_rows(module.weight.detach(), activations), requires_grad=False)
    return module


def int8_rows(weight: torch.Tensor, activation_quantization=None):
    """``weight`` in symmetric int8 with one max-abs scale a row, as torchao's ``IntxWeightOnlyConfig``
    (``activation_quantization`` None: an embedding) or ``Int8DynamicActivationIntxWeightConfig``
    (``"int8_asym_per_token"``: a linear) with ``PerAxis(0)`` quantize it, a block of rows at a time:
    torchao's float temporaries for a whole 0.8B token table (1 GiB in fp32) were 2 GiB more, the
    export's peak. Each row's scale depends on its row only, so the blocks give torchao's values."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    rows, columns = weight.shape
    block = max(1, INT8_ROWS_BLOCK_ELEMENTS // columns)
    parts = [IntxUnpackedToInt8Tensor.from_hp(weight[start:start + block], (1, columns), torch.int8,
                                              activation_quantization=activation_quantization)
             for start in range(0, rows, block)]
    return IntxUnpackedToInt8Tensor(
        torch.cat([part.qdata for part in parts]), torch.cat([part.scale for part in parts]),
        torch.cat([part.zero_point for part in parts]), torch.int8, (1, columns), weight.dtype,
        activation_quantization,
    )


def lookup_only_bytes(mode: str, vocab_size: int, hidden_size: int, tied: bool) -> int:
    """Bytes of a ``mode`` program's token table that only the lookup reads (one row a token), not the
    output head (every row, every step): what a decode step does not stream of the file. fp32 (``none``)
    programs keep the table beside XNNPACK's own copy of the head; a tied planes head (``PLANES_MODES``)
    reads the high plane (and the fifth) and leaves the low one; the other modes' tied heads read the
    table's own int8 rows. An untied table is the lookup's alone (its codes counted, its scales, under 1% of
    them, not)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    weights = vocab_size * hidden_size
    if mode == "none":
        return 4 * weights
    if not tied:
        return weights
    return weights // 2 if mode in PLANES_MODES else 0


def share_tied_vocabulary(model: nn.Module) -> bool:
    """When a tied model's quantized table and head hold the same int8 rows and scales (``int8_rows`` gives
    both), rebuild the head's weight on the table's tensors, so the 8-bit vocabulary is held once (254 MB
    on the 0.8B shape) through the rest of the export. Returns whether it did."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    table, head = getattr(model.embed_tokens, "weight", None), getattr(model.lm_head, "weight", None)
    if not (model.config.tie_word_embeddings and type(table) is IntxUnpackedToInt8Tensor
            and type(head) is IntxUnpackedToInt8Tensor):
        return False
    parts = ("qdata", "scale", "zero_point")
    if table.block_size != head.block_size or not all(torch.equal(getattr(table, p), getattr(head, p)) for p in parts):
        return False
    model.lm_head.weight = nn.Parameter(IntxUnpackedToInt8Tensor(
        table.qdata, table.scale, table.zero_point, head.target_dtype, head.block_size, head.dtype,
        head.activation_quantization), requires_grad=False)
    return True


def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Quantize ``model``'s linears and embeddings (``mode`` one of ``MODES``); returns it."""
    quantizer = Quantizer(mode)
    for name, module in list(model.named_modules()):
        replacement = quantizer(name, module)
        if replacement is not module:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, replacement)
    return model
