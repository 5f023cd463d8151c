"""In-place activations (``Rule.inplace``) on both frontends, checked against PyTorch's
MemTracker measuring the same model with ``inplace=True`` and ``inplace=False`` modules.

In-place writes only remove an activation's input while the activation runs, so they lower
the peak only where the peak is at such an activation: a wide ReLU between two linears (below,
by hand and measured), or ResNet-18 and MobileNetV2 exported for inference, where the exporter
folds BatchNorm into the convolutions so that a Conv's output feeds the ReLU directly. In
PyTorch itself their peaks are at a BatchNorm, whose input and output are both live: MemTracker
measures no saving, and neither does graphcost.
"""
from __future__ import annotations

import io

import onnx
import pytest
import torch
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import PassOptions
from graphcost.analyzer.load.loading import load_graph
from graphcost.analyzer.measure.reference import measure_inference
from torch import nn

from graphcost import models_zoo


def with_inplace(model: nn.Module, inplace: bool) -> nn.Module:
    for m in model.modules():
        if hasattr(m, "inplace"):
            m.inplace = inplace
    return model


def measured_peaks(build, args) -> tuple[int, int]:
    """MemTracker's activation peak of one no_grad forward: (out of place, in place)."""
    with torch.no_grad():
        return tuple(measure_inference(with_inplace(build(), flag), args)[0]
                     for flag in (False, True))


def onnx_proto(model, args):
    buf = io.BytesIO()
    torch.onnx.export(model, args, buf, dynamo=False, opset_version=17)
    return onnx.load_from_string(buf.getvalue())


def peaks(model, args, fx: bool) -> tuple[int, int]:
    """graphcost's activation peak (inputs excluded, as MemTracker excludes them): plain and
    with the in-place what-if."""
    graph = load_graph(model, example_inputs=args) if fx else load_graph(onnx_proto(model, args))
    return tuple(run_passes(graph, PassOptions(include_inputs=False, inplace=flag)).memory.peak_bytes
                 for flag in (False, True))  # one trace, both what-ifs


@pytest.mark.parametrize("fx", [True, False], ids=["fx", "onnx"])
def test_wide_relu_in_place_saves_its_input(fx):
    # Linear(64→1024) → ReLU → Linear(1024→8) at batch 4; h = 4·1024·4 B = 16,384 B,
    # out = 4·8·4 = 128 B. Out of place the peak is at the ReLU: h + h = 32,768 B. In place
    # the ReLU writes into its input: the peak is at the last linear, h + out = 16,512 B
    # (saving 16,256 B).
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 8)).eval()
    args = (torch.randn(4, 64),)
    measured = measured_peaks(build, args)
    assert measured == (32_768, 16_512)
    assert peaks(build(), args, fx) == measured


# The folded (inference) ONNX exports at 1×3×224×224:
# resnet18: conv1 writes 64·112·112·4 B = 3,211,264 B and its ReLU as much again: the peak is
#   at that ReLU, 6,422,528 B. In place, the peak moves to the max pool: the ReLU's 3,211,264 B
#   + the pool's 64·56·56·4 = 802,816 B = 4,014,080 B.
# mobilenet_v2: features.2 expands 16 → 96 channels at 112·112: 96·112·112·4 = 4,816,896 B, and
#   its ReLU6 (Clip) writes as much: 9,633,792 B + the Clip's two 4-byte bound constants =
#   9,633,800 B. In place, the peak is the depthwise conv after it: 4,816,896 B in +
#   96·56·56·4 = 1,204,224 B out = 6,021,120 B.
FOLDED = {"resnet18": (6_422_528, 4_014_080), "mobilenet_v2": (9_633_800, 6_021_120)}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_cnn_in_place_on_both_frontends(name):
    args = models_zoo.example_inputs(name, batch=1)
    plain, inplace = measured_peaks(lambda: models_zoo.build_model(name), args)
    assert plain == inplace  # PyTorch: in-place ReLU/ReLU6 leave the peak where it was
    model = models_zoo.build_model(name)
    assert peaks(model, args, fx=True) == (plain, plain)  # eager lifetimes: as measured
    assert peaks(model, args, fx=False) == FOLDED[name]
