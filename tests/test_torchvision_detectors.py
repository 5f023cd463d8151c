"""torchvision's own detectors traced at their upper bounds (issue 24).

What they meet beyond the zoo's detectors (tests/test_data_dependent.py): ``torch.unique`` of a
data-dependent size (``batched_nms`` above 4,000 box coordinates on CPU loops over the classes,
``_batched_nms_vanilla``), bounded by its input's elements and, where the trace shows the class
ids made by ``arange``, ``full`` or ``x % k``, by their values; ``boxes.unbind(1)`` (four
columns, not a loop over the boxes); a length read as a number (``len(proposals)``) whose
shapes divide by the symbol. Random weights, one 128×128 image, 3 classes. Expected figures are
worked out by hand in the comments or are FlopCounterMode's on an eager run of the same model.
The tests without torchvision are the class-id intervals on a small model.
"""
from __future__ import annotations

import re

import pytest
import torch
from graphcost.analyzer.frontends.torch.compat import TORCH_VERSION
from graphcost.passes.errors import GraphcostError
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze

# TwoMLPHead + FastRCNNPredictor per RoI (representation 1024, 3 classes): fc6 256·7·7·1024 =
# 12,845,056, fc7 1024·1024 = 1,048,576, class scores 1024·3 = 3,072, box deltas 1024·12 =
# 12,288 → 13,908,992 MACs.
PER_ROI_MACS = 13_908_992


@pytest.fixture(scope="module")
def detection():
    from graphcost.analyzer.frontends.torch.optional_imports import torchvision_problem

    problem = torchvision_problem()
    if problem:  # (a torchvision built for another torch raises, no ImportError)
        pytest.skip(problem)
    pytest.importorskip("torchvision")
    from torchvision.models import detection
    return detection


def _build(detection, name: str, **kw):
    torch.manual_seed(0)
    model = getattr(detection, name)(weights=None, weights_backbone=None, num_classes=3, **kw)
    return model.eval(), [torch.rand(3, 128, 128)]


def _eager(model, images, hook=None):
    """MACs by FlopCounterMode on a real CPU run, the RoIs the box head saw, the detections."""
    rois: list[int] = []
    handle = hook.register_forward_hook(lambda m, i, o: rois.append(i[0].shape[0])) \
        if hook is not None else None
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = model(images)
    if handle is not None:
        handle.remove()
    return counter.get_total_flops() // 2, rois, out


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _symbol(r, origin: str):
    return [s for s in r.bounds.sizes if origin in s.origin]


def test_fasterrcnn_mobilenet_320_box_head_counts_every_proposal(detection):
    model, images = _build(detection, "fasterrcnn_mobilenet_v3_large_320_fpn")
    r = analyze(model, (images,))
    assert r.coverage.percent == 100.0
    assert r.totals.params == _params(model)
    # the box head runs on at most rpn_post_nms_top_n_test = 150 RoIs (the 320 model's setting)
    head = {n.scope: n.macs for n in r.nodes if n.macs and "roi_heads" in (n.scope or "")}
    assert head == {"roi_heads.box_head.fc6": 150 * 12_845_056,
                    "roi_heads.box_head.fc7": 150 * 1_048_576,
                    "roi_heads.box_predictor.cls_score": 150 * 3_072,
                    "roi_heads.box_predictor.bbox_pred": 150 * 12_288}
    assert any("is read as a number" in w and "at its maximum, 150" in w for w in r.warnings)
    # transform.postprocess's boxes.unbind(1) is the four coordinates, not a loop over boxes
    assert not any("unrolled" in w for w in r.warnings), r.warnings
    nms = _symbol(r, "torchvision.nms")
    assert nms and all(s.source == "torchvision.nms: NMS keeps at most the boxes it is given"
                       for s in nms)
    assert "Min(150, " in " ".join(c for s in nms for c in s.capped)
    # a real run: the RoIs it keeps cost the same per RoI; the rest of the bound is the RoIs
    # it does not keep
    eager, rois, out = _eager(model, images, model.roi_heads.box_head)
    assert rois[0] <= 150 and out[0]["boxes"].shape[0] <= 100  # box_detections_per_img
    assert r.totals.macs - eager == (150 - rois[0]) * PER_ROI_MACS


def test_fasterrcnn_resnet50_loops_over_levels_and_classes(detection):
    # 128×128: 3·(32² + 16² + 8² + 4² + 2²) = 4,092 anchors, ≤ 1000 per level kept → 2,020 RPN
    # boxes, 8,080 coordinates: batched_nms takes the per-class loop over torch.unique(levels)
    model, images = _build(detection, "fasterrcnn_resnet50_fpn", min_size=128, max_size=128,
                           rpn_score_thresh=0.5)  # the real run keeps fewer than the bound
    r = analyze(model, (images,))
    assert r.coverage.percent == 100.0
    assert r.totals.params == _params(model)
    loops = [w for w in r.warnings if "is unrolled at its maximum" in w]
    # the RPN's levels are torch.full(n, level) for the 5 FPN levels; the RoI heads' labels
    # torch.arange(num_classes) — 5 and 3 per-class NMS calls, not one per box
    assert any("5 iterations" in w and "its input's lying in [0, 4] (torch.full)" in w
               for w in loops), loops
    assert any("3 iterations" in w and "its input's lying in [0, 2] (torch.arange)" in w
               for w in loops), loops
    # RoIs at most rpn_post_nms_top_n_test = 1000
    eager, rois, _ = _eager(model, images, model.roi_heads.box_head)
    assert rois[0] < 1000
    assert r.totals.macs - eager == (1000 - rois[0]) * PER_ROI_MACS


def test_retinanet_convolutions_exact_and_class_loop_bounded(detection):
    model, images = _build(detection, "retinanet_resnet50_fpn", min_size=128, max_size=128)
    r = analyze(model, (images,))
    assert r.coverage.percent == 100.0
    assert r.totals.params == _params(model)
    eager, _, out = _eager(model, images)
    assert r.totals.macs == eager  # the post-processing has no MACs: the convolutions are exact
    assert r.bounds.lower_flops < r.totals.flops
    # per level topk(min(1000, positions·9 anchors·3 classes)): 16²·27 = 6,912 → 1000, 8²·27 =
    # 1,728 → 1000, 432, 108, 27 → at most 2,567 boxes reach each class's NMS
    nms = _symbol(r, "torchvision.nms")
    assert nms and {s.upper for s in nms} == {2_567}
    assert any(c.endswith("≤ 300") for s in r.bounds.sizes for c in s.capped)  # detections
    assert out[0]["boxes"].shape[0] <= 300
    # the class ids are topk_idxs % num_classes: 3 values, not 2,567
    assert any("3 iterations" in w and "lying in [0, 2] (x % 3)" in w for w in r.warnings)


def test_ssdlite_convolutions_exact_and_nms_bounded(detection):
    model, images = _build(detection, "ssdlite320_mobilenet_v3_large")  # resized to 320×320
    r = analyze(model, (images,))
    assert r.coverage.percent == 100.0
    assert r.totals.params == _params(model)
    eager, _, out = _eager(model, images)
    assert r.totals.macs == eager
    # 6 default boxes at each of 20² + 10² + 5² + 3² + 2² + 1² positions = 3,234 per class;
    # ≤ topk_candidates 300 per foreground class (2) → the NMS sees at most 600 boxes and keeps
    # ≤ detections_per_img 300
    sizes = r.bounds.sizes
    assert {s.upper for s in sizes if "nms" not in s.origin} == {3_234}
    (nms,) = _symbol(r, "torchvision.nms")
    assert nms.upper == 600 and any(c.endswith("≤ 300") for c in nms.capped)
    assert out[0]["boxes"].shape[0] <= 300


def test_mask_rcnn_pasting_reads_box_coordinates_as_sizes(detection):
    # the loop over the detections runs (at most box_detections_per_img 100); each mask is
    # resized to int(box[2] - box[0] + 1) pixels: a value, which no size bound decides
    model, images = _build(detection, "maskrcnn_resnet50_fpn", min_size=128, max_size=128)
    with pytest.raises(GraphcostError, match=r"branches on the data-dependent u\d+; u\d+ is a "
                       "value read from a tensor, not a size"):
        analyze(model, (images,))


class Rows(nn.Module):
    """A loop over the first 5 kept rows, reading a column of each (``paste_masks_in_image``'s
    ``for m, b in zip(masks, boxes)``, then ``b[2]``)."""

    def forward(self, x):
        rows = x[torch.nonzero(x[:, 0] > 0)[:, 0][:5]]
        return torch.stack([r[2] * 2 for r in rows])


def test_a_loop_over_a_capped_length_yields_rows():
    # Min(5, u0) rows: 5 iterations, each row of 4 (torch 2.14's own unbind keeps the axis:
    # pieces of Min(5, u0)//5 rows, and r[2] is out of range)
    r = analyze(Rows(), (torch.randn(8, 4),))
    assert r.coverage.percent == 100.0
    assert sum(n.op == "aten.mul.Tensor" for n in r.nodes) == 5
    if TORCH_VERSION >= (2, 9):  # torch 2.8 decides x[:5] as 5 rows (asserting u0 ≥ 5)
        assert any("Min(5, u0)" in w and "unrolled at its maximum, 5 iterations" in w
                   for w in r.warnings), r.warnings


class ClassLoop(nn.Module):
    """RoIHeads.postprocess_detections' class ids (``arange`` expanded over the boxes, masked
    by a score threshold) looped over as ``_batched_nms_vanilla`` does."""

    def __init__(self, write: bool = False):
        super().__init__()
        self.write = write

    def forward(self, scores):
        labels = torch.arange(scores.shape[1]).view(1, -1).expand_as(scores)
        keep = scores > 0.5
        scores, labels = scores[keep], labels[keep]
        if self.write:
            labels += 10  # values the interval no longer says: forgotten, not shifted
        return torch.stack([scores[labels == c].sum() for c in torch.unique(labels)])


def test_class_ids_bound_the_loop_and_a_write_forgets_them():
    scores = torch.rand(100, 3)
    r = analyze(ClassLoop(), (scores,))
    assert r.coverage.percent == 100.0
    assert any("unrolled at its maximum, 3 iterations (an upper bound: torch.unique: at most "
               "3 distinct values, its input's lying in [0, 2] (torch.arange))" in w
               for w in r.warnings), r.warnings
    # written in place: only the element count bounds it, 300 kept scores > 256 iterations
    with pytest.raises(GraphcostError, match=re.escape("(from torch.unique), up to 300 times")):
        analyze(ClassLoop(write=True), (scores,))
