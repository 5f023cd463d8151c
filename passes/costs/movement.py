"""Data movement, views, constants and control flow: ops that do no arithmetic (each declared
zero with its reason) plus the few movement ops that do compute (Resize, Range)."""
from __future__ import annotations

import math
from typing import Any

from ..costs.registry import AXIS_ATTRS, OpView, rule, zero_cost

FAMILY = "movement"

# Views: the output shares the input's storage, so no bytes move and liveness aliases them.
# The backward of a view hands the gradient on as a view too.
VIEW: dict[str, Any] = dict(alias=True, family=FAMILY, grad_view="always")
zero_cost("Reshape", "Squeeze", "Unsqueeze", "Flatten",
          "aten.view.default", "aten.reshape.default", "aten.flatten.using_ints",
          "aten.unsqueeze.default", "aten.squeeze.dims",
          reason="view: output aliases input storage", rf="reshape", **VIEW)
zero_cost("Identity", "aten.alias.default", "aten.lift_fresh.default", "aten.detach.default",
          reason="view: output aliases input storage", rf="pointwise", same_shape=True, **VIEW)
zero_cost("Dropout", "aten.dropout.default", "aten.feature_dropout.default",
          reason="identity at inference (a view); a training step's dropout is "
                 "aten.native_dropout", rf="pointwise", same_shape=True, saves="mask",
          alias=True, family=FAMILY, grad_view="always")
# torch views: no copy, outputs (every one, for split/unbind) share the input's storage.
zero_cost("aten.permute.default", "aten.expand.default", "aten.slice.Tensor",
          "aten.select.int", "aten.split_with_sizes.default", "aten.chunk.default",
          "aten.as_strided.default", "aten.diagonal.default", "aten.narrow.default",
          "aten.unflatten.int", "aten.view_as_real.default", "aten.view_as_complex.default",
          "aten._conj.default",   # (a complex view with its conjugate bit set: no copy)
          "aten.unfold.default",  # sliding windows by strides (HaloNet's blocks)
          reason="torch view: output aliases input storage", **VIEW)
# Copies that keep every element where it was (a receptive field passes through).
zero_cost("Cast", "CastLike", "aten.clone.default", "aten._to_copy.default", "aten.to.dtype",
          "aten.copy.default", "aten.contiguous.default", "aten.lift_fresh_copy.default",
          reason="data movement: copies elements in place order", rf="pointwise",
          same_shape=True, family=FAMILY)
zero_cost("Concat", "aten.cat.default", reason="data movement: copies the inputs side by side",
          rf="concat", grad_view="always", attr_names=AXIS_ATTRS, family=FAMILY)
zero_cost("aten.constant_pad_nd.default", reason="data movement: copies into a padded buffer",
          rf="constant_pad", family=FAMILY)
zero_cost("aten.repeat.default", "aten.flip.default", "aten.scatter.src", "aten.scatter.value",
          "aten.scatter_add.default", "aten.index_put.default", "aten.slice_scatter.default",
          "aten.as_strided_scatter.default",
          "aten.diagonal_scatter.default",  # diagonal's backward (zeros, the diagonal written)
          reason="data movement: copies or rearranges elements", family=FAMILY)
# A view's gradient, one kernel eagerly: zeros of the input's size with the gradient copied
# into the slice, row or diagonal (decomposed, zeros and a *_scatter copy of them: two
# input-sized tensors at once; Longformer's chunked attention's step +14%)
zero_cost("aten.slice_backward.default", "aten.select_backward.default",
          "aten.diagonal_backward.default",
          reason="data movement: the gradient copied into zeros of the input's size",
          family=FAMILY)
zero_cost("aten.index_select.default", "aten.gather.default", "aten.index.Tensor",
          "aten.embedding.default",
          reason="data movement: reads the gathered rows and the indices",
          reads="outputs", index_inputs=(1,), family=FAMILY)
zero_cost("aten.full.default", "aten.empty.memory_format", "aten.empty_strided.default",
          "aten.new_empty_strided.default", "aten.empty_permuted.default", "aten.full_like.default",
          "aten.scalar_tensor.default", "aten.rand.default",
          "aten.randn.default", "aten.rand_like.default", "aten.randn_like.default",
          reason="materializes a constant or random tensor", reads="none", family=FAMILY)
zero_cost("aten._assert_tensor_metadata.default", "aten.sym_numel.default",
          "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
          reason="metadata check or size query: no tensor data", reads="none", family=FAMILY)
zero_cost("aten._assert_async.msg", "aten._assert_async.default",
          reason="checks a one-element tensor is true (a device sync): no arithmetic",
          family=FAMILY)

# Copies: every input byte is read and every output byte written, no arithmetic.
zero_cost("Pad", reason="data movement: copies into a padded buffer", config_inputs=(1, 2, 3),
          family=FAMILY)
zero_cost("Transpose", reason="data movement: copies or rearranges elements", family=FAMILY,
          grad_view="always")  # the gradient's transpose, counted as a view of it
zero_cost("Expand", "Tile",
          "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements", "Scatter",
          "ReverseSequence", "Trilu", "Col2Im", "TensorScatter",
          reason="data movement: copies or rearranges elements", family=FAMILY)
zero_cost("BitCast", reason="view: the input's bits read as another type of the same width",
          alias=True, family=FAMILY)


def _axis(v, rank: int) -> int | None:
    a = v.attr("axis")
    return None if a is None else int(a) % rank


def _compress_bound(v):
    x, cond = v.shape(0), v.shape(1)
    if x is None or cond is None or not isinstance(cond[0], int):
        return [None]
    axis = _axis(v, len(x))
    if axis is None:
        n = 1
        for d in x:
            n = n * d if isinstance(d, int) and isinstance(n, int) else None
        return [(None, (min(n, cond[0]) if n is not None else None,))]
    d = x[axis]
    return [(None, x[:axis] + (min(d, cond[0]) if isinstance(d, int) else None,) + x[axis + 1:])]


def _unique_bound(v):
    x = v.shape(0)
    if x is None:
        return [None] * 4
    axis = _axis(v, len(x))
    if axis is None:
        n = 1
        for d in x:
            n = n * d if isinstance(d, int) and isinstance(n, int) else None
        return [(None, (n,)), ("int64", (n,)), ("int64", (n,)), ("int64", (n,))]
    k = (x[axis],)
    return [(None, x), ("int64", k), ("int64", k), ("int64", k)]


zero_cost("Compress", reason="data movement: copies the selected slices", family=FAMILY,
          bound="keeps every slice the condition covers", bound_shapes=_compress_bound)
zero_cost("Unique", reason="data movement: copies the distinct elements", family=FAMILY,
          bound="every element (or slice along axis) distinct", bound_shapes=_unique_bound)
# Selections read only what they select (plus their index inputs).
zero_cost("Slice", reason="data movement: reads only the selected elements",
          reads="outputs", family=FAMILY,
          bound="starts/ends (tensors, not constants) select the whole axis",
          bound_shapes=lambda v: [(None, v.shape(0))])
zero_cost("Split", reason="data movement: reads only the selected elements",
          reads="outputs", family=FAMILY)
zero_cost("Gather", "GatherElements", "GatherND",
          reason="data movement: reads the gathered rows and the indices",
          reads="outputs", index_inputs=(1,), family=FAMILY,
          saves=(1,))  # the backward scatters into the rows its indices name
# Metadata and constants: nothing read, the (small) output written.
zero_cost("Shape", "Size", reason="reads tensor metadata only", reads="none", family=FAMILY)
zero_cost("Constant", "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform",
          "RandomNormalLike", "RandomUniformLike",
          reason="materializes a constant or random tensor", reads="none", family=FAMILY)
zero_cost("If", "Loop", "Scan",
          reason="control flow: the body's nodes are costed as nodes of their own",
          reads="none", family="control", bodies=True)


@rule("OneHot", saves="nothing")
def one_per_output(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel(0)  # one compare/select per output element


def _nonzero_bound(v):
    x = v.shape(0)
    if x is None or not all(isinstance(d, int) for d in x):
        return [None]
    n = 1
    for d in x:
        n *= d
    return [("int64", (len(x), n))]


@rule("NonZero", saves="nothing", bound="every element non-zero",
      bound_shapes=_nonzero_bound)
def nonzero(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # one compare per input element


# torch's nonzero declares its own maximum (its input's element count): the trace's range
rule("aten.nonzero.default", saves="nothing")(nonzero)


@rule("aten.repeat_interleave.Tensor", saves="nothing")
def repeat_indices(op: OpView) -> tuple[int, int]:
    # repeats (n,) → the index of each repeated row (sum(repeats), a size the data decides,
    # with no maximum torch can declare): a running sum of the counts (n adds), then the
    # indices written
    return 0, op.in_numel(0)


@rule("Range", "aten.arange.start_step", saves="nothing")
def range_(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel(0)  # start + i·delta: one FLOP per element


@rule("Resize", "Upsample", config_inputs=(1, 2, 3), saves="nothing")
def resize(op: OpView) -> tuple[int, int]:
    mode = op.attr("mode", "nearest")
    return 0, _interpolation(op, mode.decode() if isinstance(mode, bytes) else mode)


def _interpolation(op: OpView, mode: str, backward: bool = False) -> int:
    # nearest: a copy (0). linear over r resized axes: 2^r − 1 lerps (a + t·(b − a): 3 FLOPs)
    # per output. cubic: 4 taps × (mul + add) per resized axis per output. A backward is the
    # transpose of the same linear map (each output's gradient weighted back onto its taps):
    # counted as the forward at the same sizes, its gradient input the forward's output.
    x, y = op.in_shape(0), op.out_shape(0)
    if backward:
        x, y = y, x
    r = sum(1 for a, b in zip(x, y) if a != b)
    if mode == "linear":
        return math.prod(y) * 3 * (2 ** r - 1)
    if mode == "cubic":
        return math.prod(y) * 8 * r
    return 0


# F.interpolate reaches the graph whole, and in a training step its backward too, as one
# kernel each as eager runs them (analyzer/frontends/torch/frontend.py keeps them from torch's
# Python decompositions): counted as ONNX's Resize, which the exporters write for them.
_LINEAR = ("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d")
_NEAREST = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
            "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")


def _forms(bases: tuple[str, ...], suffix: str = "") -> tuple[str, ...]:
    """The aten names of ``bases``: ``.vec`` (sizes or scales, as F.interpolate calls it) and
    ``.default`` (sizes); a backward has only ``.default``."""
    if suffix:
        return tuple(f"aten.{b}{suffix}.default" for b in bases)
    return tuple(f"aten.{b}.{form}" for b in bases for form in ("vec", "default"))


zero_cost(*_forms(_NEAREST), reason="data movement: each output copies its nearest input",
          family=FAMILY)


@rule(*_forms(_NEAREST, "_backward"), saves="nothing")
def upsample_nearest_backward(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # each output's gradient added onto the input it copied


@rule(*_forms(_LINEAR), saves="nothing")
def upsample_linear(op: OpView) -> tuple[int, int]:
    return 0, _interpolation(op, "linear")


@rule(*_forms(_LINEAR, "_backward"), saves="nothing")
def upsample_linear_backward(op: OpView) -> tuple[int, int]:
    return 0, _interpolation(op, "linear", backward=True)


@rule(*_forms(("upsample_bicubic2d",)), saves="nothing")
def upsample_bicubic(op: OpView) -> tuple[int, int]:
    return 0, _interpolation(op, "cubic")


@rule(*_forms(("upsample_bicubic2d",), "_backward"), saves="nothing")
def upsample_bicubic_backward(op: OpView) -> tuple[int, int]:
    return 0, _interpolation(op, "cubic", backward=True)


# F.interpolate(..., antialias=True) (DINOv2's position embeddings at another resolution).
# PyTorch resizes one axis at a time, the last first, skipping axes that keep their size
# (separable_upsample_generic_Nd_kernel_impl in ATen's CPU UpSampleKernel.cpp); on an axis
# shrunk by s the filter (2 taps bilinear, 4 bicubic, 6 Lanczos: how many outputs one input
# reaches when torch 2.14 enlarges an axis twofold, 4, 8 and 12) is stretched to s times its
# taps, each tap a multiply and an add (an estimate: the taps are trimmed at the borders). The
# backward counted as the forward at the same sizes (the transpose, as above).
_ANTIALIASED = {"_upsample_bilinear2d_aa": 2, "_upsample_bicubic2d_aa": 4,
                "_upsample_lanczos2d_aa": 6}  # (Lanczos: not in torch 2.8)


@rule(*_forms(tuple(_ANTIALIASED)), *_forms(tuple(_ANTIALIASED), "_backward"),
      saves="nothing")
def upsample_antialiased(op: OpView) -> tuple[int, int]:
    base = op.node.op.removeprefix("aten.").split(".")[0]
    taps = _ANTIALIASED[base.removesuffix("_backward")]
    shape, out = list(op.in_shape(0)), op.out_shape(0)
    if base.endswith("_backward"):
        shape, out = list(out), shape
    flops = 0
    for axis in reversed(range(2, len(out))):
        if shape[axis] != out[axis]:
            support = math.ceil(taps * max(1.0, shape[axis] / max(1, out[axis])))
            shape[axis] = out[axis]
            flops += math.prod(shape) * 2 * support
    return 0, flops
