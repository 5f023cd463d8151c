"""torchvision's detection ops in plain torch: ``nms``, ``roi_align`` and the box helpers.

torchvision cannot be installed beside every torch, so the zoo's detection models bring their
own ops, registered with ``torch.library`` under ``graphcost_zoo::`` with torchvision's schemas
(``nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor``, ``roi_align(Tensor
input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, int
sampling_ratio, bool aligned) -> Tensor``). Like torchvision's, the fake kernel of ``nms``
returns a size the data decides (``ctx.new_dynamic_size()``, no maximum): a trace meets
exactly what it meets in torchvision's detection models. The CPU kernels are plain torch,
slow but exact enough to run the models for real (tests compare a real run's FLOPs).

The box helpers copy torchvision.ops.boxes and torchvision.models.detection._utils, including
the branches a trace must decide (``batched_nms``: ``if boxes.numel() == 0``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F


@torch.library.custom_op("graphcost_zoo::nms", mutates_args=())
def nms(dets: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Indices of the boxes kept by greedy non-maximum suppression, by decreasing score."""
    if dets.numel() == 0:
        return torch.empty((0,), dtype=torch.long, device=dets.device)
    order = scores.argsort(descending=True)
    boxes = dets[order]
    over = (box_iou(boxes, boxes) > iou_threshold).triu(1)  # i suppresses j > i
    keep = torch.ones(len(boxes), dtype=torch.bool, device=dets.device)
    for i in range(len(boxes)):
        if keep[i]:
            keep &= ~over[i]
    return order[keep]


@nms.register_fake
def _nms_fake(dets, scores, iou_threshold):
    n = torch.library.get_ctx().new_dynamic_size()  # as torchvision's: no maximum declared
    return dets.new_empty((n,), dtype=torch.long)


@torch.library.custom_op("graphcost_zoo::roi_align", mutates_args=())
def roi_align(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
              pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """(K, C, ph, pw): each RoI (batch index, x1, y1, x2, y2) cut into ph×pw bins, each the
    mean of sampling_ratio² bilinear samples (``sampling_ratio`` > 0 here)."""
    k, c = rois.shape[0], input.shape[1]
    s = max(sampling_ratio, 1)
    out = input.new_zeros((k, c, pooled_height * s, pooled_width * s))
    if k == 0:
        return out[:, :, ::s, ::s]
    off = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, 1:] * spatial_scale - off).unbind(1)
    w, h = x2 - x1, y2 - y1
    if not aligned:
        w, h = w.clamp(min=1.0), h.clamp(min=1.0)
    ty = (torch.arange(pooled_height * s, device=rois.device) + 0.5) / s
    tx = (torch.arange(pooled_width * s, device=rois.device) + 0.5) / s
    ys = y1[:, None] + ty[None] * (h / pooled_height)[:, None]    # (K, ph·s)
    xs = x1[:, None] + tx[None] * (w / pooled_width)[:, None]     # (K, pw·s)
    height, width = input.shape[-2:]
    size = (k, ys.shape[1], xs.shape[1])
    gx = ((xs + 0.5) / width * 2 - 1)[:, None, :].expand(size)   # grid_sample's coordinates
    gy = ((ys + 0.5) / height * 2 - 1)[:, :, None].expand(size)
    grid = torch.stack((gx, gy), -1)
    image = rois[:, 0].long()
    for b in image.unique().tolist():
        rows = (image == b).nonzero()[:, 0]
        g = grid[rows].reshape(1, -1, xs.shape[1], 2)
        sampled = F.grid_sample(input[b:b + 1], g, mode="bilinear", align_corners=False)
        out[rows] = sampled.reshape(c, len(rows), ys.shape[1], xs.shape[1]).transpose(0, 1)
    return F.avg_pool2d(out, s)


@roi_align.register_fake
def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                    aligned):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


def box_area(boxes: Tensor) -> Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    lt = torch.max(a[:, None, :2], b[:, :2])
    rb = torch.min(a[:, None, 2:], b[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (box_area(a)[:, None] + box_area(b) - inter)


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """torchvision.ops.boxes._batched_nms_coordinate_trick: one NMS over every class, boxes of
    different classes moved apart so they never overlap."""
    if boxes.numel() == 0:  # the branch torch.export cannot decide without a bound
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    max_coordinate = boxes.max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return torch.ops.graphcost_zoo.nms(boxes + offsets[:, None], scores, iou_threshold)


def remove_small_boxes(boxes: Tensor, min_size: float) -> Tensor:
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return torch.where((ws >= min_size) & (hs >= min_size))[0]


def clip_boxes_to_image(boxes: Tensor, size: tuple[int, int]) -> Tensor:
    height, width = size
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack((x, y), dim=boxes.dim()).reshape(boxes.shape)


class BoxCoder:
    """torchvision.models.detection._utils.BoxCoder.decode."""

    def __init__(self, weights: tuple[float, float, float, float],
                 clip: float = math.log(1000.0 / 16)):
        self.weights, self.clip = weights, clip

    def decode(self, codes: Tensor, boxes: Tensor) -> Tensor:
        """codes (N, 4·k) against boxes (N, 4) → (N, k, 4)."""
        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights
        wx, wy, ww, wh = self.weights
        dx, dy = codes[:, 0::4] / wx, codes[:, 1::4] / wy
        dw = torch.clamp(codes[:, 2::4] / ww, max=self.clip)
        dh = torch.clamp(codes[:, 3::4] / wh, max=self.clip)
        cx, cy = dx * widths[:, None] + ctr_x[:, None], dy * heights[:, None] + ctr_y[:, None]
        w, h = torch.exp(dw) * widths[:, None], torch.exp(dh) * heights[:, None]
        return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), dim=2)


def anchors(size: tuple[int, int], stride: int, scales: tuple[float, ...], device=None,
            ratios: tuple[float, ...] = (0.5, 1.0, 2.0)) -> Tensor:
    """torchvision's AnchorGenerator for one level: (H·W·A, 4), A = scales × ratios, in the
    order (y, x, anchor)."""
    r = torch.tensor(ratios, device=device)
    s = torch.tensor(scales, device=device)
    hr = torch.sqrt(r)
    ws = (s[None, :] / hr[:, None]).reshape(-1)
    hs = (s[None, :] * hr[:, None]).reshape(-1)
    base = torch.stack([-ws, -hs, ws, hs], dim=1) / 2
    ys = torch.arange(size[0], dtype=torch.float32, device=device) * stride
    xs = torch.arange(size[1], dtype=torch.float32, device=device) * stride
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack((xx.reshape(-1), yy.reshape(-1), xx.reshape(-1), yy.reshape(-1)), 1)
    return (shifts.view(-1, 1, 4) + base.view(1, -1, 4)).reshape(-1, 4)
