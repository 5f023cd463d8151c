"""Two small detectors built the way torchvision's are, in plain torch (ops: detection_ops.py).

* ``TwoStageDetector`` (Faster R-CNN): backbone → 2-level FPN → RPN (objectness and box
  deltas per anchor) → per image: top-``pre_nms_top_n`` per level, decode, clip, drop small
  boxes, score threshold, batched NMS, keep ``post_nms_top_n`` → multi-scale RoIAlign
  (levels by box size, ``torch.where(levels == l)`` per level) → two-layer MLP box head on
  every proposal → class scores and per-class deltas → per image: softmax, decode, clip,
  score threshold, drop small boxes, batched NMS, keep ``detections_per_img``.
* ``SingleStageDetector`` (RetinaNet): backbone → FPN → class and box towers on every
  anchor → per image and level: sigmoid scores over a threshold (a boolean mask), top
  ``min(topk_candidates, kept)``, decode, clip → batched NMS → keep ``detections_per_img``.

Every data-dependent size torchvision's models meet is here: ``nonzero`` (masks and
``torch.where``), NMS's output (a size its fake kernel leaves unbounded), slices of them
(``keep[:100]``), a top-k whose k is ``min(constant, data-dependent size)``, a branch on a
data-dependent size (``batched_nms``'s ``boxes.numel() == 0``). The maxima the models declare
are torchvision's attributes (``rpn_post_nms_top_n_test``, ``box_detections_per_img``,
``topk_candidates``), here constructor arguments. Inputs: a batch of 3×128×128 images (the
sizes need not be multiples of 16: the FPN resizes). Output: boxes (N, 4), scores (N),
labels (N) and the image each belongs to (N), for the whole batch.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .detection_ops import (
    BoxCoder,
    anchors,
    batched_nms,
    clip_boxes_to_image,
    remove_small_boxes,
)
from .zoo_model import BATCH, ZooModel

IMAGE = (3, 128, 128)


class Backbone(nn.Module):
    """Four stride-2 convs (16, 32, 64, 64 channels) and a two-level FPN (strides 8, 16, 32
    channels): lateral 1×1 convs, a nearest-neighbour top-down path, 3×3 output convs."""

    def __init__(self, width: int = 32):
        super().__init__()
        chans = [3, 16, 32, 64, 64]
        self.body = nn.ModuleList(nn.Sequential(nn.Conv2d(a, b, 3, 2, 1), nn.ReLU())
                                  for a, b in zip(chans, chans[1:]))
        self.lateral = nn.ModuleList([nn.Conv2d(64, width, 1), nn.Conv2d(64, width, 1)])
        self.output = nn.ModuleList([nn.Conv2d(width, width, 3, 1, 1) for _ in range(2)])

    def forward(self, x: Tensor) -> list[Tensor]:
        feats = []
        for stage in self.body:
            x = stage(x)
            feats.append(x)
        c3, c4 = feats[2], feats[3]
        p4 = self.lateral[1](c4)
        p3 = self.lateral[0](c3) + F.interpolate(p4, size=c3.shape[-2:], mode="nearest")
        return [self.output[0](p3), self.output[1](p4)]


STRIDES = (8, 16)
SCALES = ((32.0,), (64.0,))  # one anchor size per level, 3 aspect ratios: 3 anchors


def _anchors(features: list[Tensor]) -> list[Tensor]:
    return [anchors((f.shape[-2], f.shape[-1]), s, sc, f.device)
            for f, s, sc in zip(features, STRIDES, SCALES)]


def _batched(out: list[tuple[Tensor, Tensor, Tensor, Tensor]]
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each image's (boxes, scores, labels, image index), concatenated over the batch."""
    boxes, scores, labels, image = [torch.cat(parts) for parts in zip(*out)]
    return boxes, scores, labels, image


class TwoStageDetector(nn.Module):
    """Faster R-CNN in miniature (module docstring). Thresholds and maxima are torchvision's
    test-time defaults (``rpn_pre_nms_top_n_test`` = ``rpn_post_nms_top_n_test`` = 1000,
    ``box_detections_per_img`` = 100)."""

    def __init__(self, num_classes: int = 5, pre_nms_top_n: int = 1000,
                 post_nms_top_n: int = 1000, rpn_nms_thresh: float = 0.7,
                 rpn_min_size: float = 1e-3, box_score_thresh: float = 0.05,
                 box_nms_thresh: float = 0.5, box_min_size: float = 1e-2,
                 detections_per_img: int = 100, width: int = 32, representation: int = 128):
        super().__init__()
        self.backbone = Backbone(width)
        self.rpn_conv = nn.Conv2d(width, width, 3, 1, 1)
        self.rpn_cls = nn.Conv2d(width, 3, 1)
        self.rpn_bbox = nn.Conv2d(width, 12, 1)
        self.fc6 = nn.Linear(width * 7 * 7, representation)
        self.fc7 = nn.Linear(representation, representation)
        self.cls_score = nn.Linear(representation, num_classes)
        self.bbox_pred = nn.Linear(representation, num_classes * 4)
        self.num_classes = num_classes
        self.pre_nms_top_n, self.post_nms_top_n = pre_nms_top_n, post_nms_top_n
        self.rpn_nms_thresh, self.rpn_min_size = rpn_nms_thresh, rpn_min_size
        self.box_score_thresh, self.box_nms_thresh = box_score_thresh, box_nms_thresh
        self.box_min_size, self.detections_per_img = box_min_size, detections_per_img
        self.rpn_coder = BoxCoder((1.0, 1.0, 1.0, 1.0))
        self.box_coder = BoxCoder((10.0, 10.0, 5.0, 5.0))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        size = (images.shape[-2], images.shape[-1])
        features = self.backbone(images)
        proposals = self._proposals(features, size, images.shape[0])
        rois = torch.cat([torch.cat([torch.full_like(p[:, :1], i), p], 1)
                          for i, p in enumerate(proposals)])
        x = self._roi_pool(features, rois).flatten(1)
        x = F.relu(self.fc7(F.relu(self.fc6(x))))
        logits, deltas = self.cls_score(x), self.bbox_pred(x)
        return self._detections(logits, deltas, proposals, size)

    def _proposals(self, features: list[Tensor], size, batch: int) -> list[Tensor]:
        """torchvision's RegionProposalNetwork at inference: every anchor decoded, the top
        ``pre_nms_top_n`` objectness per level kept, then per image the filters and NMS."""
        objectness, deltas = [], []
        for f in features:
            t = F.relu(self.rpn_conv(f))
            objectness.append(self.rpn_cls(t).permute(0, 2, 3, 1).reshape(batch, -1))
            deltas.append(self.rpn_bbox(t).permute(0, 2, 3, 1).reshape(batch, -1, 4))
        per_level = [o.shape[1] for o in objectness]
        obj = torch.cat(objectness, 1)
        anchor = torch.cat(_anchors(features)).repeat(batch, 1)
        boxes = self.rpn_coder.decode(torch.cat(deltas, 1).reshape(-1, 4), anchor)
        boxes = boxes.reshape(batch, -1, 4)
        top, levels, offset = [], [], 0
        for lvl, n in enumerate(per_level):
            k = min(self.pre_nms_top_n, n)
            top.append(obj[:, offset:offset + n].topk(k, dim=1)[1] + offset)
            levels.append(torch.full((k,), lvl, dtype=torch.int64, device=obj.device))
            offset += n
        rows, top = torch.arange(batch, device=obj.device)[:, None], torch.cat(top, 1)
        prob, boxes, lvl = torch.sigmoid(obj[rows, top]), boxes[rows, top], torch.cat(levels)
        out = []
        for i in range(batch):
            b = clip_boxes_to_image(boxes[i], size)
            keep = remove_small_boxes(b, self.rpn_min_size)
            b, scores, lv = b[keep], prob[i][keep], lvl[keep]
            keep = torch.where(scores >= 0.0)[0]
            b, scores, lv = b[keep], scores[keep], lv[keep]
            keep = batched_nms(b, scores, lv, self.rpn_nms_thresh)
            out.append(b[keep[: self.post_nms_top_n]])
        return out

    def _roi_pool(self, features: list[Tensor], rois: Tensor) -> Tensor:
        """torchvision's MultiScaleRoIAlign: each RoI pooled 7×7 (2×2 samples per bin) from
        the level its size maps to (LevelMapper: k0 = 4 at a canonical size of 64 here)."""
        area = (rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])
        k = torch.floor(4 + torch.log2(torch.sqrt(area) / 64 + 1e-6))
        levels = torch.clamp(k, min=3, max=4).to(torch.int64) - 3
        result = rois.new_zeros((rois.shape[0], features[0].shape[1], 7, 7))
        for lvl, (f, stride) in enumerate(zip(features, STRIDES)):
            idx = torch.where(levels == lvl)[0]
            pooled = torch.ops.graphcost_zoo.roi_align(f, rois[idx], 1.0 / stride, 7, 7, 2,
                                                       False)
            result[idx] = pooled
        return result

    def _detections(self, logits: Tensor, deltas: Tensor, proposals: list[Tensor],
                    size: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        per_image = [p.shape[0] for p in proposals]
        boxes_all = self.box_coder.decode(deltas, torch.cat(proposals))
        scores_all = F.softmax(logits, -1)
        out = []
        for i, (boxes, scores) in enumerate(zip(boxes_all.split(per_image),
                                                scores_all.split(per_image))):
            boxes = clip_boxes_to_image(boxes, size)
            labels = torch.arange(self.num_classes, device=scores.device).view(1, -1)
            labels = labels.expand_as(scores)
            boxes, scores, labels = boxes[:, 1:], scores[:, 1:], labels[:, 1:]  # background
            boxes, scores, labels = boxes.reshape(-1, 4), scores.reshape(-1), labels.reshape(-1)
            keep = torch.where(scores > self.box_score_thresh)[0]
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            keep = remove_small_boxes(boxes, self.box_min_size)
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            keep = batched_nms(boxes, scores, labels, self.box_nms_thresh)
            keep = keep[: self.detections_per_img]
            out.append((boxes[keep], scores[keep], labels[keep],
                        torch.full_like(labels[keep], i)))
        return _batched(out)


class SingleStageDetector(nn.Module):
    """RetinaNet in miniature (module docstring): towers of one 3×3 conv + ReLU, sigmoid
    class scores per anchor, torchvision's post-processing and defaults
    (``topk_candidates`` 1000, ``detections_per_img`` 300)."""

    def __init__(self, num_classes: int = 4, score_thresh: float = 0.05,
                 nms_thresh: float = 0.5, topk_candidates: int = 1000,
                 detections_per_img: int = 300, width: int = 32):
        super().__init__()
        self.backbone = Backbone(width)
        self.cls_tower = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1), nn.ReLU())
        self.cls_logits = nn.Conv2d(width, 3 * num_classes, 3, 1, 1)
        self.box_tower = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1), nn.ReLU())
        self.bbox_reg = nn.Conv2d(width, 12, 3, 1, 1)
        self.num_classes = num_classes
        self.score_thresh, self.nms_thresh = score_thresh, nms_thresh
        self.topk_candidates, self.detections_per_img = topk_candidates, detections_per_img
        self.coder = BoxCoder((1.0, 1.0, 1.0, 1.0))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        size = (images.shape[-2], images.shape[-1])
        features = self.backbone(images)
        batch, c = images.shape[0], self.num_classes
        logits = [self.cls_logits(self.cls_tower(f)).permute(0, 2, 3, 1).reshape(batch, -1, c)
                  for f in features]
        deltas = [self.bbox_reg(self.box_tower(f)).permute(0, 2, 3, 1).reshape(batch, -1, 4)
                  for f in features]
        level_anchors = _anchors(features)
        out = []
        for i in range(batch):
            boxes_i, scores_i, labels_i = [], [], []
            for lg, dl, an in zip(logits, deltas, level_anchors):
                scores = torch.sigmoid(lg[i]).flatten()
                keep = scores > self.score_thresh
                scores = scores[keep]
                idxs = torch.where(keep)[0]
                k = min(self.topk_candidates, idxs.size(0))  # torchvision's _topk_min
                scores, top = scores.topk(k)
                idxs = idxs[top]
                anchor = torch.div(idxs, c, rounding_mode="floor")
                boxes = self.coder.decode(dl[i][anchor], an[anchor])[:, 0]
                boxes_i.append(clip_boxes_to_image(boxes, size))
                scores_i.append(scores)
                labels_i.append(idxs % c)
            boxes, scores = torch.cat(boxes_i), torch.cat(scores_i)
            labels = torch.cat(labels_i)
            keep = batched_nms(boxes, scores, labels, self.nms_thresh)[: self.detections_per_img]
            out.append((boxes[keep], scores[keep], labels[keep],
                        torch.full_like(labels[keep], i)))
        return _batched(out)


def two_stage(**kwargs) -> nn.Module:
    return TwoStageDetector(**kwargs)


def single_stage(**kwargs) -> nn.Module:
    return SingleStageDetector(**kwargs)


def at_bound(model: nn.Module) -> nn.Module:
    """The same model set so that a real run reaches every maximum: no score threshold, no
    minimum box size, NMS that suppresses nothing (IoU never exceeds 1). What it computes then
    is what graphcost's upper bound counts."""
    for name in ("score_thresh", "box_score_thresh"):
        if hasattr(model, name):
            setattr(model, name, -math.inf)
    for name in ("rpn_min_size", "box_min_size"):
        if hasattr(model, name):
            setattr(model, name, 0.0)
    for name in ("nms_thresh", "rpn_nms_thresh", "box_nms_thresh"):
        if hasattr(model, name):
            setattr(model, name, 1.0)
    return model


def _images(batch: int) -> dict[str, tuple[int, ...]]:
    return {"images": (batch, *IMAGE)}


_OUT = ("boxes", "scores", "labels", "image_ids")
DETECTION_MODELS: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("fasterrcnn_tiny", two_stage, _images, {"images": torch.float32},
             "two-stage detector (Faster R-CNN-like): 4 conv backbone, 2-level FPN, RPN, "
             "NMS, multi-scale RoIAlign, MLP box head, per-class NMS; 3×128×128 images; "
             "torch.export only (custom NMS op)", {"images": {0: BATCH}}, _OUT,
             torch_only=True),
    ZooModel("retinanet_tiny", single_stage, _images, {"images": torch.float32},
             "single-stage detector (RetinaNet-like): 4 conv backbone, 2-level FPN, class and "
             "box towers, score threshold, top-k, NMS; 3×128×128 images; torch.export only "
             "(custom NMS op)", {"images": {0: BATCH}}, _OUT, torch_only=True),
]}
