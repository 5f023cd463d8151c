"""Models whose sizes depend on the data, traced at their upper bounds (issue #14).

The zoo's detectors (models_zoo/detection.py) meet what torchvision's detection models meet:
``nonzero`` from masks, NMS (a custom op whose fake kernel leaves its size unbounded),
``keep[:100]``, a top-k of ``min(1000, data-dependent size)`` and ``if boxes.numel() == 0``.
Expected figures are worked out by hand in the comments, and checked against FlopCounterMode
on real CPU runs: the model as it is (below the bound) and set so that every maximum is
reached (``detection.at_bound``: no thresholds, NMS suppressing nothing), which must equal it.
"""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.analyzer.frontends.torch.compat import TORCH_VERSION
from graphcost.analyzer.render.files import render_csv, render_markdown
from graphcost.models_zoo import build_model, detection, example_inputs
from graphcost.passes.errors import GraphcostError
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze

# torch 2.8's slice of a data-dependent size (keep[:300]) keeps the size's own symbol instead
# of Min(300, u): nothing is capped below the symbol's maximum to label (the figures are equal).
_SLICE_28 = f"torch {torch.__version__}: the slice after NMS should be Min(N, u)"

# fasterrcnn_tiny, 1×3×128×128, MACs by hand (output positions × C_out × C_in·k²):
# backbone convs 64²·16·27 + 32²·32·144 + 16²·64·288 + 8²·64·576 = 13,565,952; FPN laterals
# 16²·32·64 + 8²·32·64 = 655,360, outputs 16²·32·288 + 8²·32·288 = 2,949,120 → 17,170,432.
# RPN on 16² + 8² = 320 positions: 3×3 conv 320·32·288 = 2,949,120, objectness 320·3·32 =
# 30,720, deltas 320·12·32 = 122,880 → 3,102,720. Static part: 20,273,152.
STATIC_MACS = 20_273_152
# Box head per RoI: fc6 (32·7·7 = 1,568 → 128) 200,704 + fc7 16,384 + classes 128·5 = 640
# + deltas 128·20 = 2,560 = 220,288. RoIs at most 768 + 192 = 960 (the anchors of both levels,
# each under rpn_pre_nms_top_n 1000): 211,476,480 → 231,749,632 at the bound.
PER_ROI_MACS = 220_288
ROIS = 960


def real_macs(model, inputs) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = model(*inputs)
    return counter.get_total_flops() // 2, out


@pytest.fixture(scope="module")
def two_stage():
    return analyze("zoo:fasterrcnn_tiny")


@pytest.fixture(scope="module")
def single_stage():
    return analyze("zoo:retinanet_tiny")


def test_two_stage_bound_is_the_hand_count_and_a_run_at_the_bound(two_stage):
    r = two_stage
    assert r.coverage.percent == 100.0
    model = build_model("fasterrcnn_tiny")
    assert r.totals.params == sum(p.numel() for p in model.parameters())
    assert r.totals.macs == STATIC_MACS + ROIS * PER_ROI_MACS == 231_749_632
    assert r.bounds.lower_macs == STATIC_MACS  # every data-dependent size at 0
    x = example_inputs("fasterrcnn_tiny")
    below, _ = real_macs(model, x)
    assert STATIC_MACS < below < r.totals.macs  # NMS keeps fewer proposals than the bound
    reached, _ = real_macs(detection.at_bound(model), x)
    assert reached == r.totals.macs


def test_two_stage_bound_is_labelled_with_its_symbols(two_stage):
    r = two_stage
    sizes = {s.symbol: s for s in r.bounds.sizes}
    nms = [s for s in sizes.values() if "nms" in s.origin]
    assert [s.upper for s in nms] == [960, 3_840]  # RPN boxes; 960 RoIs × 4 classes
    assert all("NMS keeps at most" in s.source for s in nms)
    if TORCH_VERSION >= (2, 9):  # box_detections_per_img
        assert nms[1].capped == (f"Min(100, {nms[1].symbol}) ≤ 100",), _SLICE_28
    fc6 = next(n for n in r.nodes if n.op == "aten.addmm.default" and n.scope == "fc6")
    assert fc6.bound.startswith("upper bound: data-dependent size") and "u" in fc6.bound
    assert fc6.macs == ROIS * 1_568 * 128
    static = next(n for n in r.nodes if n.op == "aten.convolution.default")
    assert static.bound is None
    # every format carries the bound: JSON, CSV, Markdown (and the terminal's summary)
    body = json.loads(r.to_json())
    assert body["bounds"]["sizes"][0]["symbol"] == "u0" and body["bounds"]["lower_macs"] == \
        STATIC_MACS
    assert any((n["bound"] or "").startswith("upper bound") for n in body["nodes"])
    assert fc6.bound in render_csv(r)
    assert f"{nms[0].symbol} ∈ [0, 960] at 960" in render_markdown(r)


def test_single_stage_static_macs_exact_and_outputs_bounded(single_stage):
    r = single_stage
    assert r.coverage.percent == 100.0
    model = build_model("retinanet_tiny")
    assert r.totals.params == sum(p.numel() for p in model.parameters())
    below, out = real_macs(model, example_inputs("retinanet_tiny"))
    assert r.totals.macs == below  # post-processing has no MACs: the convs are exact
    assert r.totals.flops > r.bounds.lower_flops
    sizes = {s.symbol: s for s in r.bounds.sizes}
    # per level the top-k is min(topk_candidates 1000, kept scores): 8²·3 anchors × 4 classes
    # = 768 at most on the coarse level; the fine level's 3,072 are cut to 1000; the NMS then
    # sees ≤ 1,768 boxes and 300 detections (detections_per_img) are kept
    nms = next(s for s in sizes.values() if "nms" in s.origin)
    assert nms.upper == 1_768
    if TORCH_VERSION >= (2, 9):
        assert nms.capped == (f"Min(300, {nms.symbol}) ≤ 300",), _SLICE_28
    assert out[0].shape[0] <= 300


def test_dim_sets_a_data_dependent_maximum():
    r = analyze("zoo:fasterrcnn_tiny", dims={"u2": 500, "u7": 5_000})
    sizes = {s.symbol: s for s in r.bounds.sizes}
    assert (sizes["u2"].upper, sizes["u2"].source) == (500, "--dim u2=500")
    assert r.totals.macs == STATIC_MACS + 500 * PER_ROI_MACS  # 130,417,152
    # above the model's own maximum (≤ 4 × 500 boxes reach the second NMS): that one is kept
    assert sizes["u7"].upper == 2_000
    assert any("--dim u7=5000 is above" in w for w in r.warnings)


class Repeat(nn.Module):
    """``repeat_interleave`` by counts in a tensor: a size no op declares a maximum for."""

    def __init__(self, branch: bool = False):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.branch = branch

    def forward(self, x, counts):
        y = torch.repeat_interleave(self.fc(x), counts, dim=0)
        if self.branch and y.shape[0] == 0:
            return y
        return self.fc(y)


REPEAT_INPUTS = (torch.randn(4, 8), torch.tensor([1, 2, 3, 4]))


def test_a_missing_bound_is_named_with_its_flag():
    r = analyze(Repeat(), REPEAT_INPUTS)
    assert r.coverage.unknown_shape  # not costed, and said in one line:
    assert any("the data-dependent size u0" in w and "pass --dim u0=MAX" in w
               for w in r.warnings)
    with pytest.raises(GraphcostError, match=r"branches on the data-dependent Eq\(u0, 0\); "
                       r"the size u0 \(from torch.repeat_interleave\) has no upper bound: "
                       r"pass dims=\{'u0': MAX\}"):
        analyze(Repeat(branch=True), REPEAT_INPUTS)
    # bounded: fc on x 4·8·8 = 256 MACs, on at most 64 repeated rows 64·8·8 = 4,096
    r = analyze(Repeat(branch=True), REPEAT_INPUTS, dims={"u0": 64})
    assert r.coverage.percent == 100.0 and r.totals.macs == 4_352
    with pytest.raises(GraphcostError, match="no data-dependent size named 'u5'; its "
                                             "data-dependent sizes: u0"):
        analyze(Repeat(), REPEAT_INPUTS, dims={"u5": 3})


class PerClass(nn.Module):
    """torchvision's _batched_nms_vanilla pattern: a Python loop over ``torch.unique``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, boxes, labels):
        return torch.stack([self.fc(boxes[torch.where(labels == c)[0]]).sum(0)
                            for c in torch.unique(labels)])


def test_a_loop_over_a_data_dependent_size_unrolls_at_its_maximum():
    inputs = (torch.randn(1000, 4), torch.randint(0, 5, (1000,)))
    with pytest.raises(GraphcostError, match=r"loops over the data-dependent size u0 \(from "
                       r"torch.unique\), up to 1000 times; graphcost unrolls at most 256: "
                       r"pass dims=\{'u0': MAX\}"):
        analyze(PerClass(), inputs)
    # at most 5 classes: 5 iterations, each over at most all 1000 boxes: 5·1000·4·4 MACs
    r = analyze(PerClass(), inputs, dims={"u0": 5})
    assert r.coverage.percent == 100.0 and r.totals.macs == 80_000
    assert any("unrolled at its maximum, 5 iterations" in w for w in r.warnings)
