"""Detection and spatial sampling: NonMaxSuppression, RoI pooling, grid sampling, deformable
convolution, unpooling.

A bilinear sample of one channel is 4 multiplies + 3 adds = 7 FLOPs (the tap weights are
computed once per position and shared across channels: not counted per channel); a trilinear
one 8 + 7 = 15; in general 2^r taps → 2^(r+1) − 1 per sample, cubic 4^r taps → 2·4^r − 1.
"""
from __future__ import annotations

import math

from ..costs import shape_fns as sf
from ..costs.registry import WINDOW_ATTRS, OpView, rule, zero_cost

IOU = 13  # intersection corners (4 max/min), sizes (2), clamp at 0 (2), area (1),
#           union a + b − i (2), ratio (1), compare with the threshold (1)


def _nms_bound(v):
    boxes, scores = v.shape(0), v.shape(1)
    if boxes is None or scores is None:
        return [None]
    b, c, n = scores
    per_class = sf.const_int(v, 2, 0 if not v.has_input(2) else None)
    if per_class is None or not isinstance(n, int):
        per_class = n
    else:
        per_class = min(per_class, n)
    if not all(isinstance(d, int) for d in (b, c, per_class)):
        return [None]
    return [("int64", (b * c * per_class, 3))]


@rule("NonMaxSuppression", config_inputs=(2, 3, 4), saves="nothing",
      bound="selected_indices holds at most min(max_output_boxes_per_class, boxes) boxes per "
            "class and batch", bound_shapes=_nms_bound)
def non_max_suppression(op: OpView) -> tuple[int, int]:
    # boxes (B, n, 4), scores (B, C, n): per batch and class a score-threshold compare per box
    # (n), a sort (n·⌈log2 n⌉) and, at worst, the IoU of every pair of boxes (13 each); box
    # areas once per batch (3 per box: two differences and a product).
    b, c, n = op.in_shape(1)
    pairs = n * (n - 1) // 2
    op.bounded("the IoU of every pair of boxes is counted (the greedy loop stops once "
               "max_output_boxes_per_class are kept)")
    return 0, b * c * (n + n * max(1, math.ceil(math.log2(max(n, 2)))) + IOU * pairs) \
        + b * n * 3


def _nms_keep(v):
    boxes = v.shape(0)  # torchvision's nms keeps at most the boxes it is given
    return [("int64", None if boxes is None else boxes[:1])]


@rule("torchvision.nms.default", "graphcost_zoo.nms.default", saves="nothing",
      bound="NMS keeps at most the boxes it is given", bound_shapes=_nms_keep)
def nms(op: OpView) -> tuple[int, int]:
    # dets (n, 4), scores (n): a sort (n·⌈log2 n⌉ compares), box areas (3 per box) and, at
    # worst, the IoU of every pair (13 each) — NonMaxSuppression's count for one class
    # without its score threshold.
    n = op.in_shape(0)[0]
    op.bounded("the IoU of every pair of boxes is counted (the greedy loop skips the "
               "suppressed ones)")
    return 0, n * max(1, math.ceil(math.log2(max(n, 2)))) + IOU * (n * (n - 1) // 2) + 3 * n


@rule("RoiAlign", "torchvision.roi_align.default", "graphcost_zoo.roi_align.default",
      index_inputs=(2,), saves="inputs")
def roi_align(op: OpView) -> tuple[int, int]:
    # X (N, C, H, W), rois (R, 4) → (R, C, oh, ow) (torchvision: rois (R, 5) with the batch
    # index first, the same count): each output bin averages (or maxes)
    # sampling_ratio² bilinear samples (7 + 1 to pool each), an average divides once. With
    # sampling_ratio 0 the count adapts to each RoI's size: counted for a RoI as large as the
    # feature map, ⌈H/oh⌉·⌈W/ow⌉ samples (an upper bound).
    _, _, h, w = op.in_shape(0)
    out = op.out_shape(0)
    sr = int(op.attr("sampling_ratio", 0) or 0)
    if sr > 0:
        samples = sr * sr
    else:
        samples = math.ceil(h / out[2]) * math.ceil(w / out[3])
        op.bounded("sampling_ratio 0 adapts to each RoI: counted for RoIs as large as the "
                   "feature map")
    n = op.out_numel(0)
    avg = n if op.attr("mode", "avg") == "avg" else 0
    return 0, n * samples * 8 + avg


@rule("MaxRoiPool", "torchvision.roi_pool.default", saves="inputs")
def max_roi_pool(op: OpView) -> tuple[int, int]:
    # X (N, C, H, W), rois (R, 5): the bins of a RoI partition it, so each (RoI, channel) is at
    # most H·W compares: R·C·H·W, counted for RoIs as large as the feature map.
    _, c, h, w = op.in_shape(0)
    r = op.in_shape(1)[0]
    op.bounded("counted for RoIs as large as the feature map")
    return 0, r * c * h * w


def _taps(mode: str, r: int) -> int:
    if mode in ("linear", "bilinear"):
        return 2 ** (r + 1) - 1
    if mode in ("cubic", "bicubic"):
        return 2 * 4 ** r - 1
    return 0  # nearest: a gather


@rule("GridSample", saves="inputs")
def grid_sample(op: OpView) -> tuple[int, int]:
    # X (N, C, D…), grid (N, D_out…, r): per output element the mode's taps (above); per output
    # position the r coordinates unnormalized (multiply, add: 2 each).
    grid = op.in_shape(1)
    r = grid[-1]
    mode = op.attr("mode", "linear")
    positions = math.prod(grid[:-1])
    return 0, op.out_numel(0) * _taps(mode, r) + positions * 2 * r


# torch's grid_sample: interpolation_mode 0 bilinear, 1 nearest, 2 bicubic (the count above)
_GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}


@rule("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default", saves="inputs")
def grid_sampler(op: OpView) -> tuple[int, int]:
    grid = op.in_shape(1)
    r = grid[-1]
    mode = _GRID_MODES.get(int(op.attr("interpolation_mode", 0)), "linear")
    return 0, op.out_numel(0) * _taps(mode, r) + math.prod(grid[:-1]) * 2 * r


@rule("AffineGrid", config_inputs=(1,), saves="inputs")
def affine_grid(op: OpView) -> tuple[int, int]:
    # theta (N, r, r+1) applied to every base-grid point (x, y[, z], 1): grid (N, D…, r) gets
    # r+1 MACs per element (a batched matmul against the constant base grid).
    grid = op.out_shape(0)
    macs = op.out_numel(0) * (grid[-1] + 1)
    return macs, 2 * macs


@rule("DeformConv", saves="operands", attr_names=WINDOW_ATTRS)
def deform_conv(op: OpView) -> tuple[int, int]:
    # X (N, C, H, W), W (oC, C/g, k…), offset, B, mask: a Conv's MACs (output × C/g·Πk), and
    # for each input channel, output position and kernel tap a sampled input: offset add per
    # coordinate (2 in 2-D), bilinear sample (7), mask multiply (1 when given).
    out = op.out_shape(0)
    w = op.in_shape(1)
    macs = op.out_numel(0) * math.prod(w[1:])
    x = op.in_shape(0)
    r = len(w) - 2
    samples = x[0] * x[1] * math.prod(out[2:]) * math.prod(w[2:])
    per = r + _taps("linear", r) + (1 if op.has_input(4) else 0)
    bias = op.out_numel(0) if op.has_input(3) else 0
    return macs, 2 * macs + bias + samples * per


zero_cost("MaxUnpool", reason="data movement: zero-fills the output and scatters the input by "
          "its indices", config_inputs=(2,), attr_names=WINDOW_ATTRS, family="detection")
zero_cost("CenterCropPad", reason="data movement: copies the centre crop into a padded buffer",
          config_inputs=(1,), family="detection")
