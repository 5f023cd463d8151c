"""The training sweep's reference (benchmarks/flop_formulas.py): FlopCounterMode with the
weight gradient of a grouped convolution counted once, by hand."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.flop_formulas import conv_backward_flops


@pytest.mark.parametrize("transposed", [False, True])
def test_a_grouped_conv_weight_gradient_is_counted_once(transposed):
    # x 2×8×8×8 into a 3×3 conv, 8 → 8 channels in 4 groups, padding 1 (8×8 out): each
    # output element meets 8/4 = 2 input channels × 9 taps → 2·8·64 outputs × 18 = 18,432
    # MACs forward; the input's gradient the same, the weight's the same (each group's
    # weight against its own channels) → backward 2·36,864 = 73,728 FLOPs. torch's own
    # formula counts the weight's 4 times (every input channel against every output one).
    conv = (nn.ConvTranspose2d if transposed else nn.Conv2d)(8, 8, 3, padding=1, groups=4,
                                                               bias=False)
    m = nn.Sequential(nn.Conv2d(8, 8, 1), conv)
    x = torch.randn(2, 8, 8, 8)
    ours = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: conv_backward_flops})
    with ours:
        m(x).sum().backward()
    torchs = FlopCounterMode(display=False)
    with torchs:
        m(x).sum().backward()
    counts = ours.get_flop_counts()["Sequential.1"]
    assert counts[torch.ops.aten.convolution] == 2 * 18_432
    assert counts[torch.ops.aten.convolution_backward] == 73_728
    # (the input's gradient 36,864 + the weight's 4 × 36,864)
    assert torchs.get_flop_counts()["Sequential.1"][torch.ops.aten.convolution_backward] == \
        36_864 + 4 * 36_864
