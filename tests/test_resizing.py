"""F.interpolate, forward and backward, as eager runs it: one kernel each. torch decomposes
every resizing op in Python while it traces (a ``py_impl`` at the Autograd key, which no
decomposition table turns off), so a bilinear upsample's backward was traced as input-sized
zeros and an index_put per tap: a decoder's training step +204% (bilinear) and +307%
(bicubic) over MemTracker's, a bicubic upsample's inference peak 7.6 times its output.
graphcost keeps those kernels out of the trace (analyzer/frontends/torch/frontend.py
``kept_whole``); the steps against MemTracker and FlopCounterMode on this CPU."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import (
    measure_inference,
    measure_training,
    training_loss_of,
)
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze


class _Decoder(nn.Module):
    """A segmentation head's shape: a strided convolution, resized back up 4×, a convolution."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.down = nn.Conv2d(3, 32, 3, stride=4, padding=1)
        self.head = nn.Conv2d(32, 8, 3, padding=1)

    def forward(self, x):
        corners = {} if self.mode.startswith("nearest") else {"align_corners": False}
        y = F.interpolate(self.down(x), scale_factor=4, mode=self.mode, **corners)
        return self.head(y)


# (2, 32, 32, 32) resized to (2, 32, 128, 128): 1,048,576 outputs over 2 resized axes. Per
# output: nearest 0; bilinear 3 lerps of 3 FLOPs = 9; bicubic 4 taps × (mul + add) per axis =
# 16. The backward counted as the forward (the transposed map), nearest's as one add per
# output gradient.
RESIZE_FLOPS = {"nearest": (0, 1_048_576), "nearest-exact": (0, 1_048_576),
                "bilinear": (9_437_184, 9_437_184), "bicubic": (16_777_216, 16_777_216)}


@pytest.mark.parametrize("mode", list(RESIZE_FLOPS))
def test_a_resizing_decoder_step_is_the_step_eager_runs(mode):
    torch.manual_seed(0)
    model, x = _Decoder(mode), torch.randn(2, 3, 128, 128)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    resize = [n for n in r.nodes if "upsample" in n.op]
    assert len(resize) == 2, [n.op for n in r.nodes]  # the forward and its backward, whole
    assert tuple(n.flops for n in resize) == RESIZE_FLOPS[mode]
    # Peak, at the head's backward: its input (the resized 2·32·128·128 floats, 4,194,304 B)
    # and that input's gradient (the same), the parameters (896 + 2,312 floats: 12,832 B), the
    # head's gradients (9,248 B), the loss and its gradient (4 B each): 8,410,696 B.
    # Decomposed, the bilinear step said 25,585,220 B with the input (+204%).
    measured, _ = measure_training(model, (x,), "sgd")
    assert r.training.peak_bytes == measured == 2 * 4_194_304 + 12_832 + 9_248 + 8
    # FlopCounterMode counts the convolutions' (2·MACs) and no resizing
    counter = FlopCounterMode(display=False)
    with counter:
        training_loss_of(model, (x,), None).backward()
    assert 2 * r.totals.macs == counter.get_total_flops()


def test_a_trilinear_step_is_the_step_eager_runs():
    # a volume (1, 4, 8, 16, 16) → conv → trilinear 2× → sum: the resize's backward whole;
    # peak against MemTracker's on this CPU
    class Volume(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(4, 8, 3, padding=1)

        def forward(self, x):
            return F.interpolate(self.conv(x), scale_factor=2, mode="trilinear")

    torch.manual_seed(0)
    model, x = Volume(), torch.randn(1, 4, 8, 16, 16)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    ops = {n.op for n in r.nodes}
    assert {"aten.upsample_trilinear3d.default",
            "aten.upsample_trilinear3d_backward.default"} <= ops, ops
    measured, _ = measure_training(model, (x,), "sgd")
    assert r.training.peak_bytes == measured, (r.training.peak_bytes, measured)


def test_bicubic_inference_holds_only_its_output():
    # (2, 3, 64, 64) → bicubic 4× → (2, 3, 256, 256): the output, 393,216 floats =
    # 1,572,864 B, is all an inference allocates (MemTracker's peak); decomposed, graphcost
    # said 12,689,408 B with the 98,304 B input (7.6 times). FLOPs as ONNX's Resize cubic:
    # 393,216 outputs × 16 = 6,291,456.
    class Up(nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=4, mode="bicubic")

    x = torch.randn(2, 3, 64, 64)
    r = analyze(Up(), (x,), include_inputs=False, what_if=False)
    assert [n.op for n in r.nodes] == ["aten.upsample_bicubic2d.vec"]
    assert r.totals.flops == 6_291_456
    assert r.memory.peak_bytes == measure_inference(Up(), (x,))[0] == 1_572_864
