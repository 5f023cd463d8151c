"""Data movement, views, constants and control flow: ops that do no arithmetic (each declared
zero with its reason) plus the few movement ops that do compute (Resize, Range)."""
from __future__ import annotations

from graphcost.passes.costs.registry import OpView, rule, zero_cost

FAMILY = "movement"

# Views: the output shares the input's storage, so no bytes move and liveness aliases them.
zero_cost("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity",
          reason="view: output aliases input storage", alias=True, family=FAMILY)
zero_cost("Dropout", reason="identity at inference (a view); training graphs are not costed here",
          alias=True, family=FAMILY, saves="mask")
# torch views: no copy, outputs (every one, for split/unbind) share the input's storage.
zero_cost("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
          "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.expand.default",
          "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
          "aten.squeeze.default", "aten.flatten.using_ints", "aten.unflatten.int",
          "aten.slice.Tensor", "aten.select.int", "aten.alias.default", "aten.detach.default",
          "aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int",
          "aten.chunk.default", "aten.as_strided.default", "aten.diagonal.default",
          "aten.narrow.default", "aten.view_as_real.default", "aten.view_as_complex.default",
          "aten.dropout.default", "aten.feature_dropout.default", "aten.lift_fresh.default",
          reason="torch view: output aliases input storage", alias=True, family=FAMILY)
zero_cost("aten.clone.default", "aten._to_copy.default", "aten.to.dtype", "aten.copy.default",
          "aten.contiguous.default", "aten.lift_fresh_copy.default", "aten.cat.default",
          "aten.stack.default", "aten.constant_pad_nd.default", "aten.pad.default",
          "aten.repeat.default", "aten.tril.default", "aten.triu.default", "aten.flip.default",
          "aten.roll.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
          "aten.index_put.default", "aten.slice_scatter.default", "aten.select_scatter.default",
          "aten.pixel_shuffle.default", "aten.pixel_unshuffle.default",
          "aten.upsample_nearest2d.default", "aten.upsample_nearest2d.vec",
          reason="data movement: copies or rearranges elements", family=FAMILY)
zero_cost("aten.index_select.default", "aten.gather.default", "aten.index.Tensor",
          "aten.embedding.default",
          reason="data movement: reads the gathered rows and the indices",
          reads="outputs", index_inputs=(1,), family=FAMILY)
zero_cost("aten.full.default", "aten.zeros.default", "aten.ones.default",
          "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_permuted.default",
          "aten.full_like.default",
          "aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default",
          "aten.scalar_tensor.default", "aten.new_zeros.default", "aten.new_ones.default",
          "aten.new_full.default", "aten.new_empty.default", "aten.rand.default",
          "aten.randn.default", "aten.rand_like.default", "aten.randn_like.default",
          reason="materializes a constant or random tensor", reads="none", family=FAMILY)
zero_cost("aten._assert_tensor_metadata.default", "aten.sym_size.int", "aten.sym_numel.default",
          "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
          reason="metadata check or size query: no tensor data", reads="none", family=FAMILY)

# Copies: every input byte is read and every output byte written, no arithmetic.
zero_cost("Pad", reason="data movement: copies into a padded buffer", config_inputs=(1, 2, 3),
          family=FAMILY)
zero_cost("Transpose", "Concat", "Expand", "Tile", "Cast", "CastLike",
          "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements", "Scatter",
          "ReverseSequence", "Trilu", "Compress", "Col2Im", "Unique",
          reason="data movement: copies or rearranges elements", family=FAMILY)
# Selections read only what they select (plus their index inputs).
zero_cost("Slice", "Split", reason="data movement: reads only the selected elements",
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
          reads="none", family=FAMILY)


@rule("OneHot", "NonZero", saves="nothing")
def one_per_output(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel(0)  # one compare/select per output element


@rule("Range", "aten.arange.default", "aten.arange.start", "aten.arange.start_step",
      saves="nothing")
def range_(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel(0)  # start + i·delta: one FLOP per element


@rule("Resize", "Upsample", config_inputs=(1, 2, 3), saves="nothing")
def resize(op: OpView) -> tuple[int, int]:
    # nearest: a copy (0). linear over r resized axes: 2^r − 1 lerps of 3 FLOPs per output.
    # cubic: 4 taps × (mul + add) per resized axis per output.
    mode = op.attr("mode", "nearest")
    if isinstance(mode, bytes):
        mode = mode.decode()
    x, y = op.in_shape(0), op.out_shape(0)
    r = sum(1 for a, b in zip(x, y) if a != b)
    if mode == "linear":
        return 0, op.out_numel(0) * 3 * (2 ** r - 1)
    if mode == "cubic":
        return 0, op.out_numel(0) * 8 * r
    return 0, 0
