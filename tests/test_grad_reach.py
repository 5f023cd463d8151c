"""Which parameters a training step's gradient reaches (analyzer/frontends/torch/
grad_reach.py), read off the exported forward, against eager autograd's ``.grad``."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.frontends.torch.capture import StepLoss
from graphcost.analyzer.frontends.torch.grad_reach import unreached_parameters
from torch import nn

from tests.test_dead_ends import _NoGradient, _UnreadProjection, _Unused


class _FilledInPlace(nn.Module):
    """A zeros_like filled chunk by chunk in place (the gated delta rule's output), then a
    view of it made before the writes and read after: the gradient reaches both layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        out = torch.zeros_like(x)
        first = out[:4]
        first.copy_(self.a(x[:4]))
        out[4:] = self.b(x[4:])
        return first * 2 + out.sum()


class _TopKIndices(nn.Module):
    """Scores whose top-k indices alone are used (HY-V4's indexer): no gradient reaches the
    scorer, only the gathered rows' projection."""

    def __init__(self):
        super().__init__()
        self.score, self.proj = nn.Linear(64, 1), nn.Linear(64, 64)

    def forward(self, x):
        idx = self.score(x).squeeze(-1).topk(2).indices
        return self.proj(x[idx])


@pytest.mark.parametrize("model", [_FilledInPlace, _TopKIndices, _NoGradient, _Unused,
                                   _UnreadProjection])
def test_the_parameters_no_gradient_reaches_are_eagers(model):
    m, x = model(), torch.randn(8, 64)
    m(x).sum().backward()
    eager = {f"model.{n}" for n, p in m.named_parameters() if p.grad is None}
    gm = torch.export.export(StepLoss(m), (x,), strict=False).module()
    names = {id(p): n for n, p in gm.named_parameters()}
    assert {names[id(p)] for p in unreached_parameters(gm)} == eager
    assert eager or model is _FilledInPlace  # (each case but the first leaves some out)
